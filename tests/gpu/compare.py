#!/usr/bin/env python3
"""The GPU check's comparison: the report of a run over NCCL against the report of the same run over
MPI. Both must say result "pass" (exit 0), hold the same runs (probe, mode, loss) and parameters, at
least one gradient, with the same statuses, and every gradient (reduced, reference, each rank's local)
equal to 1e-12 relative. Prints one line per broken assertion and exits 1; 0 with a summary otherwise.
usage: compare.py MPI.json NCCL.json"""
import json
import math
import sys

TOL = 1e-12


def flat(x):
    """the numbers of a nest of values; an elided tensor ({elided, numel, norm, first}) as its norm and
    first values, so that two elided tensors compare by what they keep"""
    if isinstance(x, dict) and x.get("elided") is True:
        yield x["norm"]
        yield from x["first"]
    elif isinstance(x, list):
        for v in x:
            yield from flat(v)
    else:
        yield x


def relative_difference(x, y):
    """||x - y|| / ||x|| over equal nests of numbers, "nan"/"inf" strings and None (a rank without a
    gradient); None: not comparable"""
    x, y = list(flat(x)), list(flat(y))
    if len(x) != len(y):
        return None
    d2 = n2 = 0.0
    for u, v in zip(x, y):
        if u is None or v is None:
            if u is not v:
                return None
            continue
        u, v = float(u), float(v)
        if not (math.isfinite(u) and math.isfinite(v)):
            if repr(u) != repr(v):
                return None   # a NaN or Inf on one side only, or of another kind
            continue
        d2 += (u - v) ** 2
        n2 += u * u
    return math.sqrt(d2) / (math.sqrt(n2) or 1.0)


def compare(a, b):
    """a: the MPI report, b: the NCCL one; returns (problems, gradients compared, worst difference)"""
    problems, n, worst = [], 0, 0.0
    for name, d, backend in (("mpi", a, "mpi"), ("nccl", b, "nccl")):
        env = d.get("environment") or {}
        if env.get("backend") != backend:
            problems.append(f"{name}: backend is {env.get('backend')!r}, expected {backend!r}")
        if d.get("result") != "pass" or d.get("exit_code") != 0:
            problems.append(f"{name}: result {d.get('result')!r}, exit {d.get('exit_code')}, error {d.get('error')}")
    if not (b.get("environment") or {}).get("nccl_version"):
        problems.append("nccl: no nccl_version in the environment")
    ra, rb = a.get("runs") or [], b.get("runs") or []
    if len(ra) != len(rb) or not ra:
        problems.append(f"run counts: mpi {len(ra)}, nccl {len(rb)} (both must be equal and > 0)")
    for x, y in zip(ra, rb):
        key = lambda r: (r.get("probe"), r.get("mode"), r.get("local_loss"), r.get("world"))
        if key(x) != key(y):
            problems.append(f"runs differ: mpi {key(x)}, nccl {key(y)}")
            continue
        where = "%s mode %s%s" % (x["probe"], x["mode"], " (local loss)" if x.get("local_loss") else "")
        px, py = x.get("params") or [], y.get("params") or []
        if [p["name"] for p in px] != [p["name"] for p in py]:
            problems.append(f"{where}: parameters differ")
            continue
        for p, q in zip(px, py):
            if p["status"] != q["status"]:
                problems.append(f"{where} {p['name']}: status mpi {p['status']}, nccl {q['status']}")
            for k in ("reduced", "reference", "local"):
                if (p.get(k) is None) != (q.get(k) is None):
                    problems.append(f"{where} {p['name']} {k}: None on one backend only")
                    continue
                if p.get(k) is None:
                    continue
                d = relative_difference(p[k], q[k])
                if d is None:
                    problems.append(f"{where} {p['name']} {k}: shapes or non-finite values differ")
                    continue
                n += 1
                if d > TOL:
                    problems.append(f"{where} {p['name']} {k}: relative difference {d:.3e} > {TOL:g}")
                worst = max(worst, d)
    if n == 0:
        problems.append("no gradient was compared")
    return problems, n, worst


def main():
    try:
        a, b = (json.load(open(f)) for f in sys.argv[1:3])
    except (OSError, ValueError) as e:
        print(f"cannot read the reports: {e}")
        return 1
    problems, n, worst = compare(a, b)
    for p in problems[:20]:
        print(p)
    if len(problems) > 20:
        print(f"... and {len(problems) - 20} more")
    env = b.get("environment") or {}
    print(f"{len(b.get('runs') or [])} runs, {n} gradients compared, worst relative difference {worst:.2e}; "
          f"nccl {env.get('nccl_version')}, cuda {env.get('cuda_version')}, devices {env.get('devices')}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
