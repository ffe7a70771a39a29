"""Replays a gradcheck-dist report in real PyTorch and compares every DDP gradient.

usage: /usr/bin/python3 tests/torch/crosscheck.py REPORT.json      (Debian: apt-get install python3-torch)

For each run in the report, W gloo processes rebuild the model from the report's setup (initial
weights, each rank's inputs), gather with the library's own code path, wrap the model in real
DistributedDataParallel(find_unused_parameters=True), call backward, and compare each parameter's
gradient (or its None) with the report's `reduced`. Modes:
  off    Lightning sync_grads=False: dist.all_gather under torch.no_grad(), stacked
  on     torch.distributed.nn.functional.all_gather (what Lightning sync_grads=True calls)
  local  open_clip gather_features(gather_with_grad=False): gather without grad, own slot put back
  avg    Horovod allgather (not installed here): an autograd Function, backward all_reduce AVG, own slot
Not part of ctest: torch is a large dependency. Exit 1 on any difference.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn
import torch.multiprocessing as mp
import torch.nn.functional as F


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
        return torch.cat(out)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g)
        g /= dist.get_world_size()
        return g.chunk(dist.get_world_size())[dist.get_rank()]


def gather(x, mode):
    W = dist.get_world_size()
    if W == 1:  # no process group in the modelled single-process run: the tensor itself
        return x
    if mode == "on":
        return torch.cat(dnn.all_gather(x))
    if mode == "avg":
        return HorovodAllgather.apply(x)
    with torch.no_grad():
        out = [torch.zeros_like(x) for _ in range(W)]
        dist.all_gather(out, x.contiguous())
    if mode == "local":
        out[dist.get_rank()] = x
    return torch.cat(out)


class Model(torch.nn.Module):
    def __init__(self, run):
        super().__init__()
        setup = {p["name"]: torch.tensor(p["init"], dtype=torch.float64).reshape(p["shape"]) for p in run["setup"]["params"]}
        names = ["fc1", "fc2"] if run["probe"] == "simplenet" else ["img", "txt"]
        for n in names:
            w = setup[n + ".weight"]
            lin = torch.nn.Linear(w.shape[1], w.shape[0]).double()
            with torch.no_grad():
                lin.weight.copy_(w)
                lin.bias.copy_(setup[n + ".bias"])
            setattr(self, n, lin)
        if run["probe"] == "contrastive":
            self.logit_scale = torch.nn.Parameter(setup["logit_scale"].clone())
        self.run = run

    def forward(self, inputs):
        run, mode, rank, W = self.run, self.run["mode"], dist.get_rank(), dist.get_world_size()
        if run["probe"] == "simplenet":
            x = F.relu(self.fc1(inputs["input1"]))
            y = F.relu(self.fc2(inputs["input2"]))
            k = gather(x, mode).view(-1) * gather(y, "on").view(-1)
            return F.mse_loss(k, torch.zeros_like(k))
        I = F.normalize(self.img(inputs["x_img"]), dim=-1)
        T = F.normalize(self.txt(inputs["x_txt"]), dim=-1)
        Ia, Ta, s, B = gather(I, mode), gather(T, mode), self.logit_scale.exp(), I.shape[0]
        if run["local_loss"]:
            labels = torch.arange(B) + rank * B
            return (F.cross_entropy(s * I @ Ta.T, labels) + F.cross_entropy(s * T @ Ia.T, labels)) / 2
        logits, labels = s * Ia @ Ta.T, torch.arange(W * B)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def worker(rank, W, run, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=W)
    model = Model(run)
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    inputs = {t["name"]: torch.tensor(t["data"], dtype=torch.float64).reshape(t["shape"]) for t in run["setup"]["inputs"][rank]["tensors"]}
    ddp(inputs).backward()
    if rank == 0:
        grads = {n: (None if p.grad is None else p.grad.reshape(-1).tolist()) for n, p in model.named_parameters()}
        q.put(grads)
    dist.destroy_process_group()


def main():
    report = json.load(open(sys.argv[1]))
    failures, port = 0, 29500 + os.getpid() % 1000
    for i, run in enumerate(report["runs"]):
        W = run["world"]
        q = mp.get_context("spawn").SimpleQueue()
        mp.spawn(worker, args=(W, run, port + i, q), nprocs=W)
        grads, worst = q.get(), 0.0
        for p in run["params"]:
            g, mine = grads[p["name"]], p["reduced"]
            if (g is None) != (mine is None):
                failures += 1
                print(f"FAIL {run['probe']} {run['mode']} {p['name']}: torch {'None' if g is None else 'a gradient'}, gradcheck-dist {'None' if mine is None else 'a gradient'}")
                continue
            if g is None:
                continue
            a, b = torch.tensor(g, dtype=torch.float64), torch.tensor(mine, dtype=torch.float64)
            err = float((a - b).norm() / max(a.norm(), 1e-300))
            worst = max(worst, err)
            if err > 1e-12:
                failures += 1
                print(f"FAIL {run['probe']} {run['mode']} {p['name']}: relative difference {err:.3g}\n  torch {g}\n  ours  {mine}")
        nones = [p["name"] for p in run["params"] if grads[p["name"]] is None]
        print(f"{run['probe']:12} local_loss={run['local_loss']!s:5} world {W} mode {run['mode']:5}: torch None for {nones or 'none'}; "
              f"worst relative difference {worst:.1e}")
    print(f"crosscheck: {failures} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
