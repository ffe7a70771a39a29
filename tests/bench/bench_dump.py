#!/usr/bin/env python3
"""Figures, not pass/fail: gradcheck_dist.dump_grads against safetensors.torch.save_file and a raw write
of the same bytes, on the same gradients, in one run.

    bench_dump.py [--layers 4] [--width 8192] [--reps 3] [--dir DIR] [--only METHOD]

The model is `layers` x Linear(width, width) in float32 (default 4 x 8192: 1.07 GB of gradients, the
size issue 22 names). Each method runs in a fresh process of this same Python (its peak memory is its
own): it builds the model, fills every .grad, then writes the file `reps` times (each to a new name,
deleted after); wall time is the median. Methods:
  save_file     safetensors.torch.save_file({name: grad}, path), what a user would call by hand
  raw           one open(), f.write() of every gradient's bytes (numpy view, no copy): the floor
  dump_grads    gradcheck_dist.dump_grads(model, path) (its default writer)
  builtin       dump_grads(..., writer="builtin") (no safetensors package)
GB/s is the gradient bytes over the median wall time (page cache: the files need not reach the disk);
extra MiB is the process's peak resident memory less its resident memory just before the first write.
Prints a table; exits 0, or 1 when a method failed (its row says so).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(HERE, "..", "..", "python")
METHODS = ("save_file", "raw", "dump_grads", "builtin")


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def one(method, layers, width, reps, out_dir):
    """runs in the child: {"s": [...], "bytes": n, "extra_mib": m}"""
    sys.path.insert(0, PYDIR)
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, device="meta") for _ in range(layers)])
    model.to_empty(device="cpu")
    for i, p in enumerate(model.parameters()):
        p.data.fill_(0.25)
        p.grad = torch.empty_like(p).fill_(0.5 + i)
    grads = {n: p.grad for n, p in model.named_parameters()}
    nbytes = sum(g.numel() * g.element_size() for g in grads.values())
    if method in ("dump_grads", "builtin"):
        from gradcheck_dist import dump_grads

        def write(path):
            dump_grads(model, path, rank=0, world=1, writer=None if method == "dump_grads" else "builtin")
    elif method == "save_file":
        from safetensors.torch import save_file

        def write(path):
            save_file(grads, path)
    else:
        def write(path):
            with open(path, "wb") as f:
                for g in grads.values():
                    f.write(memoryview(g.numpy()).cast("B"))
    base = rss_mib()
    times = []
    for r in range(reps):
        path = os.path.join(out_dir, f"{method}.{r}.safetensors")
        t = time.perf_counter()
        write(path)
        times.append(time.perf_counter() - t)
        os.remove(path)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"s": times, "bytes": nbytes, "extra_mib": max(0.0, peak - base)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", help="where the files go (default: a temp dir under $TMPDIR)")
    ap.add_argument("--only", choices=METHODS, help=argparse.SUPPRESS)   # the child's mode
    a = ap.parse_args()
    out_dir = a.dir or tempfile.mkdtemp(prefix="gcd-bench-dump.")
    if a.only:
        print(json.dumps(one(a.only, a.layers, a.width, a.reps, out_dir)))
        return 0
    import torch

    try:
        import safetensors
        st = f"safetensors {safetensors.__version__}"
    except ImportError:
        st = "no safetensors package"
    print(f"dump writers: {a.layers} x Linear({a.width}, {a.width}) float32 gradients, {sys.executable} (torch "
          f"{torch.__version__}, {st}), median of {a.reps}, into {out_dir} (page cache), {os.cpu_count()} cores, "
          f"load average {open('/proc/loadavg').read().split()[0]} (1 min)")
    print(f"{'method':12} {'GB':>7} {'median s':>9} {'GB/s':>7} {'x save_file':>12} {'extra MiB':>10}")
    rows, failed = {}, 0
    for m in METHODS:
        p = subprocess.run([sys.executable, __file__, "--only", m, "--layers", str(a.layers), "--width", str(a.width),
                            "--reps", str(a.reps), "--dir", out_dir], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        if p.returncode != 0:
            failed = 1
            print(f"{m:12} failed (exit {p.returncode}): {p.stderr.strip()[-300:]}", flush=True)
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r["median"] = statistics.median(r["s"])
        rows[m] = r
        rel = f"{rows['save_file']['median'] / r['median']:.2f}" if "save_file" in rows else "n/a"
        print(f"{m:12} {r['bytes'] / 1e9:7.3f} {r['median']:9.3f} {r['bytes'] / r['median'] / 1e9:7.2f} {rel:>12} "
              f"{r['extra_mib']:10.0f}", flush=True)
    if "save_file" in rows:
        print("(x save_file: save_file's median time / the method's; issue 22's goal for dump_grads: >= 0.9)")
    if not a.dir:
        subprocess.run(["rm", "-rf", out_dir])
    return failed


if __name__ == "__main__":
    sys.exit(main())
