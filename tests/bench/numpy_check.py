#!/usr/bin/python3
"""The peer for the `gradcheck-dist check` benchmark: numpy doing the same checks over the same files.

    numpy_check.py DUMP... | DIR [--ref REF] [--chunk ELEMS]

Per parameter, across all ranks (float64 accumulation): non-finite count, all-zero, per-rank L2
norm, max |rank_k - rank_0|; g = rank 0's gradient (stage reduced) or the sum over ranks / world
(stage local); with --ref: <g,r>, <r,r>, <g,g>, ||g-r||^2 and the ok / scaled / mismatch verdict.
Files are mapped (np.frombuffer over mmap) and read tensor by tensor, in chunks of --chunk elements
so the float64 temporaries stay in cache. Prints a status count and, last, one machine-readable line:
`numpy_s <wall seconds> numpy_gbs <GB/s over the total bytes of the dump files, --ref included>`.
"""
import argparse
import glob
import json
import mmap
import os
import struct
import sys
import time
from collections import Counter

import numpy as np

NP_DTYPE = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
TOL = {"F64": 1e-9, "F32": 1e-5, "F16": 1e-2, "BF16": 1e-2}


class Dump:
    def __init__(self, path):
        self.path = path
        self.size = os.path.getsize(path)
        with open(path, "rb") as f:
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (n,) = struct.unpack_from("<Q", self.mm, 0)
        hdr = json.loads(self.mm[8:8 + n])
        self.meta = hdr.pop("__metadata__", {})
        self.tensors = hdr
        self.base = 8 + n

    def get(self, name):
        """The tensor as a flat read-only array in its stored dtype, or None if absent."""
        e = self.tensors.get(name)
        if e is None:
            return None
        b, end = e["data_offsets"]
        dt = NP_DTYPE[e["dtype"]]
        return np.frombuffer(self.mm, dtype=dt, count=(end - b) // dt.itemsize, offset=self.base + b)


class Scratch:
    """Preallocated chunk buffers, so the inner loop allocates nothing."""

    def __init__(self, n_ranks, chunk):
        self.x = [np.empty(chunk) for _ in range(n_ranks)]
        self.r = np.empty(chunk)
        self.acc = np.empty(chunk)
        self.tmp = np.empty(chunk)
        self.u32 = np.empty(chunk, dtype=np.uint32)
        self.fin = np.empty(chunk, dtype=bool)


def to_f64(out, x, dtype, sc):
    """out[:len(x)] = x as float64 (BF16: the top 16 bits of a float32)."""
    m = x.size
    if dtype == "BF16":
        np.left_shift(x, np.uint32(16), out=sc.u32[:m], dtype=np.uint32)
        np.copyto(out[:m], sc.u32[:m].view(np.float32))
    else:
        np.copyto(out[:m], x)
    return out[:m]


def check_param(arrs, dtypes, ref, ref_dtype, stage, world, sc, chunk):
    """arrs: per-rank flat arrays (None = absent). Returns a dict of the figures."""
    have = [k for k, a in enumerate(arrs) if a is not None]
    n = arrs[have[0]].size
    nonfinite = [0] * len(arrs)
    norm2 = [0.0] * len(arrs)
    nonzero = [False] * len(arrs)
    maxdiff = 0.0
    gr = rr = gg = dd = 0.0
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        m = e - s
        first = None
        for k in have:
            x = to_f64(sc.x[k], arrs[k][s:e], dtypes[k], sc)
            q = float(np.dot(x, x))
            if not np.isfinite(q):  # NaN/Inf somewhere (or an overflow): count, then zero them
                np.isfinite(x, out=sc.fin[:m])
                nonfinite[k] += m - int(np.count_nonzero(sc.fin[:m]))
                np.copyto(x, 0.0, where=~sc.fin[:m])
                q = float(np.dot(x, x))
            norm2[k] += q
            if not nonzero[k]:
                nonzero[k] = q > 0 or bool(x.any())
            if first is None:
                first = x
                if stage == "local":
                    np.copyto(sc.acc[:m], x)
            else:
                t = np.subtract(x, first, out=sc.tmp[:m])
                np.abs(t, out=t)
                maxdiff = max(maxdiff, float(t.max()))
                if stage == "local":
                    np.add(sc.acc[:m], x, out=sc.acc[:m])
        if ref is None:
            continue
        if stage == "reduced":
            g = first
        else:
            g = np.divide(sc.acc[:m], world, out=sc.acc[:m])
        r = to_f64(sc.r, ref[s:e], ref_dtype, sc)
        gr += float(np.dot(g, r))
        rr += float(np.dot(r, r))
        gg += float(np.dot(g, g))
        t = np.subtract(g, r, out=sc.tmp[:m])
        dd += float(np.dot(t, t))
    return dict(have=have, nonfinite=nonfinite, norm=[v ** 0.5 for v in norm2], nonzero=nonzero,
                maxdiff=maxdiff, gr=gr, rr=rr, gg=gg, dd=dd)


def status(f, n_ranks, stage, has_ref, tol):
    if not f["have"]:
        return "none"
    if len(f["have"]) < n_ranks:
        return "partial"
    if any(f["nonfinite"]):
        return "nonfinite"
    if not any(f["nonzero"]) and (not has_ref or f["rr"] > 0):
        return "zero"
    if stage == "reduced" and f["maxdiff"] > tol * max(f["norm"]):  # a loose bound; 0 on identical ranks
        return "disagree"
    if not has_ref:
        return "present"
    if f["dd"] ** 0.5 <= tol * f["rr"] ** 0.5:
        return "ok"
    if f["gr"] > 0 and f["rr"] > 0:
        c = f["gr"] / f["rr"]
        if max(0.0, f["gg"] - 2 * c * f["gr"] + c * c * f["rr"]) ** 0.5 <= tol * c * f["rr"] ** 0.5:
            return "scaled"
    return "mismatch"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dumps", nargs="+")
    ap.add_argument("--ref")
    ap.add_argument("--chunk", type=int, default=1 << 16)
    a = ap.parse_args()
    t0 = time.perf_counter()
    paths = []
    for p in a.dumps:
        paths += sorted(glob.glob(os.path.join(p, "*.safetensors"))) if os.path.isdir(p) else [p]
    if a.ref:
        paths = [p for p in paths if not os.path.samefile(p, a.ref)]
    dumps = sorted((Dump(p) for p in paths), key=lambda d: int(d.meta.get("gradcheck.rank", 0)))
    ref = Dump(a.ref) if a.ref else None
    params = json.loads(dumps[0].meta["gradcheck.params"])
    stage = dumps[0].meta.get("gradcheck.stage", "reduced")
    world = int(dumps[0].meta.get("gradcheck.world", len(dumps)))
    dtypes_present = {e["dtype"] for d in dumps + ([ref] if ref else []) for e in d.tensors.values()}
    tol = max(TOL[t] for t in dtypes_present)
    counts = Counter()
    sc = Scratch(len(dumps), a.chunk)
    for name in params:
        arrs = [d.get(name) for d in dumps]
        dts = [d.tensors[name]["dtype"] if name in d.tensors else None for d in dumps]
        if all(x is None for x in arrs):
            counts["none"] += 1
            continue
        r = ref.get(name) if ref else None
        f = check_param(arrs, dts, r, ref.tensors[name]["dtype"] if r is not None else None,
                        stage, world, sc, a.chunk)
        counts[status(f, len(dumps), stage, ref is not None, tol)] += 1
    wall = time.perf_counter() - t0
    total = sum(d.size for d in dumps) + (ref.size if ref else 0)
    print(f"numpy_check: {len(dumps)} dumps, stage {stage}, {len(params)} params, tol {tol:g}: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
    print(f"numpy_s {wall:.3f} numpy_gbs {total / 1e9 / wall:.3f} bytes {total}")
    clean = set(counts) <= {"ok", "present"}
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
