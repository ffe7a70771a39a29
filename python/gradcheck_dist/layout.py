"""Where each rank's piece of a parameter's gradient sits: the map `gradcheck.shards` and `gradcheck.mesh` record
(docs/dumps.md, "Pieces on a mesh").

Two sources: DTensor gradients (torch's parallelize_module, FSDP2, both on a (dp, tp) mesh), which carry their
mesh and placements; and hand-written tensor parallelism (Megatron, nanotron, picotron style: plain parameters
holding a slice), declared once with `tp_layout(model, {...}, group=...)` or read from megatron-core's parameter
attributes. torch is imported only when a dump is written.
"""
import json


class Shard:
    """Split along tensor dimension `dim` over the tensor-parallel group (torch's Shard(d) is accepted too)."""

    def __init__(self, dim):
        self.dim = int(dim)

    def __repr__(self):
        return f"Shard({self.dim})"


REPLICATE = {"kind": "replicate"}


# ---- DTensor gradients


def _placement(name, pl):
    """One placement as the map records it: {"kind": "shard", "dim": d}, strided_shard (+ split_factor),
    replicate, partial (+ op)."""
    kind = type(pl).__name__
    if kind == "Replicate":
        return dict(REPLICATE)
    if kind == "_StridedShard":
        return {"kind": "strided_shard", "dim": int(pl.dim), "split_factor": int(pl.split_factor)}
    if kind == "Shard":
        return {"kind": "shard", "dim": int(pl.dim)}
    if kind in ("Partial", "_Partial"):
        op = str(getattr(pl, "reduce_op", "sum")).lower()
        op = {"redopsum": "sum", "redopavg": "avg"}.get(op.replace("_", "").replace(".", ""), op)
        if op not in ("sum", "avg"):
            raise ValueError(f"{name}: gradient placement {pl}: a partial {op!r} cannot be assembled (sum and avg can)")
        return {"kind": "partial", "op": op}
    raise ValueError(f"{name}: gradient placement {pl} ({kind}) is not supported")


def _root(mesh):
    get = getattr(mesh, "_get_root_mesh", None)
    return get() if get is not None else mesh


def mesh_record(mesh, name="a parameter"):
    """{"shape", "names", "coords", "ranks"} of a DeviceMesh: this rank's coordinates and every coordinate's rank."""
    coords = mesh.get_coordinate()
    if coords is None:
        raise ValueError(f"{name}: this rank is not in its gradient's device mesh")
    names = list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None
    return {"shape": [int(s) for s in mesh.mesh.shape], "names": names, "coords": [int(c) for c in coords],
            "ranks": [int(r) for r in mesh.mesh.reshape(-1).tolist()]}


def _on_root(name, g, root):
    """g's placements, one per root-mesh dimension: a submesh's dimensions found by name, the rest replicate."""
    mesh, pls = g.device_mesh, [_placement(name, p) for p in g.placements]
    if mesh is root or (mesh.mesh_dim_names == root.mesh_dim_names and mesh.mesh.shape == root.mesh.shape):
        return pls
    if not mesh.mesh_dim_names or not root.mesh_dim_names or any(n not in root.mesh_dim_names for n in mesh.mesh_dim_names):
        raise ValueError(f"{name}: its gradient's mesh {mesh.mesh_dim_names} is a submesh whose dimensions are not "
                         f"named dimensions of the root mesh {root.mesh_dim_names} (a flattened mesh): not supported")
    out = [dict(REPLICATE) for _ in root.mesh.shape]
    for n, p in zip(mesh.mesh_dim_names, pls):
        out[list(root.mesh_dim_names).index(n)] = p
    return out


def flat_ok(g):
    """True when the FSDP form {"shape", "start"} describes g's piece exactly (Shard(0) and Replicate only)."""
    return all(type(p).__name__ == "Replicate" or (type(p).__name__ == "Shard" and p.dim == 0) for p in g.placements)


def dtensor_piece(name, g):
    """(local piece shaped as its box, map entry, root mesh) of a DTensor gradient with any placements."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    root = _root(g.device_mesh)
    lengths, offsets = compute_local_shape_and_global_offset(g.shape, g.device_mesh, g.placements)
    local = g.to_local()
    shape = [int(s) for s in g.shape]
    lengths, offsets = [int(x) for x in lengths], [int(x) for x in offsets]
    n = 1
    for x in lengths:
        n *= x
    if local.numel() != n or any(o < 0 or o + l > s for o, l, s in zip(offsets, lengths, shape)):
        raise ValueError(f"{name}: placements {g.placements}: the local piece holds {local.numel()} elements, not the box "
                         f"{lengths} at {offsets} of {shape} that torch computes for it")
    entry = {"shape": shape, "placements": _on_root(name, g, root), "offsets": offsets, "lengths": lengths}
    return local.reshape(lengths), entry, root


# ---- hand-written tensor parallelism


def _declared(name, v):
    """A declaration as a placement: Shard(d) (ours or torch's) or "replicate" / Replicate()."""
    if isinstance(v, str) and v.lower() == "replicate" or type(v).__name__ == "Replicate":
        return dict(REPLICATE)
    if type(v).__name__ == "Shard" and isinstance(getattr(v, "dim", None), int):
        return {"kind": "shard", "dim": v.dim}
    raise ValueError(f"tp_layout: {name}: {v!r} is not Shard(dim) or 'replicate'")


def _megatron(p):
    """A megatron-core parameter's declaration from its attributes, or None when it has none."""
    if not getattr(p, "tensor_model_parallel", False):
        return dict(REPLICATE) if hasattr(p, "tensor_model_parallel") or getattr(p, "sequence_parallel", False) else None
    if int(getattr(p, "partition_stride", 1)) != 1:
        raise ValueError("tp_layout: partition_stride != 1 (a strided split of a fused weight) is not supported")
    return {"kind": "shard", "dim": int(p.partition_dim)}


def tp_layout(model, layout=None, group=None):
    """Declares how a hand-written tensor-parallel model splits its parameters, for dump_grads.

    layout: {name or parameter: Shard(d) | "replicate"}; names are the original names (dump_grads' names).
    Parameters it does not name are replicated across the group (every tensor-parallel rank holds them whole);
    None reads megatron-core's attributes instead (tensor_model_parallel with partition_dim: Shard(partition_dim);
    otherwise, sequence_parallel ones included, replicate). group: the tensor-parallel process group (None: the
    whole world). Every rank calls it (it exchanges the groups' members), after the model is built and before
    the dump. The mesh is (dp, tp): tp the group, dp which group. Returns the declarations by name."""
    import torch.distributed as dist

    from .dump import clean_name, unwrap

    root = unwrap(model)
    named = [(clean_name(n), p) for n, p in root.named_parameters() if p.requires_grad]
    by_name, by_id = {}, {}
    for k, v in (layout or {}).items():
        (by_name if isinstance(k, str) else by_id)[k if isinstance(k, str) else id(k)] = v
    known = {n for n, _ in named}
    unknown = [k for k in by_name if k not in known] + (["(a parameter object)"] if set(by_id) - {id(p) for _, p in named} else [])
    if unknown:
        raise ValueError(f"tp_layout: not trainable parameters of this model: {unknown}")
    decl = {}
    for n, p in named:
        v = by_name.get(n, by_id.get(id(p)))
        decl[n] = _declared(n, v) if v is not None else (_megatron(p) if layout is None else None) or dict(REPLICATE)
        if decl[n]["kind"] == "shard" and not 0 <= decl[n]["dim"] < p.dim():
            raise ValueError(f"tp_layout: {n}: Shard({decl[n]['dim']}) of a {p.dim()}-D parameter")
    world, rank = dist.get_world_size(), dist.get_rank()
    members = dist.get_process_group_ranks(group) if group is not None else list(range(world))
    every = [None] * world
    dist.all_gather_object(every, members)
    groups = sorted({tuple(m) for m in every}, key=min)
    size = len(groups[0])
    if any(len(g) != size for g in groups) or sorted(r for g in groups for r in g) != list(range(world)):
        raise ValueError(f"tp_layout: the tensor-parallel groups {groups} do not split the world into equal groups")
    mesh = {"shape": [len(groups), size], "names": ["dp", "tp"],
            "coords": [groups.index(tuple(members)), members.index(rank)], "ranks": [r for g in groups for r in g]}
    root.__dict__["_gradcheck_tp"] = {"decl": decl, "group": group, "mesh": mesh}
    return decl


def tp_pieces(model, entries):
    """The hand-written declarations applied to collect()'s entries [(name, grad, shard)]: a sharded
    parameter's map entry (its offset along the split dim from the lengths every group member holds); the
    mesh record, or None when tp_layout was not called. Collective over the tensor-parallel group."""
    from .dump import unwrap

    spec = unwrap(model).__dict__.get("_gradcheck_tp")
    if spec is None:
        return entries, None
    import torch.distributed as dist

    decl, group, mesh = spec["decl"], spec["group"], spec["mesh"]
    params = dict((n, p) for n, p in _named(model))
    split = [n for n, _, _ in entries if decl.get(n, REPLICATE)["kind"] == "shard"]
    mine = [int(params[n].shape[decl[n]["dim"]]) for n in split]   # the parameter's length: its gradient may be None
    every = [None] * mesh["shape"][1]
    dist.all_gather_object(every, mine, group=group)
    t = mesh["coords"][1]
    out = []
    for name, g, shard in entries:
        d = decl.get(name, REPLICATE)
        if d["kind"] != "shard" or g is None:
            out.append((name, g, shard))
            continue
        i, dim = split.index(name), d["dim"]
        shape = [int(s) for s in params[name].shape]
        offsets, lengths = [0] * len(shape), list(shape)
        offsets[dim] = sum(e[i] for e in every[:t])
        shape[dim] = sum(e[i] for e in every)
        placements = [dict(REPLICATE), {"kind": "shard", "dim": dim}]
        out.append((name, g.reshape(lengths), {"shape": shape, "placements": placements, "offsets": offsets, "lengths": lengths}))
    return out, mesh


def _named(model):
    from .dump import clean_name, unwrap

    return [(clean_name(n), p) for n, p in unwrap(model).named_parameters() if p.requires_grad]


def check_entry(name, e):
    """A map entry as the writer promises it (a check of our own output, before anything is written)."""
    if "start" in e:
        return
    nd = len(e["shape"])
    if len(e["offsets"]) != nd or len(e["lengths"]) != nd:
        raise ValueError(f"{name}: offsets/lengths do not have one value per dimension of {e['shape']}")
    for p in e["placements"]:
        if p["kind"] in ("shard", "strided_shard") and not 0 <= p["dim"] < nd:
            raise ValueError(f"{name}: placement {json.dumps(p)} names a dimension out of range")
