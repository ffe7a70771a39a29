"""Issue 38 (D2) on real torch steps: each cause's first finding names the cause and its fix, and a look-alike
with another cause is not named as it.

- None on every rank: a wrapper that keeps the gradients in its own buffer (Megatron-style DDP: param.main_grad,
  .grad left None) against a graph really cut (a detach()), with and without such a wrapper;
- a gather whose backward keeps only this rank's slot (lightly's old GatherLayer, run's mode local) against
  one rank's wrong temperature, a per-rank normalised loss and dropout.

usage: GRADCHECK_DIST=build/gradcheck-dist python -m pytest -q tests/torch/test_causes_real.py
"""
import json
import math
import multiprocessing
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
from gradcheck_dist import GradcheckFailure, check_ddp, dump_grads, read_dump, run_check  # noqa: E402

WORLD = 2


@pytest.fixture(autouse=True, scope="module")
def binary():
    b = os.environ.get("GRADCHECK_DIST") or os.path.join(ROOT, "build", "gradcheck-dist")
    assert os.access(b, os.X_OK), f"gradcheck-dist binary not found at {b}: set GRADCHECK_DIST"
    os.environ["GRADCHECK_DIST"] = os.path.abspath(b)


def counting(report):
    return [f for f in report["runs"][0]["findings"] if f.get("counts")]


# ---- None on every rank: kept in the wrapper's buffer, or cut


class Small(torch.nn.Module):
    def __init__(self, cut=False):
        super().__init__()
        self.cut = cut
        self.trunk, self.head = torch.nn.Linear(6, 8), torch.nn.Linear(8, 1)

    def forward(self, x):
        h = torch.tanh(self.trunk(x))
        if self.cut and dist.is_initialized():   # the ranks cut the trunk off; the reference does not
            h = h.detach()
        return self.head(h).pow(2).mean()


class MainGradDDP(torch.nn.Module):
    """As Megatron's DistributedDataParallel keeps gradients: a hook on each parameter's AccumulateGrad node moves
    .grad into param.main_grad (a zeroed buffer of the wrapper's) and sets .grad to None; finish_grad_sync averages
    main_grad over the ranks. Nothing writes them back to .grad."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self._nodes = []
        for p in module.parameters():
            p.main_grad = torch.zeros_like(p)
            node = p.expand_as(p).grad_fn.next_functions[0][0]
            node.register_hook(self._move(p))
            self._nodes.append(node)   # kept alive, as Megatron keeps them

    @staticmethod
    def _move(p):
        def hook(*_):
            if p.grad is not None:
                p.main_grad.add_(p.grad.detach())
                p.grad = None
        return hook

    def forward(self, *a):
        return self.module(*a)

    def finish_grad_sync(self):
        for p in self.module.parameters():
            dist.all_reduce(p.main_grad)
            p.main_grad /= dist.get_world_size()


def _batch():
    return torch.randn(8, 6, generator=torch.Generator().manual_seed(3))


def _held_rank(rank, world, initfile, outdir, wrap, cut):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + initfile, rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = Small(cut)
        if wrap:
            model = MainGradDDP(model)
            model(_batch().chunk(world)[rank]).backward()
            model.finish_grad_sync()
            dump_grads(model.module, os.path.join(outdir, "reduced", f"rank{rank}.safetensors"))
        else:
            ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
            ddp(_batch().chunk(world)[rank]).backward()
            dump_grads(ddp, os.path.join(outdir, "reduced", f"rank{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


def held_step(tmp_path, wrap, cut):
    """The ranks' dumps (real gloo processes) and the single-process reference; check's (rc, report, text)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_held_rank, args=(r, WORLD, str(tmp_path / "init"), str(tmp_path), wrap, cut))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, f"rank exit {p.exitcode}"
    torch.manual_seed(0)
    ref = Small()
    ref(_batch()).backward()
    dump_grads(ref, tmp_path / "ref.safetensors", rank=0, world=1)
    return run_check(tmp_path / "reduced", ref=tmp_path / "ref.safetensors")


def test_main_grad_wrapper_should_be_named_as_the_buffer_not_a_cut(tmp_path):
    rc, report, text = held_step(tmp_path, wrap=True, cut=False)
    _, meta = read_dump(tmp_path / "reduced" / "rank0.safetensors")
    held = json.loads(meta["gradcheck.held"])
    assert set(held) == {"trunk.weight", "trunk.bias", "head.weight", "head.bias"}, held
    assert all(h["attr"] == "main_grad" and h["norm"] > 0 for h in held.values()), held
    assert rc == 1, text
    first = counting(report)[0]
    assert first["kind"] == "held", counting(report)
    words = " ".join(first["message"].split())
    assert "in the wrapper's own buffer (main_grad), never copied to .grad" in words, words
    assert "dump or step from main_grad" in words, words
    assert "cut the graph (" not in " ".join(f["message"] for f in counting(report)), counting(report)


def test_detach_should_be_named_a_cut_not_the_buffer(tmp_path):
    rc, report, text = held_step(tmp_path, wrap=False, cut=True)
    assert rc == 1, text
    first = counting(report)[0]
    assert first["kind"] == "none" and set(first["params"]) == {"trunk.weight", "trunk.bias"}, counting(report)
    assert "cut the graph" in first["message"] and "detach()" in first["message"], first
    assert "main_grad" not in text, text


def test_detach_under_a_main_grad_wrapper_should_be_a_cut_with_the_buffer_empty(tmp_path):
    """The wrapper's buffer exists but nothing reached it: recorded with norm 0, so still a cut."""
    rc, report, text = held_step(tmp_path, wrap=True, cut=True)
    assert rc == 1, text
    fs = counting(report)
    cut = [f for f in fs if set(f["params"]) >= {"trunk.weight", "trunk.bias"}]
    assert cut and cut[0]["kind"] == "none" and "cut the graph" in cut[0]["message"], fs
    assert "recorded and zero on every rank" in cut[0]["message"], cut[0]
    assert "nothing is learned" not in cut[0]["message"], cut[0]   # the head learns, from main_grad
    held = [f for f in fs if f["kind"] == "held"]
    assert held and set(held[0]["params"]) == {"head.weight", "head.bias"}, fs


def test_malformed_held_record_should_be_refused_naming_it(tmp_path):
    from gradcheck_dist import write_dump

    g = {"w": torch.ones(3)}
    write_dump(tmp_path / "ref.safetensors", g, ["w", "v"], "reduced", rank=0, world=1)
    for r in range(WORLD):
        write_dump(tmp_path / "d" / f"rank{r}.safetensors", g, ["w", "v"], "reduced", rank=r, world=WORLD,
                   extra_metadata={"gradcheck.held": json.dumps({"v": {"attr": "main_grad", "norm": "big"}})})
    rc, _, text = run_check(tmp_path / "d", ref=tmp_path / "ref.safetensors")
    assert rc == 2 and "gradcheck.held['v']" in text, (rc, text)


# ---- a gather whose backward keeps only this rank's slot (lightly's GatherLayer before its fix), and look-alikes

LIKE_LOCAL = "like a gather whose backward keeps only this rank's slot gives"


class GatherOwnSlot(torch.autograd.Function):
    """lightly's GatherLayer before its fix: all_gather forward; backward returns this rank's slot of the
    gradient only (the other ranks' gradients for its rows are dropped, nothing all-reduced)."""

    @staticmethod
    def forward(ctx, x):
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        return grads[dist.get_rank()].clone()


def _gather(x, own_slot):
    if not dist.is_initialized():
        return x
    if own_slot:
        return torch.cat(GatherOwnSlot.apply(x))
    from gradcheck_dist import all_gather_with_grad

    return all_gather_with_grad(x)


def _eye_rank(n):
    """lightly's dist.eye_rank: this rank's rows' own columns among the gathered ones."""
    if not dist.is_initialized():
        return torch.eye(n, dtype=torch.bool)
    r, w = dist.get_rank(), dist.get_world_size()
    m = torch.zeros(n, n * w, dtype=torch.bool)
    m[:, r * n:(r + 1) * n] = torch.eye(n, dtype=torch.bool)
    return m


class SimCLR(torch.nn.Module):
    """A backbone and a projection head under lightly's NTXentLoss(gather_distributed=True), temperature 0.5:
    every parameter is before the gather. how: "own_slot" (the bug), "fixed" (an autograd gather), "hot_rank"
    (rank 1 computes at temperature 1.0: the forward differs there), "per_rank_mean" (each rank normalises by
    its own count of weighted rows), "dropout" (p=0.1: the masks differ)."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.backbone, self.head = torch.nn.Linear(10, 32), torch.nn.Linear(32, 16)
        self.drop = torch.nn.Dropout(0.1 if how == "dropout" else 0.0)

    def forward(self, x0, x1):
        r = dist.get_rank() if dist.is_initialized() else 0
        t = 1.0 if self.how == "hot_rank" and r == 1 else 0.5
        embed = lambda x: F.normalize(self.head(self.drop(torch.relu(self.backbone(x)))), dim=1)  # noqa: E731
        out0, out1 = embed(x0), embed(x1)
        n, own = len(out0), self.how == "own_slot"
        big0, big1 = _gather(out0, own), _gather(out1, own)
        diag = _eye_rank(n)
        l00, l01 = out0 @ big0.T / t, out0 @ big1.T / t
        l10, l11 = out1 @ big0.T / t, out1 @ big1.T / t
        l00, l11 = l00[~diag].view(n, -1), l11[~diag].view(n, -1)
        logits = torch.cat([torch.cat([l01, l00], 1), torch.cat([l10, l11], 1)])
        labels = (torch.arange(n) + r * n).repeat(2)
        if self.how == "per_rank_mean":
            w = (x0[:, 0] > 0).float().repeat(2)
            return (w * F.cross_entropy(logits, labels, reduction="none")).sum() / w.sum()
        return F.cross_entropy(logits, labels)


def simclr_batch(seed=9, n=16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    return x + 0.1 * torch.randn(n, 10, generator=g), x + 0.1 * torch.randn(n, 10, generator=g)


def make_simclr_own_slot():
    return SimCLR("own_slot")


def make_simclr_fixed():
    return SimCLR("fixed")


def make_simclr_hot_rank():
    return SimCLR("hot_rank")


def make_simclr_per_rank_mean():
    return SimCLR("per_rank_mean")


def make_simclr_dropout():
    return SimCLR("dropout")


def step_pair(model, batch, rank, world):
    return model(*batch)


def verdict(make, world=WORLD, batch=None):
    try:
        return check_ddp(make, step_pair, simclr_batch() if batch is None else batch, world=world)
    except GradcheckFailure as e:
        return e.report


SIMCLR = {"backbone.weight", "backbone.bias", "head.weight", "head.bias"}


@pytest.mark.parametrize("world", [2, 4])
def test_gather_keeping_its_own_slot_should_be_one_finding_naming_it_and_the_fix(world):
    r = verdict(make_simclr_own_slot, world)
    fs = counting(r)
    assert len(fs) == 1, fs   # four tensors, one cause: one finding (before: four one-line mismatches)
    assert fs[0]["kind"] == "own_slot" and set(fs[0]["params"]) == SIMCLR, fs
    words = " ".join(fs[0]["message"].split())
    assert LIKE_LOCAL in words and "run's mode local" in words, words
    assert "torch.distributed.nn.functional.all_gather" in words, words   # the fix
    assert "mean loss" in words and "is the single-process objective" in words, words   # why: the forward is right


def test_fixed_gather_should_pass():
    r = verdict(make_simclr_fixed)
    assert not counting(r), counting(r)


@pytest.mark.parametrize("make", [make_simclr_hot_rank, make_simclr_per_rank_mean])
def test_look_alike_with_a_forward_that_differs_should_not_be_named_like_local(make):
    """A hotter temperature on rank 1 gives the same figures per tensor as the own-slot gather (cosine 0.99, the
    reference x0.75): the recorded losses show the forward differs, so it is not named so."""
    r = verdict(make)
    fs = counting(r)
    assert fs and all(f["kind"] == "mismatch" for f in fs), fs
    assert LIKE_LOCAL not in " ".join(" ".join(f["message"].split()) for f in fs), fs
    params = {p["name"]: p for p in r["runs"][0]["params"]}
    if make is make_simclr_hot_rank:   # the look-alike is close: its figures would pass the per-tensor test alone
        assert all(0 < params[n]["scale"] < 1 and params[n]["cosine"] > 0.98 for n in SIMCLR), params


def test_dropout_should_not_be_named_like_local():
    r = verdict(make_simclr_dropout)
    assert LIKE_LOCAL not in " ".join(" ".join(f["message"].split()) for f in r["runs"][0]["findings"]), r["runs"][0]["findings"]
    # nor anything else: the masks differ between the ranks and the references, so the difference follows the
    # reference without being a bug (before: head.weight "x0.785714", a false alarm); the report says it is insensitive
    assert not counting(r), counting(r)


class Clip(torch.nn.Module):
    """CLIP with a learned logit_scale after the gather; each rank's rows against every rank's (a local loss)."""

    def __init__(self, own_slot):
        super().__init__()
        self.own_slot = own_slot
        self.enc_i, self.enc_t = torch.nn.Linear(12, 24), torch.nn.Linear(10, 24)
        self.proj_i, self.proj_t = torch.nn.Linear(24, 8), torch.nn.Linear(24, 8)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, xi, xt):
        img = F.normalize(self.proj_i(torch.relu(self.enc_i(xi))), dim=-1)
        txt = F.normalize(self.proj_t(torch.relu(self.enc_t(xt))), dim=-1)
        n, r = len(img), dist.get_rank() if dist.is_initialized() else 0
        labels = torch.arange(n) + r * n
        s = self.logit_scale.exp()
        li, lt = s * img @ _gather(txt, self.own_slot).T, s * txt @ _gather(img, self.own_slot).T
        return (F.cross_entropy(li, labels) + F.cross_entropy(lt, labels)) / 2


def make_clip_own_slot():
    return Clip(True)


def clip_batch(seed=9, n=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=g), torch.randn(n, 10, generator=g)


def test_clip_own_slot_gather_should_name_logit_scale_as_after_it():
    r = verdict(make_clip_own_slot, batch=clip_batch())
    fs = counting(r)
    assert len(fs) == 1 and LIKE_LOCAL in " ".join(fs[0]["message"].split()), fs
    assert "logit_scale" not in fs[0]["params"] and len(fs[0]["params"]) == 8, fs
    assert "logit_scale matches the reference" in " ".join(fs[0]["message"].split()), fs


# ---- the same through Lightning (check_lightning: GradcheckDump records the losses too)


def _lit_simclr():
    from gradcheck_dist.lightning import lightning_package

    pl = lightning_package()

    class LitSimCLR(pl.LightningModule):
        def __init__(self, how):
            super().__init__()
            self.net = SimCLR(how)

        def training_step(self, batch, i):
            return self.net(*batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return LitSimCLR


def make_lit_own_slot():
    return _lit_simclr()("own_slot")


def make_lit_hot_rank():
    return _lit_simclr()("hot_rank")


def test_lightning_own_slot_gather_should_be_named_and_a_hot_rank_not():
    from gradcheck_dist import check_lightning

    with pytest.raises(GradcheckFailure) as e:
        check_lightning(make_lit_own_slot, simclr_batch, world=2)
    fs = counting(e.value.report)
    assert len(fs) == 1 and fs[0]["kind"] == "own_slot" and {p.split(".", 1)[1] for p in fs[0]["params"]} == SIMCLR, fs
    assert LIKE_LOCAL in " ".join(fs[0]["message"].split()), fs
    with pytest.raises(GradcheckFailure) as e:
        check_lightning(make_lit_hot_rank, simclr_batch, world=2)
    words = " ".join(" ".join(f["message"].split()) for f in counting(e.value.report))
    assert counting(e.value.report) and LIKE_LOCAL not in words, words
