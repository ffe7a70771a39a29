#!/usr/bin/env python3
"""Seed corpus for tests/fuzz_safetensors.c: every fixture test_check_inputs.py writes (the hostile
files and the valid dumps of every case), one file each, plus a few hand-made valid dumps.

    fuzz_seeds.py DIR

The cases run dry: the binary is never called, only the files they write are kept. Files over 64 KiB
(the ~200 MB truncation dump) and anything but regular files are left out.
"""
import hashlib
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_writer as w  # noqa: E402
import test_check_inputs as t  # noqa: E402

MAX_SEED = 64 * 1024
SKIP = ("truncated", "replaced", "fifo")   # big files, FIFOs


def valid_dumps():
    """A few valid dumps beside the cases': every dtype, None params, odd names, empty tensors."""
    x = np.array([0.5, -1.25, 3.0, 1024.0])
    yield "valid_all_dtypes", w.dump_bytes({"f64": x, "f32": x.astype(np.float32), "f16": x.astype(np.float16),
                                            "bf16": w.bf16(x), "i64": np.arange(3, dtype=np.int64),
                                            "u8": np.arange(5, dtype=np.uint8), "none": None}, rank=1, world=2)
    yield "valid_empty_tensor", w.dump_bytes({"e": np.zeros((0, 3), np.float32), "s": np.float32(2.0).reshape(())})
    yield "valid_no_tensors", w.dump_bytes({"a": None, "b": None}, stage="local")
    yield "valid_unicode_names", w.dump_bytes({"blocks.0.attn.\u00e9": x, "\U0001f600": x.astype(np.float16)})
    yield "valid_8d", w.dump_bytes({"t": np.ones([1] * 7 + [2], np.float32)})
    yield "valid_extra_metadata", w.dump_bytes({"a": x}, metadata=dict(w.meta(0, 1, "reduced", ["a"]), **{
        "gradcheck.torch": "2.4.0", "gradcheck.step": "1", "other": "\u00fc"}))
    yield "valid_unpadded", w.file_bytes(*w.build([("a", x)], w.meta(0, 1, "reduced", ["a"])), pad=False)


def case_fixtures():
    """Runs every case of test_check_inputs.py dry and yields (name, bytes) of the files they wrote."""
    t.run = lambda args, timeout=None, cmd="check": (2, "", "gradcheck-dist: check: ")
    t.expect = lambda *a, **k: ("gradcheck-dist: check: ", None)
    t.need = lambda cond, why: None
    with tempfile.TemporaryDirectory(prefix="gcd-seeds-") as tmp:
        t.TMP = tmp
        for fn in t.CASES:
            if any(s in fn.__name__ for s in SKIP):
                continue
            try:
                fn()
            except Exception:   # a dry case stops where it reads a report; its files are written by then
                pass
        for root, _, files in os.walk(tmp):
            for name in sorted(files):
                path = os.path.join(root, name)
                if not os.path.isfile(path) or os.path.islink(path) or os.path.getsize(path) > MAX_SEED:
                    continue
                with open(path, "rb") as f:
                    yield os.path.relpath(path, tmp).replace(os.sep, "_"), f.read()


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: fuzz_seeds.py DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seen = set()
    for name, content in list(case_fixtures()) + list(valid_dumps()):
        digest = hashlib.sha1(content).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        with open(os.path.join(out, f"{name}-{digest[:8]}"), "wb") as f:
            f.write(content)
    print(f"fuzz_seeds: {len(seen)} seeds in {out}")


if __name__ == "__main__":
    main()
