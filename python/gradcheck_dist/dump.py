"""Gradient dumps in the format `gradcheck-dist check` reads: one safetensors file per rank.

Each trainable parameter's gradient is stored under its original name (named_parameters() with wrapper
components such as DDP's leading `module.`, FSDP's `_fsdp_wrapped_module.`, checkpoint_wrapper's
`_checkpoint_wrapped_module.` and torch.compile's `_orig_mod.` removed); a parameter whose gradient is
None is absent, and `gradcheck.params` in the metadata lists every trainable name so the checker knows it
is absent rather than forgotten. `gradcheck.precision` records the precision the step computed in.
Sharded parameters (FSDP2 DTensor gradients, FSDP1 flat parameters) are written as each rank's own
contiguous run of the original parameter, placed by `gradcheck.shards` (docs/dumps.md); pieces on a device
mesh (DTensor placements, tp_layout's declarations) as a box of the parameter with their placements, and the
mesh with this rank's coordinates in `gradcheck.mesh` (layout.py).

The writer streams: the header first, then each tensor's bytes straight from its memory (a CPU copy of
one tensor at a time only where it must convert or leave a GPU), into a temporary file in the same
directory renamed over the target. torch is imported only when a dump is written.
"""
import json
import math
import os
import platform
import secrets
import stat
import struct
import sys

FORMAT = "1"
_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}
PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16")  # finest to coarsest (bf16 keeps 8 bits of mantissa)
_COARSE = {p: i for i, p in enumerate(PRECISIONS)}
_WRAPPERS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


class DumpPathError(OSError):
    """The dump's path names something the writer must not replace (a device, a FIFO, a directory...)."""


# ---- metadata


def _versions():
    out = {"gradcheck.python": platform.python_version()}
    import torch

    out["gradcheck.torch"] = torch.__version__
    for mod in ("lightning", "pytorch_lightning"):  # only when the process uses it: imported
        m = sys.modules.get(mod)
        if m is not None and getattr(m, "__version__", None):
            out["gradcheck.lightning"] = m.__version__
            break
    return out


def _rank_world(rank, world):
    if rank is None or world is None:
        import torch.distributed as dist

        up = dist.is_available() and dist.is_initialized()
        rank = (dist.get_rank() if up else 0) if rank is None else rank
        world = (dist.get_world_size() if up else 1) if world is None else world
    return int(rank), int(world)


def unwrap(model):
    """The module under DistributedDataParallel / DataParallel, so names have no "module." prefix."""
    while hasattr(model, "module") and type(model).__name__ in ("DistributedDataParallel", "DataParallel"):
        model = model.module
    return model


def clean_name(name):
    """The original parameter name: wrapper components removed (a leading `module.` too)."""
    parts = [p for p in name.split(".") if p not in _WRAPPERS]
    while len(parts) > 1 and parts[0] == "module":
        parts = parts[1:]
    return ".".join(parts)


# ---- precision


def precision_name(p):
    """One of PRECISIONS from a precision name, a torch dtype or a Lightning precision ("bf16-mixed", 16, ...).
    None for None; ValueError for what it cannot name."""
    if p is None:
        return None
    s = str(p).replace("torch.", "").lower()
    table = {"float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32", "float16": "fp16",
             "half": "fp16", "bfloat16": "bf16", "tf32": "tf32", "fp64": "fp64", "fp32": "fp32", "fp16": "fp16",
             "bf16": "bf16", "64": "fp64", "32": "fp32", "16": "fp16"}
    if s in table:
        return table[s]
    head = s.split("-")[0]  # Lightning 2.x: "bf16-mixed", "16-mixed", "32-true", "64-true", "bf16-true", "16-true"
    if head in table and s.split("-", 1)[1:] in (["mixed"], ["true"]):
        return table[head]
    raise ValueError(f"precision {p!r}: use one of {', '.join(PRECISIONS)} (or a torch dtype, or Lightning's "
                     "'bf16-mixed', '16-mixed', '32-true', '64-true')")


def coarsest(names):
    names = [n for n in names if n]
    return max(names, key=_COARSE.__getitem__) if names else None


def _autocast_now():
    """The autocast dtypes active right now (CPU and CUDA), as precision names."""
    import torch

    out = []
    for dev in ("cpu", "cuda"):
        try:
            on = torch.is_autocast_enabled(dev)
            dt = torch.get_autocast_dtype(dev)
        except TypeError:  # torch 1.x
            on = torch.is_autocast_cpu_enabled() if dev == "cpu" else torch.is_autocast_enabled()
            dt = torch.get_autocast_cpu_dtype() if dev == "cpu" else torch.get_autocast_gpu_dtype()
        except Exception:
            continue
        if on:
            out.append(precision_name(dt))
    return out


class _Tracker:
    """What `track(model)` records between two dumps: the autocast precisions seen in the forward, which
    parameters' modules ran, the nondeterministic layers (Dropout family, p > 0) and the plain BatchNorm*d
    modules that ran in training mode. Reset by the first forward after a dump (so every dump of one step --
    LocalGradCapture's and dump_grads' -- reads the same record)."""

    def __init__(self):
        self.precision = set()
        self.ran = set()
        self.nondeterministic = {}
        self.batchnorm = {}
        self.dumped = False
        self.handles = []

    def clear(self):
        self.precision.clear()
        self.ran.clear()
        self.nondeterministic.clear()
        self.batchnorm.clear()
        self.dumped = False

    def metadata(self, names):
        """The dump's metadata: gradcheck.ran (in the dump's parameter order), .nondeterministic, .batchnorm."""
        return {"gradcheck.ran": json.dumps([n for n in names if n in self.ran]),
                "gradcheck.nondeterministic": json.dumps(list(self.nondeterministic.values())),
                "gradcheck.batchnorm": json.dumps(list(self.batchnorm.values()))}


def _dropout_entry(name, m):
    """'encoder.drop (Dropout p=0.1)' for a Dropout-family module in training mode with p > 0, else None."""
    cls = type(m).__name__
    if "Dropout" not in cls or not m.training:
        return None
    p = getattr(m, "p", None)
    try:
        if p is not None and float(p) <= 0:
            return None
    except (TypeError, ValueError):
        pass
    return f"{name or '(root)'} ({cls}" + (f" p={p:g})" if isinstance(p, (int, float)) else ")")


def _plain_batchnorm(m):
    """A BatchNorm*d (not SyncBatchNorm) that normalises with this batch's statistics now."""
    return _plain_batchnorm_class(m) and (m.training or not m.track_running_stats)


def track(model):
    """Records what `model`'s forward does, for the dumps (forward pre-hooks on its own modules, no global hook):
    per step, the autocast precision, which parameters' modules ran (gradcheck.ran), the Dropout-family layers
    with p > 0 that ran in training mode (gradcheck.nondeterministic) and the plain BatchNorm*d layers that
    normalised with the batch's statistics (gradcheck.batchnorm). dump_grads, write_dump(model=...) and
    LocalGradCapture.dump write them. The record counts from this call, or from the first forward after the last
    dump. Call it once, before the forward of the step you dump; LocalGradCapture, GradcheckDump, check_ddp and
    check_lightning call it. Idempotent; returns the hook handles."""
    root = unwrap(model)
    t = root.__dict__.get("_gradcheck_tracker")
    if t is not None:
        return t.handles
    t = _Tracker()
    root.__dict__["_gradcheck_tracker"] = t
    root.__dict__["_gradcheck_precision_seen"] = t.precision  # the old name, read by infer_precision

    def hook(name, m, own):
        def pre(mod, args):
            if t.dumped:
                t.clear()
            t.precision.update(_autocast_now())
            t.ran.update(own)
            entry = _dropout_entry(name, mod)
            if entry is not None:
                t.nondeterministic[name] = entry
            if _plain_batchnorm(mod):
                t.batchnorm[name] = f"{name or '(root)'}"
        return pre

    for prefix, m in root.named_modules():
        own = [clean_name(f"{prefix}.{n}" if prefix else n) for n, _ in m.named_parameters(recurse=False)]
        if m is root or own or "Dropout" in type(m).__name__ or _plain_batchnorm_class(m):
            t.handles.append(m.register_forward_pre_hook(hook(clean_name(prefix) if prefix else "", m, own)))
    return t.handles


def _plain_batchnorm_class(m):
    import torch

    bn = getattr(torch.nn.modules.batchnorm, "_BatchNorm", None)
    return bn is not None and isinstance(m, bn) and not isinstance(m, torch.nn.SyncBatchNorm)


track_precision = track  # the earlier name


def _tracked(model):
    """The model's _Tracker, or None when track(model) was never called on it."""
    if model is None:
        return None
    return unwrap(model).__dict__.get("_gradcheck_tracker")


def _wrapper_name(model):
    """gradcheck.wrapper: what reduces the model's gradients, as check names it in its verdict ("ddp", "fsdp",
    "fsdp2"; None: none of these; a pipeline's step passes extra_metadata={"gradcheck.wrapper": "pipeline"})."""
    if model is None or not hasattr(model, "modules"):
        return None
    for m in model.modules():
        names = {c.__name__ for c in type(m).__mro__}
        if "DistributedDataParallel" in names:
            return "ddp"
        if "FullyShardedDataParallel" in names:
            return "fsdp"
        if "FSDPModule" in names:
            return "fsdp2"
    return None


def _tracker_metadata(model, names):
    """gradcheck.ran/.nondeterministic/.batchnorm from the model's tracker (empty when untracked: unknown), and
    marks the record dumped: the next forward starts a new one."""
    t = _tracked(model)
    if t is None:
        return {}
    t.dumped = True
    return t.metadata(names)


def _tf32_on(model):
    import torch

    try:
        if torch.backends.cuda.matmul.allow_tf32:
            return True
        if torch.get_float32_matmul_precision() != "highest":
            return True
    except Exception:
        pass
    conv = any("Conv" in type(m).__name__ for m in model.modules())
    return conv and bool(getattr(torch.backends.cudnn, "allow_tf32", False))


def infer_precision(model, tensors):
    """The precision the step computed in: autocast seen in its forward (track) or active now, else the finest
    of the gradients' dtypes (fp32 on CUDA with TF32 allowed: tf32). The finest: `check` judges each tensor at
    least at its own dtype's tolerance, so one BF16 tensor among F32 ones must not claim bf16 for all (issue 32)."""
    root = unwrap(model) if model is not None else None
    seen = set(getattr(root, "_gradcheck_precision_seen", ()) or ()) if root is not None else set()
    seen.update(_autocast_now())
    from_dtypes = []
    for t in tensors:
        p = precision_name(t.dtype) if str(t.dtype).replace("torch.", "") in _DTYPES else None
        if p == "fp32" and t.is_cuda and root is not None and _tf32_on(root):
            p = "tf32"
        from_dtypes.append(p)
    finest = min((p for p in from_dtypes if p), key=_COARSE.__getitem__, default=None)
    return coarsest(list(seen)) or finest or "fp32"


# ---- which tensors: plain, DTensor shards (FSDP2), FlatParameter shards (FSDP1)


def _is_dtensor(t):
    return t is not None and hasattr(t, "to_local") and hasattr(t, "placements") and hasattr(t, "device_mesh")


def _dtensor_run(name, g):
    """(local 1-D run, {"shape", "start"}) of a DTensor sharded on dim 0 (replicated on other mesh dims)."""
    shape = list(g.shape)
    mesh = g.device_mesh
    start_row, rows = 0, shape[0] if shape else 1
    sharded = False
    for dim, pl in enumerate(g.placements):
        kind = type(pl).__name__
        if kind == "Replicate":
            continue
        if kind == "Shard" and getattr(pl, "dim", None) == 0 and shape:
            n = mesh.size(dim)
            idx = mesh.get_local_rank(dim)
            chunk = -(-rows // n)  # torch.chunk's split: ceil, the last ones shorter or empty
            start_row += min(chunk * idx, rows)
            rows = max(0, min(chunk, rows - chunk * idx))
            sharded = True
            continue
        raise ValueError(f"{name}: gradient placement {g.placements} is not supported (sharded on dim 0 only: FSDP2 "
                         "fully_shard's Shard(0), HSDP's (Replicate, Shard(0)))")
    local = g.to_local()
    inner = 1
    for d in shape[1:]:
        inner *= d
    if local.numel() != rows * inner:
        raise ValueError(f"{name}: the local shard holds {local.numel()} elements, expected {rows * inner} "
                         f"(rows {start_row}..{start_row + rows} of {shape})")
    if not sharded:
        return local, None
    return local.reshape(-1), {"shape": shape, "start": start_row * inner}


def _fsdp1_modules(root):
    out = []
    for prefix, m in root.named_modules():
        if type(m).__name__ != "FullyShardedDataParallel":
            continue
        handle = getattr(m, "_handle", None)
        if handle is None and getattr(m, "_handles", None):
            handle = m._handles[0]
        fp = getattr(handle, "flat_param", None) if handle is not None else None
        if fp is not None:
            out.append((prefix, handle, fp))
    return out


def collect(model):
    """([(name, grad or None, shard or None)] of the trainable parameters, in order) -- original names."""
    return _collect(model)[0]


def _collect(model):
    """collect()'s entries and the mesh record (gradcheck.mesh) of the DTensor gradients or tp_layout, or None.
    Collective over the tensor-parallel group when tp_layout was called."""
    from . import layout

    root = unwrap(model)
    entries, flat_ids, orig_ids, mesh = [], set(), set(), None
    for prefix, handle, fp in _fsdp1_modules(root):
        flat_ids.add(id(fp))
        infos = getattr(fp, "_shard_param_infos", None)
        if infos is None:
            raise ValueError("FSDP1 flat parameters of this torch version are not supported (no _shard_param_infos): "
                             "use torch >= 2.1")
        origs = getattr(fp, "_params", None)  # use_orig_params=True: the original parameters
        if origs:
            orig_ids.update(id(p) for p in origs)
        flat_grad = fp.grad
        for i, fqn in enumerate(fp._fqns):
            if origs and not origs[i].requires_grad:
                continue
            shape = [int(d) for d in fp._shapes[i]]
            info = infos[i]
            name = clean_name(f"{prefix}.{fqn}" if prefix else fqn)
            if not info.in_shard:
                numel = 1
                for d in shape:
                    numel *= d
                g = "empty" if flat_grad is not None or origs else None  # this rank holds none of it
                entries.append((name, g, {"shape": shape, "start": numel}))
                continue
            if flat_grad is not None:
                g = flat_grad.detach()[info.offset_in_shard:info.offset_in_shard + info.numel_in_shard]
            else:
                g = origs[i].grad if origs else None
            entries.append((name, None if g is None else g.reshape(-1),
                            {"shape": shape, "start": int(info.intra_param_start_idx)}))
    for n, p in root.named_parameters():
        if not p.requires_grad or id(p) in flat_ids or id(p) in orig_ids or getattr(p, "_is_flat_param", False):
            continue
        g = p.grad
        if _is_dtensor(g) or (g is None and _is_dtensor(p)):
            if g is None:
                entries.append((clean_name(n), None, None))
                continue
            root_mesh = layout.mesh_record(layout._root(g.device_mesh), n)
            if mesh is not None and mesh != root_mesh:
                raise ValueError(f"{n}: its gradient lives on another device mesh ({root_mesh['shape']}, {root_mesh['names']}) "
                                 f"than the others ({mesh['shape']}, {mesh['names']}): one dump records one mesh")
            mesh = root_mesh
            if layout.flat_ok(g):   # FSDP2, HSDP: the flat run every reader of format 1 reads
                local, shard = _dtensor_run(n, g)
            else:
                local, shard, _ = layout.dtensor_piece(n, g)
            entries.append((clean_name(n), local, shard))
        else:
            entries.append((clean_name(n), g, None))
    entries, tp_mesh = layout.tp_pieces(model, entries)
    if tp_mesh is not None and mesh is not None:
        raise ValueError("tp_layout was declared on a model whose gradients are DTensors (which carry their own "
                         "placements): declare plain-parameter models only")
    mesh = mesh or tp_mesh
    import torch

    out, seen = [], {}
    for name, g, shard in entries:
        if name in seen:
            raise ValueError(f"two parameters have the name {name!r} once wrapper prefixes are removed")
        seen[name] = True
        if isinstance(g, str):  # this rank's run of it is empty
            g = torch.empty(0, dtype=_flat_dtype(root))
        out.append((name, g, shard))
    return out, mesh


def _flat_dtype(root):
    for p in root.parameters():
        if p.is_floating_point():
            return p.dtype
    import torch

    return torch.float32


# ---- the writer


def _prepare(t, dtype, name):
    """The tensor as it will be written: detached, dense, contiguous, in a dumpable dtype (no copy when it is)."""
    if _is_dtensor(t):
        raise ValueError(f"{name}: a DTensor gradient (sharded): dump it with dump_grads(model, ...)")
    t = t.detach()
    if t.is_sparse:
        raise ValueError(f"{name}: sparse gradients are not supported")
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    if str(t.dtype).replace("torch.", "") not in _DTYPES:
        raise ValueError(f"{name}: unsupported gradient dtype {t.dtype} (use F64, F32, F16 or BF16)")
    if not t.is_contiguous():
        t = t.contiguous()
    return t


def _refuse_non_regular(path, dfd=None):
    """path (its last name, relative to the directory descriptor dfd when given) must be absent, a regular file
    or a link (the rename replaces the link, never its target): anything else is refused."""
    name = os.path.basename(path) if dfd is not None else path
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(name, dir_fd=dfd)
        except FileNotFoundError:
            return  # a dangling link: replaced by the rename (the link, never its target)
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a character device" if stat.S_ISCHR(st.st_mode) else
                "a block device" if stat.S_ISBLK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise DumpPathError(f"{path}: {kind}, not a regular file: the dump writer will not replace it")


def _tmp_open(dfd):
    """A new file in the directory dfd under a short name (a 255-byte target name still leaves room): (fd, name)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = f".gcd-{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, 0o600, dir_fd=dfd), tmp
        except FileExistsError:
            continue
    raise FileExistsError("no free temporary name")


def _trusted_dir(st):
    """A directory no other user controls: owned by this user or root, not group/world-writable unless sticky."""
    return st.st_uid in (0, os.geteuid()) and (not st.st_mode & 0o022 or st.st_mode & stat.S_ISVTX)


def open_dir(d, create=True):
    """A descriptor of directory d, walked one name at a time from / as the C side walks a report's path
    (src/report/report_output.c): a link is followed only when nobody else could have planted it (owned by this
    user or root, in a directory no other user controls); a name that is not a directory, or a link another
    user could have planted, is refused (DumpPathError, naming both). Missing directories are made (create)."""
    d = os.path.abspath(os.fspath(d))
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
    fd = os.open("/", flags)
    try:
        for name in [c for c in d.split("/") if c]:
            for _ in range(3):   # made by another process between the look and the mkdir: look again
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    break
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(name, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass
            if stat.S_ISLNK(st.st_mode):
                parent = os.fstat(fd)
                if not (st.st_uid in (0, os.geteuid()) and _trusted_dir(parent)):
                    raise DumpPathError(f"{d}: '{name}' is a link that another user could have planted (link owner uid "
                                        f"{st.st_uid}, directory owner uid {parent.st_uid}): not followed")
                nfd = os.open(name, flags, dir_fd=fd)
            else:
                try:
                    nfd = os.open(name, flags | getattr(os, "O_NOFOLLOW", 0), dir_fd=fd)
                except (NotADirectoryError, OSError) as e:
                    raise DumpPathError(f"{d}: '{name}' is not a directory this writer enters ({e.strerror})") from None
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _replace(dfd, tmp, path):
    """fsync'd tmp renamed over path's last name in the directory dfd, after path was checked again."""
    _refuse_non_regular(path, dfd)
    os.replace(tmp, os.path.basename(path), src_dir_fd=dfd, dst_dir_fd=dfd)


def safe_write(path, data, mode=0o666):
    """Writes bytes (or str, UTF-8) to path as every file of this package is written: the directory walked
    by open_dir (no link another user could have planted), a temporary created O_EXCL|O_NOFOLLOW beside the
    target, written, fchmod to the umask's mode, fsync'd, renamed over it; a device, FIFO or directory at path
    is refused (DumpPathError). mode: before the umask. Returns the path."""
    path = os.fspath(path)
    if isinstance(data, str):
        data = data.encode()
    dfd = open_dir(os.path.dirname(os.path.abspath(path)))
    tmp = None
    try:
        _refuse_non_regular(path, dfd)
        fd, tmp = _tmp_open(dfd)
        with os.fdopen(fd, "wb", buffering=0) as f:
            _write_all(f, memoryview(data))
            os.fchmod(f.fileno(), mode & ~_umask())
            os.fsync(f.fileno())
        _replace(dfd, tmp, path)
        tmp = None
        return path
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
        os.close(dfd)


_CHUNK = 64 << 20


def _write_tensor(f, t, pinned):
    """Writes t's bytes: CPU tensors from their own memory; CUDA tensors through two pinned buffers, the next
    chunk's device-to-host copy running while the previous one is written."""
    import torch

    if t.numel() == 0:
        return
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    if not t.is_cuda:
        _write_all(f, memoryview(raw.reshape(-1).numpy()).cast("B"))
        return
    flat = raw.reshape(-1)
    per = max(1, _CHUNK // flat.element_size())
    if pinned.get(flat.dtype) is None:
        pinned[flat.dtype] = [torch.empty(per, dtype=flat.dtype, pin_memory=True) for _ in range(2)]
    bufs = pinned[flat.dtype]
    events = [torch.cuda.Event(), torch.cuda.Event()]
    pending = None
    for i, s in enumerate(range(0, flat.numel(), per)):
        n = min(per, flat.numel() - s)
        b = bufs[i % 2]
        b[:n].copy_(flat[s:s + n], non_blocking=True)
        events[i % 2].record()
        if pending is not None:
            pb, pn, pe = pending
            pe.synchronize()
            _write_all(f, memoryview(pb[:pn].numpy()).cast("B"))
        pending = (b, n, events[i % 2])
    pb, pn, pe = pending
    pe.synchronize()
    _write_all(f, memoryview(pb[:pn].numpy()).cast("B"))


def _write_all(f, mv):
    while len(mv):  # a raw write may write less than asked (Linux: at most 2 GiB - 4 KiB at once)
        n = f.write(mv)
        mv = mv[n:]


def stream_write(path, tensors, metadata, dtype=None):
    """Writes {name: tensor} as safetensors at `path` without holding a copy of them all: header, then each
    tensor's bytes in order. Atomic (a temporary file renamed over the target); refuses to replace a device,
    FIFO, directory or other non-regular file (DumpPathError). Returns the path."""
    import torch

    if sys.byteorder != "little":
        raise RuntimeError("the built-in writer needs a little-endian host")
    path = os.fspath(path)
    dfd = open_dir(os.path.dirname(os.path.abspath(path)))
    try:
        return _stream_write_at(dfd, path, tensors, metadata, dtype)
    finally:
        os.close(dfd)


def _stream_write_at(dfd, path, tensors, metadata, dtype):
    _refuse_non_regular(path, dfd)
    header, order, offset = {}, [], 0
    for name, t in tensors.items():
        t = _prepare(t, dtype, name)
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[str(t.dtype).replace("torch.", "")], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        order.append(name)
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    fd, tmp = _tmp_open(dfd)
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            _write_all(f, memoryview(struct.pack("<Q", len(text)) + text))
            pinned = {}
            for name in order:  # converted again here, one at a time: never all the copies at once
                _write_tensor(f, _prepare(tensors[name], dtype, name), pinned)
            os.fchmod(f.fileno(), 0o644 & ~_umask())   # no fsync: dumps are GBs and rewritten by a rerun (docs/python.md)
        _replace(dfd, tmp, path)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    return path


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def _use_safetensors(writer):
    """True only when writer == "safetensors": the streaming writer is the default (faster, bounded memory)."""
    if writer not in (None, "builtin", "stream", "safetensors"):
        raise ValueError(f"writer must be None, 'stream' or 'safetensors', not {writer!r}")
    return writer == "safetensors"


def write_dump(path, grads, params, stage, rank=None, world=None, extra_metadata=None, dtype=None, writer=None,
               precision=None, shards=None, model=None, mesh=None, earlier=None):
    """Writes `grads` ({name: tensor or None}) for the trainable names `params`; atomic (temp + rename).

    precision: the precision the step computed in (PRECISIONS, a torch dtype or a Lightning string); None:
    inferred (infer_precision). shards: {name: {"shape": [...], "start": n}} for tensors that are one rank's
    run of a larger parameter, or {name: {"shape", "placements", "offsets", "lengths"}} for a piece on a mesh,
    which needs mesh: {"shape", "names", "coords", "ranks"} (docs/dumps.md). writer: None/"stream" (streams each tensor into the file) or "safetensors"
    (safetensors.torch.save_file, which copies every tensor first). earlier: stage local only, {name: tensor}: the
    gradient accumulated before the last backward, written as NAME@earlier (LocalGradCapture.mark()). Returns the
    path written.
    """
    if stage not in ("local", "reduced"):
        raise ValueError(f"stage must be 'local' or 'reduced', not {stage!r}")
    rank, world = _rank_world(rank, world)
    unknown = [n for n in grads if n not in params]
    if unknown:
        raise ValueError(f"gradients for names that are not trainable parameters: {unknown}")
    tensors = {n: grads[n] for n in params if grads.get(n) is not None}
    for n, t in tensors.items():
        if _is_dtensor(t):
            raise ValueError(f"{n}: a DTensor gradient (FSDP2): dump it with dump_grads(model, ...), which writes "
                             "each rank's shard")
    prec = precision_name(precision) or infer_precision(model, tensors.values())
    meta = {"gradcheck.format": FORMAT, "gradcheck.rank": str(rank), "gradcheck.world": str(world),
            "gradcheck.stage": stage, "gradcheck.params": json.dumps(list(params)), "gradcheck.precision": prec}
    meta.update(_tracker_metadata(model, params))
    wrapper = _wrapper_name(model)
    if wrapper:
        meta["gradcheck.wrapper"] = wrapper
    shards = {n: s for n, s in (shards or {}).items() if n in tensors}
    from .layout import check_entry

    for n, s in shards.items():
        check_entry(n, s)
        if "start" not in s and mesh is None:
            raise ValueError(f"{n}: a piece placed on a mesh, but no mesh was given (mesh=)")
        if "start" not in s and len(s["placements"]) != len(mesh["shape"]):
            raise ValueError(f"{n}: {len(s['placements'])} placements on a {len(mesh['shape'])}-D mesh")
    if shards:
        meta["gradcheck.shards"] = json.dumps(shards, separators=(",", ":"))
    if earlier:
        if stage != "local":
            raise ValueError("earlier= is the local stage's: the gradient accumulated before the last backward")
        tensors.update({n + "@earlier": earlier[n] for n in params if earlier.get(n) is not None and n in tensors})
    if mesh is not None:
        meta["gradcheck.mesh"] = json.dumps(mesh, separators=(",", ":"))
    meta.update(_versions())
    meta.update({str(k): str(v) for k, v in (extra_metadata or {}).items()})
    if _use_safetensors(writer):
        from safetensors.torch import save

        # bytes, then written as every file here is (safe_write): safetensors' own save_file opens a path
        return safe_write(path, save({n: _prepare(t, dtype, n).cpu().clone() for n, t in tensors.items()},
                                     metadata=meta), mode=0o644)
    return stream_write(path, tensors, meta, dtype)


def _trainable(model):
    return [(clean_name(n), p) for n, p in unwrap(model).named_parameters() if p.requires_grad]


HELD_ATTRS = ("main_grad",)   # where wrappers keep a parameter's gradient instead of .grad (Megatron's DDP: main_grad)


def held_grads(model, names, attrs=HELD_ATTRS):
    """gradcheck.held: {name: {"attr": "main_grad", "norm": x}} for the trainable parameters in `names` (those whose
    .grad is None) that hold a tensor in one of `attrs`: a wrapper (Megatron-style DDP, a pipeline stage's
    data-parallel bucket) kept their gradient in its own buffer and never wrote it to .grad. `check` tells that from a
    cut graph by the norm: a filled buffer (norm > 0) is a gradient that .grad lacks; an empty one is no gradient."""
    import torch

    out, want = {}, set(names)
    for n, p in unwrap(model).named_parameters():
        name = clean_name(n)
        if name not in want or name in out:
            continue
        for a in attrs:
            t = getattr(p, a, None)
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                norm = float(torch.linalg.vector_norm(t.detach().double()))
                out[name] = {"attr": a, "norm": norm if math.isfinite(norm) else None}
                break
    return out


SKETCH_COLS = 15  # a sketch dump's row: these columns, then the K sketch values (src/check/internal.h GCD_SK_*)
_SK_DTYPE = {"float64": 0, "float32": 1, "float16": 2, "bfloat16": 3}


def _sketch_row(name, g, shard, k, seed):
    """One parameter's row of a sketch dump (docs/dumps.md): non-finite count, first non-finite index, norm of the
    finite values (float64), start and count of this piece in the parameter, dtype code, ndim, shape (8), then
    guard._sketch's K values at the piece's offset (pieces of one parameter add). On the CPU, float64."""
    import torch

    from .guard import _seed, _sketch

    if shard is not None and "start" not in shard:
        raise ValueError(f"{name}: a piece on a device mesh (tensor parallel): sketch dumps take whole gradients and "
                         "FSDP's contiguous runs only")
    shape = [int(d) for d in (shard["shape"] if shard is not None else g.shape)]
    if len(shape) > 8:
        raise ValueError(f"{name}: {len(shape)} dimensions, at most 8")
    start = int(shard["start"]) if shard is not None else 0
    flat = g.detach().reshape(-1)
    key = str(flat.dtype).replace("torch.", "")
    if key not in _SK_DTYPE:
        raise ValueError(f"{name}: unsupported gradient dtype {flat.dtype} (use F64, F32, F16 or BF16)")
    row = torch.zeros(SKETCH_COLS + k, dtype=torch.float64)
    row[1] = -1.0
    row[3:7] = torch.tensor([float(start), float(flat.numel()), float(_SK_DTYPE[key]), float(len(shape))],
                            dtype=torch.float64)
    row[7:7 + len(shape)] = torch.tensor([float(d) for d in shape], dtype=torch.float64)
    if flat.numel():
        sk, ss = _sketch(flat, start, _seed(seed, name), k, math.prod(shape))
        row[SKETCH_COLS:] = sk.cpu()
        ss = float(ss)
        if not math.isfinite(ss) or ss == 0:  # a NaN or infinity (or squares beyond the range, or below it): the rare
            bad = ~torch.isfinite(flat)        # path counts them and takes the finite values' norm in float64
            nbad = int(bad.sum())
            row[0] = float(nbad)
            if nbad:
                row[1] = float(start + int(bad.nonzero()[0, 0]))
            fin = (flat[~bad] if nbad else flat).double()
            top = float(fin.abs().max()) if fin.numel() else 0.0
            ss = top * top * float((fin / top).pow(2).sum()) if top > 0 else 0.0
            if not math.isfinite(ss):  # squares beyond float64 (an F64 gradient over 1e154): the norm scaled by its largest
                row[2] = top * math.sqrt(float((fin / top).pow(2).sum()))
                ss = None
        if ss is not None:
            row[2] = math.sqrt(ss)
    return row


def _dump_sketch(model, path, entries, k, seed, stage, rank, world, extra_metadata, dtype, precision):
    if stage != "reduced":
        raise ValueError(f"sketch dumps are of the reduced stage only (each rank's gradient after the reduce), not {stage!r}")
    k, seed = int(k), int(seed)
    if not 1 <= k <= 4096 or not 0 <= seed <= 0x7FFFFFFF:
        raise ValueError(f"sketch={k}, seed={seed}: the sketch's size is 1 to 4096, the seed 0 to 2147483647")
    import torch

    from .guard import SKETCH_FAMILY   # what the projections are: check compares only like with like

    grads = {n: (g.to(dtype) if dtype is not None and g is not None else g) for n, g, _ in entries}
    prec = precision_name(precision) or infer_precision(model, [g for g in grads.values() if g is not None])
    with torch.no_grad():
        rows = {n: _sketch_row(n, grads[n], s, k, seed) for n, g, s in entries if g is not None}
    meta = {str(a): str(b) for a, b in (extra_metadata or {}).items()}
    meta.update({"gradcheck.sketch": str(k), "gradcheck.seed": str(seed),
                 "gradcheck.projections": SKETCH_FAMILY})
    return write_dump(path, rows, [n for n, _, _ in entries], stage, rank, world, meta, None, None, precision=prec,
                      model=model)


def dump_grads(model, path, stage="reduced", rank=None, world=None, extra_metadata=None, dtype=None, writer=None,
               precision=None, loss=None, sketch=None, seed=0):
    """Writes each trainable parameter's .grad (None: absent) to `path`.

    Call it after loss.backward() (under DDP the gradients are then already all-reduced: stage
    "reduced"). rank/world default to torch.distributed's when a process group is up, else 0/1.
    dtype casts the gradients before writing (e.g. torch.bfloat16). precision: what the step computed in
    ("fp64", "fp32", "tf32", "bf16", "fp16", a torch dtype, or Lightning's "bf16-mixed"...); None infers it
    (autocast seen by track_precision or active now, else the gradients' dtypes). Sharded models (FSDP2
    fully_shard, FSDP1) write each rank's own shard of every original parameter, no gather; DTensor gradients
    with any placements (tensor and sequence parallel, FSDP2 over TP) write each rank's piece and where it sits,
    and so do plain parameters declared with tp_layout (docs/dumps.md). With tp_layout every rank of the
    tensor-parallel group must call it (it exchanges the pieces' lengths). A parameter whose .grad is None but which
    holds a gradient buffer of its wrapper's (`main_grad`, HELD_ATTRS) is recorded in gradcheck.held with the buffer's
    norm (held_grads): `check` then says where its gradient went instead of calling the graph cut. loss: this rank's
    loss of the step (the reference's: the objective), recorded as gradcheck.loss: where the ranks' mean loss is the
    reference's, the forward is right, and `check` can say which backward a wrong gradient looks like.

    sketch=K: a sketch dump instead (docs/dumps.md): per parameter its non-finite count, float64 norm and a
    K-value linear sketch (seeded random projections, `seed`; FSDP shards at their offset, so pieces add), KB per
    model; `gradcheck-dist check` compares sketch dumps with a sketch reference (docs/guard.md: world W vs W/2).
    """
    entries, mesh = _collect(model)
    if loss is not None:
        extra_metadata = {"gradcheck.loss": repr(float(loss)), **(extra_metadata or {})}
    if sketch is not None:
        return _dump_sketch(model, path, entries, sketch, seed, stage, rank, world, extra_metadata, dtype, precision)
    grads = {n: g for n, g, _ in entries}
    shards = {n: s for n, _, s in entries if s is not None}
    held = held_grads(model, [n for n, g, _ in entries if g is None])
    if held:
        extra_metadata = {"gradcheck.held": json.dumps(held, separators=(",", ":")), **(extra_metadata or {})}
    return write_dump(path, grads, [n for n, _, _ in entries], stage, rank, world, extra_metadata, dtype, writer,
                      precision=precision, shards=shards, model=model, mesh=mesh)


class LocalGradCapture:
    """Captures each rank's own gradient before DDP's all-reduce (stage "local").

    A hook on every trainable parameter clones the gradient autograd computes for it; under DDP the
    hooks run before the gradient reaches DDP's reducer. A parameter autograd never reaches (unused
    under find_unused_parameters=True) gets no call and stays absent (None); a hook called with None
    (torch 2.x, an output the loss ignores) counts as no gradient. Gradients of several backward calls add
    up, as .grad does; reset() clears them, remove() takes the hooks off. It also records the autocast
    precision of the forward (track_precision).

        cap = LocalGradCapture(ddp_model)
        loss.backward()
        cap.dump(f"local/rank{rank}.safetensors")
    """

    def __init__(self, model):
        named = _trainable(model)
        self.model = model
        self.params = [n for n, _ in named]
        self.grads = {}
        self.earlier = {}
        self._handles = [p.register_hook(self._hook(n)) for n, p in named]
        track(model)

    def _hook(self, name):
        def hook(g):
            if g is None:
                return None
            prev = self.grads.get(name)
            self.grads[name] = g.detach().clone() if prev is None else prev + g.detach()
            return None
        return hook

    def mark(self):
        """Call right before the last backward of a step (gradient accumulation: before the synced one): what was
        captured so far is kept, and dump() writes it beside each gradient as NAME@earlier. `check` then tells a
        last backward that did not sync (each rank's reduced gradient: the ranks' mean of the earlier part plus its
        own last part) from other reasons the ranks disagree. Nothing captured yet: nothing kept."""
        self.earlier = {n: g.clone() for n, g in self.grads.items()}

    def reset(self):
        self.grads = {}
        self.earlier = {}

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def dump(self, path, rank=None, world=None, extra_metadata=None, dtype=None, writer=None, precision=None):
        return write_dump(path, self.grads, self.params, "local", rank, world, extra_metadata, dtype, writer,
                          precision=precision, model=self.model, earlier=self.earlier)


# ---- reading (for tests and callers that want the numbers back without safetensors)


def read_dump(path):
    """Returns (tensors {name: torch tensor}, metadata {str: str}) of a dump."""
    import torch

    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode())
    meta = header.pop("__metadata__", {})
    base, out = 8 + n, {}
    np_types = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.int16}
    for name, h in header.items():
        b, e = h["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + b:base + e]), dtype=np_types[h["dtype"]]) if e > b else \
            torch.empty(0, dtype=np_types[h["dtype"]])
        if h["dtype"] == "BF16":
            t = t.view(torch.bfloat16)
        out[name] = t.reshape(h["shape"])
    return out, meta
