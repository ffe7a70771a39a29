"""Issue 38 on real torch steps through check_ddp: where the numbers show a cause, the first finding names it
and its fix; a similar-looking step with another cause is not given that name.

usage: GRADCHECK_DIST=build/gradcheck-dist python -m pytest -q tests/torch/test_causes_real.py
Registered under Debian's torch 1.13 (.venv, label torch) and PyPI's torch 2.x (.venv-torch2, labels torch2;slow).

  - ranks that disagree after DDP's all-reduce: the forward around the wrapper (a method of model.module), a
    parameter left outside DDP, require_backward_grad_sync set after the forward (the last backward of an
    accumulation unsynced), and, not named so, a gradient changed after the all-reduce (a comm hook);
"""
import os
import sys

import pytest
import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
from gradcheck_dist import GradcheckFailure, check_ddp  # noqa: E402

WORLD = 2


@pytest.fixture(autouse=True, scope="module")
def binary():
    b = os.environ.get("GRADCHECK_DIST") or os.path.join(ROOT, "build", "gradcheck-dist")
    assert os.access(b, os.X_OK), f"gradcheck-dist binary not found at {b}: set GRADCHECK_DIST"
    os.environ["GRADCHECK_DIST"] = os.path.abspath(b)


def counting(report):
    return [f for f in report["runs"][0]["findings"] if f.get("counts")]


def first_finding(*args, **kw):
    """check_ddp(...) that must find something: its first finding's message."""
    with pytest.raises(GradcheckFailure) as e:
        check_ddp(*args, **kw)
    found = counting(e.value.report)
    assert found, e.value.report
    return found[0]["message"], e.value.report


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

    def forward(self, x, y):
        return self.loss(x, y)

    def loss(self, x, y):
        return ((self.l2(torch.tanh(self.l1(x))) - y) ** 2).mean()


def make_net():
    return Net()


def make_net_l2_outside_ddp():
    m = Net()
    m._ddp_params_and_buffers_to_ignore = ["l2.weight", "l2.bias"]   # DDP leaves these out of its all-reduce
    return m


def batch(n=16, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)


def _inner(model):
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


# ---- ranks that disagree after the all-reduce, told apart by the local dumps


def step_around_wrapper(model, b, rank, world):
    return _inner(model).loss(*b)   # a method of model.module: DDP's forward never ran, so no all-reduce either


def step_wrapper(model, b, rank, world):
    return model(*b)


def test_forward_around_the_wrapper_should_name_it_and_the_fix():
    msg, _ = first_finding(make_net, step_around_wrapper, batch(), world=WORLD)
    assert "no all-reduce ran for them" in msg and "went around the DDP wrapper" in msg, msg
    assert "Fix: call the wrapper, model(...)" in msg, msg
    assert "no rank holds it" in msg, msg


def test_parameters_left_outside_ddp_should_be_named_outside_not_around_the_wrapper():
    msg, _ = first_finding(make_net_l2_outside_ddp, step_wrapper, batch(), world=WORLD)
    assert msg.startswith("l2.weight and l2.bias: no all-reduce ran for them"), msg
    assert "outside DDP" in msg and "a method of model.module" not in msg, msg


def _accumulate(model, b, flag_after_forward, k=2):
    """nanoGPT's loop inside the step: K micro-batches, backward on all but the last (the harness does the last);
    require_backward_grad_sync = (i == K - 1), set after (the bug) or before (right) the forward."""
    x, y = b
    for i in range(k):
        if not flag_after_forward and hasattr(model, "require_backward_grad_sync"):
            model.require_backward_grad_sync = i == k - 1
        loss = model(x.chunk(k)[i], y.chunk(k)[i]) / k
        if flag_after_forward and hasattr(model, "require_backward_grad_sync"):
            model.require_backward_grad_sync = i == k - 1
        if i < k - 1:
            loss.backward()
    return loss


def step_flag_after_forward(model, b, rank, world):
    return _accumulate(model, b, True)


def step_flag_before_forward(model, b, rank, world):
    return _accumulate(model, b, False)


def test_sync_flag_set_after_the_forward_should_name_the_unsynced_last_backward():
    msg, rep = first_finding(make_net, step_flag_after_forward, batch(), world=WORLD)
    assert "the last backward of the gradient accumulation did not sync" in msg, msg
    assert "require_backward_grad_sync was set after its forward" in msg and "Fix: decide before each forward" in msg, msg
    causes = {p["name"]: p.get("stage_cause") for p in rep["runs"][0]["params"]}
    assert set(causes.values()) == {"last_unsynced"}, causes


def test_sync_flag_set_before_the_forward_should_pass():
    check_ddp(make_net, step_flag_before_forward, batch(), world=WORLD)


def _halve_on_rank1_after_reduce(model):
    """A comm hook: DDP's all-reduce (mean), then rank 1 halves what it received: changed after the all-reduce."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel) or getattr(model, "_gcd_hooked", False):
        return
    model._gcd_hooked = True

    def hook(state, bucket):
        buf = bucket.buffer().div_(dist.get_world_size())
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def then(f):
            out = f.value()[0]
            return out * 0.5 if dist.get_rank() == 1 else out
        return fut.then(then)

    model.register_comm_hook(None, hook)


def step_changed_after_reduce(model, b, rank, world):
    _halve_on_rank1_after_reduce(model)
    return model(*b)


def test_gradient_changed_after_the_all_reduce_should_not_be_named_unsynced_or_unreduced():
    msg, _ = first_finding(make_net, step_changed_after_reduce, batch(), world=WORLD)
    assert "a gradient changed after the all-reduce" in msg, msg
    assert "rank 0 holds it, the other not" in msg, msg
    for other in ("no all-reduce ran", "did not sync", "part the ranks' mean"):
        assert other not in msg, msg
