"""Issue 23, the Python side (python/gradcheck_dist, helper py's files), as pytest cases:

- write_dump never replaces what is not a regular file: a FIFO or a character device at the path is
  refused (an exception naming the path), and left as it was;
- write_dump writes a legal 250-character file name (its temporary name must stay within NAME_MAX);
- find_binary / run_check with GRADCHECK_DIST pointing at a file that cannot be executed (mode 0644,
  a directory) raise the documented RuntimeError, never a raw PermissionError.

    GRADCHECK_DIST=build/gradcheck-dist .venv/bin/python -m pytest -q tests/torch/test_py_hostile.py
"""
import os
import pathlib
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from gradcheck_dist import harness  # noqa: E402
from gradcheck_dist.dump import write_dump  # noqa: E402

GRADS = {"w": torch.ones(3, dtype=torch.float64)}


def test_write_dump_refuses_a_fifo(tmp_path):
    p = tmp_path / "rank0.safetensors"
    os.mkfifo(p)
    with pytest.raises((ValueError, OSError, RuntimeError), match="rank0.safetensors"):
        write_dump(str(p), GRADS, ["w"], "reduced", rank=0, world=1)
    assert stat.S_ISFIFO(os.lstat(p).st_mode), "the FIFO was replaced by a regular file"


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root (the CI runs as root)")
def test_write_dump_refuses_a_char_device(tmp_path):
    p = tmp_path / "null.safetensors"
    os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))   # /dev/null's numbers
    with pytest.raises((ValueError, OSError, RuntimeError), match="null.safetensors"):
        write_dump(str(p), GRADS, ["w"], "reduced", rank=0, world=1)
    assert stat.S_ISCHR(os.lstat(p).st_mode), "the device node was replaced by a regular file"


def test_write_dump_writes_a_250_character_name(tmp_path):
    p = tmp_path / ("r" * 238 + ".safetensors")
    assert len(p.name) == 250
    write_dump(str(p), GRADS, ["w"], "reduced", rank=0, world=1)
    assert p.is_file() and p.stat().st_size > 8


@pytest.mark.parametrize("kind", ["file-0644", "directory"])
def test_gradcheck_dist_not_executable_is_runtime_error(tmp_path, monkeypatch, kind):
    b = tmp_path / "gradcheck-dist"
    if kind == "directory":
        b.mkdir()
    else:
        b.write_text("#!/bin/sh\nexit 0\n")
        b.chmod(0o644)
    monkeypatch.setenv("GRADCHECK_DIST", str(b))
    with pytest.raises(RuntimeError):
        harness.run_check([str(tmp_path / "rank0.safetensors")])


# ---- issue 33: the harness's outputs, its processes and temporaries, its input

NOBODY = 65534
SECRET = b"SECRET\n"
PYDIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")


def _victim(tmp_path):
    """A root-owned directory and file that no write of the harness may reach."""
    v = tmp_path / "victim"
    v.mkdir()
    (v / "secret").write_bytes(SECRET)
    return v


def _intact(v):
    return sorted(os.listdir(v)) == ["secret"] and (v / "secret").read_bytes() == SECRET


def _nobody_dir(tmp_path, name="alice"):
    """A directory another user (nobody) owns, where that user plants links: the workdir goes inside it."""
    os.chmod(tmp_path, 0o755)
    d = tmp_path / name
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    return d


def _plant(link, target):
    os.symlink(target, link)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)


def _dumps(d, world=2, scale=1.0):
    g = {"w": torch.full((3,), scale, dtype=torch.float64)}
    for r in range(world):
        write_dump(str(d / f"rank{r}.safetensors"), g, ["w"], "reduced", rank=r, world=world)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's links needs root (CI runs as root)")


@needs_root
def test_ticket_never_follows_a_link_planted_in_the_workdir(tmp_path):
    v = _victim(tmp_path)
    wd = _nobody_dir(tmp_path)
    os.makedirs(tmp_path / "ok")
    _dumps(tmp_path / "ok")
    write_dump(str(tmp_path / "ref.safetensors"), {"w": torch.full((3,), 2.0, dtype=torch.float64)}, ["w"],
               "reduced", rank=0, world=1)
    rc, rep, _ = harness.run_check(str(tmp_path / "ok"), ref=str(tmp_path / "ref.safetensors"),
                                   json_path=str(wd / "report.json"))
    assert rc == 1 and rep is not None
    _plant(wd / "ticket.md", v / "secret")
    harness._ticket(harness.find_binary(), str(wd))
    assert _intact(v), "ticket.md was written through nobody's link into root's file"


@needs_root
def test_dump_never_enters_a_directory_link_planted_in_the_workdir(tmp_path):
    v = _victim(tmp_path)
    wd = _nobody_dir(tmp_path)
    _plant(wd / "reduced", v)
    with pytest.raises(OSError, match="reduced"):
        write_dump(str(wd / "reduced" / "rank0.safetensors"), GRADS, ["w"], "reduced", rank=0, world=1)
    with pytest.raises(OSError, match="reduced"):
        write_dump(str(wd / "reduced" / "rank0.safetensors"), GRADS, ["w"], "reduced", rank=0, world=1,
                   writer="safetensors")
    assert _intact(v), "a dump was written into the directory nobody's link points at"


@needs_root
def test_check_ddp_in_a_workdir_with_planted_links_writes_nothing_through_them(tmp_path):
    v = _victim(tmp_path)
    wd = _nobody_dir(tmp_path)
    for n in ("reduced", "local"):
        _plant(wd / n, v)
    _plant(wd / "ticket.md", v / "secret")
    _plant(wd / "error-rank0.txt", v / "secret")
    with pytest.raises(harness.GradcheckFailure) as e:   # a failing step: the ticket is written too
        harness.check_ddp(_make, _half_step, torch.randn(4, 2), world=2, workdir=str(wd), timeout=120)
    assert e.value.workdir == str(wd)
    assert _intact(v), "check_ddp wrote through a link nobody planted in its workdir"
    assert not os.path.islink(wd / "reduced") and os.path.isfile(wd / "ticket.md")


def _make():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 1)


def _half_step(model, batch, rank, world):   # the loss halved on the ranks: every gradient x0.5
    return model(batch).pow(2).mean() * (0.5 if world > 1 else 1.0)


def _ok_step(model, batch, rank, world):
    return model(batch).pow(2).mean()


def test_reused_workdir_does_not_mix_in_stale_rank_files(tmp_path):
    wd = tmp_path / "wd"
    (wd / "reduced").mkdir(parents=True)
    for r in (2, 3):   # what a world-4 call left
        write_dump(str(wd / "reduced" / f"rank{r}.safetensors"), {"weight": torch.ones(1, 2), "bias": torch.ones(1)},
                   ["weight", "bias"], "reduced", rank=r, world=4)
    rep = harness.check_ddp(_make, _ok_step, torch.randn(4, 2), world=2, workdir=str(wd), timeout=120)
    assert rep["exit_code"] == 0
    assert sorted(os.listdir(wd / "reduced")) == ["rank0.safetensors", "rank1.safetensors"]


@pytest.mark.parametrize("world", [0, -1, "4", 2.0, True, None, 10 ** 6])
def test_check_ddp_refuses_a_bad_world_before_starting_anything(tmp_path, world):
    t0 = time.monotonic()
    for fn, args in ((harness.check_ddp, (_make, _ok_step, torch.randn(4, 2))), (harness.check_lightning, (_make, _make))):
        with pytest.raises(ValueError, match="world"):
            fn(*args, world=world, workdir=str(tmp_path / "wd"))
    assert time.monotonic() - t0 < 5
    assert not (tmp_path / "wd").exists(), "a workdir was made for a refused call"


SLOW_SCRIPT = """
import os, sys, time
sys.path.insert(0, {pydir!r})
import torch
from gradcheck_dist import check_ddp

def make():
    return torch.nn.Linear(2, 1)

def step(model, batch, rank, world):
    open(os.path.join({marks!r}, "started-%d" % os.getpid()), "w").close()
    time.sleep(600)
    return model(batch).sum()

if __name__ == "__main__":
    check_ddp(make, step, torch.randn(4, 2), world=2, timeout=900)
"""


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT])
def test_ctrl_c_during_check_ddp_leaves_no_process_and_no_directory(tmp_path, sig):
    marks = tmp_path / "marks"
    marks.mkdir()
    # the script's TMPDIR, a short path (inside the conftest's private one): the forkserver's socket,
    # TMPDIR/pymp-*/listener-*, must fit in 107 bytes, which one under a deep tmp_path did not
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="c-"))
    script = tmp_path / "slow.py"
    script.write_text(SLOW_SCRIPT.format(pydir=os.path.abspath(PYDIR), marks=str(marks)))
    env = dict(os.environ, TMPDIR=str(tmp))
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while len(os.listdir(marks)) < 3 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.2)   # two ranks (in their probe step) and the reference, each asleep in step
        pids = [int(n.split("-")[1]) for n in os.listdir(marks)]
        assert len(pids) == 3, f"the ranks did not reach the step: {p.stdout.read().decode()[-2000:] if p.poll() is not None else ''}"
        p.send_signal(sig)
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    time.sleep(1)
    left = [q for q in pids if _alive(q)]
    for q in left:
        os.kill(q, signal.SIGKILL)
    assert not left, f"processes left running after Ctrl-C: {left}"
    assert os.listdir(tmp) == [], f"temporaries left in TMPDIR after Ctrl-C: {os.listdir(tmp)}"
