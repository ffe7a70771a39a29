"""Sketch dumps of CUDA gradients (issue 35, G2 item 3), one process on one GPU: the sketch is computed where the
gradient lives and only its row comes to the CPU. Asserts: two sketch dumps of the same CUDA gradients agree (exit
0); a x0.25 step is `scaled` 0.25 against them; a CPU sketch of the same gradients agrees (exit 0: the projections
are hashed, the same on every device). Written without a GPU to run it (it runs on the CPU
with `--device cpu`, where the CPU-vs-GPU case is left out).

usage: python3 tests/gpu/sketch_gpu.py GRADCHECK_DIST [--device cuda|cpu]
Prints PASS/FAIL lines; exits non-zero when any failed.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python"))
from gradcheck_dist.dump import dump_grads  # noqa: E402

GCD = os.path.abspath(sys.argv[1])
DEV = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
failed = 0


def result(ok, what, got=""):
    global failed
    print(f"{'PASS' if ok else 'FAIL'}: {what}" + (f" -- {got}" if got else ""), flush=True)
    failed += not ok


def check(d, a, b):
    js = os.path.join(d, "r.json")
    p = subprocess.run([GCD, "check", a, "--ref", b, "--json", js], capture_output=True, text=True, timeout=300)
    rep = json.load(open(js)) if p.returncode in (0, 1) else None
    return p.returncode, rep, p.stdout + p.stderr


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Tanh(), torch.nn.Linear(4096, 512)).to(DEV)
    model(torch.randn(64, 4096, device=DEV)).pow(2).mean().backward()
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        a = dump_grads(model, os.path.join(d, "a.safetensors"), sketch=16)
        took = time.perf_counter() - t
        b = dump_grads(model, os.path.join(d, "b.safetensors"), sketch=16)
        code, rep, out = check(d, a, b)
        result(code == 0, f"two sketch dumps of the same {DEV} gradients agree (exit 0)",
               f"exit {code}, dump {took:.3f} s, {os.path.getsize(a)} bytes, {out[-300:] if code else ''}")
        for p in model.parameters():
            p.grad.mul_(0.25)
        c = dump_grads(model, os.path.join(d, "c.safetensors"), sketch=16)
        code, rep, out = check(d, c, b)
        scales = [p["scale"] for p in rep["runs"][0]["params"]] if rep else []
        result(code == 1 and rep and {p["status"] for p in rep["runs"][0]["params"]} == {"scaled"} and
               all(abs(s - 0.25) < 1e-6 for s in scales), "a x0.25 step is scaled 0.25", f"exit {code}, scales {scales}")
        if DEV != "cpu":
            for p in model.parameters():
                p.grad.mul_(4)
            cpu = model.to("cpu")
            e = dump_grads(cpu, os.path.join(d, "e.safetensors"), sketch=16)
            code, rep, out = check(d, e, b)
            result(code == 0, "a CPU sketch of the same gradients agrees (device-independent projections)", f"exit {code}")
    print(f"{'all passed' if not failed else f'{failed} failed'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
