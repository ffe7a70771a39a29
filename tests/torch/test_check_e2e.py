"""`gradcheck-dist check` end to end on gradients from real torch.distributed (gloo, 4 CPU processes).

usage: /usr/bin/python3 tests/torch/test_check_e2e.py [GRADCHECK_DIST]   (or env GRADCHECK_DIST)

A small CLIP-like model (image Linear, text Linear, logit_scale, and a `head` Linear that forward never
uses) in float32 under DistributedDataParallel(find_unused_parameters=True), one step. Every rank
computes the contrastive loss over the *gathered* global batch (W*B pairs), so each rank's loss is the
global loss and the DDP mean of the rank gradients is the single-process gradient of that loss on the
whole batch, which the reference (one process, no process group, same seed) dumps. Scenarios:
  a  gather with grad (torch.distributed.nn.functional.all_gather)  --ignore 'head.*': ok, exit 0
  a-local  a's gradients before the all-reduce (LocalGradCapture); the tool's DDP mean: ok, exit 0
  b  gather under no_grad (Lightning sync_grads=False): encoders none, logit_scale ok, exit 1
  c  b with the own slot put back (open_clip / torchmetrics): encoders scaled 1/world, exit 1
  d  a with a NaN put into rank 1's img.weight gradient after backward: nonfinite, exit 1
  e  a with rank 2's txt.bias gradient changed after the all-reduce: disagree, exit 1
  f  a without --ignore: the unused head is none on every rank and in the reference: a note, exit 0
  g  a dumped in bfloat16: ok at the bf16 tolerance, exit 0
Every dump is written twice, by safetensors and by the built-in writer (GRADCHECK_DIST_NO_SAFETENSORS=1),
read back and compared with the gradients in Python, and every scenario's numbers are checked in Python
before the binary's verdict is. Prints one line per check and `N passed, M failed`; exits 1 on any
failure, including a missing torch, safetensors or binary.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
from spawned import leave  # noqa: E402  (tests/torch, this script's directory)
W, B, DI, DT, E = 4, 2, 6, 5, 4
SCENARIOS = {"a": "grad", "b": "nograd", "c": "own", "d": "grad", "e": "grad"}
WRITERS = ("safetensors", "builtin")
TIMEOUT_S = 240
passed = failed = 0


def check(ok, name, detail=""):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + detail}", flush=True)
    return ok


def finish():
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed or not passed else 0)


try:
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn
    import torch.multiprocessing as mp
    import torch.nn.functional as F

    import gradcheck_dist
    from gradcheck_dist import LocalGradCapture, dump_grads, read_dump
except ImportError as e:  # never a silent skip
    check(False, "import torch and gradcheck_dist", f"{e} (Debian: apt-get install python3-torch)")
    finish()


# ---- the model and the objective


def gather(x, mode):
    if not dist.is_initialized():  # the single-process reference: the batch is already global
        return x
    if mode == "grad":
        return torch.cat(dnn.all_gather(x))
    with torch.no_grad():  # Lightning's all_gather(sync_grads=False)
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
    if mode == "own":  # open_clip gather_with_grad=False / torchmetrics: the own slot put back
        out[dist.get_rank()] = x
    return torch.cat(out)


class Clip(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.img, self.txt = torch.nn.Linear(DI, E), torch.nn.Linear(DT, E)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.head = torch.nn.Linear(E, 2)  # never used in forward

    def forward(self, x_img, x_txt, mode):
        I, T = F.normalize(self.img(x_img), dim=-1), F.normalize(self.txt(x_txt), dim=-1)
        Ia, Ta = gather(I, mode), gather(T, mode)
        logits, labels = self.logit_scale.exp() * Ia @ Ta.T, torch.arange(Ia.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def make_model():
    torch.manual_seed(0)
    return Clip()


def global_batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(W * B, DI, generator=g), torch.randn(W * B, DT, generator=g)


def dump_both(model_or_cap, dirpath, rank, **kw):
    """Writes rank{rank}.safetensors under dirpath/<writer>/ with each writer, through the env switch."""
    paths = []
    for w in WRITERS:
        if w == "builtin":
            os.environ["GRADCHECK_DIST_NO_SAFETENSORS"] = "1"
        try:
            path = os.path.join(dirpath, w, f"rank{rank}.safetensors")
            if isinstance(model_or_cap, LocalGradCapture):
                paths.append(model_or_cap.dump(path, **kw))
            else:
                paths.append(dump_grads(model_or_cap, path, **kw))
        finally:
            os.environ.pop("GRADCHECK_DIST_NO_SAFETENSORS", None)
    return paths


def same(a, b):
    """Equal in dtype, shape and value, NaN equal to NaN."""
    return a.dtype == b.dtype and a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def verify_dump(path, grads, dtype=None):
    """The file holds exactly `grads` ({name: tensor|None}), read by our reader and by safetensors."""
    from safetensors.torch import load_file

    mine, meta = read_dump(path)
    theirs = load_file(path)
    present = {n: g for n, g in grads.items() if g is not None}
    assert set(mine) == set(present) == set(theirs), (path, sorted(mine), sorted(present))
    for n, g in present.items():
        want = g.detach().to(dtype) if dtype is not None else g.detach()
        assert same(mine[n], want) and same(theirs[n], want), (path, n)
    assert json.loads(meta["gradcheck.params"]) == list(grads), (path, meta)
    return meta


# ---- the DDP run: every scenario in one process group


def worker(rank, out, initfile):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="file://" + initfile, rank=rank, world_size=W)
    try:
        x_img, x_txt = (t.chunk(W)[rank] for t in global_batch())
        for name, mode in SCENARIOS.items():
            model = make_model()
            ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
            cap = LocalGradCapture(ddp)
            ddp(x_img, x_txt, mode).backward()
            if name == "d" and rank == 1:
                model.img.weight.grad[0, 0] = float("nan")
            if name == "e" and rank == 2:
                model.txt.bias.grad += 0.01
            grads = {n: p.grad for n, p in model.named_parameters()}
            for p in dump_both(ddp, os.path.join(out, name), rank):
                meta = verify_dump(p, grads)
                assert (meta["gradcheck.rank"], meta["gradcheck.world"], meta["gradcheck.stage"]) == (str(rank), str(W), "reduced"), meta
            if name == "a":
                for p in dump_both(cap, os.path.join(out, "a-local"), rank):
                    assert verify_dump(p, {n: cap.grads.get(n) for n in cap.params})["gradcheck.stage"] == "local"
                for p in dump_both(ddp, os.path.join(out, "g"), rank, dtype=torch.bfloat16):
                    verify_dump(p, grads, torch.bfloat16)
            dist.barrier()
    finally:
        dist.destroy_process_group()
    leave()   # tests/torch/spawned.py: past interpreter exit


def run_ddp(out):
    ctx = mp.get_context("spawn")
    initfile = os.path.join(out, "pg-init")
    procs = [ctx.Process(target=worker, args=(r, out, initfile)) for r in range(W)]
    for p in procs:
        p.start()
    from gradcheck_dist.harness import _join_all   # bounded: the ranks still running at the deadline are killed
    try:
        codes, why = _join_all(procs, TIMEOUT_S, "DDP run"), None
    except RuntimeError as e:
        codes, why = None, str(e)
    return check(codes == [0] * W, f"DDP run: {W} gloo ranks, {len(SCENARIOS)} scenarios, dumps read back", why or f"exit codes {codes}")


def reference(out):
    model = make_model()
    model(*global_batch(), "grad").backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    paths = dump_both(model, os.path.join(out, "ref"), 0)
    for p in paths:
        verify_dump(p, grads)
    return {w: p for w, p in zip(WRITERS, paths)}


# ---- the numbers, checked in Python


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def python_checks(out, ref):
    r, _ = read_dump(ref["safetensors"])

    def load(s, writer="safetensors"):
        return [read_dump(os.path.join(out, s, writer, f"rank{k}.safetensors"))[0] for k in range(W)]

    dumps = {s: load(s) for s in ("a", "a-local", "b", "c", "d", "e", "g")}
    enc, other = ["img.weight", "img.bias", "txt.weight", "txt.bias"], ["logit_scale"]
    check(all(same(load(s, "builtin")[k][n], t) for s, ds in dumps.items() for k, d in enumerate(ds) for n, t in d.items()),
          "python: both writers hold the same numbers")
    check("head.weight" not in r and all("head.weight" not in d for ds in dumps.values() for d in ds),
          "python: the unused head is absent (None) everywhere")
    a = dumps["a"][0]
    err = max(rel(a[n], r[n]) for n in enc + other)
    check(err < 1e-5, f"python a: DDP gradient = reference (max rel err {err:.1e})", f"{err}")
    check(all(torch.equal(dumps["a"][k][n], a[n]) for k in range(W) for n in a), "python a: ranks agree bit for bit")
    mean = {n: sum(d[n] for d in dumps["a-local"] if n in d) / W for n in enc + other}
    err = max(rel(mean[n], r[n]) for n in mean)
    check(err < 1e-5, f"python a-local: mean of the local gradients = reference (max rel err {err:.1e})", f"{err}")
    b = dumps["b"][0]
    check(sorted(b) == other and rel(b["logit_scale"], r["logit_scale"]) < 1e-5,
          "python b: only logit_scale has a gradient, and it is right", str(sorted(b)))
    c = dumps["c"][0]
    err = max(rel(c[n], r[n] / W) for n in enc)
    check(err < 1e-5 and rel(c["logit_scale"], r["logit_scale"]) < 1e-5,
          f"python c: encoders = reference / {W} (max rel err {err:.1e})", f"{err}")
    d = [x["img.weight"] for x in dumps["d"]]
    check(math.isnan(d[1][0, 0]) and all(torch.isfinite(d[k]).all() for k in (0, 2, 3)), "python d: NaN on rank 1 only")
    e = [x["txt.bias"] for x in dumps["e"]]
    check(all(torch.equal(e[k], a["txt.bias"]) for k in (0, 1, 3)) and float((e[2] - a["txt.bias"]).abs().max()) > 5e-3,
          "python e: rank 2's txt.bias differs")
    err = max(rel(dumps["g"][0][n], r[n]) for n in enc + other)
    check(dumps["g"][0]["img.weight"].dtype == torch.bfloat16 and err < 1e-2,
          f"python g: bf16 gradient within 1e-2 of the reference ({err:.1e})", f"{err}")


# ---- the binary


def binary_checks(gcd, out, ref, work):
    p = subprocess.run([gcd, "check", "--snippet"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 0 and p.stdout == gradcheck_dist.snippet(), "check --snippet prints python/gradcheck_dist/snippet.txt",
          f"exit {p.returncode}; differs from snippet.txt:\n{p.stdout}")
    ign = ["--ignore", "head.*"]
    enc = ["img.weight", "img.bias", "txt.weight", "txt.bias"]
    ok5 = {n: "ok" for n in enc + ["logit_scale"]}
    cases = [  # (scenario, dump dir, extra args, exit code, {param: status}, {param: scale})
        ("a", "a", ign, 0, ok5, {}),
        ("a-local", "a-local", ign, 0, ok5, {}),
        ("b", "b", ign, 1, dict({n: "none" for n in enc}, logit_scale="ok"), {}),
        ("c", "c", ign, 1, dict({n: "scaled" for n in enc}, logit_scale="ok"), {n: 1 / W for n in enc}),
        ("d", "d", ign, 1, dict(ok5, **{"img.weight": "nonfinite"}), {}),
        ("e", "e", ign, 1, dict(ok5, **{"txt.bias": "disagree"}), {}),
        ("f", "a", [], 0, dict(ok5, **{"head.weight": "none", "head.bias": "none"}), {}),
        ("g", "g", ign, 0, ok5, {}),
    ]
    for w in WRITERS:
        for name, d, extra, code, statuses, scales in cases:
            label = f"check {name} ({w})"
            js = os.path.join(work, f"{name}-{w}.json")
            cmd = [gcd, "check", os.path.join(out, d, w), "--ref", ref[w], "--json", js] + extra
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                check(False, label, "gradcheck-dist check ran past 60 s: " + " ".join(cmd))
                continue
            try:
                rep = json.load(open(js))
                run = rep["runs"][0]
                got = {q["name"]: q["status"] for q in run["params"]}
                scale = {q["name"]: q.get("scale") for q in run["params"]}
            except Exception as e:
                check(False, label, f"exit {p.returncode}, no readable report ({e}): {p.stderr[-2000:]}")
                continue
            bad = [f"{n}: {got.get(n)} != {s}" for n, s in statuses.items() if got.get(n) != s]
            bad += [f"{n}: scale {scale.get(n)} != {s}" for n, s in scales.items()
                    if not isinstance(scale.get(n), (int, float)) or abs(scale[n] - s) > 1e-4 * s]
            if p.returncode != code or rep.get("exit_code") != code:
                bad.insert(0, f"exit {p.returncode} (report {rep.get('exit_code')}) != {code}")
            if name == "g" and not (rep.get("tolerance") and rep["tolerance"] >= 1e-2):
                bad.append(f"tolerance {rep.get('tolerance')} is not the bf16 one")
            if name == "a-local" and run.get("stage") != "local":
                bad.append(f"stage {run.get('stage')} != local")
            summary = ", ".join(f"{n} {got.get(n)}" for n in statuses)
            check(not bad, f"{label}: exit {p.returncode}; {summary}", "; ".join(bad) + "\n" + p.stdout + p.stderr)


def main():
    gcd = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("GRADCHECK_DIST") or os.path.join(ROOT, "build", "gradcheck-dist")
    try:
        import safetensors.torch  # noqa: F401
        have_st = True
    except ImportError:
        have_st = False
    check(have_st, "safetensors importable (both writers are tested)", "pip install safetensors")
    os.environ["GRADCHECK_DIST_NO_SAFETENSORS"] = "1"
    check(not gradcheck_dist.dump._use_safetensors(None), "GRADCHECK_DIST_NO_SAFETENSORS=1 selects the built-in writer")
    del os.environ["GRADCHECK_DIST_NO_SAFETENSORS"]
    if not have_st:
        finish()
    work = tempfile.mkdtemp(prefix="gcd-e2e-")
    try:
        out = os.path.join(work, "dumps")
        os.makedirs(out)
        if run_ddp(out):
            ref = reference(out)
            python_checks(out, ref)
            if check(os.access(gcd, os.X_OK), f"binary {gcd}", "not found or not executable (argv[1] or GRADCHECK_DIST)"):
                binary_checks(gcd, out, ref, work)
    finally:
        if os.environ.get("GCD_KEEP"):
            print("kept", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
