"""GradcheckDump: a Lightning Callback that dumps every rank's reduced gradients at one step."""
import os
import sys


def lightning_package():
    """lightning.pytorch or pytorch_lightning: whichever is already imported, else installed."""
    for mod in ("lightning.pytorch", "pytorch_lightning"):
        if mod in sys.modules:
            return sys.modules[mod]
    try:
        import lightning.pytorch as pl
    except ImportError:
        try:
            import pytorch_lightning as pl
        except ImportError as e:
            raise ImportError("GradcheckDump needs Lightning: pip install lightning (or pytorch-lightning)") from e
    return pl


class _GradcheckDump:
    """Writes DIRPATH/rank{r}.safetensors in on_after_backward at global step `step` (once).

    Under DDP the gradients are already all-reduced there: stage "reduced" (with
    accumulate_grad_batches > 1 the dump waits for the micro-batch whose backward is all-reduced;
    with a GradScaler (16-mixed on GPUs) the gradients are still multiplied by the loss scale). Run it once with
    devices=N and once with devices=1 (the reference, same seed and global batch), then
    `gradcheck-dist check DIRPATH --ref REFDIR/rank0.safetensors`.
    """

    def __init__(self, dirpath, step=0, stage="reduced", dtype=None, writer=None):
        self.dirpath, self.step, self.stage, self.dtype, self.writer = os.fspath(dirpath), step, stage, dtype, writer
        self.written = None

    def on_after_backward(self, trainer, pl_module):
        from .dump import dump_grads

        should_accumulate = getattr(trainer.fit_loop, "_should_accumulate", lambda: False)
        if self.written is None and trainer.global_step == self.step and not should_accumulate():
            path = os.path.join(self.dirpath, f"rank{trainer.global_rank}.safetensors")
            self.written = dump_grads(pl_module, path, stage=self.stage, rank=trainer.global_rank,
                                      world=trainer.world_size, dtype=self.dtype, writer=self.writer,
                                      extra_metadata={"gradcheck.step": trainer.global_step})


GradcheckDump = type("GradcheckDump", (_GradcheckDump, lightning_package().Callback), {"__doc__": _GradcheckDump.__doc__})
