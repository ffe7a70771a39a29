#!/usr/bin/python3
"""The PyTorch peer of `gradcheck-dist run --probe contrastive`: the same work in float64 on gloo.

    bench_torch.py [--world 4] [--batch B] [--dim-img D] [--dim-txt D] [--dim-emb E] [--modes on|all]
    bench_torch.py --check REPORT.json      the report's contrastive runs (its world), replayed and compared

W worker processes (started here, one Python each, as torchrun would; a file store, no port), each:
per mode, encode its own batch (two Linear + normalize), gather the features with the mode, the CLIP
loss over the gathered batch (logit_scale), backward, then DDP's mean of the gradients (one flattened
all_reduce / W, as one DDP bucket; a None gradient stays None). Then, once, on rank 0: the
single-process reference over the whole batch (every rank's inputs, rebuilt from their seeds; no
collectives), as gradcheck-dist computes it once per probe. Modes:
  off    dist.all_gather under no_grad (Lightning sync_grads=False)
  on     torch.distributed.nn.functional.all_gather (Lightning sync_grads=True)
  local  all_gather under no_grad, own slot put back (open_clip gather_with_grad=False, torchmetrics)
  avg    a backward that all_reduces and averages the own slot (Horovod allgather)
Threads per worker: OMP_NUM_THREADS (and OPENBLAS_NUM_THREADS) if set, else max(1, cores // W), the
policy gradcheck-dist's BLAS follows. Bounded: the whole job has --timeout seconds (default 600);
workers destroy their process group and leave with os._exit (torch 1.13's gloo can hang at exit).

Prints `torch_compute_s X` (rank 0: from the first encode to the last gradient, after the process
group is up). With --check: each run's DDP mean against its `reduced`, the reference against
`reference`, relative difference <= 1e-12, None exactly where gradcheck-dist has none; exit 1 on any
difference, 2 on a report it cannot replay (summary-only or elided tensors: write a small one).
Exit 3 when the workers fail or time out.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODES = ("off", "on", "local", "avg")
NAMES = ("img.weight", "img.bias", "txt.weight", "txt.bias", "logit_scale")


# ---- the worker: torch is imported here only, so the launcher stays light
def worker(a):
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn
    import torch.nn.functional as F

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
    from crosscheck import gather   # the four modes as the cross-check reproduces them (Horovod's backward averages)

    def clip_loss(I, T, scale):   # I, T (N,E): mean of the image and text cross-entropies
        logits, labels = scale * I @ T.T, torch.arange(I.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2

    def encode(p, x):   # x: x_img (B,Di), x_txt (B,Dt) -> I, T (B,E)
        return (F.normalize(F.linear(x[0], p[0], p[1]), dim=-1), F.normalize(F.linear(x[1], p[2], p[3]), dim=-1))

    def ddp_step(p, x, mode):   # this rank's gradients after DDP's mean; None where no rank got one
        for t in p:
            t.grad = None
        I, T = encode(p, x)
        clip_loss(gather(I, mode), gather(T, mode), p[4].exp()).backward()
        have = [t.grad for t in p if t.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in have])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        out, k = [], 0
        for t in p:
            if t.grad is None:
                out.append(None)
            else:
                out.append(flat[k:k + t.numel()].view_as(t))
                k += t.numel()
        return out

    def reference(p, xs):   # one process, the whole batch: xs[r] is rank r's inputs
        q = [t.detach().clone().requires_grad_() for t in p]
        I, T = encode(q, (torch.cat([x[0] for x in xs]), torch.cat([x[1] for x in xs])))
        clip_loss(I, T, q[4].exp()).backward()
        return [t.grad for t in q]

    rank, W = a.rank, a.world
    torch.set_num_threads(a.threads)
    code = 0
    try:
        if a.check:
            runs, params, xs = replay(a.check, W, torch)
            modes = [r["mode"] for r in runs]
        else:
            B, Di, Dt, E = a.batch, a.dim_img, a.dim_txt, a.dim_emb
            g = torch.Generator().manual_seed(a.seed)
            params = [(torch.rand(*s, generator=g, dtype=torch.float64) * 2 - 1) / d ** 0.5
                      for s, d in (((E, Di), Di), ((E,), Di), ((E, Dt), Dt), ((E,), Dt))]
            params.append(torch.tensor(1 / 0.07, dtype=torch.float64).log())

            def rank_inputs(r):   # x_img (B,Di), x_txt (B,Dt) of rank r, from its own seed
                g = torch.Generator().manual_seed(a.seed * 1000003 + 1 + r)
                return (torch.randn(B, Di, generator=g, dtype=torch.float64),
                        torch.randn(B, Dt, generator=g, dtype=torch.float64))
            # rank 0 rebuilds every rank's inputs for the reference, as gradcheck-dist's rank 0 does
            xs = [rank_inputs(r) if rank in (0, r) else None for r in range(W)]
            modes = list(MODES) if a.modes == "all" else ["on"]
        p = [t.requires_grad_() for t in params]
        dist.init_process_group("gloo", init_method="file://" + a.store, rank=rank, world_size=W,
                                timeout=__import__("datetime").timedelta(seconds=a.timeout))
        dist.barrier()
        t0 = time.perf_counter()
        reduced = [ddp_step(p, xs[rank], m) for m in modes]
        ref = reference(p, xs) if rank == 0 else None
        dist.barrier()
        t1 = time.perf_counter()
        dist.destroy_process_group()
        if rank == 0:
            print(f"torch_compute_s {t1 - t0:.4f}", flush=True)
            if a.check:
                code = compare(runs, reduced, ref, torch)
    except Exception as e:
        print(f"bench_torch: rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        code = 3
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit skips finalizers: torch.distributed.nn's import made a temporary directory (its jit
    # instantiator's), removed here or it outlives the worker
    tmp = getattr(sys.modules.get("torch.distributed.nn.jit.instantiator"), "_TEMP_DIR", None)
    if tmp is not None:
        tmp.cleanup()
    os._exit(code)   # past gloo's destructor, which can hang in torch 1.13


# ---- --check: the report's setup in, its gradients to compare against
def setup_of(doc, run):
    """the run's setup: its own (today's reports), else the top-level entry of its probe"""
    if run.get("setup") is not None:
        return run["setup"]
    for s in doc.get("setups") or []:
        if s.get("probe") == run["probe"]:
            return s
    print(f"bench_torch: the report has no setup for probe {run['probe']}", file=sys.stderr)
    os._exit(2)


def values(v, what):
    if not isinstance(v, list):
        print(f"bench_torch: {what}: no values in the report ({'summary-only' if v is None else 'elided'}); "
              "write a small report without --summary-only", file=sys.stderr)
        os._exit(2)
    return v


def replay(path, W, torch):
    """(runs, initial params, every rank's inputs) of the report's contrastive runs at world W"""
    doc = json.load(open(path))
    runs = [r for r in doc["runs"] if r["probe"] == "contrastive" and not r["local_loss"] and r["world"] == W]
    if not runs:
        print(f"bench_torch: {path}: no contrastive run (without --local-loss) at world {W}", file=sys.stderr)
        os._exit(2)
    setup = setup_of(doc, runs[0])

    def tensor(t, field, what):
        return torch.tensor(values(t[field], what), dtype=torch.float64).reshape(t["shape"])

    init = {q["name"]: tensor(q, "init", f"setup {q['name']}") for q in setup["params"]}
    params = [init[n] for n in NAMES]
    xs = []
    for inp in sorted(setup["inputs"], key=lambda i: i["rank"]):
        t = {x["name"]: tensor(x, "data", f"rank {inp['rank']} {x['name']}") for x in inp["tensors"]}
        xs.append((t["x_img"], t["x_txt"]))
    return runs, params, xs


def compare(runs, reduced, ref, torch):
    """1 on any difference from the report, else 0; one line per run"""
    bad = 0
    for run, grads in [(r, g) for r, g in zip(runs, reduced)] + [(None, ref)]:
        worst, lines = 0.0, []
        for p in (run or runs[0])["params"]:
            g = grads[NAMES.index(p["name"])]
            want = p["reference"] if run is None else p["reduced"]
            label = "reference" if run is None else f"mode {run['mode']}"
            none = want is None if run is None else p["status"] == "none"
            if none or g is None:
                if none != (g is None):
                    lines.append(f"FAIL {label} {p['name']}: torch {'None' if g is None else 'a gradient'}, "
                                 f"gradcheck-dist {'none' if none else 'a gradient'}")
                continue
            b = torch.tensor(values(want, f"{label} {p['name']}"), dtype=torch.float64).reshape(g.shape)
            err = float((g - b).norm() / max(float(b.norm()), 1e-300))
            worst = max(worst, err)
            if err > 1e-12:
                lines.append(f"FAIL {label} {p['name']}: relative difference {err:.3g}; "
                             f"torch {g.reshape(-1)[:4].tolist()}, gradcheck-dist {b.reshape(-1)[:4].tolist()}")
        bad += len(lines)
        print(f"{'reference' if run is None else 'mode ' + run['mode']:10} worst relative difference {worst:.1e}"
              + ("" if lines else ", ok"))
        print("\n".join(lines)) if lines else None
    print(f"bench_torch --check: {'FAIL' if bad else 'pass'} ({bad} differences)")
    return 1 if bad else 0


# ---- the launcher: W workers, a file store, one deadline
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dim-img", type=int, default=512)
    ap.add_argument("--dim-txt", type=int, default=256)
    ap.add_argument("--dim-emb", type=int, default=128)
    ap.add_argument("--modes", choices=("on", "all"), default="on")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--check", metavar="REPORT.json")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank is not None:
        worker(a)
    if a.check:   # the world is the report's
        try:
            runs = [r for r in json.load(open(a.check))["runs"] if r["probe"] == "contrastive" and not r["local_loss"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"bench_torch: --check {a.check}: cannot read its runs: {e}")
        if not runs:
            sys.exit(f"bench_torch: --check {a.check}: no contrastive run without --local-loss")
        a.world = runs[0]["world"]
        setup = setup_of(json.load(open(a.check)), runs[0])   # one message here, not one per worker
        for t in setup["params"] + [t for i in setup["inputs"] for t in i["tensors"]]:
            values(t.get("init", t.get("data")), f"setup {t['name']}")
    if a.world < 1 or min(a.batch, a.dim_img, a.dim_txt, a.dim_emb) < 1:
        sys.exit("bench_torch: --world, --batch and the dims must be >= 1")
    threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // a.world))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    with tempfile.TemporaryDirectory(prefix="bench_torch.") as tmp:
        argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--store", os.path.join(tmp, "store"),
                "--threads", str(threads), "--world", str(a.world)]
        procs = [subprocess.Popen(argv + ["--rank", str(r)], env=env) for r in range(a.world)]
        deadline = time.monotonic() + a.timeout
        while time.monotonic() < deadline:   # until all are done, one failed (the others would wait), or time's up
            codes = [pr.poll() for pr in procs]
            if None not in codes or any(codes):
                break
            time.sleep(0.01)
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
            pr.wait()
    if None in codes and not any(codes):
        print(f"bench_torch: the workers did not finish within {a.timeout:g} s (killed)", file=sys.stderr)
        sys.exit(3)
    if codes[0] == 1 or 2 in codes:   # a difference (rank 0 compares), a report it cannot replay
        sys.exit(1 if codes[0] == 1 else 2)
    if any(codes):
        print(f"bench_torch: worker exit codes {codes}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
