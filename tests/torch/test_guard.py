"""gradcheck_dist.guard inside real training (issue 35): 4 gloo CPU ranks, a small CLIP-like model, plain loops
(torchrun-style processes) and a Lightning Trainer. Each defect is caught at the first guarded step and located
(the ranks named); a correct run of 200 steps is clean on every seed tried. Runs on torch 1.13 (.venv) and
torch 2.x (.venv-torch2); FSDP2 (DTensor shards) on torch 2.x only.

usage: GRADCHECK_DIST_LIB=build/libgradcheck_dist.so python -m pytest -q tests/torch/test_guard.py
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import warnings

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "python"))
import gradcheck_dist  # noqa: E402
from gradcheck_dist.guard import CHUNK, GradcheckFinding, _sketch, guard  # noqa: E402
from spawned import free_port, leave  # noqa: E402  (tests/torch)

WORLD = 4
B, DI, DT, E = 8, 12, 10, 6
TIMEOUT = 300  # seconds for a whole multi-rank case


class Clip(torch.nn.Module):
    def __init__(self, head=False):
        super().__init__()
        self.img = torch.nn.Sequential(torch.nn.Linear(DI, 16), torch.nn.Tanh(), torch.nn.Linear(16, E))
        self.txt = torch.nn.Linear(DT, E)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.head = torch.nn.Linear(E, 1) if head else None

    def forward(self, x_img, x_txt, gather, use_head=False):
        I, T = F.normalize(self.img(x_img), dim=-1), F.normalize(self.txt(x_txt), dim=-1)
        loss = clip_loss(self.logit_scale.exp(), gather(I), gather(T))
        if use_head:
            loss = loss + self.head(I).pow(2).mean()
        return loss


def clip_loss(scale, I, T):
    logits = scale * I @ T.t()
    labels = torch.arange(len(I))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def batch_for(rank, step, seed):
    g = torch.Generator().manual_seed(seed * 100003 + step * 101 + rank)
    return torch.randn(B, DI, generator=g), torch.randn(B, DT, generator=g)


# ---- one rank of a plain training loop (torch.distributed, gloo), started by run_case


def _rank(rank, case, seed, steps, outdir, port):
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(seed)
    model = Clip(head=(case == "partial"))
    out = {"finding": None}
    left_out = dist.new_group([0, 1, 2]) if case == "left_out" else None
    if case in ("ok", "nan"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model)
    else:
        wrapped = model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = guard(wrapped, every=1, on_finding="raise", report=os.path.join(outdir, "report-{step}.json"), k=8)
    try:
        for step in range(steps):
            x_img, x_txt = batch_for(rank, step, seed)
            use_head = case == "partial" and rank < 2  # an auxiliary loss on ranks 0 and 1 only
            loss = wrapped(x_img, x_txt, gradcheck_dist.all_gather_with_grad, use_head)
            loss.backward()
            if case == "left_out":  # a hand-written average whose group leaves rank 3 out: it keeps its own
                for p in model.parameters():
                    if rank < 3:
                        dist.all_reduce(p.grad, group=left_out)
                        p.grad /= 3
            if case == "partial":  # a hand-written average that skips the parameters a rank has no gradient for
                for p in model.parameters():
                    t = p.grad if p.grad is not None else torch.zeros_like(p)
                    dist.all_reduce(t)
                    if p.grad is not None:
                        p.grad = t / WORLD
            if case == "nan" and rank == 2 and step == 3:  # after the reduce: a rank-local op gone wrong
                model.img[0].weight.grad[1, 2] = float("nan")
            g.check(step)
            opt.step()
            opt.zero_grad()
        out["steps"] = steps
    except GradcheckFinding as e:
        out = {"finding": str(e), "step": e.step, "ranks": e.ranks, "report": e.report}
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()  # every rank done with gloo before any tears it down (an abort in teardown under load)
    dist.destroy_process_group()
    leave()


def run_case(case, seed=0, steps=6):
    outdir = tempfile.mkdtemp(prefix="guard-")
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, case, seed, steps, outdir, port)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(TIMEOUT)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    assert all(p.exitcode == 0 for p in procs), f"{case}: rank exit codes {[p.exitcode for p in procs]}"
    res = []
    for r in range(WORLD):
        with open(os.path.join(outdir, f"rank{r}.json")) as f:
            res.append(json.load(f))
    return res, outdir


def findings(report, kind):
    return [f for f in report["runs"][0]["findings"] if f["kind"] == kind and f["counts"]]


def test_left_out_rank_should_disagree_naming_rank_3():
    res, _ = run_case("left_out")
    for r in res:  # every rank raises the same, at the first guarded step
        assert r["finding"] and r["step"] == 0 and r["ranks"] == [3], r
    f = findings(res[0]["report"], "disagree")
    assert f and "rank 3" in f[0]["message"] and "between rank 0" in f[0]["message"], res[0]["report"]["runs"][0]["findings"]


def test_nan_on_one_rank_should_be_found_on_rank_2():
    res, outdir = run_case("nan")
    for r in res:
        assert r["finding"] and r["step"] == 3 and r["ranks"] == [2], r
    f = findings(res[0]["report"], "nonfinite")
    assert f and f[0]["params"] == ["img.0.weight"] and "on rank 2: 1 of 192 (first at index 14)" in f[0]["message"], f
    assert f[0]["message"].startswith("step 3: img.0.weight"), f  # the guard's words name the step
    with open(os.path.join(outdir, "report-3.json")) as fh:  # rank 0 wrote check's report, with the step
        written = json.load(fh)
    assert written["runs"][0]["guard"] == {"step": 3, "every": 1, "sketch": 8, "ranks": [2]} and written["result"] == "fail"


def test_parameter_used_on_some_ranks_should_be_partial_naming_ranks_2_and_3():
    res, _ = run_case("partial")
    for r in res:
        assert r["finding"] and r["step"] == 0 and r["ranks"] == [2, 3], r
    f = findings(res[0]["report"], "partial")
    assert sorted(x["params"][0] for x in f) == ["head.bias", "head.weight"], f
    assert all("None on ranks 2 and 3" in x["message"] for x in f), f


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correct_clip_run_of_200_steps_should_give_no_finding(seed):
    res, _ = run_case("ok", seed=seed, steps=200)
    for r in res:
        assert r["finding"] is None and r["steps"] == 200, r


# ---- the sketch: linear, so shards add (FSDP); bounded memory


def test_sketch_of_shards_should_add_to_the_whole():
    g = torch.randn(2 * CHUNK + 4097, generator=torch.Generator().manual_seed(5))
    whole, ss = _sketch(g, 0, 11, 8)
    assert abs(float(ss.sqrt()) / float(g.double().norm()) - 1) < 1e-6
    for cut in (1, 1023, 1024, 5000, CHUNK - 1, CHUNK, CHUNK + 3000, 2 * CHUNK + 1):
        parts = _sketch(g[:cut], 0, 11, 8, g.numel())[0] + _sketch(g[cut:], cut, 11, 8)[0]
        assert float((parts - whole).norm() / whole.norm()) < 1e-5, cut
    other = g.clone()
    other[CHUNK + 17] += 1e-2 * float(g.norm())  # one changed value changes the sketch
    assert float((_sketch(other, 0, 11, 8)[0] - whole).norm() / whole.norm()) > 1e-3


def _py_sign(seed, key, bit):
    """The projections' definition in plain Python integers (docs/guard.md): sign `bit` of hash(seed, key)."""
    def mix(x):
        x ^= x >> 16
        x = (x * 0x21F0AAAD) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x735A2D97) & 0xFFFFFFFF
        return x ^ (x >> 15)
    h = mix(mix((key & 0xFFFFFFFF) ^ (seed & 0xFFFFFFFF)) ^ (key >> 32))
    return 1 - 2 * ((h >> bit) & 1)


def test_sketch_should_follow_its_definition_without_a_generator():
    # s_j = sum_i g_i w[i % ROW] R[i // ROW, j]: w from (seed + 3, column), R from (seed + 1, row); no torch
    # generator, so the same on a GPU as here (tests/gpu/guard_gpu.py compares the two devices)
    from gradcheck_dist.guard import ROW

    k, seed, start = 40, 123, ROW - 300   # k > 32: two hashes per row; a shard starting 300 elements before a row's end
    g = torch.randn(2 * ROW + 77, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    want = [0.0] * k
    w = [_py_sign(seed + 3, c, 0) for c in range(ROW)]
    rows = {}
    for i, x in enumerate(g.tolist()):
        at = start + i
        r = at // ROW
        if r not in rows:
            rows[r] = [_py_sign(seed + 1, r * 2 + j // 32, j % 32) for j in range(k)]
        for j in range(k):
            want[j] += x * w[at % ROW] * rows[r][j]
    got, ss = _sketch(g, start, seed, k)
    assert max(abs(a - b) for a, b in zip(got.tolist(), want)) < 1e-9 * float(g.norm())
    assert abs(float(ss) - float(g.pow(2).sum())) < 1e-9 * float(ss)
    # float32 on the CPU goes through the library's one-pass kernel (src/guard/pass.c); torch's two passes agree
    import importlib

    guard = importlib.import_module("gradcheck_dist.guard")   # the module; the package's `guard` is the function
    assert guard._fused() is not None
    for fused in (None, False):   # None: the kernel, loaded on first use; False: torch's matrix-vector product
        guard._FUSED = fused
        got, ss = _sketch(g.float(), start, seed, k)
        assert max(abs(a - b) for a, b in zip(got.tolist(), want)) < 1e-5 * float(g.norm())
        assert abs(float(ss) - float(g.pow(2).sum())) < 1e-5 * float(ss)
        assert callable(guard._FUSED) == (fused is None)
    guard._FUSED = None
    # a parameter of at most ROW elements: every (element, j) its own sign, hashed from (seed + 2, element):
    # K degrees of freedom for a bias, where one row's product (g . w) would give one; here its second shard
    small, start = g[:700], 1000   # elements 1000..1699 of a parameter of 2000
    want = [sum(x * _py_sign(seed + 2, (start + i) * 2 + j // 32, j % 32) for i, x in enumerate(small.tolist()))
            for j in range(k)]
    got = _sketch(small, start, seed, k, total=2000)[0]
    assert max(abs(a - b) for a, b in zip(got.tolist(), want)) < 1e-9 * float(small.norm())


def test_small_gradients_sketched_together_should_match_one_at_a_time():
    from gradcheck_dist.guard import ROW, _small_sketches

    gen = torch.Generator().manual_seed(8)
    gs = [torch.randn(n, generator=gen) for n in (1, 5, 768, ROW, 3000)] + [torch.randn(17, generator=gen).bfloat16()]
    seeds = [3, 9, 11, 12, 40, 7]
    sk, ss = _small_sketches(gs, seeds, 40)
    for i, g in enumerate(gs):
        one, one_ss = _sketch(g, 0, seeds[i], 40)
        assert float((sk[i] - one).norm() / one.norm()) < 1e-5, i
        assert abs(float(ss[i] / one_ss) - 1) < 1e-6, i


# ---- Lightning: the default all_gather (sync_grads=False) detaches the encoders


LIGHTNING = r'''
import json, math, os, sys
sys.path.insert(0, sys.argv[2])
import torch, torch.nn.functional as F
from gradcheck_dist.lightning import lightning_package, GradcheckGuard
from gradcheck_dist.guard import GradcheckFinding
pl = lightning_package()
B, DI, DT, E = 8, 12, 10, 6

class LitClip(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.img, self.txt = torch.nn.Linear(DI, E), torch.nn.Linear(DT, E)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))
    def training_step(self, batch, batch_idx):
        I, T = F.normalize(self.img(batch[0]), dim=-1), F.normalize(self.txt(batch[1]), dim=-1)
        I, T = self.all_gather(I).flatten(0, 1), self.all_gather(T).flatten(0, 1)   # the default: sync_grads=False
        logits = self.logit_scale.exp() * I @ T.t()
        labels = torch.arange(len(I))
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, DI, generator=g), torch.randn(64, DT, generator=g))
trainer = pl.Trainer(accelerator="cpu", devices=4, strategy="ddp_find_unused_parameters_true", max_steps=5,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[GradcheckGuard(every_n_steps=2, on_finding="raise")])
out = {"finding": None}
try:
    trainer.fit(LitClip(), torch.utils.data.DataLoader(data, batch_size=B))
except GradcheckFinding as e:
    out = {"finding": str(e), "step": e.step, "ranks": e.ranks, "report": e.report}
with open(os.path.join(sys.argv[1], "rank%d.json" % trainer.global_rank), "w") as f:
    json.dump(out, f)
sys.stdout.flush()
os._exit(0)
'''


def test_lightning_default_all_gather_should_raise_naming_the_encoders():
    outdir = tempfile.mkdtemp(prefix="guard-pl-")
    script = os.path.join(outdir, "lit.py")
    with open(script, "w") as f:
        f.write(LIGHTNING)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo")
    p = subprocess.Popen([sys.executable, script, outdir, os.path.join(SRC, "python")], env=env, cwd=outdir,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        log, _ = p.communicate(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait(10)
    res = []
    for r in range(WORLD):
        path = os.path.join(outdir, f"rank{r}.json")
        assert os.path.exists(path), f"rank {r} wrote nothing:\n{log.decode(errors='replace')[-3000:]}"
        with open(path) as f:
            res.append(json.load(f))
    for r in res:  # the first guarded step: global step 0
        assert r["finding"] and r["step"] == 0 and r["ranks"] == [0, 1, 2, 3], r
    f = findings(res[0]["report"], "none")
    assert f and sorted(f[0]["params"]) == ["img.bias", "img.weight", "txt.bias", "txt.weight"], res[0]["report"]
    assert "only 1 of 5 parameters receives a gradient: logit_scale" in f[0]["message"], f[0]["message"]


# ---- FSDP2 (DTensor shards, torch >= 2.4): summarised per shard, combined per parameter


def _fsdp2_rank(rank, outdir, port):
    import datetime

    import torch.distributed as dist

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    from gradcheck_dist.guard import COLS, _seed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))  # 10 rows: uneven over 4
    for m in (model[0], model[2]):
        fully_shard(m)
    fully_shard(model)
    g = guard(model, every=1, k=8)
    out = {}
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(rank))
    model(x).pow(2).mean().backward()
    names, _, table = g.summarise(torch.device("cpu"))
    sums = table[:, COLS:].clone()
    dist.all_reduce(sums)  # the shards' sketches, added
    fulls = {n: p.grad.full_tensor().reshape(-1) for n, p in model.named_parameters()}
    out["sketch_err"] = max(float((sums[i] - _sketch(fulls[n], 0, _seed(0, n), 8)[0]).norm() / fulls[n].norm())
                            for i, n in enumerate(names))
    out["sharded"] = [bool(x) for x in table[:, 6].tolist()]
    report = g.check(0)
    out["clean"] = report["result"]
    out["norm_err"] = max(abs(p["norm"] / float(fulls[p["name"]].norm()) - 1) for p in report["runs"][0]["params"])
    model.zero_grad()
    model(x).pow(2).mean().backward()
    if rank == 1:
        list(model.parameters())[0].grad.to_local()[0, 0] = float("nan")  # rank 1's shard of 0.weight
    try:
        g.check(1)
        out["nan"] = None
    except GradcheckFinding as e:
        out["nan"] = (e.ranks, [f["kind"] for f in e.report["runs"][0]["findings"] if f["counts"]])
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()  # every rank done with gloo before any tears it down (an abort in teardown under load)
    dist.destroy_process_group()
    leave()


def test_fsdp2_shards_should_combine_to_the_whole_and_locate_a_nan():
    if not hasattr(torch.distributed, "tensor") and tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 4):
        pytest.skip(f"FSDP2 needs torch >= 2.4 (this is {torch.__version__}): the torch2 tier runs it")
    outdir = tempfile.mkdtemp(prefix="guard-fsdp2-")
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_fsdp2_rank, args=(r, outdir, port)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(TIMEOUT)
        if p.is_alive():
            p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    with open(os.path.join(outdir, "rank0.json")) as f:
        r = json.load(f)
    assert all(r["sharded"]) and r["clean"] == "pass", r
    assert r["sketch_err"] < 1e-5 and r["norm_err"] < 1e-5, r
    assert r["nan"] == [[1], ["nonfinite"]], r  # (ranks named, finding kinds), through JSON


# ---- FSDP1 (FlatParameter, torch >= 2.1): each rank's run of the flat shard, combined per original parameter


def _fsdp1_rank(rank, world, orig, outdir, port):
    import datetime

    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from gradcheck_dist.dump import collect

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(12, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))  # 163 values: uneven over 2
    ref = [p.detach().clone().requires_grad_(True) for p in plain.parameters()]
    model = FSDP(plain, use_orig_params=orig, device_id=torch.device("cpu"))
    g = guard(model, every=1, k=8)
    xs = [torch.randn(8, 12, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    out = {}

    def ref_norms():  # the whole model on every rank's batch: FSDP averages the ranks' gradients
        w0, b0, w2, b2 = ref
        loss = sum((torch.tanh(x @ w0.t() + b0) @ w2.t() + b2).pow(2).mean() for x in xs) / world
        grads = torch.autograd.grad(loss, ref)
        return {n: float(t.norm()) for n, t in zip(["0.weight", "0.bias", "2.weight", "2.bias"], grads)}

    model(xs[rank]).pow(2).mean().backward()
    report = g.check(0)
    want = ref_norms()
    out["clean"] = report["result"]
    out["sharded"] = sorted(p["name"] for p in report["runs"][0]["params"])
    out["norm_err"] = max(abs(p["norm"] / want[p["name"]] - 1) for p in report["runs"][0]["params"])
    out["notes"] = [f["message"] for f in report["runs"][0]["findings"]]
    model.zero_grad()
    model(xs[rank]).pow(2).mean().backward()
    for name, t, _ in collect(model):  # a dropped gradient: 2.weight's pieces zeroed on every rank that holds one
        if name == "2.weight" and t is not None:
            t.zero_()
    try:
        g.check(1)
        out["dropped"] = None
    except GradcheckFinding as e:
        run = e.report["runs"][0]
        out["dropped"] = [[f["kind"], f["params"], f["message"]] for f in run["findings"] if f["counts"]]
        out["text"] = str(e)
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()  # no rank tears gloo down while another still talks
    dist.destroy_process_group()
    leave()


@pytest.mark.parametrize("orig", [True, False])
def test_fsdp1_flat_shards_should_combine_per_parameter_and_catch_a_dropped_gradient(orig):
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 1):
        pytest.skip(f"FSDP1 flat parameters need torch >= 2.1 (_shard_param_infos; this is {torch.__version__}): "
                    "the torch2 tier runs it")
    world = 2
    outdir = tempfile.mkdtemp(prefix="guard-fsdp1-")
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_fsdp1_rank, args=(r, world, orig, outdir, port)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(TIMEOUT)
        if p.is_alive():
            p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    res = []
    for r in range(world):
        with open(os.path.join(outdir, f"rank{r}.json")) as f:
            res.append(json.load(f))
    r = res[0]
    assert r["clean"] == "pass" and r["sharded"] == ["0.bias", "0.weight", "2.bias", "2.weight"], r
    assert r["norm_err"] < 1e-5, r
    assert not any("--ref" in m or "reference" in m for m in r["notes"]), r["notes"]  # the guard's words, not check's
    assert all(m.startswith("step 0: ") for m in r["notes"]), r["notes"]
    for x in res:  # every rank raises alike, at step 1, naming the parameter
        assert x["dropped"] and [d[:2] for d in x["dropped"]] == [["zero", ["2.weight"]]], x
        assert x["dropped"][0][2].startswith("step 1: 2.weight gets a gradient of exactly zero"), x["dropped"]
        assert x["text"].startswith("gradcheck_dist.guard, ranks [0, 1]: step 1: 2.weight"), x["text"]


# ---- one process, no process group: docs/guard.md's "Use" block as written, and what it lists under it


class Detached(torch.nn.Module):
    """The seed's bug in one process: the encoder's output detached before the loss (as a no_grad gather would),
    so only `scale` learns. `fixed=True`: the same model, nothing detached."""

    def __init__(self, fixed=False):
        super().__init__()
        torch.manual_seed(0)
        self.enc, self.scale, self.fixed = torch.nn.Linear(6, 4), torch.nn.Parameter(torch.tensor(2.0)), fixed

    def forward(self, x):
        z = self.enc(x)
        return (self.scale * (z if self.fixed else z.detach())).pow(2).mean()


def loader_of(n):
    g = torch.Generator().manual_seed(5)
    return [torch.randn(8, 6, generator=g) for _ in range(n)]


def test_use_block_in_guard_md_as_written_should_stop_the_seed_bug_at_step_0():
    from doc_recipes import blocks

    (block,) = blocks("Use", os.path.join(SRC, "docs", "guard.md"))
    for fixed in (True, False):
        model = Detached(fixed)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ns = {"model": model, "loader": loader_of(3), "optimizer": optimizer}
        if fixed:
            exec(block, ns)   # three steps, step 0 guarded: clean
            assert ns["g"].last["result"] == "pass" and ns["step"] == 2, ns["g"].last["result"]
            continue
        with pytest.raises(GradcheckFinding) as e:
            exec(block, ns)
        assert e.value.step == 0 and float(model.scale) == 2.0, "raised at step 0, before its optimizer.step()"
        assert "enc.weight" in str(e.value) and "scale" in str(e.value), str(e.value)


@pytest.mark.parametrize("how", ["warn", "log"])
def test_warn_and_log_should_report_and_let_training_go_on(how, caplog):
    model = Detached()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = guard(model, every=2, on_finding=how)
    seen = []
    for step, x in enumerate(loader_of(4)):
        model(x).backward()
        if how == "warn":
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                g.check(step)
            seen += [str(m.message) for m in w if m.category is RuntimeWarning and "gradcheck_dist.guard" in str(m.message)]
        else:
            g.check(step)
        opt.step()
        opt.zero_grad()
    if how == "log":
        seen = [r.getMessage() for r in caplog.records if r.name == "gradcheck_dist.guard" and r.levelname == "ERROR"]
    assert [s.split(": ")[1].split(" ")[1] for s in seen] == ["0", "2"], seen   # "...: step N: ..." at steps 0 and 2
    assert all("enc.weight" in s for s in seen), seen


def test_optimizer_pre_hook_should_check_before_the_step():
    model = Detached()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if not hasattr(opt, "register_step_pre_hook"):
        with pytest.raises(RuntimeError, match="register_step_pre_hook"):
            guard(model, every=1, optimizer=opt)
        return
    g = guard(model, every=1, optimizer=opt)
    model(loader_of(1)[0]).backward()
    before = model.scale.detach().clone()
    with pytest.raises(GradcheckFinding, match="enc.weight"):
        opt.step()
    assert torch.equal(model.scale.detach(), before), "the optimizer stepped past the finding"
    g.remove()
    opt.step()
    assert not torch.equal(model.scale.detach(), before), "the removed hook still stops the step"


# ---- torchrun: the guard in a script torchrun starts (env:// rendezvous, DDP), as a user runs it

TORCHRUN = r'''
import json, os, sys
import torch, torch.distributed as dist
sys.path.insert(0, sys.argv[3])
import gradcheck_dist
from gradcheck_dist.guard import GradcheckFinding

outdir, case = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")   # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
g = gradcheck_dist.guard(ddp, every=2, report=os.path.join(outdir, "guard-{step}.json"))
out = {"steps": 0}
try:
    for step in range(6):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * rank + step))
        ddp(x).pow(2).mean().backward()
        if case == "drift" and step == 4 and rank == 1:   # after the reduce, one rank's copy changes
            model[2].bias.grad += 1e-2
        g.check(step)
        opt.step()
        opt.zero_grad()
        out["steps"] = step + 1
except GradcheckFinding as e:
    out.update(finding=str(e), step=e.step, ranks=e.ranks)
with open(os.path.join(outdir, "rank%d.json" % rank), "w") as f:
    json.dump(out, f)
dist.barrier()
dist.destroy_process_group()
'''


@pytest.mark.parametrize("case", ["clean", "drift"])
def test_torchrun_script_should_guard_every_rank(case, tmp_path):
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 0):
        pytest.skip(f"Debian 12's torch {torch.__version__} torchrun fails on Python 3.11 (docs/dumps.md): the torch2 tier runs it")
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(script), str(tmp_path), case, os.path.join(SRC, "python")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    reports = sorted(f.name for f in tmp_path.glob("guard-*.json"))
    if case == "clean":
        assert [r["steps"] for r in res] == [6, 6] and reports == ["guard-0.json", "guard-2.json", "guard-4.json"], (res, reports)
        assert all(json.loads((tmp_path / n).read_text())["result"] == "pass" for n in reports)
        return
    assert [r.get("step") for r in res] == [4, 4] and [r["steps"] for r in res] == [4, 4], res   # both ranks, at step 4
    assert all("step 4:" in r["finding"] and "2.bias" in r["finding"] and "rank 1" in r["finding"] for r in res), res
    rep = json.loads((tmp_path / "guard-4.json").read_text())
    assert rep["result"] == "fail" and rep["runs"][0]["guard"]["step"] == 4, rep["runs"][0]["guard"]
