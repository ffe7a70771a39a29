"""Whole checks from a test: real DDP (or a real Lightning Trainer) on gloo CPU processes, a
single-process reference, and `gradcheck-dist check` on the dumps.

    check_ddp(make_model, step, batch, world=4)      plain PyTorch DistributedDataParallel
    check_lightning(make_module, make_batch, world=4)  Lightning Trainer, strategy ddp (find unused)
    run_check(dumps, ref=...)                        the binary alone: (exit code, report)

Both return the parsed JSON report of the check. They raise GradcheckFailure (an AssertionError whose
message is the findings' text; .report holds the report) when the check finds something (exit 1),
and RuntimeError when a rank fails or hangs (every wait is bounded: `timeout` seconds, then the
ranks are killed) or the checker reports bad input or a runtime failure (exit 2, 3).

The same objective. DDP averages the ranks' gradients; the reference is the gradient of the loss
computed in one process on the whole batch (world 1, no process group). Both are the same gradient
when the world-1 loss equals the mean over ranks of the rank losses, for example:
  - a per-sample mean loss (each rank: the mean over its shard; shards are equal in size), or
  - a loss over the gathered global batch (each rank's loss is the global loss), computed with a
    gather that carries gradients (gradcheck_dist.all_gather_with_grad: on recent torch
    torch.distributed._functional_collectives.all_gather_single_autograd, on torch 1.13
    torch.distributed.nn.functional.all_gather; Lightning all_gather(sync_grads=True)). With world == 1
    there is no process group: do not gather (all_gather_with_grad returns its input then).
Let the model's forward return the loss (or only what the loss uses): DDP(find_unused_parameters=True)
finds the unused parameters by walking back from forward's outputs (check_ddp sets it only when a probe
step shows a parameter without a gradient: find_unused_parameters="auto"). A sum over the shard instead of
a mean, or a loss normalised by the rank's batch size in another way, is a different objective: the
check then reports `scaled`, which is correct.
"""
import json
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

# ---- the binary


def own_binary():
    """The gradcheck-dist that was installed with this package (pip install: the wheel's RECORD names where,
    <venv>/bin, --user or --prefix alike), or None: not installed, or this module is not that installation's
    (a source tree on sys.path)."""
    try:
        from importlib import metadata

        dist = metadata.distribution("gradcheck-dist")
        here = os.path.realpath(__file__)
        files = dist.files or ()
        if not any(os.path.realpath(dist.locate_file(f)) == here for f in files if f.name == "harness.py"):
            return None
        for f in files:
            if f.name == "gradcheck-dist" and f.parent.name == "bin":
                return os.path.abspath(dist.locate_file(f))
    except Exception:  # no metadata, an unreadable RECORD: not ours to judge here
        return None
    return None


def find_binary(binary=None):
    """The gradcheck-dist executable: `binary`, else $GRADCHECK_DIST, else the one installed with this package
    (own_binary), else PATH. A setting the caller made wins; the package's own program wins over another on PATH
    (another version). RuntimeError when it is missing, not a file or not executable (never a raw
    PermissionError). The harness calls it before any rank starts."""
    env = os.environ.get("GRADCHECK_DIST")
    own = None if binary or env else own_binary()
    b = binary or env or own or shutil.which("gradcheck-dist")
    where = "binary=" if binary else "GRADCHECK_DIST=" if env else "installed with gradcheck_dist: " if own else ""
    if not b or not os.path.isfile(b) or not os.access(b, os.X_OK):
        why = "not on PATH" if not b else "not found" if not os.path.exists(b) else \
            "not a file" if not os.path.isfile(b) else "not executable"
        raise RuntimeError(f"gradcheck-dist {why} ({where}{b or ''}): install it (pip install . in gradcheck-dist's "
                           "source), put it on PATH or set GRADCHECK_DIST")
    return os.path.abspath(b)


PERMUTATION_SEED = 20261204   # the fixed seed of the permuted reference's row order


def permuted_path(ref):
    """Where the permuted reference of `ref` lives: DIR/rank0.safetensors -> DIR/permuted.safetensors (GradcheckDump's
    and clip_step.py's layout), else X.safetensors -> X-permuted.safetensors (check_ddp's ref-permuted.safetensors)."""
    ref = os.fspath(ref)
    d, base = os.path.split(ref)
    if base == "rank0.safetensors":
        return os.path.join(d, "permuted.safetensors")
    stem = base[:-len(".safetensors")] if base.endswith(".safetensors") else base
    return os.path.join(d, stem + "-permuted.safetensors")


def _refs(ref, references):
    """The --ref arguments: ref (a path or a list of paths); references=2 with one path adds its permuted sibling
    (permuted_path, which must exist); references=1 keeps the first; None: as given."""
    if ref is None:
        return []
    refs = [os.fspath(ref)] if isinstance(ref, (str, os.PathLike)) else [os.fspath(r) for r in ref]
    if references is None:
        return refs
    if references not in (1, 2):
        raise ValueError(f"references must be 1 or 2, not {references!r}")
    if references == 1:
        return refs[:1]
    if len(refs) == 1:
        second = permuted_path(refs[0])
        if not os.path.exists(second):
            raise ValueError(f"references=2: no second reference beside {refs[0]} ({second}): dump the permuted "
                             "reference, or pass ref=[A, B], or references=1")
        refs.append(second)
    return refs[:2]


def run_check(dumps, ref=None, ignore=(), tol=None, binary=None, json_path=None, timeout=120, references=None):
    """Runs `gradcheck-dist check`; returns (exit code, report dict or None, stdout+stderr text).

    ref: the reference dump, or a list of two ([A, B]: the same step in two row orders, `--ref A --ref B`: each
    tensor's rounding noise is measured by what they disagree by). references=2 with one ref adds its permuted
    sibling (permuted_path); 1 uses one reference only; None (default) passes what ref gives."""
    dumps = [os.fspath(dumps)] if isinstance(dumps, (str, os.PathLike)) else [os.fspath(d) for d in dumps]
    refs = _refs(ref, references)
    tmp = None
    if json_path is None:
        tmp = tempfile.mkdtemp(prefix="gcd-report-")
        json_path = os.path.join(tmp, "report.json")
    cmd = [find_binary(binary), "check", *dumps, "--json", os.fspath(json_path)]
    for r in refs:
        cmd += ["--ref", r]
    for g in ignore:
        cmd += ["--ignore", g]
    if tol is not None:
        cmd += ["--tol", repr(float(tol))]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        report = None
        if os.path.exists(json_path):
            with open(json_path) as f:
                report = json.load(f)
        return p.returncode, report, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"gradcheck-dist check ran past {timeout} s: {' '.join(cmd)}") from e
    except OSError as e:  # exec failed (a noexec mount, a bad interpreter line)
        raise RuntimeError(f"gradcheck-dist could not be run ({cmd[0]}): {e}: put it on PATH or set GRADCHECK_DIST") from e
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


class GradcheckFailure(AssertionError):
    """The check found something (exit 1): the message is the findings' text; .report the JSON report;
    .workdir the directory that keeps the dumps, report.json and ticket.md."""

    def __init__(self, message, report, workdir=None):
        super().__init__(message)
        self.report = report
        self.workdir = workdir


class HarnessError(RuntimeError):
    """A rank or the reference failed or hung, or the checker exited 2/3: .workdir keeps what there is."""

    def __init__(self, message, workdir=None):
        super().__init__(message)
        self.workdir = workdir


def _ticket(binary, outdir):
    """ticket.md beside report.json (gradcheck-dist report --format md); the path, or None."""
    src, dst = os.path.join(outdir, "report.json"), os.path.join(outdir, "ticket.md")
    if not os.path.exists(src):
        return None
    try:
        p = subprocess.run([binary, "report", src, "--format", "md"], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode not in (0, 1) or not p.stdout:
        return None
    from .dump import safe_write

    return safe_write(dst, p.stdout)   # never through a link planted in the workdir (issue 33)


def _kept(outdir):
    names = [n for n in ("report.json", "ticket.md", "ref.safetensors", "ref-permuted.safetensors", "reduced", "local",
                         "ranks", "ref", "ref-permuted")
             if os.path.exists(os.path.join(outdir, n))]
    errs = sorted(n for n in os.listdir(outdir) if n.startswith("error-")) if os.path.isdir(outdir) else []
    return f"kept in {outdir}" + (f" ({', '.join(names + errs)})" if names or errs else "")


def _skipped(outdir, what):
    """A finding (GradcheckFailure, as exit 1), not a harness error: the ranks whose step returned no loss for the
    synced backward (skipped.json, written by the first rank that joined)."""
    path = os.path.join(outdir, "skipped.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        missing = json.load(f)
    who = ("rank " if len(missing) == 1 else "ranks ") + ", ".join(map(str, missing))
    msg = (f"{who} never joined DDP's all-reduce: the step returned no loss there, so it skipped the synced "
           f"backward; in training the other ranks wait in the all-reduce until the process group's timeout (a hang), "
           f"or pair it with another step's. Fix: every rank runs the synced backward every step (a rank without "
           f"data: a loss of zero that still reaches every parameter, e.g. sum(p.sum() for p in model.parameters()) * 0)")
    raise GradcheckFailure(f"{what}: {msg}\n{_kept(outdir)}",
                           {"runs": [{"findings": [{"kind": "skipped_backward", "counts": True, "message": msg,
                                                    "ranks": missing}], "params": []}]}, outdir)


def _unjoined(outdir, what, world):
    """A finding (GradcheckFailure), not a harness error: some ranks finished their backward (their local dumps are
    written) while the others failed or hung in DDP's all-reduce, and the finished ones gave no gradient to some
    parameters (listed in gradcheck.params, absent from their local dump): DDP without find_unused_parameters waits
    for every parameter before it all-reduces their bucket, so those ranks never joined it."""
    from .dump import read_dump

    done, unused = [], {}
    for r in range(world):
        path = os.path.join(outdir, "local", f"rank{r}.safetensors")
        if not os.path.exists(path):
            continue
        try:
            tensors, meta = read_dump(path)
            listed = json.loads(meta.get("gradcheck.params", "[]"))
        except Exception:   # unreadable: no evidence, the harness error stands
            return
        done.append(r)
        missing = [n for n in listed if n not in tensors]
        if missing:
            unused[r] = missing
    if not done or len(done) == world or not unused:
        return
    waited = [r for r in range(world) if r not in done]
    for r in waited:   # each waited (hung: no error) or lost its peers in a collective, not an error of its own step
        err = os.path.join(outdir, f"error-rank{r}.txt")
        if os.path.exists(err):
            with open(err, errors="replace") as f:
                text = f.read()
            if not any(w in text for w in ("Connection closed by peer", "Connection reset by peer", "Timed out", "timed out")):
                return
    names = sorted({n for m in unused.values() for n in m})
    who = ("rank " if len(unused) == 1 else "ranks ") + ", ".join(map(str, unused))
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    msg = (f"{who} never joined DDP's all-reduce that {'rank' if len(waited) == 1 else 'ranks'} "
           f"{', '.join(map(str, waited))} waited in: {who} gave no gradient to {shown} (absent from its local dump), "
           f"and DDP without find_unused_parameters=True waits for every parameter's gradient before it all-reduces their "
           f"bucket, so {who} finished the backward without it (in training: a hang until the process group's timeout, "
           f"or 'Expected to have finished reduction in the prior iteration' at the next step). Fix: "
           f"find_unused_parameters=True (check_ddp's default 'auto' sets it when a probe step leaves a parameter "
           f"without a gradient), or let every rank's forward reach every parameter")
    raise GradcheckFailure(f"{what}: {msg}\n{_kept(outdir)}",
                           {"runs": [{"findings": [{"kind": "unjoined_reduce", "counts": True, "message": msg,
                                                    "ranks": sorted(unused), "waited": waited, "params": names}],
                                      "params": []}]}, outdir)


def _verdict(rc, report, text, what, outdir, binary):
    if rc == 0 and report is not None:
        return report
    if rc == 1 and report is not None:
        _ticket(binary, outdir)
        msgs = [f["message"] for f in report["runs"][0]["findings"] if f.get("counts")]
        raise GradcheckFailure(f"{what}: gradcheck-dist check found:\n  " + "\n  ".join(msgs) + f"\n{_kept(outdir)}",
                               report, outdir)
    raise HarnessError(f"{what}: gradcheck-dist check exited {rc}:\n{text}\n{_kept(outdir)}", outdir)


# ---- processes, each bounded in time


def _join_all(procs, timeout, what, names=None):
    """Waits for processes until all exit 0 or the deadline. The first one to fail ends the wait at once (the
    others, likely blocked in a collective with it, are killed): a failure is named in well under a second, a
    hang at `timeout`. Returns the exit codes (None: killed at the deadline or after another's failure);
    raises RuntimeError on a hang."""
    names = names or [f"rank {r}" for r in range(len(procs))]
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.exitcode for p in procs]
        if any(c not in (None, 0) for c in codes) or all(c is not None for c in codes):
            break
        if time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    alive = [i for i, p in enumerate(procs) if p.exitcode is None]
    for i in alive:
        procs[i].kill()
    for i in alive:
        procs[i].join(10)
    if alive and not any(c not in (None, 0) for c in codes):
        hung = ", ".join(names[i] for i in alive)
        raise RuntimeError(f"{what}: {hung} still running after {timeout} s; killed")
    return codes


def _rank_errors(outdir, names):
    """The first process to fail in full (the cause), the others' last line (often a closed connection)."""
    files = [(os.path.getmtime(f), n, f) for n in names
             for f in [os.path.join(outdir, f"error-{n.replace(' ', '')}.txt")] if os.path.exists(f)]
    msgs = []
    for i, (_, n, f) in enumerate(sorted(files)):
        with open(f) as fh:
            text = fh.read().strip()
        msgs.append(f"{n} (failed first):\n{text}" if i == 0 else f"{n}: {text.splitlines()[-1] if text else ''}")
    return "\n".join(msgs)


def _permute(batch, perm):
    """Every tensor of the batch with its rows (dim 0) in the order perm."""
    import torch

    if isinstance(batch, torch.Tensor):
        if batch.shape[0] != len(perm):
            raise ValueError(f"the permuted reference needs every tensor of the batch to have {len(perm)} rows on "
                             f"dim 0, one has {tuple(batch.shape)}")
        return batch[perm]
    return type(batch)(_permute(b, perm) for b in batch)


def _rows(batch):
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    for b in batch:
        return _rows(b)
    raise ValueError("an empty batch")


def permutation(n):
    """The permuted reference's row order: a fixed seeded permutation of n rows (never the identity for n > 1)."""
    import torch

    perm = torch.randperm(n, generator=torch.Generator().manual_seed(PERMUTATION_SEED))
    if n > 1 and bool((perm == torch.arange(n)).all()):
        perm = perm.roll(1)
    return perm


def _shard(batch, rank, world):
    import torch

    if isinstance(batch, torch.Tensor):
        if batch.shape[0] % world:
            raise ValueError(f"batch of {batch.shape[0]} does not split evenly over world {world}")
        return batch.chunk(world)[rank]
    return type(batch)(_shard(b, rank, world) for b in batch)


# ---- plain PyTorch DDP


def _one_thread():
    """A child's first act: one intra-op thread. A forked child must not use the parent's OpenMP pool (it hangs
    once the parent used it, issue 24 item 4a); spawned ones share 4 ranks over the cores without oversubscribing."""
    import torch

    torch.set_num_threads(1)


def _find_unused(model, step, shard, rank, world, setting):
    """DDP's find_unused_parameters: True/False as given; "auto": True when some rank's step leaves a trainable
    parameter without a gradient (a probe step on a copy of the model, without DDP, RNG restored)."""
    if setting != "auto":
        return bool(setting)
    import copy

    import torch
    import torch.distributed as dist

    try:
        probe = copy.deepcopy(model)
        with torch.random.fork_rng(devices=[]):
            step(probe, shard, rank, world).backward()
        unused = any(p.grad is None for p in probe.parameters() if p.requires_grad)
        del probe
    except Exception:
        unused = True
    flag = torch.tensor([1 if unused else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


STRATEGIES = ("ddp", "fsdp", "fsdp2")


def _wrap(model, strategy, find_unused):
    """The model under the data-parallel wrapper check_ddp's strategy= names."""
    import torch

    if strategy == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=find_unused)
    if strategy == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP(model, use_orig_params=True, device_id=torch.device("cpu"))
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    fully_shard(model)
    return model


def _no_sync(wrapped):
    """The wrapper's own way to skip gradient synchronisation for one backward."""
    import contextlib

    if hasattr(wrapped, "no_sync"):
        return wrapped.no_sync()

    @contextlib.contextmanager
    def fsdp2():
        wrapped.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)
    return fsdp2()


def _loss_value(loss):
    """The loss as a float for gradcheck.loss, or None where it is not one finite number."""
    try:
        v = float(loss.detach().float()) if hasattr(loss, "detach") and loss.numel() == 1 else None
    except Exception:
        return None
    return v if v is not None and math.isfinite(v) else None


def _accumulated_backward(ddp, step, shard, rank, world, accumulate, losses=None, cap=None):
    """The step as gradient accumulation runs it: shard split into `accumulate` equal micro-batches, each loss
    divided by `accumulate`; every backward but the last under ddp.no_sync() (entered before the forward: DDP
    reads it there), the last synced. losses (a list): each micro-batch's loss / accumulate is appended (their sum
    is the rank's loss of the step: gradcheck.loss). cap (LocalGradCapture): marked before the last backward, so the
    local dumps keep what was accumulated before it (NAME@earlier), where anything was (the step's own backward
    calls too). Returns the ranks that skipped the synced backward."""
    import contextlib

    import torch

    for i in range(accumulate):
        micro = _shard(shard, i, accumulate)
        with _no_sync(ddp) if i < accumulate - 1 else contextlib.nullcontext():
            loss = step(ddp, micro, rank, world)
            if i == accumulate - 1:
                missing = _not_joining(loss, world)
                if missing:
                    return missing
                if cap is not None:
                    cap.mark()
            if loss is not None:
                (loss / accumulate).backward()
                if losses is not None:
                    losses.append(_loss_value(loss / accumulate))
    return []


def _not_joining(loss, world):
    """The ranks whose step returned no loss (None) for the synced backward: they would never join DDP's
    all-reduce and the others would wait in it until the process group's timeout. Every rank learns which from
    one small all_gather before the backward, so the call ends at once and names them."""
    import torch
    import torch.distributed as dist

    mine = torch.tensor([0 if loss is None else 1])
    flags = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(flags, mine)
    return [r for r, f in enumerate(flags) if not int(f.item())]


def _drop_torch_tempdir():
    """Importing torch.distributed.nn (torch 1.13) makes a temporary directory, its jit instantiator's, removed
    only at interpreter exit, which a multiprocessing child never reaches (it leaves with os._exit): removed here.
    Left, every rank of every check_ddp call leaves one in the temporary folder."""
    tmp = getattr(sys.modules.get("torch.distributed.nn.jit.instantiator"), "_TEMP_DIR", None)
    if tmp is not None:
        tmp.cleanup()


def _child(name, outdir, body):
    """A child's whole life: body(), and on any failure its traceback in error-NAME.txt and exit 1."""
    try:
        body()
    except BaseException:
        try:
            from .dump import safe_write

            safe_write(os.path.join(outdir, f"error-{name}.txt"), traceback.format_exc())
        except BaseException:
            traceback.print_exc()
        sys.stderr.flush()
        _drop_torch_tempdir()
        os._exit(1)
    _drop_torch_tempdir()


def _init_group(rank, world, initfile, timeout):
    import datetime

    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="file://" + initfile, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=max(1, int(timeout))))


def _reference(make_model, step, batch, seed, outdir, precision, references, objective=None, world=None, accumulate=1):
    """The single-process reference: no process group, the whole batch, step(model, batch, 0, 1) (or objective(model,
    batch): check_ddp's reference=); with references=2 again, re-seeded identically, the rows permuted
    (ref-permuted.safetensors: the noise). Its loss is recorded (gradcheck.loss), and with world, what each rank's
    synced micro-batch gives alone in one process (gradcheck.shard_losses, _shard_losses)."""
    import torch

    from .dump import dump_grads, track

    times = []
    for order in ("given", "permuted")[:references]:
        t0 = time.perf_counter()
        torch.manual_seed(seed)
        model = make_model()
        track(model)
        rows = batch if order == "given" else _permute(batch, permutation(_rows(batch)))
        loss = objective(model, rows) if objective is not None else _one_process_step(step, model, rows)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"the reference's {'reference(model, batch)' if objective is not None else 'step(model, batch, 0, 1)'} "
                            f"must return the loss, a scalar tensor, not {type(loss).__name__}"
                            f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
        loss.backward()
        extra = {"gradcheck.objective": "reference"} if objective is not None else {}   # not step(model, batch, 0, 1)
        if order == "permuted":
            extra["gradcheck.order"] = "permuted"
        elif world:
            losses = _shard_losses(model, step, batch, world, accumulate, seed)
            if losses is not None:
                extra["gradcheck.shard_losses"] = json.dumps(losses)
        dump_grads(model, os.path.join(outdir, "ref.safetensors" if order == "given" else "ref-permuted.safetensors"),
                   rank=0, world=1, precision=precision, extra_metadata=extra, loss=_loss_value(loss))
        times.append(time.perf_counter() - t0)
    with open(os.path.join(outdir, "ref-times.json"), "w") as f:
        json.dump(times, f)


def _one_process_step(step, model, rows):
    """step(model, rows, 0, 1), the reference's default objective; a step that needs a process group says so."""
    try:
        return step(model, rows, 0, 1)
    except (RuntimeError, ValueError) as e:
        if "process group" not in str(e).lower():
            raise
        raise RuntimeError(f"{e}\nthe reference runs step(model, batch, 0, 1) in one process, without a process group: a "
                           "step that needs one (an all_reduce of token counts) needs check_ddp(..., reference=fn(model, "
                           "batch)) returning the objective the ranks compute together (docs/python.md)") from e


def _shard_losses(model, step, batch, world, accumulate, seed):
    """What each rank's shard gives alone, as a rank's gradcheck.loss counts it (the mean over its `accumulate`
    micro-batches of step(model, micro, 0, 1)), without gradients, after the reference's dump is taken (its
    gradients are not touched). A rank's loss that is the mean of these while they differ was averaged over the
    ranks in the forward (`check` names a double reduction). None where the step cannot run so (it calls backward
    itself, or fails)."""
    import torch

    out = []
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            for r in range(world):
                mine = _shard(batch, r, world)
                out.append(sum(float(step(model, _shard(mine, i, accumulate), 0, 1).detach().float())
                               for i in range(accumulate)) / accumulate)
    except Exception:
        return None
    return out if all(math.isfinite(v) for v in out) else None


def _ddp_worker(rank, world, payload, seed, outdir, initfile, timeout, precision, find_unused, one_thread,
                references=2, accumulate=1, strategy="ddp"):   # payload: (make_model, step, batch, reference)
    def body():
        if one_thread:
            _one_thread()
        import torch
        import torch.distributed as dist

        from .dump import LocalGradCapture, dump_grads

        make_model, step, batch, objective = pickle.loads(payload) if isinstance(payload, bytes) else payload
        if rank is None:
            return _reference(make_model, step, batch, seed, outdir, precision, references, objective, world, accumulate)
        _init_group(rank, world, initfile, timeout)
        try:
            torch.manual_seed(seed)
            model = make_model()
            shard = _shard(batch, rank, world)
            fup = _find_unused(model, step, shard, rank, world, find_unused) if strategy == "ddp" else False
            ddp = _wrap(model, strategy, fup)
            cap = LocalGradCapture(ddp) if strategy == "ddp" else None   # local dumps: DDP's (before its all-reduce)
            losses = []
            missing = _accumulated_backward(ddp, step, shard, rank, world, accumulate, losses, cap)
            if missing:
                if rank == min(range(world), key=lambda r: r in missing):   # one writer: the first rank that joined
                    from .dump import safe_write

                    safe_write(os.path.join(outdir, "skipped.json"), json.dumps(missing))
                return
            if cap is not None:
                cap.dump(os.path.join(outdir, "local", f"rank{rank}.safetensors"), precision=precision)
            loss = sum(losses) if losses and None not in losses else None   # the rank's loss of the step: gradcheck.loss
            dump_grads(ddp, os.path.join(outdir, "reduced", f"rank{rank}.safetensors"), precision=precision, loss=loss,
                       extra_metadata={"gradcheck.accumulate": str(accumulate)} if accumulate > 1 else None)
        finally:
            dist.destroy_process_group()
    _child("ref" if rank is None else f"rank{rank}", outdir, body)


def _tp_worker(rank, world, payload, seed, outdir, initfile, timeout, precision, one_thread, references, mesh):
    def body():
        if one_thread:
            _one_thread()
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        from .dump import dump_grads

        make_model, parallelize, step, batch = pickle.loads(payload) if isinstance(payload, bytes) else payload
        if rank is None:   # the unparallelised model: parallelize is never called
            return _reference(make_model, step, batch, seed, outdir, precision, references)
        _init_group(rank, world, initfile, timeout)
        try:
            dm = init_device_mesh("cpu", tuple(mesh), mesh_dim_names=("dp", "tp"))
            torch.manual_seed(seed)
            model = make_model()
            model = parallelize(model, dm) or model
            d = dm.get_coordinate()[0]   # every tp rank of dp replica d: the same shard
            step(model, _shard(batch, d, mesh[0]), d, mesh[0]).backward()
            dump_grads(model, os.path.join(outdir, "reduced", f"rank{rank}.safetensors"), precision=precision)
        finally:
            dist.destroy_process_group()
    _child("ref" if rank is None else f"rank{rank}", outdir, body)


def _start_method(start_method, payload):
    """(method, payload): "forkserver" when make_model, step and batch pickle (by reference: top-level
    functions), else "fork" (closures, lambdas) with one thread per child. Both are safe after the parent used
    torch's thread pool; an explicit start_method is used as given."""
    if start_method not in (None, "auto", "fork", "spawn", "forkserver"):
        raise ValueError(f"start_method must be None, 'fork', 'spawn' or 'forkserver', not {start_method!r}")
    try:
        data = pickle.dumps(payload)
    except Exception:
        data = None
    if start_method in (None, "auto"):
        start_method = "forkserver" if data is not None else "fork"
    if start_method != "fork" and data is None:
        pickle.dumps(payload)  # raises, naming what does not pickle
    return start_method, (data if start_method != "fork" else payload)


MAX_WORLD = 256   # processes of a whole torch each: more is a typo (10**6 forked until the machine stopped)


def _check_world(world):
    """world: an int from 1 to MAX_WORLD, refused before anything starts (not "4", 2.0, True, 0, -1)."""
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_WORLD:
        raise ValueError(f"world must be an int from 1 to {MAX_WORLD} (one process each), not {world!r}")


# what a call leaves in its workdir: a second call clears them first (a world-4 call's rank2/rank3 dumps must
# not join a world-2 check)
_OUTPUTS = ("reduced", "local", "ranks", "ref", "ref-permuted", "ref.safetensors", "ref-permuted.safetensors", "report.json", "ticket.md")


def _prepare_workdir(outdir):
    """Makes outdir (walked as every output is: no link another user could have planted, dump.open_dir) and
    removes what an earlier call left there (_OUTPUTS, error-*); a link is removed itself, never followed."""
    import stat

    from .dump import open_dir

    dfd = open_dir(outdir)
    try:   # by the descriptor open_dir checked: outdir swapped for a link meanwhile removes nothing elsewhere
        for n in os.listdir(dfd):
            if n in _OUTPUTS or n.startswith("error-") or n == "skipped.json":
                if stat.S_ISDIR(os.stat(n, dir_fd=dfd, follow_symlinks=False).st_mode):
                    shutil.rmtree(n, dir_fd=dfd)
                else:
                    os.unlink(n, dir_fd=dfd)
    finally:
        os.close(dfd)


def _end_procs(procs):
    """Every process still running is killed, by pid, and joined: on every path out of a call (an exception,
    KeyboardInterrupt); the ones already joined are left alone (their pid may be another's now)."""
    for p in procs:
        if p.pid is not None and p.exitcode is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in procs:
        if p.pid is not None:
            p.join(10)


def check_ddp(make_model, step, batch, world=4, seed=0, ignore=(), tol=None, binary=None, workdir=None, timeout=300,
              start_method=None, precision=None, find_unused_parameters="auto", one_thread=True, references=2,
              accumulate=1, strategy="ddp", reference=None):
    """Checks one DDP step against the single-process reference.

    make_model(): builds the model (called after torch.manual_seed(seed) on every rank and for the
    reference). step(model, shard, rank, world): returns the loss of `shard` (rank r gets the r-th of
    `world` equal slices of `batch`, a tensor or tuple of tensors, on dim 0); the harness calls
    backward. The reference calls step(model, batch, 0, 1) in its own process, without a process group.

    Processes: the ranks and the reference each run in a child process, all bounded by `timeout` (a hang in the
    reference alone too); the first one to fail stops the others at once and is named. start_method None picks a
    safe one: "forkserver" when make_model, step and batch pickle (top-level functions; a calling script then
    needs an `if __name__ == "__main__":` guard), else "fork" (closures); every child uses one intra-op thread
    (one_thread=False keeps torch's default), so a fork after the parent used torch's thread pool cannot hang.
    precision: what the step computes in (dump_grads); None infers it (autocast seen in forward, dtypes).
    find_unused_parameters: DDP's flag, or "auto" (default): True only when a probe step on a copy of the
    model leaves some trainable parameter without a gradient on some rank (True breaks a model whose
    forward returns a parameter itself, e.g. open_clip's SigLIP logit_bias: "marked ready twice").
    references=2 (default): the reference process computes the step twice, the second time re-seeded identically
    with the batch's rows permuted (one fixed seeded permutation, every tensor of the batch alike, on dim 0):
    ref-permuted.safetensors (`gradcheck.order=permuted`). Mathematically the same gradient when the loss does not
    depend on the rows' order; what the two disagree by is each tensor's own rounding noise, which `check --ref A
    --ref B` measures. references=1: the reference once (a step whose loss depends on the row order). A batch
    whose tensors cannot be permuted alike (rows of different counts) falls back to one reference, with a warning.
    accumulate=K: gradient accumulation: each rank's shard is split into K equal micro-batches, each loss divided
    by K, the first K-1 backward calls under DDP's no_sync() and the last synced; the reference is the objective,
    not the loop (step(model, batch, 0, 1) once). The shard's rows must split evenly into K.
    reference: the reference's objective, reference(model, batch) -> loss, called in the reference process (no
    process group) on the whole batch in place of step(model, batch, 0, 1): for an objective the one-process step does
    not compute (per-rank statistics, a loss normalised by a count the ranks all-reduce; docs/python.md). It must be
    the objective whose gradient DDP's average of the ranks' gradients is: (1/world) x the sum of the ranks' losses.
    strategy: the data-parallel wrapper: "ddp" (default; local dumps too), "fsdp" (FSDP1, use_orig_params=True)
    or "fsdp2" (fully_shard on the whole model; torch >= 2.4): the reduced (sharded) dumps only.
    Each rank's dump records its loss of the step and the reference's the objective (gradcheck.loss).
    Dumps go to workdir (a temporary directory when None, removed after a pass and kept after a failure):
    reduced/, local/, ref.safetensors, ref-permuted.safetensors, and after a failure report.json and ticket.md;
    the exception names it.
    """
    _check_world(world)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise ValueError(f"accumulate must be an int >= 1 (micro-batches per step), not {accumulate!r}")
    references = _no_second_reference(batch, references, "check_ddp")
    bin_path = find_binary(binary)  # before any rank starts
    if reference is not None and not callable(reference):
        raise TypeError(f"reference must be a function reference(model, batch) -> loss, not {type(reference).__name__}")
    method, payload = _start_method(start_method, (make_model, step, batch, reference))
    return _run_ranks(f"check_ddp world {world}", "gcd-ddp-", _ddp_worker, world, method,
                      (payload, seed, None, None, timeout, precision, find_unused_parameters, one_thread, references,
                       accumulate, strategy),
                      ["reduced"] + (["local"] if strategy == "ddp" else []), workdir, timeout, references, ignore, tol,
                      bin_path)


def _run_ranks(what, prefix, worker, world, method, args, dumps, workdir, timeout, references, ignore, tol, bin_path):
    """check_ddp's and check_tp's processes: worker(rank, world, *args) for ranks 0..world-1 and the reference
    (rank None), args' outdir and initfile (its 3rd and 4th) filled in here; every one bounded by `timeout`, the
    first failure named; then `check` on the dumps (outdir's subfolders `dumps`) against ref.safetensors (and
    ref-permuted.safetensors): the report, or GradcheckFailure / HarnessError naming the kept workdir."""
    import torch.multiprocessing as mp

    own = workdir is None
    outdir = tempfile.mkdtemp(prefix=prefix) if own else os.path.abspath(os.fspath(workdir))
    ok = False
    procs, pgdir = [], tempfile.mkdtemp(prefix="gcd-pg-")   # gloo's init file: private, never in a shared workdir
    try:
        _prepare_workdir(outdir)
        args = args[:2] + (outdir, os.path.join(pgdir, "init")) + args[4:]
        ctx = mp.get_context(method)
        if method == "forkserver":
            ctx.set_forkserver_preload(["torch", "torch.distributed"])  # never this package: the children take the caller's sys.path
        ranks = list(range(world)) + [None]
        names = [f"rank {r}" for r in range(world)] + ["the single-process reference"]
        procs = [ctx.Process(target=worker, daemon=True, args=(r, world) + args) for r in ranks]
        for p in procs:
            p.start()
        try:
            codes = _join_all(procs, timeout, what, names)
        except RuntimeError as e:
            _unjoined(outdir, what, world)
            raise HarnessError(f"{e}\n{_kept(outdir)}", outdir) from None
        if any(codes):
            _unjoined(outdir, what, world)
            errors = _rank_errors(outdir, [n.replace("the single-process reference", "ref") for n in names])
            if not errors:
                errors = ("no process reached the step (its own output is above); a script that calls check_ddp "
                          "needs an `if __name__ == '__main__':` guard")
            shown = ", ".join(f"{n}: {'killed' if c is None else c}" for n, c in zip(names, codes))
            raise HarnessError(f"{what}: exit codes {shown}\n{errors}\n{_kept(outdir)}", outdir)
        _skipped(outdir, what)
        # both stages in one check: the local dumps say which ranks gave no gradient before the all-reduce
        refs = [os.path.join(outdir, "ref.safetensors")]
        if references == 2:
            refs.append(os.path.join(outdir, "ref-permuted.safetensors"))
        rc, report, text = run_check([os.path.join(outdir, d) for d in dumps],
                                     ref=refs, ignore=ignore, tol=tol, binary=bin_path,
                                     json_path=os.path.join(outdir, "report.json"))
        out = _verdict(rc, report, text, what, outdir, bin_path)
        ok = True
        return out
    except (GradcheckFailure, HarnessError):
        ok = None   # kept: the exception names the directory and what is in it
        raise
    finally:
        _end_procs(procs)
        shutil.rmtree(pgdir, ignore_errors=True)
        if own and ok is not None:   # a pass, or an interrupt or error that names no directory: removed
            shutil.rmtree(outdir, ignore_errors=True)


def _no_second_reference(batch, references, caller):
    """references, or 1 (with a warning) when the batch's rows cannot be permuted alike."""
    if references not in (1, 2):
        raise ValueError(f"references must be 1 or 2, not {references!r}")
    if references == 2:   # a batch whose rows cannot be permuted alike: one reference, said (check may say undecided)
        try:
            _permute(batch, permutation(_rows(batch)))
        except (ValueError, TypeError, IndexError) as e:
            import warnings

            warnings.warn(f"{caller}: no second reference ({e}); each tensor is judged on its claimed tolerance alone",
                          stacklevel=3)
            references = 1
    return references


def check_tp(make_model, parallelize, step, batch, mesh=(1, 2), seed=0, ignore=(), tol=None, binary=None, workdir=None,
             timeout=300, start_method=None, precision=None, one_thread=True, references=2):
    """Checks one tensor-parallel (and data-parallel) step against the unparallelised model in one process.

    mesh=(dp, tp): dp * tp gloo ranks on a DeviceMesh init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp",
    "tp")). On every rank: torch.manual_seed(seed), make_model(), then parallelize(model, mesh) (parallelize_module
    on mesh["tp"], fully_shard on mesh["dp"] when dp > 1, tp_layout: whatever the training does; it may return the
    model or None), then step(model, shard, d, dp).backward() where d is the rank's dp coordinate and shard the d-th
    of dp equal slices of `batch` on dim 0: the same shard on every tp rank of replica d. The tp ranks' backward
    together must compute replica d's loss (a loss on a replicated output, or each rank's sum over its sequence
    shard); with dp > 1 parallelize's data-parallel wrapper averages the replicas. Then dump_grads on every rank
    (each piece and its placements) and `check` on them against the reference: make_model() with
    step(model, batch, 0, 1) (and its permuted second reference, references=2), exactly as check_ddp; returns the
    report or raises GradcheckFailure / HarnessError as check_ddp does (workdir: reduced/, ref*.safetensors).
    """
    if (not isinstance(mesh, (tuple, list)) or len(mesh) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in mesh)):
        raise ValueError(f"mesh must be (dp, tp), two ints >= 1, not {mesh!r}")
    _check_world(mesh[0] * mesh[1])
    references = _no_second_reference(batch, references, "check_tp")
    bin_path = find_binary(binary)  # before any rank starts
    method, payload = _start_method(start_method, (make_model, parallelize, step, batch))
    return _run_ranks(f"check_tp mesh (dp {mesh[0]}, tp {mesh[1]})", "gcd-tp-", _tp_worker, mesh[0] * mesh[1], method,
                      (payload, seed, None, None, timeout, precision, one_thread, references, tuple(mesh)),
                      ["reduced"], workdir, timeout, references, ignore, tol, bin_path)


# ---- Lightning: one subprocess per Trainer (Lightning relaunches the script for ranks 1..N-1)


def _qualname(fn):
    """MODULE:NAME, or FILE.py:NAME for a function of the running script (loaded there as a module)."""
    mod = fn.__module__
    if mod == "__main__" and getattr(sys.modules["__main__"], "__file__", None):
        mod = os.path.abspath(sys.modules["__main__"].__file__)
    if "<" in fn.__qualname__ or mod == "__main__":
        raise ValueError(f"{mod}:{fn.__qualname__}: check_lightning needs importable top-level functions")
    return f"{mod}:{fn.__qualname__}"


def _run_group(cmd, env, timeout, what, outdir):
    """Runs cmd in its own process group; on timeout kills the whole group (Lightning's child ranks too)."""
    try:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             text=True, start_new_session=True)
    except OSError as e:
        raise HarnessError(f"{what}: could not start {cmd[0]}: {e}", outdir) from e
    chunks = []
    reader = threading.Thread(target=lambda: chunks.append(p.stdout.read()), daemon=True)
    reader.start()
    exited = False
    try:
        exited = _wait_unreaped(p.pid, timeout)
    finally:
        # the leader is at most a zombie until p.wait() below: its group id is still ours to signal (a rank left
        # behind by a failed launch, all of them on a timeout or KeyboardInterrupt: every path goes through here)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
        reader.join(10)
    out = "".join(c for c in chunks if c)
    if not exited:
        raise HarnessError(f"{what}: still running after {timeout} s; killed\n{out[-4000:]}\n{_kept(outdir)}", outdir)
    if p.returncode:
        raise HarnessError(f"{what}: exited {p.returncode}\n{out[-6000:]}\n{_kept(outdir)}", outdir)
    return out


def _wait_unreaped(pid, timeout):
    """True once child pid has exited (left unreaped: WNOWAIT), False at the deadline. KeyboardInterrupt passes
    through; the caller's kill of the group then still finds the group ours."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:
            return True
        time.sleep(0.05)
    return False


def check_lightning(make_module, make_batch, world=4, seed=0, ignore=(), tol=None, binary=None, workdir=None, timeout=300,
                    precision=None, find_unused_parameters=True, accumulate_grad_batches=1, references=2):
    """Checks one Lightning training step (Trainer, CPU, devices=world, strategy "ddp" -- with
    find_unused_parameters=True (default) "ddp_find_unused_parameters_true" --, max_steps=1, GradcheckDump at
    step 0) against the same module trained with devices=1 (no process group) on the whole batch.

    make_module(): a LightningModule with training_step(batch, batch_idx) returning the loss and
    configure_optimizers. make_batch(): the global batch, a tensor or tuple of tensors. Both must be
    importable top-level functions: each Trainer runs in a fresh `python -m gradcheck_dist._lightning_run`.
    Rows: the ranks' Trainer runs with use_distributed_sampler=False (Lightning's own DistributedSampler shuffles:
    the reference would see other rows) and each rank gets exactly its rows: rank r the r-th of `world` equal
    slices (check_ddp's split).
    precision: the Trainers' precision ("32-true", "bf16-mixed", ...: passed to both Trainers and recorded in the
    dumps; None: Lightning's default, and the dumps record what they see).
    accumulate_grad_batches=K: the ranks run K micro-batches each (the batch in K * world equal chunks, rank r's
    micro-batch i the chunk i * world + r); the reference runs on devices=1 with the same K, its micro-batch i
    every rank's i-th micro-batch in rank order. The objective both compute is the mean over the K micro-batches
    of the loss on micro-batch i of the whole world (Lightning divides each micro-batch's loss by K): the same
    gradient when a rank's loss is its rows' mean (or a loss over the gathered micro-batch).
    references=2 (default): the reference Trainer runs a second time on the same rows, permuted within each
    micro-batch (ref-permuted/rank0.safetensors, `gradcheck.order=permuted`), and check reads both (--ref A --ref
    B: each tensor's rounding noise measured); 1: one reference.
    workdir as for check_ddp: kept, with report.json and ticket.md, after a failure, and named in the exception.
    """
    _check_world(world)
    if references not in (1, 2):
        raise ValueError(f"references must be 1 or 2, not {references!r}")
    accumulate_grad_batches = int(accumulate_grad_batches)
    if accumulate_grad_batches < 1:
        raise ValueError(f"accumulate_grad_batches must be >= 1, not {accumulate_grad_batches}")
    bin_path = find_binary(binary)  # before any Trainer starts
    args = [_qualname(make_module), _qualname(make_batch), str(seed)]
    own = workdir is None
    outdir = tempfile.mkdtemp(prefix="gcd-pl-") if own else os.path.abspath(os.fspath(workdir))
    ok = False
    try:
        _prepare_workdir(outdir)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(__file__))] + sys.path))
        env.pop("MASTER_PORT", None)
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env["GRADCHECK_PL_PRECISION"] = "" if precision is None else str(precision)
        env["GRADCHECK_PL_FIND_UNUSED"] = "1" if find_unused_parameters else "0"
        env["GRADCHECK_PL_ACCUMULATE"] = str(accumulate_grad_batches)
        env["GRADCHECK_PL_WORLD"] = str(world)
        env["GRADCHECK_PL_REFERENCES"] = str(references)
        for w, d in ((world, "ranks"), (1, "ref")):
            cmd = [sys.executable, "-m", "gradcheck_dist._lightning_run", *args, str(w), os.path.join(outdir, d)]
            _run_group(cmd, env, timeout, f"check_lightning devices={w}", outdir)
        ranks = os.path.join(outdir, "ranks")   # and ranks/local (GradcheckDump under DDP): both stages in one check
        local = os.path.join(ranks, "local")
        refs = [os.path.join(outdir, "ref", "rank0.safetensors")]
        if references == 2:
            refs.append(os.path.join(outdir, "ref-permuted", "rank0.safetensors"))
        rc, report, text = run_check([ranks, local] if os.path.isdir(local) else ranks,
                                     ref=refs, ignore=ignore, tol=tol, binary=bin_path,
                                     json_path=os.path.join(outdir, "report.json"))
        out = _verdict(rc, report, text, f"check_lightning world {world}", outdir, bin_path)
        ok = True
        return out
    except (GradcheckFailure, HarnessError):
        ok = None   # kept: the exception names the directory and what is in it
        raise
    finally:
        if own and ok is not None:   # a pass, or an interrupt or error that names no directory: removed
            shutil.rmtree(outdir, ignore_errors=True)
