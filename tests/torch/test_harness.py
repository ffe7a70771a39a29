"""gradcheck_dist.check_ddp / check_lightning on real gloo ranks, against the real `gradcheck-dist check`.

usage: GRADCHECK_DIST=build/gradcheck-dist /usr/bin/python3 -m pytest -q tests/torch/test_harness.py
Needs torch and pytorch-lightning==2.2.5 (see the README). Nothing is skipped: a missing torch,
Lightning or binary fails the tests that need it, with the reason.

The CLIP-like objective: each rank's loss is the symmetric contrastive loss over the gathered global
batch, so the DDP mean of the rank gradients is the gradient of the one-process loss on the whole
batch when (and only when) the gather carries gradients.
"""
import math
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python"))
import gradcheck_dist  # noqa: E402
from gradcheck_dist import GradcheckFailure, check_ddp, check_lightning  # noqa: E402
from doc_recipes import run_section  # noqa: E402  (tests/torch: pytest puts it on sys.path)

ENC = ["img.weight", "img.bias", "txt.weight", "txt.bias"]
B, DI, DT, E = 2, 6, 5, 4  # B samples per rank

# ---- plain PyTorch: the model, the gathers, the steps (top-level: the ranks are spawned processes)


class Clip(torch.nn.Module):
    """forward returns the loss, as a DDP model should: DDP finds unused parameters from its outputs."""

    def __init__(self, head=False):
        super().__init__()
        self.img, self.txt = torch.nn.Linear(DI, E), torch.nn.Linear(DT, E)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        if head:
            self.head = torch.nn.Linear(E, 2)  # forward never uses it

    def forward(self, x_img, x_txt, how):
        I, T, s = F.normalize(self.img(x_img), dim=-1), F.normalize(self.txt(x_txt), dim=-1), self.logit_scale.exp()
        if how == "local":  # open_clip local_loss=True, gather_with_grad=False: own rows against all columns
            Ia, Ta = gather(I, "nograd"), gather(T, "nograd")
            labels = torch.arange(I.shape[0]) + (dist.get_rank() if dist.is_initialized() else 0) * I.shape[0]
            return (F.cross_entropy(s * I @ Ta.T, labels) + F.cross_entropy(s * T @ Ia.T, labels)) / 2
        return clip_loss(s, gather(I, how), gather(T, how))


def make_clip():
    return Clip()


def make_clip_head():
    return Clip(head=True)


def gather(x, how):
    if not dist.is_initialized():  # world 1, the reference: the batch is already the global one
        return x
    if how == "grad":
        import torch.distributed.nn.functional as dnn

        return torch.cat(dnn.all_gather(x))
    with torch.no_grad():
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
    if how == "own":
        out[dist.get_rank()] = x
    return torch.cat(out)


def clip_loss(s, Ia, Ta):
    logits, labels = s * Ia @ Ta.T, torch.arange(Ia.shape[0])
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def step_grad(model, batch, rank, world):  # torch.distributed.nn.functional.all_gather
    return model(*batch, "grad")


def step_nograd(model, batch, rank, world):  # Lightning all_gather(sync_grads=False)
    return model(*batch, "nograd")


def step_own(model, batch, rank, world):  # open_clip gather_with_grad=False / torchmetrics: own slot back
    return model(*batch, "own")


def step_local_loss(model, batch, rank, world):  # open_clip local_loss=True, gather_with_grad=False
    return model(*batch, "local")


def batch_for(world):
    g = torch.Generator().manual_seed(1)
    return torch.randn(world * B, DI, generator=g), torch.randn(world * B, DT, generator=g)


def statuses(report):
    return {p["name"]: p["status"] for p in report["runs"][0]["params"]}


def failing(make_model, step, world):
    with pytest.raises(GradcheckFailure) as e:
        check_ddp(make_model, step, batch_for(world), world=world)
    return e.value


@pytest.fixture(autouse=True, scope="module")
def binary():
    b = os.environ.get("GRADCHECK_DIST") or os.path.join(os.path.dirname(__file__), "..", "..", "build", "gradcheck-dist")
    assert os.access(b, os.X_OK), f"gradcheck-dist binary not found at {b}: set GRADCHECK_DIST"
    os.environ["GRADCHECK_DIST"] = os.path.abspath(b)


@pytest.mark.parametrize("world", [2, 4])
def test_gather_with_grad_should_match_reference(world):
    report = check_ddp(make_clip, step_grad, batch_for(world), world=world)
    assert set(statuses(report).values()) == {"ok"}, statuses(report)
    assert report["runs"][0]["world"] == world


@pytest.mark.parametrize("world", [2, 4])
def test_gather_without_grad_should_leave_encoders_none(world):
    e = failing(make_clip, step_nograd, world)
    assert statuses(e.report) == dict({n: "none" for n in ENC}, logit_scale="ok")
    assert "logit_scale" in str(e)


def test_own_slot_should_scale_encoders_by_one_over_world():
    e = failing(make_clip, step_own, 4)
    assert statuses(e.report) == dict({n: "scaled" for n in ENC}, logit_scale="ok")
    scales = [p["scale"] for p in e.report["runs"][0]["params"] if p["name"] in ENC]
    assert all(abs(c - 0.25) < 1e-5 for c in scales), scales


def test_local_loss_without_grad_should_mismatch():
    e = failing(make_clip, step_local_loss, 4)
    st = statuses(e.report)
    assert all(st[n] == "mismatch" for n in ENC) and st["logit_scale"] == "ok", st


def test_unused_head_should_be_none():
    # None on every rank and in the reference too: unused by the loss, a note and no failure (issue 24: 3)
    report = check_ddp(make_clip_head, step_grad, batch_for(4), world=4)
    assert statuses(report) == dict({n: "ok" for n in ENC}, logit_scale="ok", **{"head.weight": "none", "head.bias": "none"})


def test_ignore_should_leave_the_head_out():
    report = check_ddp(make_clip_head, step_grad, batch_for(2), world=2, ignore=["head.*"])
    assert "head.weight" not in statuses(report) or statuses(report)["head.weight"] != "none"


# ---- Lightning (pytorch-lightning 2.2.5): self.all_gather with and without sync_grads


try:
    import pytorch_lightning as pl

    LightningModule, LIGHTNING_ERROR = pl.LightningModule, None
except ImportError as err:  # the Lightning tests fail with this reason, never skip
    LightningModule, LIGHTNING_ERROR = torch.nn.Module, err


class LitClip(LightningModule):
    def __init__(self, sync_grads):
        super().__init__()
        self.img, self.txt = torch.nn.Linear(DI, E), torch.nn.Linear(DT, E)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.sync_grads = sync_grads

    def gathered(self, x):
        if self.sync_grads is None:
            y = self.all_gather(x)  # the default: sync_grads=False
        else:
            y = self.all_gather(x, sync_grads=self.sync_grads)
        return y.flatten(0, 1) if y.dim() == x.dim() + 1 else y  # (world, B, E) under DDP

    def training_step(self, batch, batch_idx):
        x_img, x_txt = batch
        I, T = F.normalize(self.img(x_img), dim=-1), F.normalize(self.txt(x_txt), dim=-1)
        return clip_loss(self.logit_scale.exp(), self.gathered(I), self.gathered(T))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def make_lit_default():
    return LitClip(None)


def make_lit_sync():
    return LitClip(True)


def make_lit_batch():
    return batch_for(4)


def test_lightning_all_gather_default_should_fail():
    assert LIGHTNING_ERROR is None, f"pytorch-lightning cannot be imported: {LIGHTNING_ERROR}"
    with pytest.raises(GradcheckFailure) as e:
        check_lightning(make_lit_default, make_lit_batch, world=4)
    assert statuses(e.value.report) == dict({n: "none" for n in ENC}, logit_scale="ok")
    assert e.value.report["runs"][0]["dumps"][0]["metadata"].get("gradcheck.lightning") == pl.__version__


def test_lightning_all_gather_sync_grads_should_pass():
    assert LIGHTNING_ERROR is None, f"pytorch-lightning cannot be imported: {LIGHTNING_ERROR}"
    report = check_lightning(make_lit_sync, make_lit_batch, world=4)
    assert set(statuses(report).values()) == {"ok"}, statuses(report)


def test_snippet_should_name_both_recipes():
    s = gradcheck_dist.snippet()
    assert "dump_grads" in s and "GradcheckDump" in s and "gradcheck-dist check" in s and "track(" in s and "ref-permuted" in s and len(s.splitlines()) == 10


def test_check_ddp_should_leave_no_torch_temporaries():
    # issue 33: every rank imports torch.distributed.nn, whose jit instantiator makes a temporary directory
    # that only interpreter exit removes; a multiprocessing child never gets there (os._exit), so each rank of
    # each call left one (in the temporary folder it was started with, /tmp once that one was gone)
    import glob
    import tempfile

    def torch_temporaries():
        return {p for root in {tempfile.gettempdir(), os.environ.get("TMPDIR", "/tmp"), "/tmp"}
                for p in glob.glob(os.path.join(root, "tmp*", "_remote_module_non_scriptable.py"))}

    before = torch_temporaries()
    for start_method in (None, "spawn"):
        check_ddp(make_clip, step_grad, batch_for(2), world=2, start_method=start_method)
    left = torch_temporaries() - before
    assert not left, f"check_ddp's ranks left torch's temporary directories: {sorted(left)}"


def test_spawned_ranks_should_work_too():
    report = check_ddp(make_clip, step_grad, batch_for(2), world=2, start_method="spawn")
    assert set(statuses(report).values()) == {"ok"}, statuses(report)


# ---- issue 38: gradient accumulation (check_ddp(..., accumulate=K)), as docs/python.md writes it

def make_mlp():
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def step_mean(model, batch, rank, world):  # one micro-batch's loss: a mean over its rows
    x, y = batch
    return F.mse_loss(model(x).squeeze(-1), y)


def step_sum(model, batch, rank, world):  # summed over rows: the reference sums the whole batch
    x, y = batch
    return ((model(x).squeeze(-1) - y) ** 2).sum()


def mlp_batch():
    g = torch.Generator().manual_seed(2)
    return torch.randn(16, 6, generator=g), torch.randn(16, generator=g)


def test_accumulation_recipe_in_python_md_as_written():
    (line, report), = run_section("Gradient accumulation", globals())   # the doc's step_mean, its "# passes"
    assert "accumulate=2" in line and report["result"] == "pass", report["result"]


def test_accumulate_should_show_a_summed_loss_divided_by_world_and_k():
    with pytest.raises(GradcheckFailure) as e:
        check_ddp(make_mlp, step_sum, mlp_batch(), world=2, accumulate=2)
    scales = [p["scale"] for p in e.value.report["runs"][0]["params"]]
    assert all(abs(c - 0.25) < 1e-4 for c in scales), scales   # 1/(world x K): the micro-batches' 1/K too
    first = e.value.report["runs"][0]["findings"][0]["message"]   # named from gradcheck.accumulate and the losses
    assert "(= 1/(world x 2 accumulation steps)): a loss summed over rows" in first, first
    assert "Fix: average each micro-batch's loss over its rows" in first and "divided by 4 gradient" not in first, first


def step_mean_quarter(model, batch, rank, world):  # a mean divided by 4 itself: x1/4 against the undivided objective
    return step_mean(model, batch, rank, world) / 4


def test_accumulate_should_not_call_a_divided_mean_a_summed_loss():
    with pytest.raises(GradcheckFailure) as e:   # the same x0.25, but each rank's loss is not its rows' sum
        check_ddp(make_mlp, step_mean_quarter, mlp_batch(), world=2, accumulate=2,
                  reference=lambda model, batch: step_mean(model, batch, 0, 1) / 2)
    first = e.value.report["runs"][0]["findings"][0]["message"]
    assert "x0.5 (= 1/2, the accumulation steps check_ddp ran)" in first, first   # what the losses show: an extra 1/K
    assert "world): a loss summed over rows" not in first and "steps)): a loss summed" not in first, first


def test_accumulate_should_refuse_what_is_not_a_count():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="accumulate"):
            check_ddp(make_mlp, step_mean, mlp_batch(), world=2, accumulate=bad)


# ---- issue 38: a rank that skips the synced backward is a finding naming it, not a harness error after the timeout

def step_skip_rank1(model, batch, rank, world):  # rank 1 has "no data" this step and skips its backward
    return None if rank == 1 else step_mean(model, batch, rank, world)


def step_raise_rank1(model, batch, rank, world):  # a rank that fails is a harness error, not this finding
    if rank == 1:
        raise RuntimeError("rank 1's data loader failed")
    return step_mean(model, batch, rank, world)


def test_a_rank_that_skips_the_backward_should_be_named_at_once():
    import time

    t0 = time.monotonic()
    (line, e), = run_section("A rank that skips the synced backward", globals())   # docs/python.md, as written
    assert time.monotonic() - t0 < 60, "waited for the timeout"
    assert "timeout=120" in line and "every rank runs the synced backward" in str(e), str(e)
    assert e.report["runs"][0]["findings"][0]["ranks"] == [1]


def test_a_rank_that_raises_should_stay_a_harness_error():
    from gradcheck_dist.harness import HarnessError

    with pytest.raises(HarnessError) as e:
        check_ddp(make_mlp, step_raise_rank1, mlp_batch(), world=2, timeout=120)
    assert "never joined" not in str(e.value) and "data loader failed" in str(e.value)
