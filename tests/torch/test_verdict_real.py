"""Issue 32 on real torch steps: what `check` must catch (misses) and must pass (false alarms), each case as
users train, through check_ddp / check_lightning / dump_grads and the real binary.

usage: GRADCHECK_DIST=build/gradcheck-dist python -m pytest -q -rs tests/torch/test_verdict_real.py
Registered twice (tests/CMakeLists.txt): under Debian's torch 1.13 (.venv) and under PyPI's torch 2.x
(.venv-torch2, through tests/zoo/run.sh, where a skip fails). A case whose API torch 1.13 lacks (gloo all-reduce
of bf16, a CPU GradScaler) is skipped there only, with the reason printed (-rs); on torch 2.x nothing skips.

Findings are read from the JSON report (kinds: none, partial, zero, nonfinite, disagree, scaled, mismatch,
local_none, ran_none, undecided; notes have counts false) and their words.
"""
import contextlib
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
from gradcheck_dist import GradcheckFailure, check_ddp, check_lightning, read_dump, run_check, write_dump  # noqa: E402

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
SEEDS = [0, 1, 2]


def torch2_only(why):
    """A case that needs torch 2.x: skipped, with the reason printed, on torch 1.13 only."""
    if not TORCH2:
        pytest.skip(f"torch2 only ({why}); torch {torch.__version__} here: runs in the torch2 tier")


@pytest.fixture(autouse=True, scope="module")
def binary():
    b = os.environ.get("GRADCHECK_DIST") or os.path.join(ROOT, "build", "gradcheck-dist")
    assert os.access(b, os.X_OK), f"gradcheck-dist binary not found at {b}: set GRADCHECK_DIST"
    os.environ["GRADCHECK_DIST"] = os.path.abspath(b)


def findings(report):
    return report["runs"][0]["findings"]


def counting(report):
    return [f for f in findings(report) if f.get("counts")]


def notes(report):
    return [f for f in findings(report) if not f.get("counts")]


def fails(*args, **kw):
    """check_ddp(...) that must find something: the GradcheckFailure's report."""
    with pytest.raises(GradcheckFailure) as e:
        check_ddp(*args, **kw)
    return e.value.report


def kinds_of(report, name):
    return [f["kind"] for f in counting(report) if name in f.get("params", [])]


def text_of(report):
    return "\n".join(f["message"] for f in findings(report))


# ---- a trunk with a small head: the head's gradient is ~1e-2 of the trunk's


class Headed(torch.nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)
        self.head = torch.nn.Linear(16, 2)
        self.to(dtype)

    def forward(self, x, y):
        h = torch.tanh(self.l1(x.to(self.l1.weight.dtype)))
        out = self.l2(h)
        main = F.mse_loss(out.float(), y)
        aux = self.head(out).float().pow(2).mean()
        return main + 1e-4 * aux   # the head's gradient: ~1e-4 of the trunk's


def make_headed():
    return Headed()


def make_headed_bf16():
    return Headed(torch.bfloat16)


def headed_batch(n=16, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g), torch.randn(n, 16, generator=g)


def _distort_after_reduce(model, names, how):
    """A DDP comm hook: the all-reduce (mean over ranks) as DDP does it, then `how` applied to the reduced
    gradient of the parameters `names` on every rank: the bug is after the all-reduce."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel) or getattr(model, "_gcd_hooked", False):
        return
    model._gcd_hooked = True
    ids = {id(p): n for n, p in model.module.named_parameters() if n in names}

    def hook(state, bucket):
        buf = bucket.buffer()
        buf.div_(dist.get_world_size())
        fut = dist.all_reduce(buf, async_op=True).get_future()
        params = bucket.parameters()

        def then(f):
            out = f.value()[0]
            off = 0
            for p in params:
                n = p.numel()
                if id(p) in ids:
                    how(out[off:off + n])
                off += n
            return out
        return fut.then(then)

    model.register_comm_hook(None, hook)


def _zero(t):
    t.zero_()


def _negate(t):
    t.neg_()


def _off_by_0p3(t):  # 0.3 % of the gradient's norm, in a direction of its own (not a scale)
    g = torch.Generator().manual_seed(11)
    tf = t.float().reshape(-1)
    d = torch.randn(tf.shape, generator=g)
    d = d - (d @ tf) / tf.norm().pow(2).clamp_min(1e-30) * tf
    t.add_((d * (0.003 * tf.norm() / d.norm())).reshape(t.shape).to(t.dtype))


HEAD = ("head.weight", "head.bias")


def step_autocast_zero_head(model, batch, rank, world):
    _distort_after_reduce(model, HEAD, _zero)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(*batch)


def step_autocast_negate_head(model, batch, rank, world):
    _distort_after_reduce(model, HEAD, _negate)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(*batch)


def step_plain_zero_head(model, batch, rank, world):
    _distort_after_reduce(model, HEAD, _zero)
    return model(*batch)


def step_plain_negate_head(model, batch, rank, world):
    _distort_after_reduce(model, HEAD, _negate)
    return model(*batch)


def step_autocast(model, batch, rank, world):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(*batch)


def step_plain(model, batch, rank, world):
    return model(*batch)


# ---- misses: bf16 hides a small head zeroed or negated after the all-reduce


def test_bf16_autocast_head_zeroed_after_allreduce_should_be_zero():
    r = fails(make_headed, step_autocast_zero_head, headed_batch(), world=2)
    assert "zero" in kinds_of(r, "head.weight"), counting(r)
    assert "head.weight" in json.dumps(counting(r))


def test_bf16_autocast_head_negated_after_allreduce_should_be_named_negated():
    r = fails(make_headed, step_autocast_negate_head, headed_batch(), world=2)
    assert "mismatch" in kinds_of(r, "head.weight"), counting(r)
    assert "negated" in text_of(r) or "pointing away" in text_of(r), text_of(r)


def test_bf16_params_head_zeroed_after_allreduce_should_be_zero():
    torch2_only("gloo's all-reduce of bfloat16 parameters: 'Invalid scalar type' on torch 1.13")
    r = fails(make_headed_bf16, step_plain_zero_head, headed_batch(), world=2)
    assert "zero" in kinds_of(r, "head.weight"), counting(r)


def test_bf16_params_head_negated_after_allreduce_should_be_named_negated():
    torch2_only("gloo's all-reduce of bfloat16 parameters: 'Invalid scalar type' on torch 1.13")
    r = fails(make_headed_bf16, step_plain_negate_head, headed_batch(), world=2)
    assert "mismatch" in kinds_of(r, "head.weight"), counting(r)
    assert "negated" in text_of(r) or "pointing away" in text_of(r), text_of(r)


@pytest.mark.parametrize("seed", SEEDS)
def test_bf16_autocast_correct_step_should_pass(seed):
    report = check_ddp(make_headed, step_autocast, headed_batch(seed=seed), world=2, seed=seed)
    assert not counting(report), counting(report)


# ---- misses: one BF16 tensor must not loosen the F32 ones


class Mixed(torch.nn.Module):
    """Every parameter F32 but `emb`'s, stored BF16 (a user's half embedding)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Linear(16, 16).to(torch.bfloat16)
        self.l1, self.out = torch.nn.Linear(16, 32), torch.nn.Linear(32, 1)

    def forward(self, x, y):
        h = self.emb(x.to(torch.bfloat16)).float()
        return F.mse_loss(self.out(torch.tanh(self.l1(h))).squeeze(-1), y)


def make_mixed():
    return Mixed()


def mixed_batch():
    g = torch.Generator().manual_seed(6)
    return torch.randn(16, 16, generator=g), torch.randn(16, generator=g)


def step_mixed_l1_off(model, batch, rank, world):
    _distort_after_reduce(model, ("l1.weight",), _off_by_0p3)
    return model(*batch)


def step_mixed(model, batch, rank, world):
    return model(*batch)


def test_one_bf16_tensor_should_not_loosen_an_f32_tensor_0p3_percent_wrong():
    torch2_only("gloo's all-reduce of a bfloat16 parameter: 'Invalid scalar type' on torch 1.13")
    r = fails(make_mixed, step_mixed_l1_off, mixed_batch(), world=2)
    assert kinds_of(r, "l1.weight"), counting(r)
    assert not any(k for n in ("l1.bias", "out.weight", "out.bias") for k in kinds_of(r, n)), counting(r)


def test_one_bf16_tensor_correct_step_should_pass():
    torch2_only("gloo's all-reduce of a bfloat16 parameter: 'Invalid scalar type' on torch 1.13")
    report = check_ddp(make_mixed, step_mixed, mixed_batch(), world=2)
    assert not counting(report), counting(report)


def test_bf16_label_on_one_file_should_not_loosen_an_f32_tensor(tmp_path):
    """Hand-made from a real step: an F32 tensor 0.3 % wrong, and only one rank's file says
    gradcheck.precision=bf16: the claims disagree (exit 2, naming the files), or the tensor is a finding."""
    torch.manual_seed(0)
    model = make_headed()
    model(*headed_batch()).backward()
    names = [n for n, _ in model.named_parameters()]
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    for i, path in enumerate(("ref.safetensors", "ref-permuted.safetensors")):
        write_dump(tmp_path / path, grads, names, "reduced", rank=0, world=1, precision="fp32",
                   extra_metadata={"gradcheck.order": "permuted"} if i else None)
    wrong = dict(grads)
    w = wrong["l1.weight"].clone()
    _off_by_0p3(w)
    wrong["l1.weight"] = w
    for r in range(2):
        write_dump(tmp_path / "d" / f"rank{r}.safetensors", wrong, names, "reduced", rank=r, world=2,
                   precision="bf16" if r == 0 else "fp32")
    rc, report, text = run_check(tmp_path / "d", ref=[tmp_path / "ref.safetensors", tmp_path / "ref-permuted.safetensors"])
    if rc == 2:
        assert "bf16" in text and "rank0" in text, text
    else:
        assert rc == 1 and report is not None and kinds_of(report, "l1.weight"), (rc, text)


# ---- misses: HSDP, two replicas of one shard that differ


def test_hsdp_replicas_that_differ_should_disagree(tmp_path):
    """A real step's gradients written as HSDP writes them: a 2 x 2 mesh (replicate, shard), ranks 0/1 shard
    the rows, ranks 2/3 hold the same runs again; rank 1's copy is wrong."""
    torch.manual_seed(0)
    model = make_headed()
    model(*headed_batch()).backward()
    names = [n for n, _ in model.named_parameters()]
    full = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    for i, path in enumerate(("ref.safetensors", "ref-permuted.safetensors")):
        write_dump(tmp_path / path, full, names, "reduced", rank=0, world=1, precision="fp32",
                   extra_metadata={"gradcheck.order": "permuted"} if i else None)
    for r in range(4):
        s = r % 2
        grads, shards = {}, {}
        for n, g in full.items():
            flat = g.reshape(-1)
            half = -(-flat.numel() // 2)
            run = flat[s * half:(s + 1) * half].clone()
            if r == 1 and n == "l1.weight":   # read first: a "last wins" reader keeps rank 3's good copy
                run[::3] *= -1.0
            grads[n] = run
            shards[n] = {"shape": list(g.shape), "start": s * half}
        write_dump(tmp_path / "d" / f"rank{r}.safetensors", grads, names, "reduced", rank=r, world=4,
                   precision="fp32", shards=shards)
    rc, report, text = run_check(tmp_path / "d", ref=[tmp_path / "ref.safetensors", tmp_path / "ref-permuted.safetensors"])
    assert rc == 1 and report is not None, (rc, text)
    assert "disagree" in kinds_of(report, "l1.weight"), counting(report)


# ---- misses: LoRA adapters inside a reentrant checkpoint


class LoraBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.base = torch.nn.Linear(8, 8)
        self.base.requires_grad_(False)     # frozen base weights
        self.lora_a, self.lora_b = torch.nn.Linear(8, 2, bias=False), torch.nn.Linear(2, 8, bias=False)
        torch.nn.init.normal_(self.lora_b.weight, std=0.1)

    def forward(self, x):
        return torch.tanh(self.base(x) + self.lora_b(self.lora_a(x)))


class Lora(torch.nn.Module):
    """4 of 6 trainable tensors are LoRA adapters inside checkpoint; the input does not require grad."""

    def __init__(self, reentrant):
        super().__init__()
        self.blocks = torch.nn.ModuleList([LoraBlock(), LoraBlock()])
        self.head = torch.nn.Linear(8, 1)
        self.reentrant = reentrant

    def forward(self, x, y):
        from torch.utils.checkpoint import checkpoint

        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=self.reentrant)
        return F.mse_loss(self.head(x).squeeze(-1), y)


def make_lora_reentrant():
    return Lora(True)


def make_lora_plain():
    return Lora(False)


def lora_batch():
    g = torch.Generator().manual_seed(7)
    return torch.randn(8, 8, generator=g), torch.randn(8, generator=g)


def test_lora_in_reentrant_checkpoint_should_be_ran_none():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = fails(make_lora_reentrant, step_plain, lora_batch(), world=2)
    lora = ["blocks.0.lora_a.weight", "blocks.0.lora_b.weight", "blocks.1.lora_a.weight", "blocks.1.lora_b.weight"]
    for n in lora:
        assert "ran_none" in kinds_of(r, n), (n, counting(r))
    ran_none = " ".join(f["message"] for f in counting(r) if f["kind"] == "ran_none")
    assert "use_reentrant" in ran_none and "checkpoint" in ran_none, ran_none


def test_lora_in_plain_checkpoint_should_pass():
    report = check_ddp(make_lora_plain, step_plain, lora_batch(), world=2)
    assert not counting(report), counting(report)


class WithUnused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(6, 1)
        self.spare = torch.nn.Linear(6, 1)   # never called

    def forward(self, x, y):
        return F.mse_loss(self.l1(x).squeeze(-1), y)


def make_with_unused():
    return WithUnused()


def test_parameter_whose_module_never_ran_should_stay_a_note():
    g = torch.Generator().manual_seed(8)
    report = check_ddp(make_with_unused, step_plain, (torch.randn(8, 6, generator=g), torch.randn(8, generator=g)),
                       world=2)
    assert not counting(report), counting(report)
    assert any("spare.weight" in f.get("params", []) or "spare" in f["message"] for f in notes(report)), findings(report)


# ---- false alarms: fp32 CLIP / SimCLR, a projector Linear with bias right before F.normalize


class Proj(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc_i, self.enc_t = torch.nn.Linear(12, 24), torch.nn.Linear(10, 24)
        self.proj_i, self.proj_t = torch.nn.Linear(24, 8), torch.nn.Linear(24, 8)   # bias, then F.normalize
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, xi, xt):
        from gradcheck_dist import all_gather_with_grad

        I = F.normalize(self.proj_i(torch.relu(self.enc_i(xi))), dim=-1)
        T = F.normalize(self.proj_t(torch.relu(self.enc_t(xt))), dim=-1)
        if dist.is_initialized():   # float: gloo on torch 1.13 cannot all-gather bf16 (bf16-mixed)
            I, T = all_gather_with_grad(I.float()), all_gather_with_grad(T.float())
        logits, labels = self.logit_scale.exp() * I @ T.T, torch.arange(len(I))
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def make_proj():
    return Proj()


def proj_batch(seed=9, n=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=g), torch.randn(n, 10, generator=g)


@pytest.mark.parametrize("seed", SEEDS)
def test_clip_projector_bias_before_normalize_should_pass(seed):
    report = check_ddp(make_proj, step_plain, proj_batch(seed), world=2, seed=seed)
    assert not counting(report), counting(report)
    params = {p["name"]: p for p in report["runs"][0]["params"]}
    assert params["proj_i.bias"]["status"] == "ok" and params["proj_t.bias"]["status"] == "ok", params["proj_i.bias"]


def test_report_should_give_each_tensor_its_tolerance_and_the_sensitivity():
    """Two references: the tolerance used says where it came from (the claimed one, or k x the noise where that is
    larger); the noise is measured (a number) wherever the claimed tolerance did not pass the tensor by itself
    (only there is the second reference read); one reference: claimed, no noise."""
    report = check_ddp(make_proj, step_plain, proj_batch(), world=2)
    for p in report["runs"][0]["params"]:
        assert isinstance(p.get("tol"), (int, float)) and p["tol"] > 0, p
        assert p.get("tol_source") in ("measured", "claimed"), p
        assert p["noise"] is None or isinstance(p["noise"], (int, float)), p
        if p["tol_source"] == "measured" or p["rel_err"] > p["tol"]:
            assert isinstance(p.get("noise"), (int, float)), p
    run = report["runs"][0]
    assert "sensitivity" in run or "sensitivity" in report, list(run)
    one = check_ddp(make_proj, step_plain, proj_batch(), world=2, references=1)
    for p in one["runs"][0]["params"]:
        assert p.get("tol_source") == "claimed" and p.get("noise") is None, p


# ---- false alarms: a Linear bias feeding BatchNorm (true gradient exactly 0)


class BiasBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.bn, self.out = torch.nn.Linear(10, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 1)

    def forward(self, x, y):
        return F.mse_loss(self.out(torch.relu(self.bn(self.l1(x)))).squeeze(-1), y)


def make_bias_bn():
    return BiasBN()


def bn_same_stats_batch(world, seed=10, per=8):
    """Every rank's slice is the same rows: each rank's BatchNorm statistics are the whole batch's, so DDP's
    per-rank normalisation is the one-process step's (the honest setting for this false alarm; otherwise plain
    BatchNorm is a real difference, see test_plain_batchnorm_should_give_one_hint)."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(per, 10, generator=g), torch.randn(per, generator=g)
    return torch.cat([x] * world), torch.cat([y] * world)


@pytest.mark.parametrize("seed", SEEDS)
def test_linear_bias_before_batchnorm_should_pass(seed):
    report = check_ddp(make_bias_bn, step_plain, bn_same_stats_batch(2, 10 + seed), world=2, seed=seed)
    assert not counting(report), counting(report)


class BiasCentred(torch.nn.Module):
    """A Linear bias feeding a centring over the batch (what BatchNorm does first, without a BatchNorm module):
    the bias's true gradient is exactly 0; what the ranks and the reference hold there is rounding."""

    def __init__(self):
        super().__init__()
        self.l1, self.out = torch.nn.Linear(10, 16), torch.nn.Linear(16, 1)

    def forward(self, x, y):
        h = self.l1(x)
        return F.mse_loss(self.out(torch.relu(h - h.mean(0, keepdim=True))).squeeze(-1), y)


def make_bias_centred():
    return BiasCentred()


@pytest.mark.parametrize("seed", SEEDS)
def test_bias_with_zero_true_gradient_should_pass_with_two_references(seed):
    report = check_ddp(make_bias_centred, step_plain, bn_same_stats_batch(2, 20 + seed), world=2, seed=seed)
    assert not counting(report), counting(report)


def test_bias_with_zero_true_gradient_and_one_reference_should_be_undecided():
    r = fails(make_bias_centred, step_plain, bn_same_stats_batch(2, 20), world=2, references=1)
    assert "undecided" in kinds_of(r, "l1.bias"), counting(r)
    assert "second reference" in text_of(r), text_of(r)


def test_plain_batchnorm_should_give_one_hint():
    g = torch.Generator().manual_seed(12)
    r = fails(make_bias_bn, step_plain, (torch.randn(16, 10, generator=g), torch.randn(16, generator=g)), world=2)
    assert "SyncBatchNorm" in text_of(r), text_of(r)
    assert len(counting(r)) == 1, counting(r)


# ---- false alarms: dropout (the ranks and the reference draw different masks)


class Dropped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.drop, self.out = torch.nn.Linear(10, 32), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1)

    def forward(self, x, y):
        return F.mse_loss(self.out(self.drop(torch.relu(self.l1(x)))).squeeze(-1), y)


def make_dropped():
    return Dropped()


def test_dropout_should_pass_and_say_insensitive_naming_the_layer():
    g = torch.Generator().manual_seed(13)
    report = check_ddp(make_dropped, step_plain, (torch.randn(16, 10, generator=g), torch.randn(16, generator=g)),
                       world=2)
    assert not counting(report), counting(report)
    said = " ".join(f["message"] for f in notes(report))
    assert "insensitive" in said and "drop (Dropout p=0.1)" in said, said


def test_dropout_layers_should_be_recorded_in_the_dumps(tmp_path):
    g = torch.Generator().manual_seed(13)
    with contextlib.suppress(GradcheckFailure):   # the dumps are the point here, not the verdict
        check_ddp(make_dropped, step_plain, (torch.randn(16, 10, generator=g), torch.randn(16, generator=g)), world=2,
                  workdir=tmp_path)
    _, meta = read_dump(tmp_path / "reduced" / "rank0.safetensors")
    assert json.loads(meta["gradcheck.nondeterministic"]) == ["drop (Dropout p=0.1)"], meta
    assert set(json.loads(meta["gradcheck.ran"])) == {"l1.weight", "l1.bias", "out.weight", "out.bias"}, meta
    _, meta = read_dump(tmp_path / "ref-permuted.safetensors")
    assert meta.get("gradcheck.order") == "permuted", meta


# ---- false alarms: GradScaler dumped before unscale_ is a loss scale, said so


def step_scaled(model, batch, rank, world):
    loss = model(*batch)
    if world == 1:
        return loss
    return torch.amp.GradScaler("cpu").scale(loss)   # dumped before scaler.unscale_: x65536


def test_gradscaler_before_unscale_should_be_scaled_x65536_naming_unscale():
    torch2_only("torch.amp.GradScaler('cpu'): torch 1.13's GradScaler is CUDA-only (disabled on CPU)")
    r = fails(make_headed, step_scaled, headed_batch(), world=2)
    assert "scaled" in kinds_of(r, "l1.weight"), counting(r)
    t = text_of(r)
    assert "x65536" in t and "unscale_" in t, t


# ---- hints: accumulation, a plain all_gather


def step_accumulate_undivided(model, batch, rank, world):
    """K = 2 micro-batches under no_sync, each loss undivided: the ranks' gradient is K x the reference's."""
    if world == 1:
        return model(*batch)
    halves = [tuple(t.chunk(2)[i] for t in batch) for i in range(2)]
    quiet = model.no_sync if hasattr(model, "no_sync") else contextlib.nullcontext
    with quiet():
        model(*halves[0]).backward()
    return model(*halves[1])


def test_accumulation_without_dividing_should_name_the_accumulation_steps():
    r = fails(make_headed, step_accumulate_undivided, headed_batch(), world=4)
    assert "scaled" in kinds_of(r, "l1.weight"), counting(r)
    assert "accumulat" in text_of(r), text_of(r)


class PlainGather(Proj):
    def forward(self, xi, xt):
        I = F.normalize(self.proj_i(torch.relu(self.enc_i(xi))), dim=-1)
        T = F.normalize(self.proj_t(torch.relu(self.enc_t(xt))), dim=-1)
        if dist.is_initialized():
            def gather(x):
                out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
                dist.all_gather(out, x.contiguous())    # no autograd
                return torch.cat(out)
            I, T = gather(I), gather(T)
        logits, labels = self.logit_scale.exp() * I @ T.T, torch.arange(len(I))
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def make_plain_gather():
    return PlainGather()


def test_plain_all_gather_should_point_at_the_autograd_gather():
    r = fails(make_plain_gather, step_plain, proj_batch(), world=2)
    assert "none" in kinds_of(r, "enc_i.weight"), counting(r)
    assert "torch.distributed.nn.functional.all_gather" in text_of(r), text_of(r)


# ---- the README's recipe under bf16 autocast, as written (clip_step.py --autocast bf16)


def test_readme_recipe_under_bf16_autocast_should_pass(tmp_path):
    ex = os.path.join(ROOT, "python", "examples", "clip_step.py")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), GLOO_SOCKET_IFNAME="lo")
    for args in (["--world", "2", "--out", "dumps"], ["--out", "ref"]):
        p = subprocess.run([sys.executable, ex, *args, "--autocast", "bf16"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
    _, meta = read_dump(tmp_path / "dumps" / "rank0.safetensors")
    assert meta["gradcheck.precision"] == "bf16", meta
    rc, report, text = run_check(tmp_path / "dumps", ref=tmp_path / "ref" / "rank0.safetensors", references=2)
    assert rc == 0, text


# ---- Lightning 2.x: the ranks get the reference's rows; precision and accumulation


def _lightning():
    try:
        from gradcheck_dist.lightning import lightning_package

        return lightning_package()
    except Exception as e:  # a missing Lightning fails the test, with the reason
        pytest.fail(f"Lightning cannot be imported: {e}")


def _lit_base():
    pl = _lightning()

    class LitBN(pl.LightningModule):
        """Linear bias -> BatchNorm: correct only when each rank sees exactly its slice (the same rows)."""

        def __init__(self):
            super().__init__()
            self.net = BiasBN()

        def training_step(self, batch, i):
            return self.net(*batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class LitProj(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = Proj()

        def training_step(self, batch, i):
            return self.net(*batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return LitBN, LitProj


def make_lit_bn():
    return _lit_base()[0]()


def make_lit_proj():
    return _lit_base()[1]()


def lit_bn_batch():
    return bn_same_stats_batch(2, seed=14)


def lit_proj_batch():
    return proj_batch(15, n=16)


def test_lightning_should_give_each_rank_its_rows():
    report = check_lightning(make_lit_bn, lit_bn_batch, world=2)
    assert not counting(report), counting(report)


def test_lightning_clip_projector_bias_should_pass():
    report = check_lightning(make_lit_proj, lit_proj_batch, world=2)
    assert not counting(report), counting(report)


def test_lightning_bf16_mixed_with_accumulation_should_pass(tmp_path):
    report = check_lightning(make_lit_proj, lit_proj_batch, world=2, precision="bf16-mixed", accumulate_grad_batches=2,
                             workdir=tmp_path)
    assert not counting(report), counting(report)
    _, meta = read_dump(tmp_path / "ranks" / "rank0.safetensors")
    assert meta["gradcheck.precision"] == "bf16", meta
    _, meta = read_dump(tmp_path / "ref-permuted" / "rank0.safetensors")
    assert meta.get("gradcheck.order") == "permuted", meta
    local, _ = read_dump(tmp_path / "ranks" / "local" / "rank0.safetensors")   # the first micro-batch, kept apart
    earlier = sorted(n for n in local if n.endswith("@earlier"))
    assert earlier and all(n[:-len("@earlier")] in local for n in earlier), sorted(local)


# ---- pipeline parallel: docs/python.md's recipe, data 2 x pipeline 2, one check per stage, run as written


def test_pipeline_recipe_should_run_as_written(tmp_path):
    import re

    with open(os.path.join(ROOT, "docs", "python.md")) as f:
        doc = f.read()
    m = re.search(r"<!-- pipeline-recipe -->\n```sh\n(.*?)```\n<!-- /pipeline-recipe -->", doc, re.S)
    assert m, "docs/python.md has no pipeline-recipe block"
    os.symlink(os.path.join(ROOT, "python"), tmp_path / "python")
    os.symlink(os.path.dirname(os.environ["GRADCHECK_DIST"]), tmp_path / "build")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), GLOO_SOCKET_IFNAME="lo",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    lines = [l for l in m.group(1).splitlines() if l.strip()]
    assert len(lines) == 7, lines
    for line in lines:
        want = re.search(r"# exit (\d)", line)
        p = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == (int(want.group(1)) if want else 0), (line, p.returncode, (p.stdout + p.stderr)[-3000:])
        if "bug/stage0" in line:
            assert "different gradients on different ranks" in p.stdout or "disagree" in p.stdout, p.stdout[-3000:]
            # issue 38 (1f): the dumps record the pipeline (gradcheck.wrapper), and check names it, not DDP
            assert "after the pipeline's data-parallel all-reduce" in " ".join(p.stdout.split()), p.stdout[-3000:]


# ---- the tracker itself (in process, no ranks)


class TwoBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
        self.drop, self.bn = torch.nn.Dropout(0.2), torch.nn.BatchNorm1d(3)

    def forward(self, x, branch):
        if branch == "a":
            return self.a(self.drop(x)).sum()
        return self.b(self.bn(x)).sum()


def test_track_should_record_one_step_from_the_last_dump(tmp_path):
    from gradcheck_dist import LocalGradCapture, dump_grads, track

    torch.manual_seed(0)
    m = TwoBranch()
    track(m)
    cap = LocalGradCapture(m)
    m(torch.randn(4, 3), "a").backward()
    cap.dump(tmp_path / "l0.safetensors")
    dump_grads(m, tmp_path / "r0.safetensors")      # a second dump of the same step reads the same record
    for f in ("l0", "r0"):
        _, meta = read_dump(tmp_path / f"{f}.safetensors")
        assert json.loads(meta["gradcheck.ran"]) == ["a.weight", "a.bias"], meta
        assert json.loads(meta["gradcheck.nondeterministic"]) == ["drop (Dropout p=0.2)"], meta
        assert json.loads(meta["gradcheck.batchnorm"]) == [], meta
    m.zero_grad()
    m(torch.randn(4, 3), "b").backward()            # the next forward after a dump starts a new record
    dump_grads(m, tmp_path / "r1.safetensors")
    _, meta = read_dump(tmp_path / "r1.safetensors")
    assert json.loads(meta["gradcheck.ran"]) == ["b.weight", "b.bias", "bn.weight", "bn.bias"], meta
    assert json.loads(meta["gradcheck.nondeterministic"]) == [] and json.loads(meta["gradcheck.batchnorm"]) == ["bn"], meta
    m.eval()
    m(torch.randn(4, 3), "a").sum()                 # eval mode: dropout off, BatchNorm on running statistics
    m(torch.randn(4, 3), "b").sum()
    dump_grads(m, tmp_path / "r2.safetensors")
    _, meta = read_dump(tmp_path / "r2.safetensors")
    assert json.loads(meta["gradcheck.nondeterministic"]) == [] and json.loads(meta["gradcheck.batchnorm"]) == [], meta


def test_track_should_hook_only_its_own_model(tmp_path):
    from gradcheck_dist import dump_grads, track, track_precision

    assert track_precision is track
    tracked, other = TwoBranch(), TwoBranch()
    track(tracked)
    for m in (tracked, other):
        m(torch.randn(4, 3), "a").backward()
    dump_grads(other, tmp_path / "o.safetensors")
    _, meta = read_dump(tmp_path / "o.safetensors")
    assert "gradcheck.ran" not in meta, meta                 # absent: unknown, never "nothing ran"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        tracked(torch.randn(4, 3), "a")
    dump_grads(tracked, tmp_path / "t.safetensors")
    _, meta = read_dump(tmp_path / "t.safetensors")
    assert meta["gradcheck.precision"] == "bf16" and json.loads(meta["gradcheck.ran"]) == ["a.weight", "a.bias"], meta


def test_one_bf16_gradient_should_not_make_the_file_claim_bf16(tmp_path):
    from gradcheck_dist import dump_grads

    torch.manual_seed(0)
    m = make_mixed()
    m(*mixed_batch()).backward()
    _, meta = read_dump(dump_grads(m, tmp_path / "m.safetensors", rank=0, world=1))
    assert meta["gradcheck.precision"] == "fp32", meta   # the BF16 tensor's own dtype bounds its tolerance in check


def test_run_check_should_find_the_second_reference_or_say_where_it_is_missing(tmp_path):
    from gradcheck_dist.harness import _refs, permuted_path, permutation

    assert permuted_path("d/rank0.safetensors") == os.path.join("d", "permuted.safetensors")
    assert permuted_path("w/ref.safetensors") == os.path.join("w", "ref-permuted.safetensors")
    a = tmp_path / "ref.safetensors"
    a.write_bytes(b"")
    with pytest.raises(ValueError, match="ref-permuted.safetensors"):
        _refs(a, 2)
    (tmp_path / "ref-permuted.safetensors").write_bytes(b"")
    assert _refs(a, 2) == [str(a), str(tmp_path / "ref-permuted.safetensors")]
    assert _refs([a, "b"], 1) == [str(a)] and _refs([a, "b"], None) == [str(a), "b"]
    for n in (2, 3, 16):
        p = permutation(n)
        assert sorted(p.tolist()) == list(range(n)) and p.tolist() != list(range(n)), p


# ---- a batch whose rows cannot be permuted alike: one reference, said, no harness error


class _Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(3, 1)

    def forward(self, x):
        return self.l(x).pow(2).mean()


def make_lin():
    return _Lin()


def step_first(model, batch, rank, world):
    return model(batch[0])   # batch[1] (2 rows, not 8) rides along unused


def test_unpermutable_batch_should_fall_back_to_one_reference_with_a_warning():
    batch = (torch.randn(8, 3, generator=torch.Generator().manual_seed(3)), torch.zeros(2))
    with pytest.warns(UserWarning, match="no second reference"):
        report = check_ddp(make_lin, step_first, batch, world=2)
    assert report["runs"][0].get("reference2") is None, report["runs"][0].get("reference2")
