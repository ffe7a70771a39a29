"""gradcheck_dist itself (issue 24 Python side, issue 22 dump writer, issue 23 writer): runs on Debian's torch 1.13
(ctest test_py_package) and on PyPI torch 2.x (the torch2 tier), under pytest's default output capture.

usage: GRADCHECK_DIST=build/gradcheck-dist python -m pytest -q tests/torch/test_py_package.py
Nothing is skipped: what a torch version cannot do is asserted as what it does instead.
"""
import json
import os
import stat
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python"))
import gradcheck_dist  # noqa: E402
from gradcheck_dist import DumpPathError, GradcheckFailure, LocalGradCapture, check_ddp, dump_grads, read_dump  # noqa: E402
from gradcheck_dist.dump import clean_name, precision_name  # noqa: E402
from gradcheck_dist.harness import HarnessError  # noqa: E402

TORCH2 = int(torch.__version__.split(".")[0]) >= 2


@pytest.fixture(autouse=True, scope="module")
def binary():
    b = os.environ.get("GRADCHECK_DIST") or os.path.join(os.path.dirname(__file__), "..", "..", "build", "gradcheck-dist")
    assert os.access(b, os.X_OK), f"gradcheck-dist binary not found at {b}: set GRADCHECK_DIST"
    os.environ["GRADCHECK_DIST"] = os.path.abspath(b)


def safe_open_all(path):
    """The dump read back by the safetensors package itself (the format's own reader)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


# ---- the writer (issue 22: streamed; issue 23: what it refuses, long names)


def mlp(dtype=torch.float32):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    m(torch.randn(4, 5)).sum().backward()
    return m.to(dtype)  # the gradients too (torch 1.13 has no F16 matmul on the CPU)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_streamed_dump_should_be_valid_safetensors(tmp_path, dtype):
    m = mlp(dtype)
    m[2].bias.grad = None
    p = dump_grads(m, tmp_path / "r.safetensors", rank=0, world=1)
    tensors, meta = safe_open_all(p)
    assert set(tensors) == {"0.weight", "0.bias", "2.weight"}
    for n, q in m.named_parameters():
        if q.grad is not None:
            assert tensors[n].dtype == dtype and torch.equal(tensors[n], q.grad), n
    assert json.loads(meta["gradcheck.params"]) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert meta["gradcheck.precision"] == {torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16",
                                           torch.float16: "fp16"}[dtype]


def test_non_contiguous_and_cast_gradients_should_be_written_as_values(tmp_path):
    m = mlp()
    m[0].weight.grad = m[0].weight.grad.t().contiguous().t()  # a transposed layout: not contiguous
    assert not m[0].weight.grad.is_contiguous()
    p = dump_grads(m, tmp_path / "r.safetensors", rank=0, world=1, dtype=torch.float64)
    tensors, _ = safe_open_all(p)
    assert tensors["0.weight"].dtype == torch.float64
    assert torch.equal(tensors["0.weight"], m[0].weight.grad.double())


def test_two_hundred_fifty_character_name_should_be_written(tmp_path):
    name = "r" * 238 + ".safetensors"
    assert len(name) == 250
    p = dump_grads(mlp(), tmp_path / name, rank=0, world=1)
    assert os.path.basename(p) == name and os.listdir(tmp_path) == [name]  # no temporary left behind


def test_fifo_and_device_should_be_refused_not_replaced(tmp_path):
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(DumpPathError, match="FIFO"):
        dump_grads(mlp(), fifo, rank=0, world=1)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    dev = tmp_path / "null.safetensors"
    os.symlink("/dev/null", dev)  # a link to a character device: the device is what the name means
    with pytest.raises(DumpPathError, match="character device"):
        dump_grads(mlp(), dev, rank=0, world=1)
    assert os.path.islink(dev) and stat.S_ISCHR(os.stat(dev).st_mode)
    with pytest.raises(DumpPathError, match="directory"):
        dump_grads(mlp(), tmp_path, rank=0, world=1)
    assert sorted(os.listdir(tmp_path)) == ["fifo.safetensors", "null.safetensors"]


def test_safetensors_writer_should_still_be_selectable(tmp_path):
    p = dump_grads(mlp(), tmp_path / "r.safetensors", rank=0, world=1, writer="safetensors")
    tensors, meta = safe_open_all(p)
    assert meta["gradcheck.precision"] == "fp32" and set(tensors) == {"0.weight", "0.bias", "2.weight", "2.bias"}


# ---- precision (issue 24 item 2)


def test_precision_should_be_named_from_every_spelling():
    assert [precision_name(p) for p in ("bf16-mixed", "16-mixed", "32-true", "64-true", "bf16-true", 16, 32, 64,
                                        torch.bfloat16, torch.float16, "tf32", "fp32")] == \
        ["bf16", "fp16", "fp32", "fp64", "bf16", "fp16", "fp32", "fp64", "bf16", "fp16", "tf32", "fp32"]
    with pytest.raises(ValueError, match="precision"):
        precision_name("int8")


def test_autocast_should_be_recorded_from_the_forward(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    cap = LocalGradCapture(m)  # installs the precision hooks (track_precision)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(torch.randn(4, 5))
    out.float().sum().backward()
    _, meta = read_dump(dump_grads(m, tmp_path / "r.safetensors", rank=0, world=1))
    assert meta["gradcheck.precision"] == "bf16"  # the gradients are F32; the step computed in bf16
    _, meta = read_dump(cap.dump(tmp_path / "l.safetensors", rank=0, world=1))
    assert meta["gradcheck.precision"] == "bf16"
    _, meta = read_dump(dump_grads(m, tmp_path / "e.safetensors", rank=0, world=1, precision="fp16"))
    assert meta["gradcheck.precision"] == "fp16"  # the caller's word wins


# ---- names (issue 24 item 6)


def test_wrapper_prefixes_should_be_removed():
    assert clean_name("module._fsdp_wrapped_module.layers.0._checkpoint_wrapped_module.attn.weight") == \
        "layers.0.attn.weight"
    assert clean_name("_orig_mod.module.enc.weight") == "enc.weight"
    assert clean_name("enc.module.weight") == "enc.module.weight"  # a user's own "module" inside the path stays


# ---- LocalGradCapture (issue 24 item 3)


def test_hook_called_with_none_should_count_as_no_gradient(tmp_path):
    m = mlp()
    cap = LocalGradCapture(m)
    cap._hook("0.bias")(None)  # torch 2.x calls a tensor hook with None for an output the loss ignores
    assert "0.bias" not in cap.grads
    cap._hook("0.bias")(torch.ones(7))
    cap._hook("0.bias")(None)
    assert torch.equal(cap.grads["0.bias"], torch.ones(7))


# ---- the harness: never hangs, names each failure within seconds (issue 24 items 4, 10; issue 23)


class MLP(torch.nn.Module):
    def __init__(self, head=False):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        if head:
            self.head = torch.nn.Linear(4, 2)

    def forward(self, x, y):
        out = self.net(x)
        if hasattr(self, "head"):
            self.head(out)  # computed, ignored by the loss
        return F.mse_loss(out, y)


def make_mlp():
    return MLP()


def make_mlp_head():
    return MLP(head=True)


def step_mean(model, batch, rank, world):
    return model(*batch)


def step_bf16(model, batch, rank, world):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(*batch)


def step_head_in_reference_only(model, batch, rank, world):
    # the head reaches the loss in the single-process reference only: None on the ranks is then a finding
    # (a head no process uses is a note, not a failure)
    extra = model.head(model.net(batch[0]).detach()).pow(2).mean() if world == 1 else 0
    return model(*batch) + extra


def step_fails_on_rank1(model, batch, rank, world):
    if world > 1 and rank == 1:
        raise ValueError("planted failure on rank 1")
    return model(*batch)


def step_hangs_in_reference(model, batch, rank, world):
    if world == 1:
        time.sleep(3600)
    return model(*batch)


def batch_of(n=16):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 32, generator=g), torch.randn(n, 4, generator=g)


def test_second_check_after_the_thread_pool_should_not_hang():
    a = torch.randn(1024, 1024)
    for _ in range(3):
        a = (a @ a).tanh()  # the parent's intra-op pool now has threads: a plain fork would hang (item 4a)
    check_ddp(make_mlp, step_mean, batch_of(), world=2, timeout=400)  # before: the ranks hung until the timeout
    closure = lambda: MLP()  # noqa: E731  (a closure cannot be pickled: forked, with one thread per child)
    check_ddp(closure, step_mean, batch_of(), world=2, timeout=400)


def test_relative_workdir_should_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_ddp(make_mlp, step_mean, batch_of(), world=2, workdir="rel/dir", timeout=400)
    assert sorted(os.listdir(tmp_path / "rel" / "dir" / "reduced")) == ["rank0.safetensors", "rank1.safetensors"]


def test_a_failing_rank_should_be_named_within_seconds():
    t = time.monotonic()
    with pytest.raises(HarnessError) as e:
        check_ddp(make_mlp, step_fails_on_rank1, batch_of(), world=2, timeout=600)
    took = time.monotonic() - t
    assert "rank 1 (failed first)" in str(e.value) and "planted failure on rank 1" in str(e.value), str(e.value)
    assert took < 300, f"named after {took:.0f} s, not at once"  # before: at the timeout (rank 0 waits in gloo)
    assert os.path.isdir(e.value.workdir) and "kept in " + e.value.workdir in str(e.value)


def test_a_reference_that_hangs_should_be_bounded():
    t = time.monotonic()
    with pytest.raises(HarnessError, match="the single-process reference still running after 30 s"):
        check_ddp(make_mlp, step_hangs_in_reference, batch_of(), world=2, timeout=30)
    assert time.monotonic() - t < 90


def test_findings_should_keep_dumps_report_and_ticket():
    with pytest.raises(GradcheckFailure) as e:
        check_ddp(make_mlp_head, step_head_in_reference_only, batch_of(), world=2, timeout=400)
    d = e.value.workdir
    assert d and f"kept in {d}" in str(e.value)
    for n in ("report.json", "ticket.md", "ref.safetensors", "reduced/rank0.safetensors", "local/rank1.safetensors"):
        assert os.path.exists(os.path.join(d, n)), n
    with open(os.path.join(d, "report.json")) as f:
        assert json.load(f)["runs"][0]["dumps"][0]["path"].startswith(d)
    st = {p["name"]: p["status"] for p in e.value.report["runs"][0]["params"]}
    assert st["head.weight"] == "none" and st["net.0.weight"] == "ok", st  # None on the ranks: no crash (item 3)


def test_bf16_autocast_should_be_recorded_by_the_harness(tmp_path):
    check_ddp(make_mlp, step_bf16, batch_of(), world=2, workdir=tmp_path, timeout=400, tol=0.05)
    for p in ("ref.safetensors", "reduced/rank0.safetensors", "local/rank1.safetensors"):
        assert read_dump(tmp_path / p)[1]["gradcheck.precision"] == "bf16", p


@pytest.mark.parametrize("how", ["missing", "not executable", "a directory"])
def test_a_bad_binary_should_be_named_before_any_rank_starts(tmp_path, monkeypatch, how):
    b = tmp_path / "gradcheck-dist"
    if how == "not executable":
        b.write_text("#!/bin/sh\n")
    elif how == "a directory":
        b.mkdir()
    monkeypatch.setenv("GRADCHECK_DIST", str(b))
    t = time.monotonic()
    with pytest.raises(RuntimeError, match="GRADCHECK_DIST") as e:
        check_ddp(make_mlp, step_fails_on_rank1, batch_of(), world=2, timeout=400)
    assert not isinstance(e.value, PermissionError) and time.monotonic() - t < 5, str(e.value)


def test_find_unused_parameters_should_follow_the_model():
    from gradcheck_dist.harness import _find_unused

    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{os.path.abspath('.')}/.gcd-pg-{os.getpid()}",
                                rank=0, world_size=1)
    try:
        assert _find_unused(make_mlp(), step_mean, batch_of(), 0, 1, "auto") is False
        assert _find_unused(make_mlp_head(), step_mean, batch_of(), 0, 1, "auto") is True
        assert _find_unused(make_mlp_head(), step_mean, batch_of(), 0, 1, False) is False
    finally:
        dist.destroy_process_group()
        try:
            os.unlink(f".gcd-pg-{os.getpid()}")
        except OSError:
            pass


# ---- Lightning on Debian's torch (issue 24 item 9), the deprecated gather (item 8)


def test_lightning_module_should_construct_after_importing_the_package():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import torch, pytorch_lightning as pl;"
            "from gradcheck_dist import GradcheckDump\n"
            "class M(pl.LightningModule):\n"
            "    def __init__(self):\n        super().__init__(); self.l = torch.nn.Linear(2, 1)\n"
            "M(); print('constructed')")
    p = subprocess.run([sys.executable, "-c", code, os.path.join(os.path.dirname(__file__), "..", "..", "python")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "constructed" in p.stdout, p.stderr[-3000:]


def test_clip_example_should_run_without_future_warnings(tmp_path):
    ex = os.path.join(os.path.dirname(__file__), "..", "..", "python", "examples", "clip_step.py")
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "..", "python"),
               PYTHONWARNINGS="error::FutureWarning")
    for args in (["--world", "2", "--out", str(tmp_path / "d")], ["--out", str(tmp_path / "ref")]):
        p = subprocess.run([sys.executable, ex, *args], capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run([os.environ["GRADCHECK_DIST"], "check", str(tmp_path / "d"), "--ref",
                        str(tmp_path / "ref" / "rank0.safetensors"), "--no-json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
