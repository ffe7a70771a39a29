"""Every test here cleans what it made (issue 33: a day of the suite left 164 gcd-ddp-* directories).

Each test gets a private TMPDIR (tempfile's and the environment's, which Lightning's subprocesses inherit):
the directories check_ddp/check_lightning keep after a failure (GradcheckFailure names them) go into it and
are removed with it after the test. A process the test started and left running fails the test, after
it is killed by pid.
"""
import multiprocessing
import multiprocessing.util
import shutil
import tempfile

import pytest

multiprocessing.util.get_temp_dir()   # multiprocessing's own directory (the forkserver's socket): made once, in
                                      # the real TMPDIR, before any test moves it, and removed by multiprocessing


@pytest.fixture(autouse=True)
def _private_tmpdir(monkeypatch, tmp_path_factory):
    tmp_path_factory.getbasetemp()   # pytest's own tmp_path root: where pytest keeps it, before TMPDIR moves
    d = tempfile.mkdtemp(prefix="gcd-test-")
    monkeypatch.setenv("TMPDIR", d)
    monkeypatch.setattr(tempfile, "tempdir", d)
    yield d
    left = multiprocessing.active_children()
    for p in left:
        p.kill()
        p.join(10)
    shutil.rmtree(d, ignore_errors=True)
    assert not left, f"the test left processes running (killed now): {[p.pid for p in left]}"
