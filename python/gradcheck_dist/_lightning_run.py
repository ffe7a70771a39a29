"""One Trainer run for check_lightning (Lightning relaunches this same command for ranks 1..N-1).

usage: python -m gradcheck_dist._lightning_run MODULE:MAKE_MODULE MODULE:MAKE_BATCH SEED DEVICES OUTDIR
Writes OUTDIR/rank{r}.safetensors (GradcheckDump at step 0, after backward, before the optimizer step).
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


def main():
    make_module, make_batch = _load(sys.argv[1]), _load(sys.argv[2])
    seed, devices, outdir = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from .lightning import GradcheckDump, lightning_package

    pl = lightning_package()  # patched for torch 1.13 on Python 3.11 (gradcheck_dist.lightning.patch_lightning)
    pl.seed_everything(seed)
    module, batch = make_module(), make_batch()
    batch = tuple(batch) if isinstance(batch, (list, tuple)) else batch
    rows = _Rows(batch)
    if len(rows) % devices:
        raise SystemExit(f"a batch of {len(rows)} does not split evenly over {devices} devices")
    dump = GradcheckDump(outdir, step=0, precision=os.environ.get("GRADCHECK_PL_PRECISION") or None)
    find_unused = os.environ.get("GRADCHECK_PL_FIND_UNUSED", "1") == "1"
    trainer = pl.Trainer(accelerator="cpu", devices=devices, max_steps=1, callbacks=[dump],
                         strategy=("ddp_find_unused_parameters_true" if find_unused else "ddp") if devices > 1 else "auto",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=DataLoader(rows, batch_size=len(rows) // devices, shuffle=False))
    if dump.written is None:
        raise SystemExit(f"rank {trainer.global_rank}: on_after_backward never ran at step 0: nothing dumped")
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
