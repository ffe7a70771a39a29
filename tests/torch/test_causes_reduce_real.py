"""Issue 38 on real torch steps through check_ddp: where the numbers show a cause, the first finding names it
and its fix; a similar-looking step with another cause is not given that name.

usage: GRADCHECK_DIST=build/gradcheck-dist python -m pytest -q tests/torch/test_causes_reduce_real.py
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
    with pytest.raises(GradcheckFailure) as e:
        check_ddp(make_net, step_around_wrapper, batch(), world=WORLD)
    msg = counting(e.value.report)[0]["message"]
    with open(os.path.join(e.value.workdir, "ticket.md")) as f:   # the ticket's title names it too
        title = f.readline()
    assert "different ranks (no all-reduce ran)" in title, title
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


def _hook_once(model, hook):
    """DDP's comm hook set to `hook` at the step's first call (the reference's plain model has none)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not getattr(model, "_gcd_hooked", False):
        model._gcd_hooked = True
        model.register_comm_hook(None, hook)


def _halve_on_rank1_after_reduce(model):
    """A comm hook: DDP's all-reduce (mean), then rank 1 halves what it received: changed after the all-reduce."""
    def hook(state, bucket):
        buf = bucket.buffer().div_(dist.get_world_size())
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def then(f):
            out = f.value()[0]
            return out * 0.5 if dist.get_rank() == 1 else out
        return fut.then(then)

    _hook_once(model, hook)


def step_changed_after_reduce(model, b, rank, world):
    _halve_on_rank1_after_reduce(model)
    return model(*b)


def test_gradient_changed_after_the_all_reduce_should_not_be_named_unsynced_or_unreduced():
    msg, _ = first_finding(make_net, step_changed_after_reduce, batch(), world=WORLD)
    assert "a gradient changed after the all-reduce" in msg, msg
    assert "rank 0 holds it, the other not" in msg, msg
    for other in ("no all-reduce ran", "did not sync", "part the ranks' mean"):
        assert other not in msg, msg


# ---- a double reduction: the loss all-reduced before backward, and DDP's average on top


def step_loss_all_reduced(model, b, rank, world):
    loss = model(*b)
    if world > 1:   # for the logs, as many scripts do it, but on the loss backward then runs from
        dist.all_reduce(loss)
        loss = loss / world
    return loss


def step_loss_divided_by_world(model, b, rank, world):
    return model(*b) / world   # each rank's own loss, divided: x1/world, but no all-reduce of the loss


def test_loss_all_reduced_before_backward_should_be_named_a_double_reduction():
    with pytest.raises(GradcheckFailure) as e:
        check_ddp(make_net, step_loss_all_reduced, batch(), world=WORLD)
    msg = counting(e.value.report)[0]["message"]
    assert "x0.5 (= 1/world): a double reduction" in msg, msg
    assert "dist.all_reduce(loss); loss /= world" in msg and "Fix: backward each rank's own loss" in msg, msg
    with open(os.path.join(e.value.workdir, "ticket.md")) as f:   # the ticket's title names it too
        title = f.readline()
    assert "(1/world: a double reduction)" in title, title


def test_loss_divided_by_world_should_not_be_named_a_double_reduction():
    msg, _ = first_finding(make_net, step_loss_divided_by_world, batch(), world=WORLD)
    assert "x0.5 (= 1/world)" in msg and "double reduction" not in msg, msg
    assert "a loss divided by the world before backward" in msg and "summed over rows" not in msg, msg   # issue 38


class Pooled(torch.nn.Module):
    """A loss over the whole world's features: the squared norm of their mean (the same value on every rank)."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(8, 4)

    def forward(self, x, world):
        f = torch.tanh(self.l1(x))
        if world > 1:   # a gather whose backward keeps only the rank's own rows (open_clip's gather_with_grad=False)
            parts = [torch.zeros_like(f) for _ in range(world)]
            dist.all_gather(parts, f.detach())
            parts[dist.get_rank()] = f
            f = torch.cat(parts)
        return f.mean(0).pow(2).sum()


def make_pooled():
    return Pooled()


def step_pooled(model, b, rank, world):
    return model(b[0], world)


def test_equal_losses_of_a_gathered_batch_should_not_be_named_a_double_reduction():
    # every rank's loss is the same (the world's), and the gradient x1/world: but that loss is not the mean of what
    # the ranks' batches give alone, so nothing was averaged in the forward
    msg, rep = first_finding(make_pooled, step_pooled, batch(), world=WORLD)
    assert "(= 1/world)" in msg and "double reduction" not in msg, msg
    losses = {d["metadata"]["gradcheck.loss"] for d in rep["runs"][0]["dumps"]}
    assert len(losses) == 1, losses


# ---- the reference's objective: reference=fn(model, batch)

V, T = 12, 6


class Tokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(V, 8), torch.nn.Linear(8, V)

    def forward(self, ids, targets, mask):
        """Each token's loss times its mask, summed, and the number of tokens that count."""
        logits = self.out(torch.tanh(self.emb(ids)))
        per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="none")
        return (per_token * mask.reshape(-1)).sum(), mask.sum()


def make_tokens():
    return Tokens()


def token_batch():
    g = torch.Generator().manual_seed(7)
    ids, targets = torch.randint(0, V, (8, T), generator=g), torch.randint(0, V, (8, T), generator=g)
    lengths = torch.tensor([6, 6, 5, 6, 2, 1, 3, 2])   # rank 0's rows (world 2) hold 23 tokens, rank 1's 8
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    return ids, targets, mask


def step_global_token_count(model, b, rank, world):
    """The recipe (docs/python.md): every rank divides its tokens' summed loss by the token count of the whole
    world (an all_reduce of the counts) and multiplies by the world, since DDP averages the ranks' gradients."""
    total, n = model(*b)
    n = n.clone()
    dist.all_reduce(n)   # training always has a process group: the one-process reference has none
    return total * world / n


def token_objective(model, b):
    """The objective those ranks compute: every token's loss over the number of tokens."""
    total, n = model(*b)
    return total / n


def test_global_token_count_recipe_without_its_reference_should_say_to_give_one():
    with pytest.raises(RuntimeError) as e:
        check_ddp(make_tokens, step_global_token_count, token_batch(), world=WORLD)
    assert "reference=" in str(e.value) and "without a process group" in str(e.value), str(e.value)


def step_per_rank_mean(model, b, rank, world):
    total, n = model(*b)
    return total / n   # each rank's own tokens' mean: DDP's objective is the mean of these, not the token mean


def per_rank_objective(model, b):
    """What DDP's average of per-rank means is the gradient of: the mean over the world's shards of each one's own
    token mean (shards as check_ddp cuts them: rank r the r-th of WORLD equal slices)."""
    means = [model(*shard) for shard in zip(*(t.chunk(WORLD) for t in b))]
    return sum(total / n for total, n in means) / WORLD


def test_per_rank_mean_should_be_reported_against_the_token_mean():
    msg, _ = first_finding(make_tokens, step_per_rank_mean, token_batch(), world=WORLD)
    # the recorded losses show the ranks' objective is not the token mean: named first, with the fix (issue 38)
    assert "is not the single-process objective" in msg and "per-rank token or sample mean" in msg, msg
    assert "all_reduce the count" in msg and "reference=" in msg, msg


def test_objective_recipes_in_python_md_as_written():
    # the global token count, the per-rank objective and HF's window-normalised loss under accumulate=K, each with
    # its reference=, as docs/python.md writes them (its steps and objectives; each "# passes" checked)
    from doc_recipes import run_section

    got = run_section("An objective that is not the one-process step", globals())
    assert [("reference=token_objective" in line, "reference=per_rank_objective" in line, "accumulate=K" in line)
            for line, _ in got] == [(True, False, False), (False, True, False), (True, False, True)], [line for line, _ in got]
    assert all(r["result"] == "pass" for _, r in got), [r["result"] for _, r in got]


# ---- scales the held-out bug reports showed named wrongly (issue 38's evaluation, 2026-12-06)


def step_mean_times_world(model, b, rank, world):
    return model(*b) * world   # NeMo Automodel #3846: a rank's own mean loss times the data-parallel size


def step_sum_over_world_count_times_world(model, b, rank, world):   # its fix (#3830): the count all-reduced
    total = model(*b) * len(b[1])   # the rows' summed loss, through the wrapper
    n = torch.tensor(float(len(b[1])))
    dist.all_reduce(n)
    return total / n * world


def mean_objective(model, b):
    return model(*b)


def _summed_by_hook(model):
    """A comm hook that all-reduces with SUM and never divides by the world."""
    _hook_once(model, lambda state, bucket: dist.all_reduce(bucket.buffer(), async_op=True).get_future()
               .then(lambda f: f.value()[0]))


def step_summed_by_hook(model, b, rank, world):
    _summed_by_hook(model)
    return model(*b)


def test_mean_loss_times_world_should_be_named_a_loss_multiplied_by_the_world():
    msg, _ = first_finding(make_net, step_mean_times_world, batch(), world=WORLD)
    assert "x2 (= world): each rank's loss is what its batch gives alone times the world" in msg, msg
    assert "Fix: backward the rank's own mean loss" in msg and "SUM" not in msg, msg
    check_ddp(make_net, step_sum_over_world_count_times_world, batch(), world=WORLD, reference=mean_objective)


def test_gradients_summed_by_a_hook_should_not_be_named_a_loss_multiplied_by_the_world():
    msg, _ = first_finding(make_net, step_summed_by_hook, batch(), world=WORLD)
    assert "x2 (= world): a gradient all-reduced with SUM" in msg and "times the world" not in msg, msg


class Barlow(torch.nn.Module):
    """lightly's BarlowTwinsLoss before its fix (lightly #1977): the cross-correlation matrix summed over the ranks
    with a plain dist.all_reduce when a process group exists; `fixed`: torch.distributed.nn's all_reduce (#1980)."""

    def __init__(self, fixed=False):
        super().__init__()
        self.l1, self.fixed = torch.nn.Linear(8, 6), fixed

    def forward(self, x, y, world):
        za, zb = torch.tanh(self.l1(x)), torch.tanh(self.l1(x + 0.1 * y))   # two views
        c = za.t() @ zb / (len(x) * world)
        if dist.is_available() and dist.is_initialized():
            if self.fixed:
                import torch.distributed.nn as autograd_collectives

                c = autograd_collectives.all_reduce(c)
            else:
                dist.all_reduce(c)
        return (torch.diagonal(c) - 1).pow(2).sum() + 0.01 * (c - torch.diag(torch.diagonal(c))).pow(2).sum()


def make_barlow():
    return Barlow()


def make_barlow_fixed():
    return Barlow(fixed=True)


def step_barlow(model, b, rank, world):
    return model(b[0], b[1], world)


def test_statistic_summed_with_plain_all_reduce_should_name_it_and_its_fix():
    msg, _ = first_finding(make_barlow, step_barlow, batch(), world=WORLD)
    assert "x0.5 (= 1/world): a collective in the loss whose backward keeps only the rank's own part" in msg, msg
    assert "a statistic summed over the ranks with dist.all_reduce" in msg, msg
    assert "torch.distributed.nn.functional.all_gather / all_reduce" in msg, msg
    check_ddp(make_barlow_fixed, step_barlow, batch(), world=WORLD)


def step_pooled_always_gathered(model, b, rank, world):   # a step that needs a process group: reference= below
    return model(b[0], 2)


def pooled_objective(model, b):
    return model(b[0], 1)


def test_equal_losses_without_the_batches_own_should_name_both_that_give_them():
    # pytorch-metric-learning #363's shape: the reference is given (the step needs a process group), so what each
    # rank's batch gives alone is not recorded; every rank's loss is the same: two causes give that, both named
    msg, _ = first_finding(make_pooled, step_pooled_always_gathered, batch(), world=WORLD, reference=pooled_objective)
    assert "x0.5 (= 1/world): every rank's loss is the same value" in msg, msg
    assert "whose backward keeps only the rank's own part" in msg and "all-reduced before backward" in msg, msg
    assert "summed over rows" not in msg, msg


def step_micro_mean(model, b, rank, world):   # HF Trainer before num_items_in_batch: each micro-batch's own token mean
    total, n = model(*b)
    return total / n


def test_micro_batch_means_under_accumulation_should_name_the_micro_batches_count():
    msg, _ = first_finding(make_tokens, step_micro_mean, token_batch(), world=WORLD, accumulate=2, reference=token_objective)
    assert "is not the single-process objective" in msg and "each micro-batch's own count" in msg, msg
    assert "HF Trainer before num_items_in_batch" in msg, msg


def test_window_normalised_loss_divided_again_should_be_named_the_accumulation():
    # HF's fix as written (the loss over the whole step's token count, not divided by K), which check_ddp(accumulate=K)
    # divides by K: x1/K, named as the harness's division, with docs/python.md's recipe (times K) as the fix
    n_all = float(token_batch()[2].sum())

    for k in (2, 4):
        def step(model, b, rank, world):
            total, _ = model(*b)
            return total / n_all * world

        msg, _ = first_finding(make_tokens, step, token_batch(), world=WORLD, accumulate=k, reference=token_objective)
        assert f"(= 1/{k}, the accumulation steps check_ddp ran)" in msg and "return it times K" in msg, (k, msg)
