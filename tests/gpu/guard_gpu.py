"""The guard on CUDA tensors over NCCL (issue 35): WORLD ranks (one per GPU, at most 4), each a process on its own
GPU: a correct step is clean; a NaN put into rank WORLD-1's reduced gradient is found on that rank; on two GPUs or
more, a rank left out of the reduce disagrees; the sketch of a CUDA tensor (float32 and bfloat16) equals the same
tensor's sketch on the CPU (its projections are hashed, not drawn from a device's generator). Written without a GPU to run it: untested until a GPU machine runs it.

usage: GRADCHECK_DIST_LIB=build-gpu/libgradcheck_dist.so python3 tests/gpu/guard_gpu.py WORLD
Prints PASS/FAIL lines; exits non-zero when any failed.
"""
import datetime
import os
import socket
import sys

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python"))
from gradcheck_dist.guard import CHUNK, GradcheckFinding, _sketch, guard  # noqa: E402


def _rank(rank, world, port, q):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Tanh(), torch.nn.Linear(512, 8)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    g = guard(ddp, every=1)
    got = {}
    for case in ("ok", "nan", "left_out"):
        if case == "left_out" and world < 2:
            continue
        x = torch.randn(64, 512, device="cuda", generator=torch.Generator(device="cuda").manual_seed(rank))
        if case == "left_out":  # no DDP: a hand-written average over every rank but the last
            model(x).pow(2).mean().backward()
            sub = dist.new_group(list(range(world - 1)))
            for p in model.parameters():
                if rank < world - 1:
                    dist.all_reduce(p.grad, group=sub)
        else:
            ddp(x).pow(2).mean().backward()
        if case == "nan" and rank == world - 1:
            model[0].weight.grad[3, 4] = float("nan")
        try:
            g.check()
            got[case] = None
        except GradcheckFinding as e:
            got[case] = (e.ranks, [f["kind"] for f in e.report["runs"][0]["findings"] if f["counts"]])
        model.zero_grad(set_to_none=True)
    if rank == 0:
        q.put(got)
    dist.destroy_process_group()


def main():
    world = int(sys.argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    got = q.get(timeout=300)
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
    last = world - 1
    g = torch.randn(CHUNK + 12345, generator=torch.Generator().manual_seed(4))
    sk = {}
    for dt in (torch.float32, torch.bfloat16):
        cpu, ss_cpu = _sketch(g.to(dt), 777, 9, 8)
        gpu, ss_gpu = _sketch(g.to(dt).cuda(), 777, 9, 8)
        sk[str(dt)] = max(float((gpu.cpu() - cpu).norm() / cpu.norm()), abs(float(ss_gpu.cpu() / ss_cpu) - 1))
    checks = [("the sketch on CUDA equals the sketch on the CPU (float32, bfloat16) to 1e-5", max(sk.values()) < 1e-5),
              ("a correct step on CUDA over NCCL: no finding", got.get("ok", "missing") is None),
              (f"a NaN on rank {last}: nonfinite, rank {last} named", got.get("nan") == ([last], ["nonfinite"]))]
    if world > 1:
        checks.append((f"rank {last} left out of the reduce: disagree, rank {last} named",
                       got.get("left_out") == ([last], ["disagree"])))
    bad = 0
    for what, ok in checks:
        print(("PASS: " if ok else "FAIL: ") + f"guard {what} -- {got} {sk}")
        bad += not ok
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
