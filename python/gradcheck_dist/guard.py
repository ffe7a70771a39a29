"""guard: a check of the reduced gradients inside training, every N steps, at any scale (docs/guard.md).

    g = gradcheck_dist.guard(model, every=100)       # after DDP / FSDP wraps the model
    for step, batch in enumerate(loader):
        loss = model(batch); loss.backward()
        g.check(step)                                 # after the reduce (and scaler.unscale_), before the step
        optimizer.step(); optimizer.zero_grad()

or guard(model, every=100, optimizer=opt) on torch >= 2.0: a step pre-hook on the optimizer calls check().
Lightning: GradcheckGuard(every_n_steps=100) (gradcheck_dist.lightning).

Each rank summarises each parameter's gradient where it lives (present, non-finite count, norm, whether its module
ran, a K-value linear sketch: seeded random projections), the ranks all-gather the summaries (one collective on
the training's own process group), and the C classifier (libgradcheck_dist, src/guard/guard.c, the same verdict
and report as `gradcheck-dist check`) judges them on every rank alike, so every rank raises together.
"""
import ctypes
import json
import logging
import os
import warnings
import zlib

from .dump import clean_name, collect, track, unwrap

ABI = 1
COLS = 7  # name hash, present, non-finite, first non-finite, norm, ran, sharded (src/guard/guard.h)
MAX_DIM = 8
ROW = 1024  # the sketch's projections: a chunk of CHUNK elements is a (CHUNK // ROW, ROW) matrix G, and
CHUNK = ROW * 256  # s = (G w) R with w (ROW) and R (CHUNK // ROW, K) drawn from (seed, parameter, chunk)
TOL = 1e-4  # relative difference between two ranks' gradients that counts (docs/guard.md: why)

log = logging.getLogger("gradcheck_dist.guard")


class GradcheckFinding(RuntimeError):
    """A guarded step's findings: the message is the findings' text; .report (the JSON report, as check's),
    .step, .ranks (the ranks the findings name)."""

    def __init__(self, message, report, step, ranks):
        super().__init__(message)
        self.report, self.step, self.ranks = report, step, ranks


# ---- the library


def _candidates():
    env = os.environ.get("GRADCHECK_DIST_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    return [os.path.join(here, "libgradcheck_dist.so"), os.path.join(repo, "build", "libgradcheck_dist.so")]


_LIB = None


def library():
    """The judgement's shared library: $GRADCHECK_DIST_LIB, else the one installed beside this package, else a
    build tree's (build/ beside python/)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    tried = []
    for path in _candidates():
        if not os.path.isfile(path):
            tried.append(f"{path} (not there)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        lib.gcd_guard_abi.restype = ctypes.c_int
        if lib.gcd_guard_abi() != ABI:
            tried.append(f"{path} (ABI {lib.gcd_guard_abi()}, this package needs {ABI}: rebuild it)")
            continue
        lib.gcd_guard_judge.restype = ctypes.c_int
        lib.gcd_guard_judge.argtypes = [ctypes.POINTER(ctypes.c_double), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                        ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_int),
                                        ctypes.POINTER(ctypes.c_longlong), ctypes.c_longlong, ctypes.c_int,
                                        ctypes.c_double, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                        ctypes.c_char_p, ctypes.c_size_t]
        lib.gcd_guard_free.argtypes = [ctypes.c_void_p]
        _LIB = lib
        return lib
    raise RuntimeError("gradcheck_dist.guard: libgradcheck_dist.so not found: " + "; ".join(tried) +
                       ": pip install gradcheck-dist, or build it (cmake --build build) and set GRADCHECK_DIST_LIB")


def judge(summary, names, shapes, step, every, tol, report_path):
    """Runs the C classifier on the gathered summary (a float64 (world, nparam, COLS + k) torch tensor on the CPU):
    (exit code, report dict). Raises RuntimeError on bad input (2) or a report it could not write (3)."""
    import torch

    lib = library()
    s = summary.detach().to("cpu", torch.float64).contiguous()
    world, nparam, width = s.shape
    k = width - COLS
    name_arr = (ctypes.c_char_p * max(nparam, 1))(*[n.encode() for n in names])
    ndim = (ctypes.c_int * max(nparam, 1))(*[len(sh) for sh in shapes])
    flat = []
    for sh in shapes:
        flat += list(sh) + [0] * (MAX_DIM - len(sh))
    shape = (ctypes.c_longlong * max(len(flat), 1))(*flat)
    out = ctypes.c_void_p()
    err = ctypes.create_string_buffer(1024)
    ptr = ctypes.cast(s.data_ptr(), ctypes.POINTER(ctypes.c_double))
    code = lib.gcd_guard_judge(ptr, world, nparam, k, name_arr, ndim, shape, int(step), int(every), float(tol),
                               os.fsencode(report_path) if report_path else None, ctypes.byref(out), err, len(err))
    text = None
    if out.value:
        text = ctypes.string_at(out.value).decode()
        lib.gcd_guard_free(out)
    if code not in (0, 1):
        raise RuntimeError(f"gradcheck_dist.guard at step {step}: {err.value.decode(errors='replace')}")
    return code, json.loads(text)


# ---- the summary of one rank


def _seed(base, name):
    return (base * 0x9E3779B1 + zlib.crc32(name.encode())) & 0x7FFFFFFF


def _sketch(g, start, seed, k):
    """sum over g's elements i (global index start + i in its parameter) of g_i r(i), r(i) a K-vector drawn from
    (seed, chunk of i): r(i)_j = w[col] R[row, j] where i's chunk is a (CHUNK // ROW, ROW) matrix. Linear, so the
    sketches of a parameter's shards add to the whole one's. Holds one chunk's w and R at once, and copies nothing
    of g (a row cut by a shard's edge is a dot product with the matching part of w). Returns (sketch, ||g||^2): the
    sum of squares is taken chunk by chunk too, while the chunk (1 MiB of float32) is still in the cache."""
    import torch

    dev = g.device
    dt = g.dtype if g.dtype in (torch.float32, torch.float64) else torch.float32
    acc = torch.zeros(k, dtype=torch.float64, device=dev)
    ss = torch.zeros((), dtype=torch.float64, device=dev)
    gen = torch.Generator(device=dev)
    n, pos = g.numel(), 0
    while pos < n:
        at = start + pos
        c = at // CHUNK
        lo = at - c * CHUNK
        hi = min(CHUNK, lo + (n - pos))
        gen.manual_seed((seed * 1000003 + c) & 0x7FFFFFFFFFFFFFFF)
        w = torch.randn(ROW, generator=gen, device=dev, dtype=dt)
        R = torch.randn(CHUNK // ROW, k, generator=gen, device=dev, dtype=dt)
        piece = g[pos:pos + hi - lo]
        ss += piece.to(dt).dot(piece.to(dt)).double() if piece.dtype == dt else piece.to(dt).pow(2).sum().double()
        v = torch.zeros(CHUNK // ROW, dtype=dt, device=dev)
        r0, r1 = -(-lo // ROW), hi // ROW  # whole rows r0..r1
        if r0 < r1:
            a = r0 * ROW - lo
            v[r0:r1] = piece[a:a + (r1 - r0) * ROW].to(dt).view(r1 - r0, ROW).mv(w)
        else:
            r0 = r1 = lo // ROW + 1
        for row, a, b in ((lo // ROW, lo, min(hi, r0 * ROW)), (r1, max(lo, r1 * ROW), hi)):  # cut rows
            if a < b:
                v[row] += piece[a - lo:b - lo].to(dt).dot(w[a - row * ROW:b - row * ROW])
        acc += (v @ R).double()
        pos += hi - lo
    return acc, ss


def _row(name, g, shard, ran, k, seed, dev):
    """One rank's summary of one parameter, on g's device (no host sync: summarise checks every norm at once)."""
    import torch

    head = [float(zlib.crc32(name.encode())), float(g is not None), 0.0, -1.0, 0.0, float(ran), float(shard is not None)]
    row = torch.tensor(head + [0.0] * k, dtype=torch.float64, device=g.device if g is not None else dev)
    if g is not None and g.numel():
        g = g.detach().reshape(-1)
        sk, ss = _sketch(g, int(shard["start"]) if shard is not None else 0, _seed(seed, name), k)
        row[4] = ss.sqrt()  # not finite, or 0 where the values are not: summarise looks again (_fix)
        row[COLS:] = sk
    return row.to(dev)


def _fix(row, g):
    """A norm that is not finite (count the values that are not) or zero (values whose squares underflow)."""
    import torch

    g = g.detach().reshape(-1)
    bad = ~torch.isfinite(g)
    nbad = int(bad.sum())
    row[2] = float(nbad)
    row[3] = float(int(bad.nonzero()[0, 0])) if nbad else -1.0
    if not nbad:
        row[4] = torch.linalg.vector_norm(g.double())


# ---- the guard


class Guard:
    """See guard(). check(step) judges the step when step % every == 0 (step None: its own count of calls)."""

    def __init__(self, model, every=100, on_finding="raise", report=None, k=8, tol=TOL, group=None, seed=0,
                 optimizer=None):
        if on_finding not in ("raise", "warn", "log"):
            raise ValueError(f"gradcheck_dist.guard: on_finding={on_finding!r}: one of 'raise', 'warn', 'log'")
        if int(every) < 1 or int(k) < 1:
            raise ValueError(f"gradcheck_dist.guard: every={every}, k={k}: both at least 1")
        self.model, self.every, self.on_finding, self.report = model, int(every), on_finding, report
        self.k, self.tol, self.group, self.seed = int(k), float(tol), group, int(seed)
        self.calls, self.last = 0, None
        library()  # fails here, at setup, not at the first guarded step
        self.handles = list(track(model))
        root = unwrap(model)
        self.known = set()  # parameters the forward hooks can see run (FSDP1 flat parameters they cannot)
        for prefix, m in root.named_modules():
            for n, _ in m.named_parameters(recurse=False):
                self.known.add(clean_name(f"{prefix}.{n}" if prefix else n))
        self.shapes = {clean_name(n): list(p.shape) for n, p in root.named_parameters()}
        self._hook = None
        if optimizer is not None:
            if not hasattr(optimizer, "register_step_pre_hook"):
                raise RuntimeError("gradcheck_dist.guard(optimizer=...): this torch has no Optimizer.register_step_pre_hook "
                                   "(torch >= 2.0): call g.check(step) before optimizer.step() instead")
            self._hook = optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.check())

    def remove(self):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _comm(self):
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None, 0, 1, torch.device("cpu")
        backend = str(dist.get_backend(self.group)).lower()
        dev = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
        return dist, dist.get_rank(self.group), dist.get_world_size(self.group), dev

    def summarise(self, dev):
        """(names, shapes, (nparam, COLS + k) float64 tensor on dev) of this rank's gradients now."""
        from .dump import _tracked

        t = _tracked(self.model)
        ran = t.ran if t is not None else set()
        names, shapes, rows, grads = [], [], [], []
        for name, g, shard in collect(self.model):
            did = name in ran if name in self.known else g is not None
            names.append(name)
            shapes.append(list(shard["shape"]) if shard is not None else self.shapes.get(name, list(g.shape) if g is not None else [0]))
            rows.append(_row(name, g, shard, did, self.k, self.seed, dev))
            grads.append(g)
        import torch

        table = torch.stack(rows) if rows else torch.zeros(0, COLS + self.k, dtype=torch.float64, device=dev)
        norms = table[:, 4]
        odd = (~torch.isfinite(norms) | (norms == 0)) & (table[:, 1] != 0)
        for i in odd.nonzero().flatten().tolist():  # one host sync for all of them; these are rare
            if grads[i].numel():
                _fix(table[i], grads[i])
        return names, shapes, table

    def check(self, step=None):
        """Judges this step (every rank must call it, at the same steps) when step % every == 0; returns the report
        (a dict) or None when the step was not guarded. On a finding: raises GradcheckFinding, warns, or logs."""
        if step is None:
            step = self.calls
        self.calls += 1
        from .dump import _tracked

        t = _tracked(self.model)
        try:
            if step % self.every:
                return None
            return self._judge(step)
        finally:
            if t is not None:
                t.dumped = True  # the next forward starts the next step's record of which modules ran

    def _judge(self, step):
        import torch

        dist, rank, world, dev = self._comm()
        with torch.no_grad():
            names, shapes, table = self.summarise(dev)
            if dist is not None and world > 1:
                parts = [torch.empty_like(table) for _ in range(world)]
                dist.all_gather(parts, table, group=self.group)
                gathered = torch.stack(parts)
            else:
                gathered = table.unsqueeze(0)
        path = self.report.format(step=step) if self.report else None
        code, report = judge(gathered, names, shapes, step, self.every, self.tol, path if rank == 0 else None)
        self.last = report
        if code == 1:
            self._found(report, step)
        return report

    def _found(self, report, step):
        run = report["runs"][0]
        ranks = run["guard"]["ranks"]
        text = "; ".join(f["message"] for f in run["findings"] if f["counts"])
        where = f" (report: {self.report.format(step=step)})" if self.report else ""
        msg = f"gradcheck_dist.guard, ranks {ranks}: {text}{where}"  # each finding's text opens with "step N: "
        if self.on_finding == "raise":
            raise GradcheckFinding(msg, report, step, ranks)
        if self.on_finding == "warn":
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
        else:
            log.error("%s", msg)


def guard(model, every=100, on_finding="raise", report=None, k=8, tol=TOL, group=None, seed=0, optimizer=None):
    """Guards `model`'s training (plain loops, torchrun, Slurm): returns a Guard whose check(step) you call after the
    gradients are reduced (and unscaled: scaler.unscale_(optimizer)) and before optimizer.step(); with optimizer=
    (torch >= 2.0) a step pre-hook calls it. Every `every` steps: None on some or all ranks where the module ran,
    ranks that disagree after the reduce, non-finite values, only a few parameters learning, exact zeros, judged by
    the C classifier. on_finding: "raise" (GradcheckFinding), "warn" or "log". report: a path (may hold "{step}")
    rank 0 writes the JSON report to at every guarded step. k: the sketch's size. tol: see docs/guard.md.
    Call it after wrapping the model (DDP, FSDP) and on every rank."""
    return Guard(model, every=every, on_finding=on_finding, report=report, k=k, tol=tol, group=group, seed=seed,
                 optimizer=optimizer)

