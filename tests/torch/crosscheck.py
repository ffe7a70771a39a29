"""Replays gradcheck-dist reports in real PyTorch and compares every DDP gradient.

usage: /usr/bin/python3 tests/torch/crosscheck.py REPORT.json...   (Debian: apt-get install python3-torch)

For each report, W gloo processes (W = the report's world; one process group for all its runs) rebuild
each run's model from the report's setup (initial weights, each rank's inputs; in the run for schema /1,
once per probe in "setups" for /2; reports of large tensors written with --full), gather as the mode
says, wrap the model in real DistributedDataParallel(find_unused_parameters=True), call backward, and
compare each parameter's gradient (or its None) with the report's `reduced` (with --summary-only
reports, with its `norm`). What is real and what is re-implemented:
  off    dist.all_gather under torch.no_grad(), stacked: what Lightning's all_gather(sync_grads=False)
         runs, re-implemented here (also in a one-rank process group, as Lightning does)
  on     torch.distributed.nn.functional.all_gather itself (what Lightning sync_grads=True calls)
  local  dist.all_gather without grad, own slot put back: open_clip's / torchmetrics' code path,
         re-implemented here
  avg    an autograd Function whose backward all_reduces and averages: Horovod's allgather,
         re-implemented here (Horovod is not installed)
Bounded: every wait has a deadline (GCD_CROSSCHECK_TIMEOUT, default 120 s); process groups are
destroyed explicitly and workers leave with os._exit (torch 1.13's gloo can hang in its destructor).
Ends with "N passed, M failed"; exit 1 on any difference, 2 when it cannot run.
"""
import json
import os
import queue
import sys
import time

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


def run_setup(report, run):
    """the run's setup: in the run (schema /1) or the top-level "setups" entry of its probe (/2)"""
    if "setup" in run:
        return run["setup"]
    return next(s for s in report["setups"] if s["probe"] == run["probe"])


def elided(v):
    return isinstance(v, dict) and v.get("elided") is True


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


def worker(rank, W, runs, port, q):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=W, timeout=__import__("datetime").timedelta(seconds=60))
        for i, run in enumerate(runs):
            model = Model(run)
            ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
            inputs = {t["name"]: torch.tensor(t["data"], dtype=torch.float64).reshape(t["shape"])
                      for t in run["setup"]["inputs"][rank]["tensors"]}
            ddp(inputs).backward()
            if rank == 0:
                q.put((i, {n: (None if p.grad is None else p.grad.reshape(-1).tolist()) for n, p in model.named_parameters()}))
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # said, then the parent fails
        q.put((-1, f"rank {rank}: {type(e).__name__}: {e}"))
        code = 1
    else:
        code = 0
    q.close()
    q.join_thread()  # what was put is sent before the exit
    sys.stdout.flush()
    os._exit(code)  # past gloo's destructor, which can hang in torch 1.13


def compare(run, grads):
    """(failures, lines) for one run"""
    failures, worst, lines = 0, 0.0, []
    for p in run["params"]:
        g = grads[p["name"]]
        mine_none = p["status"] == "none"
        if (g is None) != mine_none:
            failures += 1
            lines.append(f"FAIL {run['probe']} {run['mode']} {p['name']}: torch {'None' if g is None else 'a gradient'}, "
                         f"gradcheck-dist {'None' if mine_none else 'a gradient'}")
            continue
        if g is None:
            continue
        a = torch.tensor(g, dtype=torch.float64)
        if p.get("reduced") is not None and not elided(p["reduced"]):
            b = torch.tensor(p["reduced"], dtype=torch.float64)
            err = float((a - b).norm() / max(float(a.norm()), 1e-300))
        else:  # --summary-only, or an elided tensor: the norm is what the report keeps
            err = abs(float(a.norm()) - p["norm"]) / max(float(a.norm()), 1e-300)
        worst = max(worst, err)
        if err > 1e-12:
            failures += 1
            lines.append(f"FAIL {run['probe']} {run['mode']} {p['name']}: relative difference {err:.3g}")
    nones = [p["name"] for p in run["params"] if grads[p["name"]] is None]
    lines.append(f"{run['probe']:12} local_loss={run['local_loss']!s:5} world {run['world']} mode {run['mode']:5}: "
                 f"torch None for {nones or 'none'}; worst relative difference {worst:.1e}")
    return failures, lines


def crosscheck(path, port, timeout):
    report = json.load(open(path))
    # each run with its setup in it (schema /2 keeps one per probe), as the workers read it
    runs = [dict(r, setup=run_setup(report, r)) for r in report["runs"] if r["probe"] in ("simplenet", "contrastive")]
    if not runs:
        return 0, 0
    if any(p["init"] is None for r in runs for p in r["setup"]["params"]):
        print(f"FAIL {path}: a --summary-only report has no initial weights or inputs to replay; write one without --summary-only")
        return 0, len(runs)
    values = [p["init"] for r in runs for p in r["setup"]["params"]] + [t["data"] for r in runs for i in r["setup"]["inputs"] for t in i["tensors"]]
    if any(elided(v) for v in values):
        print(f"FAIL {path}: the report elides initial weights or inputs (over 4096 elements); write it with --full to replay it")
        return 0, len(runs)
    W = runs[0]["world"]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, W, runs, port, q), daemon=True) for r in range(W)]
    for pr in procs:
        pr.start()
    got, deadline, passed, failed = {}, time.time() + timeout, 0, 0
    try:
        while len(got) < len(runs):
            i, grads = q.get(timeout=max(0.1, deadline - time.time()))
            if i < 0:
                raise RuntimeError(grads)
            got[i] = grads
    except queue.Empty:
        print(f"FAIL {path}: no answer from the workers within {timeout} s ({len(got)} of {len(runs)} runs)")
        failed += len(runs) - len(got)
    except RuntimeError as e:
        print(f"FAIL {path}: {e}")
        failed += len(runs) - len(got)
    for pr in procs:
        pr.join(timeout=max(1.0, deadline - time.time()))
        if pr.is_alive():
            pr.kill()
    for i, grads in sorted(got.items()):
        f, lines = compare(runs[i], grads)
        print("\n".join(lines))
        passed, failed = passed + (f == 0), failed + (f > 0)
    return passed, failed


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    timeout = float(os.environ.get("GCD_CROSSCHECK_TIMEOUT", "120"))
    passed = failed = 0
    for k, path in enumerate(sys.argv[1:]):
        p, f = crosscheck(path, 29500 + (os.getpid() + 7 * k) % 20000, timeout)
        passed, failed = passed + p, failed + f
    print(f"crosscheck: {passed} passed, {failed} failed")
    sys.exit(1 if failed or not passed else 0)


if __name__ == "__main__":
    main()
