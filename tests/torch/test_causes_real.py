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
