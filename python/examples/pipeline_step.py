"""One training step of a two-stage pipeline under data parallelism (2 x 2 on 4 gloo ranks), dumped for
`gradcheck-dist check`, one check per stage (docs/python.md, "Pipeline parallel").

    python pipeline_step.py --world 4 --out pp      # rank = dp * 2 + stage: pp/stage{s}/rank{dp}.safetensors
    python pipeline_step.py --out ref               # the whole model in one process: ref/rank0 + ref/permuted
    gradcheck-dist check pp/stage0 --ref ref/rank0.safetensors --ref ref/permuted.safetensors --ignore 'stage1.*'

Every rank builds the whole model (the same seed: the same weights and names as the reference) and runs only its
stage: stage 0 sends its activations to stage 1 (torch.distributed send/recv), stage 1 computes the loss over its
data shard and sends the activations' gradient back. Each stage is wrapped in DistributedDataParallel over its data
parallel group (the ranks that hold that stage), which averages its gradients. Each rank dumps the whole model's
gradients: the other stage's parameters are None there, so the check of stage s leaves them out (--ignore).
--bug no-dp-stage0 runs stage 0 under DDP's no_sync(), so it skips its data-parallel all-reduce: the check of stage 0 fails, stage 1's passes.
"""
import argparse
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gradcheck_dist import dump_grads, track

ROWS = 16


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stage0 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh())
        self.stage1 = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def forward(self, x, y):   # the reference: both stages in one process
        return F.mse_loss(self.stage1(self.stage0(x)).squeeze(-1), y)


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(ROWS, 8, generator=g), torch.randn(ROWS, generator=g)


def reference(a):
    for name, perm in (("rank0", None), ("permuted", torch.randperm(ROWS, generator=torch.Generator().manual_seed(2)))):
        torch.manual_seed(0)
        model = Net()
        track(model)
        x, y = data()
        if perm is not None:   # the same rows in another order: the same gradient up to rounding
            x, y = x[perm], y[perm]
        model(x, y).backward()
        dump_grads(model, os.path.join(a.out, f"{name}.safetensors"),
                   extra_metadata={"gradcheck.order": "permuted"} if perm is not None else None)


def rank_main(rank, a, initfile):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + initfile, rank=rank, world_size=4)   # no port to race for
    stage, dp = rank % 2, rank // 2
    dp_groups = [dist.new_group([s, s + 2]) for s in (0, 1)]   # every rank creates every group, in one order
    torch.manual_seed(0)
    model = Net()
    track(model)
    x, y = data()
    x, y = x.chunk(2)[dp], y.chunk(2)[dp]                       # this pipeline's data shard
    mine = model.stage0 if stage == 0 else model.stage1
    wrapped = torch.nn.parallel.DistributedDataParallel(mine, process_group=dp_groups[stage])
    if stage == 0:
        # the bug: stage 0's step under no_sync(), as a misplaced accumulation context does: no all-reduce
        with wrapped.no_sync() if a.bug == "no-dp-stage0" else contextlib.nullcontext():
            h = wrapped(x)
            dist.send(h.detach().contiguous(), rank + 1)
            gh = torch.empty_like(h)
            dist.recv(gh, rank + 1)
            h.backward(gh)
    else:
        h = torch.empty(x.shape[0], 16)
        dist.recv(h, rank - 1)
        h.requires_grad_(True)
        F.mse_loss(wrapped(h).squeeze(-1), y).backward()
        dist.send(h.grad.contiguous(), rank - 1)
    dump_grads(model, os.path.join(a.out, f"stage{stage}", f"rank{dp}.safetensors"), rank=dp, world=2,
               extra_metadata={"gradcheck.wrapper": "pipeline"})
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=1, choices=[1, 4], help="4: data 2 x pipeline 2; 1: the reference")
    ap.add_argument("--bug", choices=["none", "no-dp-stage0"], default="none")
    a = ap.parse_args()
    if a.world == 1:
        reference(a)
        return
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(rank_main, args=(a, os.path.join(d, "pg-init")), nprocs=4)


if __name__ == "__main__":
    main()
