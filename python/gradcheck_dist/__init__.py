"""gradcheck_dist: gradient dumps for `gradcheck-dist check`, and harnesses that run one.

    dump_grads(model, path)            every trainable parameter's .grad (stage "reduced")
    LocalGradCapture(model).dump(path) each rank's own gradient before DDP's all-reduce (stage "local")
    GradcheckDump(dirpath, step=0)     Lightning Callback (Lightning imported on first use)
    check_ddp(...), check_lightning(...), run_check(...)   see harness.py
    snippet()                          the recipe `gradcheck-dist check --snippet` prints
"""
import os

from .dump import LocalGradCapture, dump_grads, read_dump, write_dump

__version__ = "0.1.0"
__all__ = ["dump_grads", "write_dump", "read_dump", "LocalGradCapture", "GradcheckDump", "snippet",
           "run_check", "check_ddp", "check_lightning", "GradcheckFailure"]


def snippet():
    with open(os.path.join(os.path.dirname(__file__), "snippet.txt")) as f:
        return f.read()


def __getattr__(name):  # Lightning and the harness only when asked for
    if name == "GradcheckDump":
        from .lightning import GradcheckDump

        return GradcheckDump
    if name in ("run_check", "check_ddp", "check_lightning", "GradcheckFailure"):
        from . import harness

        return getattr(harness, name)
    raise AttributeError(f"module 'gradcheck_dist' has no attribute {name!r}")
