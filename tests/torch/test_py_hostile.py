"""Issue 23, the Python side (python/gradcheck_dist, helper py's files), as pytest cases:

- write_dump never replaces what is not a regular file: a FIFO or a character device at the path is
  refused (an exception naming the path), and left as it was;
- write_dump writes a legal 250-character file name (its temporary name must stay within NAME_MAX);
- find_binary / run_check with GRADCHECK_DIST pointing at a file that cannot be executed (mode 0644,
  a directory) raise the documented RuntimeError, never a raw PermissionError.

    GRADCHECK_DIST=build/gradcheck-dist .venv/bin/python -m pytest -q tests/torch/test_py_hostile.py
"""
import os
import stat
import sys

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
