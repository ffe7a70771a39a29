"""Gradient dumps in the format `gradcheck-dist check` reads: one safetensors file per rank.

Each trainable parameter's gradient is stored under its named_parameters() name; a parameter whose
gradient is None is absent, and `gradcheck.params` in the metadata lists every trainable name so the
checker knows it is absent rather than forgotten. torch is imported only when a dump is written.
"""
import json
import os
import platform
import struct
import sys
import tempfile

FORMAT = "1"
_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}

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


# ---- writers


def _cpu(t, dtype):
    t = t.detach()
    if t.is_sparse:
        raise ValueError("sparse gradients are not supported")
    if dtype is not None:
        t = t.to(dtype)
    if str(t.dtype).replace("torch.", "") not in _DTYPES:
        raise ValueError(f"unsupported gradient dtype {t.dtype} (use F64, F32, F16 or BF16)")
    # a copy: DDP's gradient_as_bucket_view grads share one storage, which safetensors refuses
    return t.cpu().contiguous().clone()


def _write_builtin(path, tensors, metadata):
    """safetensors without the package: u64 LE header length, JSON header padded to 8, raw data."""
    import torch

    if sys.byteorder != "little":
        raise RuntimeError("the built-in writer needs a little-endian host")
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": _DTYPES[str(t.dtype).replace("torch.", "")], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def _use_safetensors(writer):
    if writer == "builtin" or (writer is None and os.environ.get("GRADCHECK_DIST_NO_SAFETENSORS") == "1"):
        return False
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        if writer == "safetensors":
            raise
        return False
    return True


def write_dump(path, grads, params, stage, rank=None, world=None, extra_metadata=None, dtype=None, writer=None):
    """Writes `grads` ({name: tensor or None}) for the trainable names `params`; atomic (temp + rename).

    writer: "safetensors", "builtin", or None (safetensors when importable and
    GRADCHECK_DIST_NO_SAFETENSORS is not "1"). Returns the path written.
    """
    if stage not in ("local", "reduced"):
        raise ValueError(f"stage must be 'local' or 'reduced', not {stage!r}")
    rank, world = _rank_world(rank, world)
    unknown = [n for n in grads if n not in params]
    if unknown:
        raise ValueError(f"gradients for names that are not trainable parameters: {unknown}")
    tensors = {n: _cpu(grads[n], dtype) for n in params if grads.get(n) is not None}
    meta = {"gradcheck.format": FORMAT, "gradcheck.rank": str(rank), "gradcheck.world": str(world),
            "gradcheck.stage": stage, "gradcheck.params": json.dumps(list(params))}
    meta.update(_versions())
    meta.update({str(k): str(v) for k, v in (extra_metadata or {}).items()})
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    os.close(fd)
    try:
        if _use_safetensors(writer):
            from safetensors.torch import save_file

            save_file(tensors, tmp, metadata=meta)
        else:
            _write_builtin(tmp, tensors, meta)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _trainable(model):
    return [(n, p) for n, p in unwrap(model).named_parameters() if p.requires_grad]


def dump_grads(model, path, stage="reduced", rank=None, world=None, extra_metadata=None, dtype=None, writer=None):
    """Writes each trainable parameter's .grad (None: absent) to `path`.

    Call it after loss.backward() (under DDP the gradients are then already all-reduced: stage
    "reduced"). rank/world default to torch.distributed's when a process group is up, else 0/1.
    dtype casts the gradients before writing (e.g. torch.bfloat16).
    """
    named = _trainable(model)
    grads = {n: p.grad for n, p in named}
    return write_dump(path, grads, [n for n, _ in named], stage, rank, world, extra_metadata, dtype, writer)


class LocalGradCapture:
    """Captures each rank's own gradient before DDP's all-reduce (stage "local").

    A hook on every trainable parameter clones the gradient autograd computes for it; under DDP the
    hooks run before the gradient reaches DDP's reducer. A parameter autograd never reaches (unused
    under find_unused_parameters=True) gets no call and stays absent (None). Gradients of several
    backward calls add up, as .grad does; reset() clears them, remove() takes the hooks off.

        cap = LocalGradCapture(ddp_model)
        loss.backward()
        cap.dump(f"local/rank{rank}.safetensors")
    """

    def __init__(self, model):
        named = _trainable(model)
        self.params = [n for n, _ in named]
        self.grads = {}
        self._handles = [p.register_hook(self._hook(n)) for n, p in named]

    def _hook(self, name):
        def hook(g):
            prev = self.grads.get(name)
            self.grads[name] = g.detach().clone() if prev is None else prev + g.detach()
        return hook

    def reset(self):
        self.grads = {}

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def dump(self, path, rank=None, world=None, extra_metadata=None, dtype=None, writer=None):
        return write_dump(path, self.grads, self.params, "local", rank, world, extra_metadata, dtype, writer)


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
