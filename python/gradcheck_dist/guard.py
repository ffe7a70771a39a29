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
import math
import os
import warnings
import zlib

from .dump import clean_name, collect, track, unwrap

ABI = 1
COLS = 7  # name hash, present, non-finite, first non-finite, norm, ran, sharded (src/guard/guard.h)
MAX_DIM = 8
ROW = 4096  # the sketch's projections: a gradient read as rows of ROW elements is a matrix G, its sketch
CHUNK = ROW * 1024  # s = (G w) R with signs w (ROW) and R (rows, K) hashed from (seed, parameter): CHUNK at a time
SKETCH_FAMILY = "sign-hash/4096"  # what the projections are (sketch dumps record it: gradcheck.projections)
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


M32 = 0xFFFFFFFF


def _mix(x):
    """A 32-bit integer hash (x: int64 values below 2**32, every product below 2**63): the projections' signs."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & M32
    return x ^ (x >> 15)


def _signs(rows, k, seed, dt):
    """(len(rows), k) of +1 and -1: sign j of row r is bit j % 32 of a 32-bit hash of (seed, r * q + j // 32), q the
    hashes a row needs (one for k <= 32): the same on every device and every torch (no generator). seed: an int, or
    a (len(rows), 1) tensor (one per row)."""
    import torch

    q = -(-k // 32)
    key = rows.unsqueeze(1) * q + torch.arange(q, device=rows.device)
    h = _mix(_mix((key & M32) ^ (seed & M32)) ^ (key >> 32))   # (len(rows), q): one hash per 32 signs
    j = torch.arange(k, device=rows.device)
    h = h if q == 1 else h[:, j // 32]   # (len(rows), 1) broadcasts: no gather
    return (1 - 2 * ((h >> (j % 32)) & 1)).to(dt)


_W = {}   # (seed, device, dtype) -> the parameter's column signs w (ROW of them: 16 KiB per parameter in float32)


def _column_signs(seed, dev, dt):
    import torch

    key = (seed, str(dev), dt)
    if key not in _W:
        _W[key] = _signs(torch.arange(ROW, device=dev), 1, seed + 3, dt).view(ROW)
    return _W[key]


def _fused():
    """The library's one-pass row kernel (src/guard/pass.c), or None (no library: torch's two passes)."""
    try:
        f = library().gcd_guard_rows_f32
    except (RuntimeError, AttributeError):
        return None
    f.restype = None
    f.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                  ctypes.POINTER(ctypes.c_double)]
    return f


def _rows(G, w):
    """(G w, the sum of G's squares in float64) for G (rows, ROW): on the CPU in float32 one read of G (the library's
    kernel), else torch's matrix-vector product and row norms (each row's in float32, their sum in float64)."""
    import torch

    if G.device.type == "cpu" and G.dtype == torch.float32 and G.is_contiguous() and w.is_contiguous():
        global _FUSED
        if _FUSED is None:
            _FUSED = _fused() or False
        if _FUSED:
            v, sq = torch.empty(G.shape[0], dtype=torch.float32), ctypes.c_double()
            _FUSED(G.data_ptr(), G.shape[0], G.shape[1], w.data_ptr(), v.data_ptr(), ctypes.byref(sq))
            return v, sq.value
    return G.mv(w), torch.linalg.vector_norm(G, dim=1).double().square().sum()


_FUSED = None


def _sketch(g, start, seed, k, total=None):
    """The K-value linear sketch of g, elements start .. start + len(g) of a parameter of `total` elements (None:
    start + len(g)), and its sum of squares: (sketch float64 (k,), ||g||^2 float64). s_j = sum_i g_i r(i)_j over
    the parameter's element indices i, every r(i)_j a sign hashed from (seed, i) (docs/guard.md, The sketch; no
    generator, so the same on every device, and linear, so the sketches of a parameter's shards add to the whole
    one's; E[s_j^2] = ||g||^2):
      - a parameter of at most ROW elements: r(i)_j independent for every (i, j): K degrees of freedom;
      - a larger one, read as rows of ROW: r(i)_j = w[i % ROW] R[i // ROW, j], w (ROW) and R (rows, K) the
        parameter's. Per chunk of up to CHUNK elements: v = G w over its whole rows (one matrix-vector
        product; the cut rows at a shard's edges as dot products), s += v R, and the sum of squares row by row
        (each row's in float32, their sum in float64). A difference inside one row is seen through one direction
        (v's entry for that row): docs/check-verdicts.md says what that costs.
    Copies nothing of g but a float16/bfloat16 chunk converted to float32."""
    import torch

    if (start + g.numel() if total is None else total) <= ROW:
        dt = torch.float64
        x = g.detach().reshape(-1).to(dt)
        r = _signs(torch.arange(start, start + x.numel(), device=g.device), k, seed + 2, dt)
        return x @ r, x.dot(x)
    dev = g.device
    dt = g.dtype if g.dtype in (torch.float32, torch.float64) else torch.float32
    w = _column_signs(seed, dev, dt)
    acc = torch.zeros(k, dtype=torch.float64, device=dev)
    ss = torch.zeros((), dtype=torch.float64, device=dev)
    n, pos = g.numel(), 0
    while pos < n:
        piece = g[pos:pos + CHUNK - (start + pos) % ROW].to(dt)   # a chunk ends at a row's end
        lo, m = start + pos, piece.numel()
        r0, r1 = -(-lo // ROW), (lo + m) // ROW   # whole rows r0..r1 (global)
        a = r0 * ROW - lo
        if r0 < r1:
            v, sq = _rows(piece[a:a + (r1 - r0) * ROW].view(r1 - r0, ROW), w)
            ss += sq
            acc += v.double() @ _signs(torch.arange(r0, r1, device=dev), k, seed + 1, torch.float64)
        for row, b, e in ((lo // ROW, 0, min(m, a)), (r1, max(a, (r1 - r0) * ROW + a), m)):   # cut rows
            if b < e:
                c = (lo + b) % ROW
                ss += piece[b:e].dot(piece[b:e]).double()
                x = piece[b:e].dot(w[c:c + e - b]).double()
                acc += x * _signs(torch.tensor([row], device=dev), k, seed + 1, torch.float64).view(k)
        pos += m
    return acc, ss


_SMALL = {}   # (device, k, size, seeds) -> the signs (gradients, size, k) of a group of small gradients of one size


def _small_sketches(gs, seeds, k):
    """_sketch(g, 0, seed, k) of many whole gradients of at most ROW elements each at once, on their device:
    (sketches (n, k), sums of squares (n,)), float64. Gradients of one size (a model's LayerNorm weights and biases
    are mostly one size) are stacked (a copy of them: small by definition) and sketched in one batched product with
    their signs, which are drawn once and kept (float64, size x k per gradient), so a model's hundreds of biases and
    norms cost a few operations per size, not a few per gradient."""
    import torch

    dev = gs[0].device
    sk = torch.empty(len(gs), k, dtype=torch.float64, device=dev)
    ss = torch.empty(len(gs), dtype=torch.float64, device=dev)
    groups = {}
    for i, g in enumerate(gs):
        groups.setdefault(g.numel(), []).append(i)
    live = set()
    for n, idx in groups.items():
        key = (str(dev), k, n, tuple(seeds[i] for i in idx))
        live.add(key)
        if key not in _SMALL:   # the same parameters step after step: their signs are drawn once
            seed = torch.tensor([seeds[i] for i in idx], device=dev).repeat_interleave(n).unsqueeze(1) + 2
            cols = torch.arange(n, device=dev).repeat(len(idx))
            _SMALL[key] = _signs(cols, k, seed, torch.float64).view(len(idx), n, k)
        X = torch.stack([gs[i].detach().reshape(-1).to(torch.float64) for i in idx])
        at = torch.tensor(idx, device=dev)
        sk[at] = torch.bmm(X.unsqueeze(1), _SMALL[key]).squeeze(1)
        ss[at] = X.square().sum(1)
    for key in [key for key in _SMALL if key not in live]:   # a layout no longer seen: its signs go
        del _SMALL[key]
    return sk, ss


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
        """(names, shapes, (nparam, COLS + k) float64 tensor on dev) of this rank's gradients now. No host sync but
        one: the parameters whose norm is not finite or zero are looked at again (_fix), all found at once."""
        import torch

        from .dump import _tracked

        t = _tracked(self.model)
        ran = t.ran if t is not None else set()
        names, shapes, head, grads, big, small = [], [], [], [], [], {}
        for i, (name, g, shard) in enumerate(collect(self.model)):
            did = name in ran if name in self.known else g is not None
            names.append(name)
            shapes.append(list(shard["shape"]) if shard is not None else self.shapes.get(name, list(g.shape) if g is not None else [0]))
            head.append([float(zlib.crc32(name.encode())), float(g is not None), 0.0, -1.0, 0.0, float(did),
                         float(shard is not None)] + [0.0] * self.k)
            grads.append(g)
            if g is None or not g.numel():
                continue
            if shard is None and g.numel() <= ROW:
                small.setdefault(g.device, []).append(i)   # a whole gradient of one row: sketched together
            else:
                total = math.prod(shard["shape"]) if shard is not None else g.numel()
                big.append((i, int(shard["start"]) if shard is not None else 0, total))
        table = torch.tensor(head, dtype=torch.float64, device=dev).view(len(head), COLS + self.k)
        for i, start, total in big:
            sk, ss = _sketch(grads[i].detach().reshape(-1), start, _seed(self.seed, names[i]), self.k, total)
            table[i, 4] = ss.sqrt().to(dev)   # not finite, or 0 where the values are not: looked at again below (_fix)
            table[i, COLS:] = sk.to(dev)
        for idx in small.values():
            sk, ss = _small_sketches([grads[i] for i in idx], [_seed(self.seed, names[i]) for i in idx], self.k)
            at = torch.tensor(idx, device=dev)
            table[at, 4] = ss.sqrt().to(dev)
            table[at, COLS:] = sk.to(dev)
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

