"""GradcheckDump: a Lightning Callback that dumps every rank's reduced gradients at one step."""
import os
import sys


def patch_lightning(pl=None):
    """Debian 12's torch 1.13 on Python 3.11: importing torch.distributed._shard.sharded_tensor fails (a dataclass
    "mutable default"), and LightningModule.__init__ imports it. Leaves LightningModule's sharded-tensor
    state-dict hooks out where that import fails (nothing else changes). Applied on import of gradcheck_dist when
    Lightning is imported, and by GradcheckDump. Returns True when it patched."""
    mods = [pl] if pl is not None else [sys.modules[m] for m in ("lightning.pytorch", "pytorch_lightning")
                                        if m in sys.modules]
    if not mods:
        return False
    torch = sys.modules.get("torch")
    if torch is None or not str(getattr(torch, "__version__", "")).startswith("1."):
        return False
    try:
        import torch.distributed._shard.sharded_tensor  # noqa: F401
        return False
    except Exception:
        pass
    done = False
    for m in mods:
        lm = getattr(m, "LightningModule", None)
        if lm is not None and hasattr(lm, "_register_sharded_tensor_state_dict_hooks_if_available"):
            lm._register_sharded_tensor_state_dict_hooks_if_available = lambda self: None
            done = True
    return done


def lightning_package():
    """lightning.pytorch or pytorch_lightning: whichever is already imported, else installed (patched)."""
    for mod in ("lightning.pytorch", "pytorch_lightning"):
        if mod in sys.modules:
            patch_lightning(sys.modules[mod])
            return sys.modules[mod]
    try:
        import lightning.pytorch as pl
    except ImportError:
        try:
            import pytorch_lightning as pl
        except ImportError as e:
            raise ImportError("GradcheckDump needs Lightning: pip install lightning (or pytorch-lightning)") from e
    patch_lightning(pl)
    return pl


class _GradcheckDump:
    """Writes DIRPATH/rank{r}.safetensors in on_after_backward at global step `step` (once).

    Under DDP it also writes DIRPATH/local/rank{r}.safetensors: each rank's own gradient before the
    all-reduce (LocalGradCapture, summed over the step's micro-batches; with accumulate_grad_batches > 1 the part
    before the last backward also as NAME@earlier, LocalGradCapture.mark()), which says which ranks gave none:
    `gradcheck-dist check DIRPATH DIRPATH/local --ref ...` reads both stages and leads with them.
    Under DDP the gradients are already all-reduced in on_after_backward: stage "reduced" (with
    accumulate_grad_batches > 1 the dump waits for the micro-batch whose backward is all-reduced;
    with a GradScaler (16-mixed on GPUs) the gradients are still multiplied by the loss scale). Run it once with
    devices=N and once with devices=1 (the reference, same seed and global batch), then
    `gradcheck-dist check DIRPATH --ref REFDIR/rank0.safetensors`. The precision recorded is
    `precision` when given, else the coarser of trainer.precision and what the dump sees (autocast, dtypes).
    It tracks the module (gradcheck_dist.track) from the dumped step's first micro-batch: the dump records which
    parameters' modules ran, the dropout layers and the plain BatchNorm layers of that step, and the step's loss
    (gradcheck.loss: the sum of the losses its micro-batches' backward got, each divided by K as Lightning does; under
    a GradScaler, scaled).
    Sharded strategies (FSDP) write each rank's shard of every original parameter. extra_metadata: more
    metadata for the dumps (e.g. {"gradcheck.order": "permuted"} for a reference run on permuted rows).
    """

    def __init__(self, dirpath, step=0, stage="reduced", dtype=None, writer=None, precision=None, extra_metadata=None):
        self.dirpath, self.step, self.stage, self.dtype, self.writer = os.fspath(dirpath), step, stage, dtype, writer
        self.precision = precision
        self.extra_metadata = dict(extra_metadata or {})
        self.written = None
        self._local = None   # LocalGradCapture during the dumped step (DDP only)
        self._started = False
        self._losses = []    # the dumped step's micro-batch losses as backward gets them (divided by K): gradcheck.loss

    def on_fit_start(self, trainer, pl_module):
        from .dump import track

        track(pl_module)

    def _precision(self, trainer, pl_module):
        from .dump import coarsest, infer_precision, precision_name

        if self.precision is not None:
            return precision_name(self.precision)
        try:
            theirs = precision_name(getattr(trainer, "precision", None))
        except ValueError:  # e.g. "transformer-engine": what the dump sees
            theirs = None
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None and hasattr(p.grad, "dtype")]
        grads = [g for g in grads if not hasattr(g, "to_local")]
        return coarsest([theirs, infer_precision(pl_module, grads)])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.written is not None or self._started or trainer.global_step != self.step:
            return   # every other batch: nothing to do
        import torch

        from .dump import LocalGradCapture, _tracked

        self._started = True
        self._losses = []
        t = _tracked(pl_module)
        if t is not None:
            t.clear()   # the record of the dumped step only, from its first micro-batch

        if isinstance(getattr(trainer.strategy, "model", None), torch.nn.parallel.DistributedDataParallel):
            self._local = LocalGradCapture(pl_module)   # from the step's first micro-batch

    def on_before_backward(self, trainer, pl_module, loss):
        should_accumulate = getattr(trainer.fit_loop, "_should_accumulate", lambda: False)
        if self._local is not None and self._losses and not should_accumulate():
            self._local.mark()   # the step's last, all-reduced backward: what came before is NAME@earlier
        if self._started and self.written is None:
            try:
                self._losses.append(float(loss.detach()) if loss.numel() == 1 else None)
            except Exception:
                self._losses.append(None)

    def on_after_backward(self, trainer, pl_module):
        from .dump import dump_grads

        should_accumulate = getattr(trainer.fit_loop, "_should_accumulate", lambda: False)
        if self.written is None and trainer.global_step == self.step and not should_accumulate():
            name = f"rank{trainer.global_rank}.safetensors"
            meta = dict(self.extra_metadata, **{"gradcheck.step": trainer.global_step})
            precision = self._precision(trainer, pl_module)
            loss = sum(self._losses) if self._losses and None not in self._losses else None
            self.written = dump_grads(pl_module, os.path.join(self.dirpath, name), stage=self.stage,
                                      rank=trainer.global_rank, world=trainer.world_size, dtype=self.dtype,
                                      writer=self.writer, extra_metadata=meta, precision=precision, loss=loss)
            if self._local is not None:
                self._local.remove()
                self._local.dump(os.path.join(self.dirpath, "local", name), rank=trainer.global_rank,
                                 world=trainer.world_size, extra_metadata=meta, dtype=self.dtype, writer=self.writer,
                                 precision=precision)
                self._local = None


GradcheckDump = type("GradcheckDump", (_GradcheckDump, lightning_package().Callback), {"__doc__": _GradcheckDump.__doc__})


class _GradcheckGuard:
    """Guards training (gradcheck_dist.guard, docs/guard.md) every `every_n_steps` optimizer steps, in
    on_before_optimizer_step: after the backward's reduce (DDP, FSDP) and the precision plugin's unscale, before the
    optimizer steps. on_finding: "raise" (GradcheckFinding, on every rank), "warn" or "log"; report: a path (may hold
    "{step}") where rank 0 writes check's JSON report at each guarded step; k, tol, seed: see guard()."""

    def __init__(self, every_n_steps=100, on_finding="raise", report=None, k=8, tol=None, seed=0):
        self.every, self.on_finding, self.report, self.k, self.tol, self.seed = every_n_steps, on_finding, report, k, tol, seed
        self.guard = None

    def on_fit_start(self, trainer, pl_module):
        from .guard import TOL, Guard

        self.guard = Guard(pl_module, every=self.every, on_finding=self.on_finding, report=self.report, k=self.k,
                           tol=TOL if self.tol is None else self.tol, seed=self.seed)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer, *args):
        if self.guard is not None:
            self.guard.check(trainer.global_step)


GradcheckGuard = type("GradcheckGuard", (_GradcheckGuard, lightning_package().Callback), {"__doc__": _GradcheckGuard.__doc__})
