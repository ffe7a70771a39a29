"""gradcheck_dist: gradient dumps for `gradcheck-dist check`, and harnesses that run one.

    dump_grads(model, path)            every trainable parameter's .grad (stage "reduced")
    LocalGradCapture(model).dump(path) each rank's own gradient before DDP's all-reduce (stage "local")
    GradcheckDump(dirpath, step=0)     Lightning Callback (Lightning imported on first use)
    check_ddp(...), check_tp(...), check_lightning(...), run_check(...)   see harness.py
    snippet()                          the recipe `gradcheck-dist check --snippet` prints
    all_gather_with_grad(x)            a gather whose backward carries gradients, current on every torch
    guard(model, every=N)              a check inside training every N steps (the C classifier, in-process);
    GradcheckGuard(every_n_steps=N)    the same as a Lightning Callback (docs/guard.md)
    tp_layout(model, {name: Shard(d) | "replicate"}, group=tp_group)   a hand-written tensor-parallel model's
                                       splits, for dump_grads (None: megatron-core's parameter attributes)
    track(model)                       records what model's forward does (autocast precision, which modules ran,
                                       dropout, plain BatchNorm) for the dumps; track_precision: its old name
"""
import os

from .dump import DumpPathError, LocalGradCapture, clean_name, dump_grads, read_dump, track, track_precision, write_dump
from .gather import all_gather_with_grad
from .guard import Guard, GradcheckFinding, guard
from .layout import Shard, tp_layout

with open(os.path.join(os.path.dirname(__file__), "VERSION")) as _f:   # the one version: CMake reads it too
    __version__ = _f.read().strip()
__all__ = ["dump_grads", "write_dump", "read_dump", "LocalGradCapture", "GradcheckDump", "snippet",
           "run_check", "check_ddp", "check_tp", "check_lightning", "GradcheckFailure", "DumpPathError", "track",
           "track_precision",
           "all_gather_with_grad", "clean_name", "guard", "Guard", "GradcheckFinding", "GradcheckGuard",
           "tp_layout", "Shard"]


def snippet():
    with open(os.path.join(os.path.dirname(__file__), "snippet.txt")) as f:
        return f.read()


def _patch_lightning_if_imported():  # Debian torch 1.13 + Python 3.11 (issue 24 item 9); imports nothing new
    import sys

    if "torch" in sys.modules and ("pytorch_lightning" in sys.modules or "lightning.pytorch" in sys.modules):
        from .lightning import patch_lightning

        patch_lightning()


_patch_lightning_if_imported()


def __getattr__(name):  # Lightning and the harness only when asked for
    if name in ("GradcheckDump", "GradcheckGuard"):
        from . import lightning

        return getattr(lightning, name)
    if name in ("run_check", "check_ddp", "check_tp", "check_lightning", "GradcheckFailure"):
        from . import harness

        return getattr(harness, name)
    raise AttributeError(f"module 'gradcheck_dist' has no attribute {name!r}")
