"""One Trainer run for check_lightning (Lightning relaunches this same command for ranks 1..N-1).

usage: python -m gradcheck_dist._lightning_run MODULE:MAKE_MODULE MODULE:MAKE_BATCH SEED DEVICES OUTDIR
Writes OUTDIR/rank{r}.safetensors (GradcheckDump at step 0, after backward, before the optimizer step).
Environment (set by check_lightning): GRADCHECK_PL_PRECISION (the Trainers' precision), GRADCHECK_PL_ACCUMULATE
(accumulate_grad_batches K), GRADCHECK_PL_WORLD (the ranks' world, for the reference's micro-batches),
GRADCHECK_PL_REFERENCES (2: with DEVICES 1, a second Trainer on permuted rows writes OUTDIR-permuted/rank0...).

Rows: the batch's n rows are split in K * world equal chunks; rank r's micro-batch i is chunk i * world + r (K = 1:
check_ddp's split, rank r the r-th slice), and the reference's micro-batch i is chunks i * world .. i * world +
world - 1, every rank's i-th micro-batch in rank order. The ranks' Trainer gets use_distributed_sampler=False and
this sampler, so Lightning's DistributedSampler (shuffle=True) never hands the ranks other rows than the reference's.
"""
import importlib
import importlib.util
import os
import sys


def _load(name):
    mod, _, qual = name.rpartition(":")
    if mod.endswith(".py"):  # the caller's script: imported under another name, so its main guard stays shut
        spec = importlib.util.spec_from_file_location("_gradcheck_user_script", mod)
        obj = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = obj
        spec.loader.exec_module(obj)
    else:
        obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


class _Rows:
    def __init__(self, batch):
        self.batch = batch

    def __len__(self):
        return len(self.batch[0]) if isinstance(self.batch, tuple) else len(self.batch)

    def __getitem__(self, i):
        return tuple(b[i] for b in self.batch) if isinstance(self.batch, tuple) else self.batch[i]


class _RankRows:
    """The indices of this process's micro-batches (see the module's doc): the rank is read when iterated (the
    process group is up by then); the reference (devices 1) takes every rank's micro-batch i in rank order,
    its rows permuted within each micro-batch when `perm` is given."""

    def __init__(self, n, world, devices, accumulate, perm=None):
        self.n, self.world, self.devices, self.k, self.perm = n, world, devices, accumulate, perm

    def __len__(self):
        return self.n // self.devices

    def __iter__(self):
        import torch.distributed as dist

        chunk = self.n // (self.world * self.k)
        if self.devices == 1:
            per = chunk * self.world
            for i in range(self.k):
                block = list(range(i * per, (i + 1) * per))
                yield from ([block[j] for j in self.perm.tolist()] if self.perm is not None else block)
            return
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        for i in range(self.k):
            c = i * self.world + rank
            yield from range(c * chunk, (c + 1) * chunk)


def _fit(pl, make_module, batch, seed, devices, outdir, world, accumulate, precision, perm=None):
    from torch.utils.data import DataLoader

    from .lightning import GradcheckDump

    pl.seed_everything(seed)
    module = make_module()
    rows = _Rows(batch)
    n = len(rows)
    if n % (world * accumulate):
        raise SystemExit(f"a batch of {n} does not split evenly over {world} ranks x {accumulate} micro-batches")
    dump = GradcheckDump(outdir, step=0, precision=precision,
                         extra_metadata={"gradcheck.order": "permuted"} if perm is not None else None)
    find_unused = os.environ.get("GRADCHECK_PL_FIND_UNUSED", "1") == "1"
    kw = {} if precision is None else {"precision": precision}
    trainer = pl.Trainer(accelerator="cpu", devices=devices, max_steps=1, callbacks=[dump],
                         strategy=("ddp_find_unused_parameters_true" if find_unused else "ddp") if devices > 1 else "auto",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         accumulate_grad_batches=accumulate, use_distributed_sampler=False, **kw)
    micro = n // (world * accumulate) * (world if devices == 1 else 1)
    sampler = _RankRows(n, world, devices, accumulate, perm)
    trainer.fit(module, train_dataloaders=DataLoader(rows, batch_size=micro, sampler=sampler, shuffle=False))
    if dump.written is None:
        raise SystemExit(f"rank {trainer.global_rank}: on_after_backward never ran at step 0: nothing dumped")
    return trainer


def main():
    make_module, make_batch = _load(sys.argv[1]), _load(sys.argv[2])
    seed, devices, outdir = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    import torch.distributed as dist

    from .harness import permutation
    from .lightning import lightning_package

    pl = lightning_package()  # patched for torch 1.13 on Python 3.11 (gradcheck_dist.lightning.patch_lightning)
    pl.seed_everything(seed)
    batch = make_batch()
    batch = tuple(batch) if isinstance(batch, (list, tuple)) else batch
    precision = os.environ.get("GRADCHECK_PL_PRECISION") or None
    accumulate = int(os.environ.get("GRADCHECK_PL_ACCUMULATE") or 1)
    world = int(os.environ.get("GRADCHECK_PL_WORLD") or devices)
    _fit(pl, make_module, batch, seed, devices, outdir, world, accumulate, precision)
    if devices == 1 and os.environ.get("GRADCHECK_PL_REFERENCES", "1") == "2":
        per = len(_Rows(batch)) // accumulate   # rows of one reference micro-batch, permuted within it
        _fit(pl, make_module, batch, seed, devices, outdir.rstrip(os.sep) + "-permuted", world, accumulate, precision,
             perm=permutation(per))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
