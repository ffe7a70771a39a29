"""A held-out suite of real distributed-gradient bug reports, reproduced small (CPU, gloo, world 2) and run through
check_ddp as their users would: each bug's first finding must name its cause and fix, each fixed version must pass.

usage: GRADCHECK_DIST=build/gradcheck-dist python -m pytest -q tests/torch/test_bug_reports.py
       python tests/torch/test_bug_reports.py    (prints the table: bug, exit code, first finding)

  - FunASR: the loss all_reduce'd (no autograd) and divided by the world before backward; DDP averages again
  - build-nanogpt / nanoGPT: require_backward_grad_sync set after the forward; no_sync around the last forward
  - DuoduoCLIP (Lightning's all_gather default): a contrastive loss over features gathered without autograd
  - lightly's old GatherLayer: backward keeps only this rank's slot
  - verl: a per-rank token mean where the global token mean was meant (fixed: global counts, reference=)
  - a parameter used by some ranks only, DDP told find_unused_parameters=False
  - a forward through model.module.method, around the DDP wrapper
  - picotron / Megatron: gradients kept in main_grad, never copied to .grad
  - a loss summed over rows instead of averaged
  - pytorch: a reentrant checkpoint whose input needs no gradient
  - a plain dist.all_gather whose own slot is not put back
"""
import multiprocessing
import os
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
from gradcheck_dist import GradcheckFailure, all_gather_with_grad, check_ddp, dump_grads, run_check  # noqa: E402

WORLD = 2


def _binary():
    b = os.environ.get("GRADCHECK_DIST") or os.path.join(ROOT, "build", "gradcheck-dist")
    assert os.access(b, os.X_OK), f"gradcheck-dist binary not found at {b}: set GRADCHECK_DIST"
    os.environ["GRADCHECK_DIST"] = os.path.abspath(b)


def _inner(model):
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def batch(n=16, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

    def forward(self, x, y, reduce="mean"):
        return self.loss(x, y, reduce)

    def loss(self, x, y, reduce="mean"):
        e = (self.l2(torch.tanh(self.l1(x))) - y) ** 2
        return e.sum() if reduce == "sum" else e.mean()


def make_net():
    return Net()


# FunASR: average the loss over the ranks for the logs, but backward runs from it
def step_funasr(model, b, rank, world):
    loss = model(*b)
    if world > 1:
        dist.all_reduce(loss)
        loss = loss / world
    return loss


def step_plain(model, b, rank, world):
    return model(*b)


# build-nanogpt: require_backward_grad_sync set after the forward (DDP reads it in the forward)
def _accumulate(model, b, after, k=2):
    x, y = b
    for i in range(k):
        ddp = hasattr(model, "require_backward_grad_sync")
        if ddp and not after:
            model.require_backward_grad_sync = i == k - 1
        loss = model(x.chunk(k)[i], y.chunk(k)[i]) / k
        if ddp and after:
            model.require_backward_grad_sync = i == k - 1
        if i < k - 1:
            loss.backward()
    return loss


def step_flag_after(model, b, rank, world):
    return _accumulate(model, b, True)


def step_flag_before(model, b, rank, world):   # nanoGPT's train.py: set before the forward
    return _accumulate(model, b, False)


# no_sync misuse: every micro-batch's forward under no_sync, the last one too
def _no_sync(model, b, last_too, k=2):
    x, y = b
    ctx = getattr(model, "no_sync", None)
    for i in range(k):
        if ctx is not None and (i < k - 1 or last_too):
            with ctx():
                loss = model(x.chunk(k)[i], y.chunk(k)[i]) / k
        else:
            loss = model(x.chunk(k)[i], y.chunk(k)[i]) / k
        if i < k - 1:
            loss.backward()
    return loss


def step_no_sync_all(model, b, rank, world):
    return _no_sync(model, b, True)


def step_no_sync_right(model, b, rank, world):
    return _no_sync(model, b, False)


# forward around the wrapper
def step_module_method(model, b, rank, world):
    return _inner(model).loss(*b)


# loss summed over rows
def step_sum(model, b, rank, world):
    return model(*b, reduce="sum")


# ---- contrastive (CLIP-like) losses over gathered features


class Clip(torch.nn.Module):
    def __init__(self, gather, local=False):
        super().__init__()
        self.gather, self.local = gather, local
        self.img, self.txt = torch.nn.Linear(10, 16), torch.nn.Linear(12, 16)

    def forward(self, x, t):
        a, b = F.normalize(self.img(x), dim=1), F.normalize(self.txt(t), dim=1)
        r = dist.get_rank() if dist.is_initialized() else 0
        if self.local:   # this rank's images against every rank's texts (only the texts gathered)
            labels = torch.arange(len(a)) + r * len(a)
            return F.cross_entropy(a @ (GATHERS[self.gather](b) if dist.is_initialized() else b).T / 0.2, labels)
        if dist.is_initialized():
            a, b = GATHERS[self.gather](a), GATHERS[self.gather](b)
        logits = a @ b.T / 0.2
        labels = torch.arange(len(a))
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def _plain_gather(x, put_back):
    parts = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    if put_back:
        parts[dist.get_rank()] = x
    return torch.cat(parts)


class GatherLayerOld(torch.autograd.Function):
    """lightly's GatherLayer before its fix: backward returns this rank's slot only."""

    @staticmethod
    def forward(ctx, x):
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        return grads[dist.get_rank()].clone()


class GatherLayerFixed(GatherLayerOld):
    """lightly's fix: the gradients all-reduced, then this rank's slot."""

    @staticmethod
    def backward(ctx, *grads):
        g = torch.stack(grads)
        dist.all_reduce(g)
        return g[dist.get_rank()]


GATHERS = {
    "plain": lambda x: _plain_gather(x, False),          # dist.all_gather, the own slot not put back
    "plain_put_back": lambda x: _plain_gather(x, True),  # DuoduoCLIP / Lightning all_gather(sync_grads=False)
    "lightly_old": lambda x: torch.cat(GatherLayerOld.apply(x)),
    "lightly_fixed": lambda x: torch.cat(GatherLayerFixed.apply(x)),
    "autograd": all_gather_with_grad,
}


def make_clip_plain():
    return Clip("plain", local=True)


def make_clip_local_autograd():
    return Clip("autograd", local=True)


def make_clip_put_back():
    return Clip("plain_put_back")


def make_clip_lightly_old():
    return Clip("lightly_old")


def make_clip_lightly_fixed():
    return Clip("lightly_fixed")


def make_clip_autograd():
    return Clip("autograd")


def clip_batch(n=16):
    g = torch.Generator().manual_seed(9)
    return torch.randn(n, 10, generator=g), torch.randn(n, 12, generator=g)


def step_pair(model, b, rank, world):
    return model(*b)


# ---- verl: per-rank token mean vs the global token mean

V, T = 12, 6


class Tokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(V, 8), torch.nn.Linear(8, V)

    def forward(self, ids, targets, mask):
        logits = self.out(torch.tanh(self.emb(ids)))
        per_token = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="none")
        return (per_token * mask.reshape(-1)).sum(), mask.sum()


def make_tokens():
    return Tokens()


def token_batch():
    g = torch.Generator().manual_seed(7)
    ids, targets = torch.randint(0, V, (8, T), generator=g), torch.randint(0, V, (8, T), generator=g)
    lengths = torch.tensor([6, 6, 5, 6, 2, 1, 3, 2])
    return ids, targets, (torch.arange(T)[None, :] < lengths[:, None]).float()


def step_token_mean_per_rank(model, b, rank, world):
    total, n = model(*b)
    return total / n


def step_token_mean_global(model, b, rank, world):
    total, n = model(*b)
    n = n.clone()
    dist.all_reduce(n)
    return total * world / n


def token_objective(model, b):
    total, n = model(*b)
    return total / n


# ---- a parameter some ranks use (a routed expert), DDP told find_unused_parameters=False


class Routed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk, self.expert, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)

    def forward(self, x, y):
        h = torch.tanh(self.trunk(x))
        rows = x[:, 0] > 0.5   # routed by the data: batch() gives rank 1's rows none
        if rows.any():
            h = torch.where(rows[:, None], torch.tanh(self.expert(h)), h)
        return ((self.head(h) - y) ** 2).mean()


def make_routed():
    return Routed()


def routed_batch():
    x, y = batch()
    x[8:, 0] = -1.0   # rank 1 (rows 8..15 at world 2) routes nothing to the expert
    x[:8, 0] = x[:8, 0].abs() + 0.6
    return x, y


# ---- pytorch: a reentrant checkpoint whose input needs no gradient (the first block): its parameters get None


class Checkpointed(torch.nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant
        self.block, self.head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

    def forward(self, x, y):
        import torch.utils.checkpoint as cp

        h = cp.checkpoint(lambda t: torch.tanh(self.block(t)), x, use_reentrant=self.reentrant)
        return ((self.head(h) - y) ** 2).mean()


def make_checkpoint_reentrant():
    return Checkpointed(True)


def make_checkpoint_nonreentrant():
    return Checkpointed(False)


# ---- the cases: (name, bug (make, step, batch, kwargs), fixed (...), what the first finding must say)

CASES = {
    "funasr_loss_all_reduced": ((make_net, step_funasr, batch, {}), (make_net, step_plain, batch, {}),
                                ["double reduction", "Fix"]),
    "nanogpt_flag_after_forward": ((make_net, step_flag_after, batch, {}), (make_net, step_flag_before, batch, {}),
                                   ["did not sync", "require_backward_grad_sync"]),
    "no_sync_last_too": ((make_net, step_no_sync_all, batch, {}), (make_net, step_no_sync_right, batch, {}),
                         ["ran unsynced", "no_sync"]),
    "module_method": ((make_net, step_module_method, batch, {}), (make_net, step_plain, batch, {}),
                      ["went around the DDP wrapper", "Fix"]),
    "loss_summed": ((make_net, step_sum, batch, {}), (make_net, step_plain, batch, {}), ["summed over rows", "Fix"]),
    "plain_all_gather": ((make_clip_plain, step_pair, clip_batch, {}),
                         (make_clip_local_autograd, step_pair, clip_batch, {}),
                         ["plain torch.distributed.all_gather", "torch.distributed.nn.functional.all_gather"]),
    "duoduoclip_gather_no_grad": ((make_clip_put_back, step_pair, clip_batch, {}),
                                  (make_clip_autograd, step_pair, clip_batch, {}), ["own rows", "Fix"]),
    "lightly_gatherlayer": ((make_clip_lightly_old, step_pair, clip_batch, {}),
                            (make_clip_lightly_fixed, step_pair, clip_batch, {}), ["own rows", "Fix"]),
    "verl_token_mean": ((make_tokens, step_token_mean_per_rank, token_batch, {}),
                        (make_tokens, step_token_mean_global, token_batch, {"reference": token_objective}),
                        ["not the single-process objective", "per-rank token"]),
    "checkpoint_reentrant": ((make_checkpoint_reentrant, step_plain, batch, {}),
                             (make_checkpoint_nonreentrant, step_plain, batch, {}), ["use_reentrant=False"]),
    "unused_on_some_ranks": ((make_routed, step_plain, routed_batch, {"find_unused_parameters": False}),
                             (make_routed, step_plain, routed_batch, {}), ["never joined", "expert.weight", "find_unused_parameters=True"]),
}


def outcome(make, step, mkbatch, kw):
    """(exit code as the check gave it, the first counting finding's message, the report)."""
    try:
        check_ddp(make, step, mkbatch(), world=WORLD, **kw)
        return 0, "", None
    except GradcheckFailure as e:
        found = [f for f in e.report["runs"][0]["findings"] if f.get("counts")]
        return 1, " ".join(found[0]["message"].split()) if found else "(no counting finding)", e.report
    except RuntimeError as e:
        return 3, " ".join(str(e).split()), None


@pytest.fixture(autouse=True, scope="module")
def binary():
    _binary()


@pytest.mark.parametrize("name", sorted(CASES))
def test_bug_should_be_found_with_its_cause_named(name):
    bug, _, words = CASES[name]
    rc, msg, _ = outcome(*bug)
    assert rc == 1, (rc, msg)
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixed_version_should_pass(name):
    _, fixed, _ = CASES[name]
    rc, msg, _ = outcome(*fixed)
    assert rc == 0, (rc, msg)


def test_double_reduction_without_the_shard_losses_should_not_be_named_a_gather(tmp_path):
    """The FunASR step's dumps with the reference's gradcheck.shard_losses removed (dumps a user wrote without
    check_ddp): every rank's loss is the same and the objective, as under a gather keeping its own rows; without the
    batches' own losses the numbers cannot tell the two apart, so neither is named."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with pytest.raises(GradcheckFailure) as e:
        check_ddp(make_net, step_funasr, batch(), world=WORLD, workdir=str(tmp_path / "w"), references=1)
    ref = str(tmp_path / "w" / "ref.safetensors")
    assert "a double reduction:" in e.value.args[0], e.value.args[0]   # with them: named
    with safe_open(ref, "pt") as f:
        assert "gradcheck.shard_losses" in f.metadata(), f.metadata()
        meta = {k: v for k, v in f.metadata().items() if k != "gradcheck.shard_losses"}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(tmp_path / "ref-bare.safetensors"), metadata=meta)
    rc, report, _ = run_check(str(tmp_path / "w" / "reduced"), ref=str(tmp_path / "ref-bare.safetensors"))
    msg = " ".join([f for f in report["runs"][0]["findings"] if f.get("counts")][0]["message"].split())
    assert rc == 1 and "x0.5 (= 1/world)" in msg, (rc, msg)
    assert "keeps only the rank's own rows:" not in msg and "a double reduction:" not in msg, msg


# ---- picotron / Megatron: the wrapper keeps the gradients in param.main_grad; dumped (or stepped) from .grad


class MainGradDP(torch.nn.Module):
    """picotron's data-parallel bucket, small: a hook on each AccumulateGrad node moves .grad into param.main_grad
    and sets .grad to None; finish() averages main_grad over the ranks. copy_back: the fix, main_grad into .grad."""

    def __init__(self, module):
        super().__init__()
        self.module, self._nodes = module, []
        for p in module.parameters():
            p.main_grad = torch.zeros_like(p)
            node = p.expand_as(p).grad_fn.next_functions[0][0]
            node.register_hook(self._move(p))
            self._nodes.append(node)

    @staticmethod
    def _move(p):
        def hook(*_):
            if p.grad is not None:
                p.main_grad.add_(p.grad.detach())
                p.grad = None
        return hook

    def forward(self, *a):
        return self.module(*a)

    def finish(self, copy_back):
        for p in self.module.parameters():
            dist.all_reduce(p.main_grad)
            p.main_grad /= dist.get_world_size()
            if copy_back:
                p.grad = p.main_grad.clone()


def _main_grad_rank(rank, world, initfile, outdir, copy_back):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + initfile, rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = MainGradDP(Net())
        x, y = batch()
        model(x.chunk(world)[rank], y.chunk(world)[rank]).backward()
        model.finish(copy_back)
        dump_grads(model.module, os.path.join(outdir, "reduced", f"rank{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


def main_grad_outcome(copy_back):
    """The ranks (real gloo processes, dump_grads as the user calls it) and the reference, then check: (rc, first)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as d:
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=_main_grad_rank, args=(r, WORLD, os.path.join(d, "init"), d, copy_back))
                 for r in range(WORLD)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0, f"rank exit {p.exitcode}"
        torch.manual_seed(0)
        ref = Net()
        ref(*batch()).backward()
        dump_grads(ref, os.path.join(d, "ref.safetensors"), rank=0, world=1)
        rc, report, _ = run_check(os.path.join(d, "reduced"), ref=os.path.join(d, "ref.safetensors"))
    found = [f for f in report["runs"][0]["findings"] if f.get("counts")]
    return rc, " ".join(found[0]["message"].split()) if found else ""


def test_main_grad_never_copied_should_be_named_the_buffer():
    rc, msg = main_grad_outcome(False)
    assert rc == 1 and "in the wrapper's own buffer (main_grad), never copied to .grad" in msg, (rc, msg)


def test_main_grad_copied_back_should_pass():
    rc, msg = main_grad_outcome(True)
    assert rc == 0, (rc, msg)


if __name__ == "__main__":
    _binary()
    for name in sorted(CASES):
        bug, fixed, words = CASES[name]
        rc, msg, _ = outcome(*bug)
        frc, fmsg, _ = outcome(*fixed)
        named = rc == 1 and all(w in msg for w in words)
        print(f"| {name} | {rc} | {msg[:200]} | {'yes' if named else 'NO'} | {'yes' if frc == 0 else 'NO: ' + fmsg[:150]} |",
              flush=True)
    rc, msg = main_grad_outcome(False)
    frc, fmsg = main_grad_outcome(True)
    print(f"| picotron_main_grad | {rc} | {msg[:200]} | {'yes' if 'main_grad' in msg else 'NO'} | {'yes' if frc == 0 else 'NO: ' + fmsg[:150]} |")
