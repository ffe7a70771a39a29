"""The guard's cost (issue 35 item 4): one run, 4 gloo CPU ranks, a 21M-parameter MLP under DDP, the same training
step timed three ways, interleaved step by step (plain, idle, judged, plain, ...) so that drift and the other load
on the machine fall on all three alike; each overhead is the median over rounds of the paired ratio:

  plain    DDP, no guard (no hooks)
  idle     DDP + gradcheck_dist.guard(every=100) at a step it does not judge (the forward hooks and the call)
  judged   DDP + the guard judging the step (what every=1 costs at each step, and every=100 once per 100 steps)

every=100's overhead is (idle - plain) / plain + (judged - idle) / (100 plain); every=1's is (judged - plain) / plain,
each term the median over rounds of the round's slowest rank.
Memory: the guard's own tensors (its caches of signs, read; the summary table, the gathered tables, one chunk's
projections, the small gradients' float64 stack, counted), and
the peak RSS one judged check adds in a fresh process holding the model and its gradients (before the ranks start).

usage: GRADCHECK_DIST_LIB=build/libgradcheck_dist.so python tests/bench/bench_guard.py [--rounds 30]
Prints one JSON line (rank 0) and a table.
"""
import argparse
import datetime
import json
import os
import resource
import socket
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "python"))
from gradcheck_dist.guard import CHUNK, COLS, ROW, guard  # noqa: E402

gguard = sys.modules["gradcheck_dist.guard"]   # the module (the package's attribute `guard` is the function)

WORLD, WIDTH, LAYERS, BATCH, K = 4, 2304, 4, 32, 8


def make():
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def _rank(rank, port, rounds, steps, out):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)  # 4 ranks on the machine's cores
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=600))
    plain, guarded = DDP(make()), DDP(make())
    nparam = sum(p.numel() for p in plain.parameters())
    opt_p = torch.optim.SGD(plain.parameters(), lr=1e-4)
    opt_g = torch.optim.SGD(guarded.parameters(), lr=1e-4)
    g100 = guard(guarded, every=100, on_finding="raise", k=K)
    x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(rank))

    def step(model, opt, check=None, at=0):
        t0 = time.perf_counter()
        model(x).pow(2).mean().backward()
        if check is not None:
            check(at)
        opt.step()
        opt.zero_grad()
        dist.barrier()
        return time.perf_counter() - t0

    times = {"plain": [], "idle": [], "judged": []}
    step(plain, opt_p), step(guarded, opt_g, g100.check, 0)  # warm-up: allocations, DDP buckets, the library
    for _ in range(rounds * steps):
        times["plain"].append(step(plain, opt_p))
        times["idle"].append(step(guarded, opt_g, g100.check, 1))   # 1 % 100: not judged
        times["judged"].append(step(guarded, opt_g, g100.check, 0))  # judged
    report = g100.last
    all_t = [None] * WORLD
    dist.all_gather_object(all_t, {"times": times})
    if rank == 0:
        npar = len(report["runs"][0]["params"])
        # the guard's tensors: what it keeps from step to step, read from its caches (every large parameter's
        # column signs w, float32; the small gradients' signs, float64, size x K each), its table and the gathered
        # ones (float64), and at a check one chunk's R (float64) with the int64 hashes it is drawn from, v and v
        # in float64, and the small gradients stacked in float64
        kept = sum(t.numel() * t.element_size() for cache in (gguard._W, gguard._SMALL) for t in cache.values())
        small = sum(p.numel() for p in guarded.parameters() if p.numel() <= ROW)
        guard_bytes = kept + 8 * npar * (COLS + K) * (1 + 2 * WORLD) + (CHUNK // ROW) * (32 * K + 16) + 8 * small
        slow = {k: [max(t["times"][k][i] for t in all_t) for i in range(rounds * steps)] for k in times}  # the step ends at the barrier
        med = {k: statistics.median(v) for k, v in slow.items()}
        ratio = {k: statistics.median((a - b) / b for a, b in zip(slow[k], slow["plain"])) for k in ("idle", "judged")}
        judged_vs_idle = statistics.median((a - b) / c for a, b, c in zip(slow["judged"], slow["idle"], slow["plain"]))
        res = {"world": WORLD, "params": nparam, "tensors": npar, "k": K, "rounds": rounds, "steps_per_round": steps,
               "cores": os.cpu_count(), "torch": torch.__version__,
               "median_step_s": med,
               "overhead_every1": ratio["judged"],
               "overhead_every100": ratio["idle"] + judged_vs_idle / 100,
               "overhead_idle": ratio["idle"],
               "guard_bytes": guard_bytes, "guard_bytes_kept": kept, "gradient_bytes": 4 * nparam,
               "result": report["result"]}
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def memory(rounds):
    """In this process, one thread, no process group: (peak RSS KiB one judged check adds, then the medians over
    `rounds` interleaved rounds of a forward + backward and of a judged check, in seconds)."""
    torch.set_num_threads(1)
    model = make()
    g = guard(model, every=1, k=K)
    x = torch.randn(BATCH, WIDTH)
    model(x).pow(2).mean().backward()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    g.check(0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    fb, ck = [], []
    for i in range(rounds):
        model.zero_grad()
        t0 = time.perf_counter()
        model(x).pow(2).mean().backward()
        t1 = time.perf_counter()
        g.check(i)
        fb.append(t1 - t0), ck.append(time.perf_counter() - t1)
    return rss, statistics.median(fb), statistics.median(ck), statistics.median(c / f for c, f in zip(ck, fb))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=1)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rss_added, fb_s, check_s, check_ratio = memory(max(a.rounds, 5))
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"bench_guard_{os.getpid()}.json")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, port, a.rounds, a.steps, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(1800)
    for p in procs:
        if p.is_alive():
            p.kill()
    if any(p.exitcode != 0 for p in procs):
        sys.exit(f"bench_guard: rank exit codes {[p.exitcode for p in procs]}")
    with open(out) as f:
        res = json.load(f)
    os.unlink(out)
    res["peak_rss_added_kib"], res["check_seconds_one_process"] = rss_added, check_s
    res["fwd_bwd_seconds_one_process"], res["check_over_fwd_bwd_one_process"] = fb_s, check_ratio
    print(json.dumps(res))
    m = res["median_step_s"]
    print(f"{res['params'] / 1e6:.1f}M parameters ({res['tensors']} tensors), world {WORLD} gloo, {res['cores']} cores, torch {res['torch']}")
    print(f"median step: plain {m['plain'] * 1e3:.0f} ms, guard idle {m['idle'] * 1e3:.0f} ms, guard judging {m['judged'] * 1e3:.0f} ms")
    print(f"overhead: every=1 {100 * res['overhead_every1']:.1f} %, every=100 {100 * res['overhead_every100']:.2f} % "
          f"(of which the hooks and the call at a step not judged: {100 * res['overhead_idle']:.2f} %)")
    print(f"guard memory {res['guard_bytes'] / 1024:.0f} KiB per rank at a check, {res['guard_bytes_kept'] / 1024:.0f} KiB of it kept "
          f"between checks (a gradient copy would be {res['gradient_bytes'] / 2**20:.0f} MiB); "
          f"one judged check adds {res['peak_rss_added_kib']} KiB of peak RSS")
    print(f"one process, one thread: forward + backward {res['fwd_bwd_seconds_one_process'] * 1e3:.1f} ms, a judged check "
          f"{res['check_seconds_one_process'] * 1e3:.1f} ms ({100 * res['check_over_fwd_bwd_one_process']:.1f} % of it)")


if __name__ == "__main__":
    main()
