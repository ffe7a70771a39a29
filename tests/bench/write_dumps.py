#!/usr/bin/python3
"""Write gradient dumps in the `gradcheck-dist check` convention, for the throughput benchmark.

    write_dumps.py OUTDIR [--world 4] [--bytes-per-rank 1G] [--dtype F32|BF16] [--stage reduced|local]

OUTDIR/rank{r}.safetensors for r < world, and OUTDIR/ref.safetensors (world 1, rank 0, stage
reduced) holding the gradient that `check --ref` should find `ok`. The tensors are a GPT-like
parameter list (embeddings, per-layer layer norms, attention and MLP weights and biases, a few
hundred tensors) sized so that each rank's data is close to --bytes-per-rank. Values: one block of
standard-normal float32 generated once and reused at rotating offsets; BF16 is the top 16 bits of
that float32. stage reduced: every rank holds the reference values (a clean verdict). stage local:
rank r holds c_r * ref with mean(c_r) = 1, so the DDP mean the tool computes is the reference.
numpy only; the safetensors header is written by hand (u64 LE length, JSON padded with spaces).
"""
import argparse
import json
import os
import struct
import sys
import time

import numpy as np

POOL_ELEMS = 1 << 24  # 16 Mi float32 = 64 MiB of random values, reused
ELEM = {"F32": 4, "BF16": 2}


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().upper().removesuffix("IB").removesuffix("B")
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def gpt_params(n_elems):
    """A GPT-2-like named_parameters() list, [(name, shape)], totalling about n_elems elements."""
    n_layer, ctx, vocab0 = 24, 1024, 50304
    # per layer 12 d^2 + 13 d; plus wte (vocab, d), wpe (ctx, d), ln_f (2 d)
    a, b = 12 * n_layer, 13 * n_layer + vocab0 + ctx + 2
    d = max(16, int((-b + (b * b + 4 * a * n_elems) ** 0.5) / (2 * a)) // 16 * 16)
    per_layer = 12 * d * d + 13 * d
    vocab = max(16, (n_elems - n_layer * per_layer - ctx * d - 2 * d) // d)  # absorbs the rounding
    params = [("transformer.wte.weight", (vocab, d)), ("transformer.wpe.weight", (ctx, d))]
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        params += [
            (p + "ln_1.weight", (d,)), (p + "ln_1.bias", (d,)),
            (p + "attn.c_attn.weight", (3 * d, d)), (p + "attn.c_attn.bias", (3 * d,)),
            (p + "attn.c_proj.weight", (d, d)), (p + "attn.c_proj.bias", (d,)),
            (p + "ln_2.weight", (d,)), (p + "ln_2.bias", (d,)),
            (p + "mlp.c_fc.weight", (4 * d, d)), (p + "mlp.c_fc.bias", (4 * d,)),
            (p + "mlp.c_proj.weight", (d, 4 * d)), (p + "mlp.c_proj.bias", (d,)),
        ]
    params += [("transformer.ln_f.weight", (d,)), ("transformer.ln_f.bias", (d,))]
    return params


def header_bytes(params, dtype, metadata):
    hdr, off = {}, 0
    for name, shape in params:
        n = int(np.prod(shape)) * ELEM[dtype]
        hdr[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hdr["__metadata__"] = metadata
    js = json.dumps(hdr, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js, off


def write_dump(path, params, dtype, pool, metadata, scale=None):
    """pool: the value block in the file's dtype (float32, or uint16 for BF16); scale: multiply by
    this (local stage), rounding BF16 back to its top 16 bits."""
    head, nbytes = header_bytes(params, dtype, metadata)
    n_pool, start = len(pool), 0
    with open(path, "wb", buffering=0) as f:
        f.write(head)
        for _, shape in params:
            n = int(np.prod(shape))
            start = (start + 7919) % n_pool  # a different window of the pool for every tensor
            pos = start
            while n:
                k = min(n, n_pool - pos)
                blk = pool[pos:pos + k]
                if scale is not None:
                    if dtype == "BF16":
                        f32 = (blk.astype(np.uint32) << 16).view(np.float32) * np.float32(scale)
                        blk = (f32.view(np.uint32) >> 16).astype(np.uint16)
                    else:
                        blk = blk * np.float32(scale)
                f.write(memoryview(np.ascontiguousarray(blk)).cast("B"))
                n -= k
                pos = 0
    return len(head) + nbytes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--bytes-per-rank", default="1G", help="e.g. 1G, 256M, 4096 (binary units)")
    ap.add_argument("--dtype", choices=sorted(ELEM), default="F32")
    ap.add_argument("--stage", choices=["reduced", "local"], default="reduced")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.world < 1:
        ap.error("--world must be >= 1")
    t0 = time.perf_counter()
    params = gpt_params(max(1, parse_size(a.bytes_per_rank) // ELEM[a.dtype]))
    rng = np.random.default_rng(a.seed)
    pool = (rng.standard_normal(POOL_ELEMS, dtype=np.float32) * np.float32(1e-3))
    if a.dtype == "BF16":
        pool = pool.view(np.uint16)[1::2].copy()  # little-endian: the odd halves are the top bits
    names = json.dumps([n for n, _ in params])
    os.makedirs(a.outdir, exist_ok=True)
    total = 0
    for r in range(a.world):
        meta = {"gradcheck.format": "1", "gradcheck.rank": str(r), "gradcheck.world": str(a.world),
                "gradcheck.params": names, "gradcheck.stage": a.stage, "gradcheck.step": "0",
                "gradcheck.bench": "tests/bench/write_dumps.py"}
        scale = None
        if a.stage == "local" and a.world > 1:
            scale = 1.0 + 0.5 * (2 * r - (a.world - 1)) / (a.world - 1)  # mean over ranks = 1
        total += write_dump(os.path.join(a.outdir, f"rank{r}.safetensors"), params, a.dtype, pool, meta, scale)
    meta = {"gradcheck.format": "1", "gradcheck.rank": "0", "gradcheck.world": "1",
            "gradcheck.params": names, "gradcheck.stage": "reduced", "gradcheck.step": "0",
            "gradcheck.bench": "tests/bench/write_dumps.py"}
    total += write_dump(os.path.join(a.outdir, "ref.safetensors"), params, a.dtype, pool, meta)
    dt = time.perf_counter() - t0
    print(f"write_dumps: {a.world} ranks + ref, {len(params)} tensors, {a.dtype}, stage {a.stage}, "
          f"{total / 1e9:.3f} GB in {dt:.1f} s ({total / 1e9 / dt:.2f} GB/s) -> {a.outdir}", file=sys.stderr)


if __name__ == "__main__":
    main()
