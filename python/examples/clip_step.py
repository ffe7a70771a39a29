"""One training step of a small CLIP-like model, dumped for `gradcheck-dist check` (the README's recipe).

    python clip_step.py --world 4 --out dumps     # DDP on 4 gloo processes (or: torchrun --nproc_per_node 4 clip_step.py --out dumps)
    python clip_step.py --out ref                  # the reference: one process, no process group; it writes
                                                   # ref/rank0.safetensors and ref/permuted.safetensors

(--world N starts the ranks itself: Debian 12's torch 1.13 torchrun fails on Python 3.11's enum.)

Every rank computes the contrastive loss over the gathered global batch, so the mean of the ranks'
losses is the one-process loss on the whole batch: the same objective, hence the same gradient, when
the gather carries gradients. The reference computes the step twice: on the batch in order (rank0.safetensors)
and, re-seeded, on the same rows permuted (permuted.safetensors, `gradcheck.order=permuted`): the same gradient
up to rounding, so `check --ref ref/rank0.safetensors --ref ref/permuted.safetensors` measures each tensor's
rounding noise (--references 1 writes only the first). --autocast bf16 runs the forward under
torch.autocast("cpu", torch.bfloat16); track(model), called once before the forward, lets the dump record it.
--gather nograd gathers as Lightning's all_gather(sync_grads=False)
does (under torch.no_grad()): the encoders then get None and only logit_scale learns.

The gather with gradients is gradcheck_dist.all_gather_with_grad: on recent torch 2.x
torch.distributed._functional_collectives.all_gather_single_autograd(x, 0, group) (no FutureWarning), on
torch 1.13 torch.distributed.nn.functional.all_gather (which recent torch deprecates). Lightning users:
self.all_gather(x, sync_grads=True) is the same gather.
"""
import argparse
import contextlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gradcheck_dist import dump_grads

try:
    from gradcheck_dist import track
except ImportError:  # a gradcheck_dist older than this example
    from gradcheck_dist import track_precision as track

try:
    from gradcheck_dist import all_gather_with_grad
except ImportError:  # a gradcheck_dist older than this example: torch 1.13's spelling
    def all_gather_with_grad(x):
        import torch.distributed.nn.functional as dnn
        return torch.cat(dnn.all_gather(x))


class Clip(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.img, self.txt = torch.nn.Linear(8, 4), torch.nn.Linear(6, 4)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, x_img, x_txt, gather):
        I, T = F.normalize(self.img(x_img), dim=-1), F.normalize(self.txt(x_txt), dim=-1)
        I, T = gather(I.float()), gather(T.float())   # float: gloo on torch 1.13 cannot all-gather bf16 (autocast)
        logits, labels = self.logit_scale.exp() * I @ T.T, torch.arange(len(I))
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def gather_with_grad(x):
    return all_gather_with_grad(x)   # torch.cat of every rank's x, the backward summing over ranks


def gather_no_grad(x):
    with torch.no_grad():
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
    return torch.cat(out)


def autocast(a):
    return torch.autocast("cpu", dtype=torch.bfloat16) if a.autocast == "bf16" else contextlib.nullcontext()


def step(a):
    distributed = "RANK" in os.environ   # under torchrun or --world; else one process, no process group
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(0)                 # the same starting weights and global batch everywhere
    model, x_img, x_txt = Clip(), torch.randn(16, 8), torch.randn(16, 6)
    track(model)                         # once, before the forward: autocast, which modules ran (for the dump)
    shard = slice(rank * 16 // world, (rank + 1) * 16 // world)
    if distributed:
        # the no-grad gather leaves the encoders unused, which DDP must be told (as Lightning's
        # ddp_find_unused_parameters_true does); with a gradient-carrying gather every parameter is used
        ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=a.gather == "nograd")
        gather = gather_with_grad if a.gather == "grad" else gather_no_grad
        with autocast(a):
            loss = ddp(x_img[shard], x_txt[shard], gather)
        loss.backward()
    else:
        with autocast(a):
            loss = model(x_img, x_txt, lambda x: x)
        loss.backward()
    dump_grads(model, os.path.join(a.out, f"rank{rank}.safetensors"))   # after DDP's all-reduce: stage "reduced"
    if not distributed and a.references == 2:
        # the reference again, re-seeded, the same rows in another order (image i still pairs with text i):
        # mathematically the same gradient; what the two disagree by is each tensor's rounding noise
        torch.manual_seed(0)
        model, x_img, x_txt = Clip(), torch.randn(16, 8), torch.randn(16, 6)
        track(model)
        perm = torch.randperm(16, generator=torch.Generator().manual_seed(1))
        with autocast(a):
            loss = model(x_img[perm], x_txt[perm], lambda x: x)
        loss.backward()
        dump_grads(model, os.path.join(a.out, "permuted.safetensors"), extra_metadata={"gradcheck.order": "permuted"})
    if distributed:
        dist.destroy_process_group()


def rank_main(rank, a, port):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(a.world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    step(a)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for rank{r}.safetensors")
    ap.add_argument("--world", type=int, default=1, help="start this many gloo ranks (default: 1, or torchrun's)")
    ap.add_argument("--gather", choices=["grad", "nograd"], default="grad")
    ap.add_argument("--autocast", choices=["off", "bf16"], default="off", help="the forward under CPU bf16 autocast")
    ap.add_argument("--references", type=int, choices=[1, 2], default=2,
                    help="world 1: also write permuted.safetensors, the same step on permuted rows (default 2)")
    a = ap.parse_args()
    if a.world > 1 and "RANK" not in os.environ:
        import socket
        import torch.multiprocessing as mp
        with socket.socket() as s:   # a free port on loopback
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(rank_main, args=(a, port), nprocs=a.world)
    else:
        step(a)


if __name__ == "__main__":
    main()
