"""A tiny safetensors writer for the tests: raw bytes, so that it can write broken files too.

A file is an 8-byte little-endian header length N, N bytes of JSON header, then the data. This module
writes valid gradient dumps (gradcheck.* metadata, as gradcheck_dist.dump_grads does) and the pieces
the hostile fixtures are made of. Only the standard library and numpy.
"""
import json
import struct

import numpy as np

# numpy dtype -> safetensors dtype
_DTYPES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
           np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}


class Raw:
    """A tensor given as its safetensors dtype, shape and little-endian bytes (BF16, broken sizes)."""

    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, list(shape), bytes(data)


def bf16(values):
    """Raw BF16 tensor of float values (exact when their low 16 float32 bits are zero)."""
    a = np.ascontiguousarray(values, dtype="<f4")
    return Raw("BF16", a.shape, (a.view("<u4") >> 16).astype("<u2").tobytes())


def bf16_values(raw):
    """The float64 values of a Raw BF16 tensor."""
    u = np.frombuffer(raw.data, dtype="<u2").astype("<u4") << 16
    return u.view("<f4").astype(np.float64).reshape(raw.shape)


def as_raw(t):
    if isinstance(t, Raw):
        return t
    a = np.ascontiguousarray(t)
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    return Raw(_DTYPES[np.dtype(a.dtype.type)], a.shape, a.tobytes())


def header_bytes(header, pad=True):
    """JSON bytes of a header (dict, or a str taken verbatim), padded with spaces to 8 bytes."""
    h = header.encode() if isinstance(header, str) else header if isinstance(header, bytes) else \
        json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return h


def file_bytes(header, data=b"", length=None, pad=True):
    """8-byte length (the header's real one unless length is given) + header + data."""
    h = header_bytes(header, pad)
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def build(tensors, metadata=None):
    """(header dict, data bytes) for tensors, a list of (name, tensor) in order, laid out contiguously."""
    header, data = {}, bytearray()
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors:
        r = as_raw(t)
        header[name] = {"dtype": r.dtype, "shape": r.shape, "data_offsets": [len(data), len(data) + len(r.data)]}
        data += r.data
    return header, bytes(data)


def meta(rank, world, stage, params, **extra):
    m = {"gradcheck.format": "1", "gradcheck.rank": str(rank), "gradcheck.world": str(world),
         "gradcheck.stage": stage, "gradcheck.params": json.dumps(list(params))}
    m.update({k.replace("_", "."): v for k, v in extra.items()})
    return m


def dump_bytes(grads, rank=0, world=1, stage="reduced", params=None, metadata=None):
    """A gradient dump: grads is a dict name -> array/Raw/None (None: absent, like a None .grad);
    params defaults to grads' keys in order. metadata (a dict) replaces the gradcheck one."""
    if params is None:
        params = list(grads)
    m = meta(rank, world, stage, params) if metadata is None else metadata
    header, data = build([(k, v) for k, v in grads.items() if v is not None], m)
    return file_bytes(header, data)


def write(path, content):
    with open(path, "wb") as f:
        f.write(content)
    return str(path)


def write_dump(path, grads, **kw):
    return write(path, dump_bytes(grads, **kw))


def write_world(directory, per_rank, stage="reduced", params=None, name="rank{}.safetensors"):
    """One dump per rank: per_rank is a list (one dict of grads per rank). Returns the paths."""
    world = len(per_rank)
    return [write_dump(f"{directory}/{name.format(k)}", g, rank=k, world=world, stage=stage, params=params)
            for k, g in enumerate(per_rank)]
