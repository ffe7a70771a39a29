"""Sketch dumps (issue 35, G2 item 3) on real torch steps: dump_grads(..., sketch=K) and `gradcheck-dist check` on
them. 4 and 2 gloo CPU ranks under DDP, a small CLIP-like model (the gather with autograd, every rank computing the
whole batch's loss) and a small token model (a masked loss, unequal token counts per rank).

- sketch dumps of a correct, a x0.25, a None and a mismatch step give the same verdict (exit code, each
  parameter's status, each finding's kind and tensors) as full dumps of the same steps, against a single-process
  reference (full, or sketch);
- world 4 against world 2 (the reference that needs no single process, docs/guard.md): the sketches agree for a
  correct step and disagree for a loss each rank normalises by its own token count;
- a correct CLIP step on several seeds: no finding;
- a sketch dump is KB where the full one is not; the sketches of one parameter's pieces add;
- plain BatchNorm, world 4 against world 2: the split changes the objective, and the finding says so of the
  reference run (not of a single process).

Runs on torch 1.13 (.venv, ctest test_sketch) and torch 2.x (.venv-torch2, test_sketch_torch2).
usage: GRADCHECK_DIST=build/gradcheck-dist python -m pytest -q tests/torch/test_sketch.py
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "python"))
import gradcheck_dist  # noqa: E402
from gradcheck_dist.dump import dump_grads, read_dump  # noqa: E402
from spawned import free_port, leave  # noqa: E402  (tests/torch)

GCD = os.path.abspath(os.environ.get("GRADCHECK_DIST") or os.path.join(SRC, "build", "gradcheck-dist"))
K = 16
GB, DI, DT, E = 16, 12, 10, 6  # CLIP: the global batch, image and text features, embedding
LENGTHS = [6, 1, 2, 6, 3, 6, 1, 5]  # tokens: 8 sequences of up to 6 tokens; rank counts 7, 8, 9, 6 at world 4
SEEDS = (0, 1, 2)
TIMEOUT = 300


class Clip(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.img = torch.nn.Sequential(torch.nn.Linear(DI, 16), torch.nn.Tanh(), torch.nn.Linear(16, E))
        self.txt = torch.nn.Linear(DT, E)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, x_img, x_txt, case):
        I, T = F.normalize(self.img(x_img), dim=-1), F.normalize(self.txt(x_txt), dim=-1)
        if case == "none":  # the text tower cut from the loss
            T = T.detach()
        if case != "mismatch":  # mismatch: the loss of the local batch only (no gather)
            I, T = gradcheck_dist.all_gather_with_grad(I), gradcheck_dist.all_gather_with_grad(T)
        logits = self.logit_scale.exp() * I @ T.t()
        labels = torch.arange(len(I))
        loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
        return loss * 0.25 if case == "x025" else loss


class Tok(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(DT, 16)
        self.out = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.enc(x))).squeeze(-1)


class Bn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.bn, self.out = torch.nn.Linear(DT, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.bn(self.enc(x)))).squeeze(-1)


def clip_batch(seed):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(GB, DI, generator=g), torch.randn(GB, DT, generator=g)


def tok_batch(seed):
    g = torch.Generator().manual_seed(2000 + seed)
    x, y = torch.randn(len(LENGTHS), 6, DT, generator=g), torch.randn(len(LENGTHS), 6, generator=g)
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(6)] for n in LENGTHS])
    return x, y, mask


def tok_loss(model, x, y, mask, world, case):
    se = ((model(x) - y) ** 2 * mask).sum()
    if case == "perrank":  # normalised by this rank's own token count: wrong when the counts differ
        return se / mask.sum()
    return se * world / sum(LENGTHS)  # the global count: DDP's mean over ranks gives the whole batch's mean


def step(kind, case, seed, rank, world):
    """One training step's gradients on this rank (after DDP's reduce when world > 1); returns the model."""
    torch.manual_seed(seed)
    model = {"clip": Clip, "tok": Tok, "bn": Bn}[kind]()
    if kind == "bn":
        gradcheck_dist.track(model)   # which layers ran: the dump records the plain BatchNorm
    wrapped = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model, find_unused_parameters=True)  # the None case: DDP's option that hides it
    rows = slice(rank * GB // world, (rank + 1) * GB // world)
    if kind == "clip":
        x_img, x_txt = clip_batch(seed)
        loss = wrapped(x_img[rows], x_txt[rows], case)
    elif kind == "bn":  # each rank's rows normalised by their own statistics
        x, y = clip_batch(seed)
        loss = ((wrapped(x[rows, :DT]) - y[rows, 0]) ** 2).mean()
    else:
        x, y, mask = tok_batch(seed)
        n = len(LENGTHS)
        seqs = slice(rank * n // world, (rank + 1) * n // world)
        loss = tok_loss(wrapped, x[seqs], y[seqs], mask[seqs], world, case)
    loss.backward()
    if case == "desync" and rank == world - 1:  # after the reduce, the last rank's copy drifts (a rank-local op gone wrong)
        model.img[0].weight.grad[0, :3] += 1e-2
    return wrapped


def _rank(rank, world, outdir, port, jobs):
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    for name, kind, case, seed, *recipe in jobs:
        model = step(kind, case, seed, rank, world)
        if recipe:  # docs/guard.md's line, as written, in the case's own directory
            here = os.getcwd()
            os.makedirs(os.path.join(outdir, name), exist_ok=True)
            os.chdir(os.path.join(outdir, name))
            exec(recipe[0], {"gradcheck_dist": gradcheck_dist, "model": model, "world": world, "rank": rank})
            os.chdir(here)
            continue
        dump_grads(model, os.path.join(outdir, name, "full", f"rank{rank}.safetensors"))
        dump_grads(model, os.path.join(outdir, name, "sketch", f"rank{rank}.safetensors"), sketch=K)
    dist.barrier()
    dist.destroy_process_group()
    leave()


def run_world(world, jobs, outdir):
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, outdir, port, jobs)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(TIMEOUT)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    assert all(p.exitcode == 0 for p in procs), f"world {world}: rank exit codes {[p.exitcode for p in procs]}"


CLIP_CASES = [("clip-ok-%d" % s, "clip", "ok", s) for s in SEEDS] + \
             [("clip-%s" % c, "clip", c, 0) for c in ("x025", "none", "mismatch", "desync")]
TOK_CASES = [("tok-ok", "tok", "ok", 0), ("tok-perrank", "tok", "perrank", 0), ("bn-ok", "bn", "ok", 0)]


def recipe():
    """docs/guard.md's recipe: (the Python line every rank runs, the check command)."""
    with open(os.path.join(SRC, "docs", "guard.md")) as f:
        text = f.read().split("## Sketch dumps", 1)[1]
    code = [ln for ln in text.splitlines() if "dump_grads(" in ln and ln.startswith("gradcheck_dist.")]
    cmd = [ln.strip() for ln in text.splitlines() if ln.startswith("    gradcheck-dist check ")]
    assert len(code) == 1 and len(cmd) == 1, (code, cmd)
    return code[0], cmd[0].split()


@pytest.fixture(scope="module")
def runs():
    """Every step dumped (full and sketch) at world 4 and world 2, and the single-process references."""
    with tempfile.TemporaryDirectory(prefix="gcd-sketch-") as d:
        line = recipe()[0]
        docs = [("recipe-ok", "tok", "ok", 0, line), ("recipe-perrank", "tok", "perrank", 0, line)]
        run_world(4, CLIP_CASES + TOK_CASES + docs, os.path.join(d, "w4"))
        run_world(2, [c for c in CLIP_CASES if c[2] == "ok"] + TOK_CASES + docs, os.path.join(d, "w2"))
        for name in ("recipe-ok", "recipe-perrank"):  # the two runs side by side, as the recipe has them
            os.makedirs(os.path.join(d, name))
            for w in (4, 2):
                os.rename(os.path.join(d, f"w{w}", name, f"run-w{w}"), os.path.join(d, name, f"run-w{w}"))
        # one process accumulating world 4's four micro-batches (each loss / 4): the reference without a second run
        torch.manual_seed(0)
        model = Tok()
        x, y, mask = tok_batch(0)
        for r in range(4):
            seqs = slice(r * len(LENGTHS) // 4, (r + 1) * len(LENGTHS) // 4)
            (tok_loss(model, x[seqs], y[seqs], mask[seqs], 4, "ok") / 4).backward()
        dump_grads(model, os.path.join(d, "ref", "tok-accum.sketch.safetensors"), sketch=K)
        for seed in SEEDS:
            model = step("clip", "ok", seed, 0, 1)
            dump_grads(model, os.path.join(d, "ref", f"clip-{seed}.safetensors"))
            dump_grads(model, os.path.join(d, "ref", f"clip-{seed}.sketch.safetensors"), sketch=K)
        yield d


def check(*args):
    """(exit code, report) of gradcheck-dist check ARGS."""
    with tempfile.TemporaryDirectory() as t:
        js = os.path.join(t, "r.json")
        p = subprocess.run([GCD, "check", *args, "--json", js], capture_output=True, text=True, timeout=120)
        assert p.returncode in (0, 1), (args, p.returncode, p.stdout[-3000:], p.stderr[-3000:])
        with open(js) as f:
            return p.returncode, json.load(f)


def verdict(rep):
    run = rep["runs"][0]
    statuses = {p["name"]: p["status"] for p in run["params"]}
    kinds = sorted((f["kind"], tuple(sorted(f["params"]))) for f in run["findings"] if f["counts"])
    return statuses, kinds


@pytest.mark.parametrize("name", [c[0] for c in CLIP_CASES])
def test_sketch_dumps_should_give_the_full_dumps_verdict(runs, name):
    seed = int(name.rsplit("-", 1)[1]) if name.startswith("clip-ok") else 0
    ref = os.path.join(runs, "ref", f"clip-{seed}")
    code_f, full = check(os.path.join(runs, "w4", name, "full"), "--ref", ref + ".safetensors")
    code_s, sk = check(os.path.join(runs, "w4", name, "sketch"), "--ref", ref + ".sketch.safetensors")
    assert (code_s, verdict(sk)) == (code_f, verdict(full)), (name, verdict(full), verdict(sk))
    statuses, kinds = verdict(sk)
    expect = {"clip-x025": ("scaled", ["img.0.bias", "img.0.weight", "img.2.bias", "img.2.weight", "logit_scale",
                                       "txt.bias", "txt.weight"]),
              "clip-none": ("none", ["txt.bias", "txt.weight"]),
              "clip-mismatch": ("mismatch", ["img.0.bias", "img.0.weight", "img.2.bias", "img.2.weight",
                                             "logit_scale", "txt.bias", "txt.weight"]),
              "clip-desync": ("disagree", ["img.0.weight"])}
    if name.startswith("clip-ok"):  # a correct step, on every seed: no false alarm
        assert code_s == 0 and set(statuses.values()) == {"ok"}, statuses
    else:
        status, names = expect[name]
        assert code_s == 1 and sorted(n for n, s in statuses.items() if s == status) == names, statuses
    if name == "clip-desync":  # the rank named, as the full dumps name it
        d = {p["name"]: p for p in sk["runs"][0]["params"]}["img.0.weight"]
        assert [r["differs"] for r in d["per_rank"]] == [False, False, False, True], d["per_rank"]


def test_world_4_against_world_2_should_agree_for_a_correct_step(runs):
    for name in ["tok-ok"] + [f"clip-ok-{s}" for s in SEEDS]:
        code, rep = check(os.path.join(runs, "w4", name, "sketch"), "--ref",
                          os.path.join(runs, "w2", name, "sketch", "rank1.safetensors"))
        assert code == 0 and set(verdict(rep)[0].values()) == {"ok"}, (name, verdict(rep))
        # the reference is a rank of a world-2 run, and the report says so
        words = " ".join(f["message"] for f in rep["runs"][0]["findings"])
        assert "matches the reference run" in words and "single-process" not in words, (name, words)


def test_world_4_against_world_2_should_disagree_for_a_per_rank_normalised_loss(runs):
    code, rep = check(os.path.join(runs, "w4", "tok-perrank", "sketch"), "--ref",
                      os.path.join(runs, "w2", "tok-perrank", "sketch", "rank0.safetensors"))
    statuses, kinds = verdict(rep)
    assert code == 1 and set(statuses.values()) <= {"mismatch", "scaled"} and len(statuses) == 4, statuses
    assert "single-process" not in json.dumps(rep["runs"][0]["findings"]), rep["runs"][0]["findings"]


def test_world_4_against_world_2_should_name_plain_batchnorm_of_the_reference_run(runs):
    code, rep = check(os.path.join(runs, "w4", "bn-ok", "sketch"), "--ref",
                      os.path.join(runs, "w2", "bn-ok", "sketch", "rank0.safetensors"))
    words = " ".join(f["message"] for f in rep["runs"][0]["findings"] if f["counts"])
    assert code == 1 and "BatchNorm in training mode (bn)" in words, words
    assert "the reference run's ranks by other splits" in words and "single-process" not in words, words


def test_sketch_dump_should_be_small_and_keep_the_metadata(runs):
    sk = os.path.join(runs, "w4", "clip-ok-0", "sketch", "rank0.safetensors")
    tensors, meta = read_dump(sk)
    assert meta["gradcheck.sketch"] == str(K) and meta["gradcheck.seed"] == "0", meta
    assert meta["gradcheck.stage"] == "reduced" and meta["gradcheck.world"] == "4" and meta["gradcheck.wrapper"] == "ddp"
    assert meta["gradcheck.precision"] == "fp32", meta
    assert meta["gradcheck.projections"] == "sign-hash/4096", meta   # docs/guard.md, The sketch
    assert all(t.dtype == torch.float64 and tuple(t.shape) == (15 + K,) for t in tensors.values())
    # a model of 2.1M parameters: 8.4 MB of float32 gradients, one row of 15 + K float64 per parameter
    torch.manual_seed(0)
    big = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 1024))
    big(torch.randn(4, 1024)).sum().backward()
    with tempfile.TemporaryDirectory() as t:
        dump_grads(big, os.path.join(t, "full.safetensors"))
        dump_grads(big, os.path.join(t, "sketch.safetensors"), sketch=K)
        nfull, nsk = os.path.getsize(os.path.join(t, "full.safetensors")), os.path.getsize(os.path.join(t, "sketch.safetensors"))
    assert nfull > 8_000_000 and nsk < 4096, (nfull, nsk)


def test_sketch_rows_of_pieces_should_add_to_the_whole():
    from gradcheck_dist.dump import _sketch_row

    g = torch.randn(300000, generator=torch.Generator().manual_seed(3))
    whole = _sketch_row("w", g, None, K, 7)
    a = _sketch_row("w", g[:123457], {"shape": [300000], "start": 0}, K, 7)
    b = _sketch_row("w", g[123457:], {"shape": [300000], "start": 123457}, K, 7)
    assert float(((a[15:] + b[15:]) - whole[15:]).norm() / whole[15:].norm()) < 1e-6
    assert abs(math.hypot(float(a[2]), float(b[2])) / float(whole[2]) - 1) < 1e-6  # sums of squares of F32 chunks in float32


def test_the_recipe_in_guard_md_as_written(runs):
    cmd = recipe()[1]
    assert cmd[:2] == ["gradcheck-dist", "check"], cmd
    for name, code in (("recipe-ok", 0), ("recipe-perrank", 1)):
        p = subprocess.run([GCD] + cmd[1:], cwd=os.path.join(runs, name), capture_output=True, text=True, timeout=120)
        assert p.returncode == code, (name, cmd, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
        assert f"sketch dumps (K={K}, seed 0): the differences from the reference are estimated" in " ".join(p.stdout.split()), p.stdout


# ---- sharded (torch >= 2.4, the torch2 tier): each rank sketches its shard at its offset, the pieces add


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)])  # 5 rows: uneven over 2
        self.out = torch.nn.Linear(3, 1)

    def forward(self, x):
        for lin in self.layers:
            x = torch.tanh(lin(x))
        return self.out(x).pow(2).mean()


def net_batch():
    return torch.randn(8, 6, generator=torch.Generator().manual_seed(3))


def _fsdp_rank(rank, how, outdir, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = Net()
    if how == "fsdp2":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
        for lin in model.layers:
            fully_shard(lin)
        fully_shard(model)
        wrapped = model
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        for i, lin in enumerate(model.layers):
            model.layers[i] = FSDP(lin, device_id=torch.device("cpu"))
        wrapped = FSDP(model, device_id=torch.device("cpu"))
    wrapped(net_batch().chunk(2)[rank]).backward()
    dump_grads(wrapped, os.path.join(outdir, "ok", f"rank{rank}.safetensors"), sketch=K)
    if rank == 1:  # one rank's shard of every parameter doubled after the reduce-scatter: the whole is wrong
        for p in wrapped.parameters():
            if p.grad is not None:
                (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).mul_(2)
    dump_grads(wrapped, os.path.join(outdir, "bad", f"rank{rank}.safetensors"), sketch=K)
    dist.barrier()
    dist.destroy_process_group()
    leave()


@pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 4),
                    reason="FSDP needs torch >= 2.4: the torch2 tier (test_sketch_torch2) runs it")
@pytest.mark.parametrize("how", ["fsdp2", "fsdp1"])
def test_sharded_sketches_should_add_to_the_single_process_reference(how):
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_fsdp_rank, args=(how, d, free_port()), nprocs=2, start_method="spawn")
        torch.manual_seed(0)
        ref = Net()
        ref(net_batch()).backward()
        dump_grads(ref, os.path.join(d, "ref.safetensors"), sketch=K)
        _, meta = read_dump(os.path.join(d, "ok", "rank0.safetensors"))
        assert meta["gradcheck.wrapper"] == how.rstrip("1"), meta
        code, rep = check(os.path.join(d, "ok"), "--ref", os.path.join(d, "ref.safetensors"))
        assert code == 0 and set(verdict(rep)[0].values()) == {"ok"} and len(verdict(rep)[0]) == 6, verdict(rep)
        code, rep = check(os.path.join(d, "bad"), "--ref", os.path.join(d, "ref.safetensors"))
        statuses = verdict(rep)[0]
        # what rank 1 holds of each parameter (its rows: count and whole size): wholly its own, x2; in part, wrong; none, ok
        rows = read_dump(os.path.join(d, "bad", "rank1.safetensors"))[0]
        total = {n: int(torch.tensor([float(v) for v in r[7:7 + int(r[6])]]).prod()) for n, r in rows.items()}
        want = {n: "ok" if n not in rows or r[4] == 0 else "scaled" if r[4] == total[n] else "mismatch" for n, r in rows.items()}
        want.update({n: "ok" for n in statuses if n not in rows})
        assert code == 1 and statuses == want and "mismatch" in want.values(), (statuses, want)
        scales = {p["name"]: p["scale"] for p in rep["runs"][0]["params"] if p["status"] == "scaled"}
        assert all(abs(v - 2) < 1e-6 for v in scales.values()), scales


def test_sketch_row_should_count_non_finite_values_and_keep_extreme_norms():
    from gradcheck_dist.dump import _sketch_row

    g = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    g[17], g[40] = float("nan"), float("inf")
    r = _sketch_row("x", g, {"shape": [9000], "start": 1000}, K, 0)
    assert r[:5].tolist() == [2.0, 1017.0, r[2].item(), 1000.0, 5000.0], r[:5]
    assert abs(r[2].item() / g[torch.isfinite(g)].double().norm().item() - 1) < 1e-12
    big = torch.randn(300, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 1e200  # squares overflow
    assert abs(_sketch_row("y", big, None, K, 0)[2].item() / ((big / 1e200).norm().item() * 1e200) - 1) < 1e-12
    tiny = torch.full((10,), 1e-30)  # squares underflow in float32
    assert abs(_sketch_row("z", tiny, None, K, 0)[2].item() / tiny.double().norm().item() - 1) < 1e-12
    assert _sketch_row("w", torch.zeros(7), None, K, 0)[:3].tolist() == [0.0, -1.0, 0.0]


def test_one_process_with_accumulation_should_be_the_reference(runs):
    ref = os.path.join(runs, "ref", "tok-accum.sketch.safetensors")
    code, rep = check(os.path.join(runs, "w4", "tok-ok", "sketch"), "--ref", ref)
    assert code == 0 and set(verdict(rep)[0].values()) == {"ok"}, verdict(rep)
    code, rep = check(os.path.join(runs, "w4", "tok-perrank", "sketch"), "--ref", ref)
    assert code == 1 and set(verdict(rep)[0].values()) == {"mismatch"}, verdict(rep)


def _q(d, seeds, k=K):
    """Q = ||P d||^2 / (K ||d||^2) of the guard's sketch P (one seed each), docs/check-verdicts.md's random part"""
    from gradcheck_dist.guard import _sketch

    dd = float(d.double().square().sum())
    return torch.tensor([float(_sketch(d.reshape(-1), 0, s, k)[0].double().square().sum()) / (k * dd) for s in seeds],
                        dtype=torch.float64)


def test_sketch_q_should_follow_what_check_verdicts_states():
    # docs/check-verdicts.md, "Sketch dumps: what a sketch can miss": the figures measured there are these
    g = torch.Generator().manual_seed(0)
    small = _q(torch.randn(192, generator=g), range(1000))   # a bias's difference: K independent signs per value
    big = _q(torch.randn(300000, generator=g), range(200))   # spread over 74 rows of 4096
    assert small.min() > 0.1 and big.min() > 0.1, (small.min(), big.min())   # chi-square 16: P(Q < 0.1) ~ 1e-10
    assert 0.25 < torch.quantile(small, 0.01) < 0.45, torch.quantile(small, 0.01)   # chi-square 16 / 16: 0.36
    assert small.max() < 4, small.max()   # false alarms at a margin of 2: P(chi-square 16 > 64) ~ 1e-7
    pair = torch.zeros(192)
    pair[3], pair[100] = 1, -1   # two equal and opposite values: Q = n / 8, n ~ Binomial(16, 1/2) of signs that differ
    q = _q(pair, range(1000))
    assert torch.allclose(q * 8, (q * 8).round(), atol=1e-9) and q.min() > 0, q.min()
    assert float((q < 0.5).double().mean()) < 0.03, float((q < 0.5).double().mean())   # P(n <= 3) = 1.06 %
    row = torch.zeros(64, 4096)
    row[5] = torch.randn(4096, generator=g)   # one row of 4096 of a 262,144-value tensor: one degree of freedom
    q = _q(row, range(1000))
    below = float((q < 0.01).double().mean()), float((q < 0.1).double().mean())
    assert 0.04 < below[0] < 0.13 and 0.18 < below[1] < 0.31, below   # chi-square 1: 8.0 %, 24.8 %
    q = _q(torch.outer(torch.randn(64, generator=g), torch.randn(4096, generator=g)), range(1000))   # rank 1, 64 rows
    rank1 = float((q < 0.01).double().mean()), float((q < 0.1).double().mean())
    assert 0.04 < rank1[0] < 0.13 and 0.18 < rank1[1] < 0.31, rank1
    print(f"Q: small 1st pct {float(torch.quantile(small, 0.01)):.3f} min {float(small.min()):.3f} max {float(small.max()):.2f}; "
          f"big min {float(big.min()):.3f}; pair P(Q<0.5) {float((_q(pair, range(1000)) < 0.5).double().mean()):.4f}; row {below} rank1 {rank1}")
