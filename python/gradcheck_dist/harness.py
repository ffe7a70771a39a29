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
    gather that carries gradients (torch.distributed.nn.functional.all_gather, Lightning
    all_gather(sync_grads=True)). With world == 1 there is no process group: do not gather.
Let the model's forward return the loss (or only what the loss uses): DDP(find_unused_parameters=True)
finds the unused parameters by walking back from forward's outputs. A sum over the shard instead of
a mean, or a loss normalised by the rank's batch size in another way, is a different objective: the
check then reports `scaled`, which is correct.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

# ---- the binary


def find_binary(binary=None):
    b = binary or os.environ.get("GRADCHECK_DIST") or shutil.which("gradcheck-dist")
    if not b or not os.access(b, os.X_OK):
        raise RuntimeError(f"gradcheck-dist not found or not executable ({b or 'not on PATH'}): "
                           "put it on PATH or set GRADCHECK_DIST")
    return b


def run_check(dumps, ref=None, ignore=(), tol=None, binary=None, json_path=None, timeout=120):
    """Runs `gradcheck-dist check`; returns (exit code, report dict or None, stdout+stderr text)."""
    dumps = [os.fspath(dumps)] if isinstance(dumps, (str, os.PathLike)) else [os.fspath(d) for d in dumps]
    tmp = None
    if json_path is None:
        tmp = tempfile.mkdtemp(prefix="gcd-report-")
        json_path = os.path.join(tmp, "report.json")
    cmd = [find_binary(binary), "check", *dumps, "--json", os.fspath(json_path)]
    if ref is not None:
        cmd += ["--ref", os.fspath(ref)]
    for g in ignore:
        cmd += ["--ignore", g]
    if tol is not None:
        cmd += ["--tol", repr(float(tol))]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        report = None
        if os.path.exists(json_path):
            with open(json_path) as f:
                report = json.load(f)
        return p.returncode, report, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"gradcheck-dist check ran past {timeout} s: {' '.join(cmd)}") from e
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


class GradcheckFailure(AssertionError):
    """The check found something (exit 1): the message is the findings' text; .report the JSON report."""

    def __init__(self, message, report):
        super().__init__(message)
        self.report = report


def _verdict(rc, report, text, what):
    if rc == 0 and report is not None:
        return report
    if rc == 1 and report is not None:
        msgs = [f["message"] for f in report["runs"][0]["findings"] if f.get("counts")]
        raise GradcheckFailure(f"{what}: gradcheck-dist check found:\n  " + "\n  ".join(msgs), report)
    raise RuntimeError(f"{what}: gradcheck-dist check exited {rc}:\n{text}")


# ---- processes, each bounded in time


def _join_all(procs, timeout, what):
    """Waits for multiprocessing processes until the deadline; kills the rest; raises on any failure."""
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join(10)
    if hung:
        raise RuntimeError(f"{what}: ranks {hung} still running after {timeout} s; killed")
    return [p.exitcode for p in procs]


def _rank_errors(outdir, world):
    """The first rank to fail in full (the cause), the others' last line (often a closed connection)."""
    files = [(os.path.getmtime(f), r, f) for r in range(world)
             for f in [os.path.join(outdir, f"error-rank{r}.txt")] if os.path.exists(f)]
    msgs = []
    for i, (_, r, f) in enumerate(sorted(files)):
        with open(f) as fh:
            text = fh.read().strip()
        msgs.append(f"rank {r} (failed first):\n{text}" if i == 0 else f"rank {r}: {text.splitlines()[-1]}")
    return "\n".join(msgs)


def _shard(batch, rank, world):
    import torch

    if isinstance(batch, torch.Tensor):
        if batch.shape[0] % world:
            raise ValueError(f"batch of {batch.shape[0]} does not split evenly over world {world}")
        return batch.chunk(world)[rank]
    return type(batch)(_shard(b, rank, world) for b in batch)


# ---- plain PyTorch DDP


def _ddp_worker(rank, world, make_model, step, batch, seed, outdir, initfile):
    import torch
    import torch.distributed as dist

    from .dump import LocalGradCapture, dump_grads

    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method="file://" + initfile, rank=rank, world_size=world)
        try:
            torch.manual_seed(seed)
            model = make_model()
            ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
            cap = LocalGradCapture(ddp)
            step(ddp, _shard(batch, rank, world), rank, world).backward()
            cap.dump(os.path.join(outdir, "local", f"rank{rank}.safetensors"))
            dump_grads(ddp, os.path.join(outdir, "reduced", f"rank{rank}.safetensors"))
        finally:
            dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(outdir, f"error-rank{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        sys.exit(1)


def check_ddp(make_model, step, batch, world=4, seed=0, ignore=(), tol=None, binary=None, workdir=None, timeout=300,
              start_method="fork"):
    """Checks one DDP step against the single-process reference.

    make_model(): builds the model (called after torch.manual_seed(seed) on every rank and for the
    reference). step(model, shard, rank, world): returns the loss of `shard` (rank r gets the r-th of
    `world` equal slices of `batch`, a tensor or tuple of tensors, on dim 0); the harness calls
    backward. The reference calls step(model, batch, 0, 1) in this process, without a process group.
    The ranks are forked from this process (start_method="fork": quick, and make_model/step may be
    closures; should a forked rank hang in a threaded library, use "spawn"); with "spawn" they must
    be importable top-level functions and a calling script needs an `if __name__ == "__main__":` guard.
    Dumps go to workdir (a temporary directory, removed afterwards, when None): reduced/, local/,
    ref.safetensors.
    """
    import torch
    import torch.multiprocessing as mp

    from .dump import dump_grads

    own = workdir is None
    outdir = tempfile.mkdtemp(prefix="gcd-ddp-") if own else os.fspath(workdir)
    try:
        os.makedirs(outdir, exist_ok=True)
        initfile = os.path.join(outdir, f"pg-init-{os.getpid()}-{time.monotonic_ns()}")
        ctx = mp.get_context(start_method)
        procs = [ctx.Process(target=_ddp_worker, args=(r, world, make_model, step, batch, seed, outdir, initfile))
                 for r in range(world)]
        for p in procs:
            p.start()
        codes = _join_all(procs, timeout, f"check_ddp world {world}")
        if any(codes):
            errors = _rank_errors(outdir, world) or ("no rank reached the step (see stderr); a script that calls "
                                                     "check_ddp needs an `if __name__ == '__main__':` guard")
            raise RuntimeError(f"check_ddp world {world}: rank exit codes {codes}\n{errors}")
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = make_model()
            step(model, batch, 0, 1).backward()
        ref = dump_grads(model, os.path.join(outdir, "ref.safetensors"), rank=0, world=1)
        rc, report, text = run_check(os.path.join(outdir, "reduced"), ref=ref, ignore=ignore, tol=tol, binary=binary)
        return _verdict(rc, report, text, f"check_ddp world {world}")
    finally:
        if own:
            shutil.rmtree(outdir, ignore_errors=True)


# ---- Lightning: one subprocess per Trainer (Lightning relaunches the script for ranks 1..N-1)


def _qualname(fn):
    """MODULE:NAME, or FILE.py:NAME for a function of the running script (loaded there as a module)."""
    mod = fn.__module__
    if mod == "__main__" and getattr(sys.modules["__main__"], "__file__", None):
        mod = os.path.abspath(sys.modules["__main__"].__file__)
    if "<" in fn.__qualname__ or mod == "__main__":
        raise ValueError(f"{mod}:{fn.__qualname__}: check_lightning needs importable top-level functions")
    return f"{mod}:{fn.__qualname__}"


def _run_group(cmd, env, timeout, what):
    """Runs cmd in its own process group; on timeout kills the whole group (Lightning's child ranks too)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise RuntimeError(f"{what}: still running after {timeout} s; killed\n{out[-4000:]}")
    finally:
        try:  # a rank left behind by a failed launch
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    if p.returncode:
        raise RuntimeError(f"{what}: exited {p.returncode}\n{out[-6000:]}")
    return out


def check_lightning(make_module, make_batch, world=4, seed=0, ignore=(), tol=None, binary=None, workdir=None, timeout=300):
    """Checks one Lightning training step (Trainer, CPU, devices=world,
    strategy="ddp_find_unused_parameters_true", max_steps=1, GradcheckDump at step 0) against the
    same module trained with devices=1 (no process group) on the whole batch.

    make_module(): a LightningModule with training_step(batch, batch_idx) returning the loss and
    configure_optimizers. make_batch(): the global batch, a tensor or tuple of tensors; each rank
    gets len/world samples of it (Lightning's DistributedSampler, without shuffling). Both must be
    importable top-level functions: each Trainer runs in a fresh `python -m gradcheck_dist._lightning_run`.
    """
    own = workdir is None
    outdir = tempfile.mkdtemp(prefix="gcd-pl-") if own else os.fspath(workdir)
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(__file__))] + sys.path))
        env.pop("MASTER_PORT", None)
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        args = [_qualname(make_module), _qualname(make_batch), str(seed)]
        for w, d in ((world, "ranks"), (1, "ref")):
            cmd = [sys.executable, "-m", "gradcheck_dist._lightning_run", *args, str(w), os.path.join(outdir, d)]
            _run_group(cmd, env, timeout, f"check_lightning devices={w}")
        rc, report, text = run_check(os.path.join(outdir, "ranks"), ref=os.path.join(outdir, "ref", "rank0.safetensors"),
                                     ignore=ignore, tol=tol, binary=binary)
        return _verdict(rc, report, text, f"check_lightning world {world}")
    finally:
        if own:
            shutil.rmtree(outdir, ignore_errors=True)
