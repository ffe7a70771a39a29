"""Tensor- and sequence-parallel dumps (issue 39 items 1 and 2): each rank writes its piece of each gradient, its
placements on the mesh and where the piece sits (gradcheck.shards, gradcheck.mesh; docs/dumps.md, "Pieces on a
mesh"). `assemble` below is the spec in torch -- replicas compared, partials added, boxes tiled exactly once --
and the assembled gradients must equal an unsplit model's. Runs for real on gloo, CPU: torch's parallelize_module
(TP + SP) at worlds 2 and 4, FSDP2 over TP on a (dp, tp) mesh at world 4, DTensors placed Shard(d) for every d,
and a Megatron-style hand-written block declared with tp_layout (or megatron-core's attributes). Needs torch >= 2.4:
the torch 2.x tier.

usage: python -m pytest -q tests/torch/test_tp_dumps.py
"""
import json
import re
import os
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python"))
from gradcheck_dist import Shard, check_tp, dump_grads, read_dump, tp_layout, write_dump  # noqa: E402
from gradcheck_dist.harness import GradcheckFailure  # noqa: E402
from spawned import free_port, leave  # noqa: E402  (tests/torch)

H, F, S, B = 8, 10, 8, 2   # hidden, ffn (10: uneven over 4), sequence (split over tp), batch (split over dp)


class Block(torch.nn.Module):
    def __init__(self, f=F):
        super().__init__()
        self.norm = torch.nn.LayerNorm(H)
        self.fc1 = torch.nn.Linear(H, f)
        self.fc2 = torch.nn.Linear(f, H)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(self.norm(x))))


def data(seed=1):
    return torch.randn(B, S, H, generator=torch.Generator().manual_seed(seed))


def reference(dp, f=F, seed=1):
    """The unsplit block's gradient: the loss summed over the sequence, averaged over the dp replicas' batches."""
    torch.manual_seed(0)
    m = Block(f)
    sum(m(x).pow(2).sum() for x in data(seed).chunk(dp)).div(dp).backward()
    return {n: p.grad for n, p in m.named_parameters()}


def check(outdir, world, ref, code, *words, rename=None):
    """`gradcheck-dist check` on the ranks' dumps against ref (the unsplit gradient, written as a world-1 dump
    under the ranks' names): its exit code must be `code` and its output must hold each of words."""
    rename = rename or {}
    grads = {rename.get(n, n): g for n, g in ref.items()}
    refp = os.path.join(outdir, "ref.safetensors")
    write_dump(refp, grads, list(grads), "reduced", rank=0, world=1)
    paths = [os.path.join(outdir, f"rank{r}.safetensors") for r in range(world)]
    p = subprocess.run([os.environ["GRADCHECK_DIST"], "check", *paths, "--ref", refp, "--no-json"], capture_output=True, text=True, timeout=120)
    text = re.sub(r"\s+", " ", p.stdout + p.stderr)
    assert p.returncode == code and all(w in text for w in words), (p.returncode, code, words, p.stdout + p.stderr)
    return text


# ---- the spec in torch


def assemble(paths):
    """{name: whole gradient} from the ranks' dumps, and {name: largest relative difference between copies}."""
    files = [read_dump(p) for p in paths]
    meshes = [json.loads(m["gradcheck.mesh"]) for _, m in files if "gradcheck.mesh" in m]
    mesh = meshes[0] if meshes else None
    if mesh:
        assert len(meshes) == len(files), "every rank records the mesh"
        for r, (_, m) in enumerate(files):
            me = json.loads(m["gradcheck.mesh"])
            assert (me["shape"], me["names"], me["ranks"]) == (mesh["shape"], mesh["names"], mesh["ranks"])
            flat = 0
            for c, s in zip(me["coords"], me["shape"]):
                flat = flat * s + c
            assert mesh["ranks"][flat] == int(m["gradcheck.rank"]) == r, (r, me)
    names = json.loads(files[0][1]["gradcheck.params"])
    whole, copies = {}, {}
    for name in names:
        held = [(t[name], json.loads(m.get("gradcheck.shards", "{}")).get(name), json.loads(m.get("gradcheck.mesh", "null")))
                for t, m in files if name in t]
        entry = next((e for _, e, _ in held if e is not None), None)
        if entry is None:  # whole on every rank: the copies must agree
            whole[name] = held[0][0]
            copies[name] = max(float((t - held[0][0]).norm() / held[0][0].norm()) for t, _, _ in held)
        elif "start" in entry:  # format 1's flat run (FSDP)
            whole[name], copies[name] = flat_runs(name, held, entry["shape"]), 0.0
        else:
            whole[name], copies[name] = pieces(name, held, mesh)
    return whole, copies


def flat_runs(name, held, shape):
    n = 1
    for d in shape:
        n *= d
    out, cov = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.int32)
    runs = {(e["start"], t.numel()): t.reshape(-1) for t, e, _ in held}   # replicas (HSDP) hold the same run
    for (s, k), t in runs.items():
        out[s:s + k] = t.double()
        cov[s:s + k] += 1
    assert bool((cov == 1).all()), f"{name}: flat runs cover {cov.tolist()}"
    return out.reshape(shape)


def pieces(name, held, mesh):
    """Per shard coordinate: the partial pieces added (avg: averaged), the replicas compared; then the boxes tiled."""
    entry = held[0][1]
    kinds = [p["kind"] for p in entry["placements"]]
    S_ = [i for i, k in enumerate(kinds) if k in ("shard", "strided_shard")]
    P_ = [i for i, k in enumerate(kinds) if k == "partial"]
    R_ = [i for i, k in enumerate(kinds) if k == "replicate"]
    groups = {}   # c_S -> {c_R: [(piece, box)]}
    for t, e, me in held:
        assert e["shape"] == entry["shape"] and e["placements"] == entry["placements"], f"{name}: the ranks' maps differ"
        c = me["coords"]
        box = (tuple(e["offsets"]), tuple(e["lengths"]))
        assert list(t.shape) == e["lengths"], f"{name}: the stored piece is {list(t.shape)}, the map says {e['lengths']}"
        groups.setdefault(tuple(c[i] for i in S_), {}).setdefault(tuple(c[i] for i in R_), []).append((t.double(), box))
    out = torch.zeros(entry["shape"], dtype=torch.float64)
    cov = torch.zeros(entry["shape"], dtype=torch.int32)
    worst = 0.0
    n_partial = 1
    for i in P_:
        n_partial *= mesh["shape"][i]
    for cs, by_r in groups.items():
        values = []
        for cr, ps in by_r.items():
            assert len({b for _, b in ps}) == 1, f"{name}: pieces of one shard coordinate {cs} sit in different boxes"
            assert len(ps) == n_partial, f"{name}: {len(ps)} partial pieces at {cs}, {cr}, the mesh has {n_partial}"
            v = sum(t for t, _ in ps)
            if any(entry["placements"][i]["op"] == "avg" for i in P_):
                v = v / n_partial
            values.append((v, ps[0][1]))
        ref, box = values[0]
        for v, b in values[1:]:
            assert b == box, f"{name}: replicas of {cs} sit in different boxes"
            worst = max(worst, float((v - ref).norm() / max(ref.norm(), 1e-300)))
        sl = tuple(slice(o, o + k) for o, k in zip(*box))
        out[sl] += ref
        cov[sl] += 1
    assert bool((cov == 1).all()), f"{name}: the boxes cover elements {cov.reshape(-1).tolist()} times"
    return out, worst


# ---- the workers


def _init(rank, world, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _ffn(world, how):
    """torch's TP forward needs the ffn width split evenly over tp; FSDP2 over it splits unevenly (10: 5 = 3 + 2)"""
    return 12 if (world, how) == (4, "tp") else F


def _torch_tp(rank, world, how, outdir, port, seed=1, fault=None):
    """parallelize_module (TP + SP) over tp = world / dp, then (fsdp) FSDP2 over dp. fault, after the backward:
    partial_as_replicated (the norm's Partial gradient re-labelled Replicate, never all-reduced over tp),
    zero_shard (rank 1's piece of fc2.weight zeroed), bias_twice (fc2.bias's gradient all-reduced twice: x2)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    _init(rank, world, port)
    dp = 2 if how == "fsdp" else 1
    tp = world // dp
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    m = Block(_ffn(world, how))
    parallelize_module(m, mesh["tp"], {"norm": SequenceParallel(), "fc1": ColwiseParallel(input_layouts=TShard(1)),
                                       "fc2": RowwiseParallel(output_layouts=TShard(1))})
    if how == "fsdp":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
        fully_shard(m, mesh=mesh["dp"])
    d, t = mesh.get_coordinate()
    x = data(seed).chunk(dp)[d].chunk(tp, dim=1)[t]   # this replica's batch, this rank's sequence shard
    m(x).pow(2).sum().backward()
    if fault == "partial_as_replicated":
        from torch.distributed.tensor import DTensor, Replicate

        for p in (m.norm.weight, m.norm.bias):
            p.grad = DTensor.from_local(p.grad.to_local(), p.grad.device_mesh, [Replicate()] * p.grad.device_mesh.ndim, run_check=False)
    elif fault == "zero_shard" and rank == 1:
        m.fc2.weight.grad.to_local().zero_()
    elif fault == "bias_twice":
        m.fc2.bias.grad.to_local().mul_(2)
    if rank == 0:
        with open(os.path.join(outdir, "placements.json"), "w") as f:
            json.dump({n: str(p.grad.placements) for n, p in m.named_parameters()}, f)
    dump_grads(m, os.path.join(outdir, f"rank{rank}.safetensors"))
    dist.barrier()  # no rank tears gloo down while another still talks
    dist.destroy_process_group()
    leave()   # tests/torch/spawned.py: past interpreter exit


def _spawn(fn, world, *args, **kw):
    mp.start_processes(fn, args=(world,) + args + (free_port(),) + tuple(kw.values()), nprocs=world, start_method="spawn")


def _close(whole, ref):
    for n, g in ref.items():
        assert whole[n].shape == g.shape, (n, whole[n].shape, g.shape)
        assert torch.allclose(whole[n].double(), g.double(), rtol=1e-5, atol=1e-6), (n, whole[n], g)


@pytest.mark.parametrize("world,how", [(2, "tp"), (4, "tp"), (4, "fsdp")])
def test_torch_tp_pieces_should_assemble_to_the_unsplit_gradient(tmp_path, world, how):
    _spawn(_torch_tp, world, how, str(tmp_path))
    placed = json.load(open(tmp_path / "placements.json"))
    if how == "tp":   # what the issue saw: the norm's gradient partial, the row-parallel weight Shard(1)
        assert placed["norm.weight"] == "(Partial(sum),)" and placed["fc2.weight"] == "(Shard(dim=1),)", placed
    else:             # FSDP2 over TP
        assert placed["fc1.weight"] == "(_StridedShard(dim=0, sf=2), Shard(dim=0))", placed
    paths = [str(tmp_path / f"rank{r}.safetensors") for r in range(world)]
    meta = read_dump(paths[0])[1]
    mesh = json.loads(meta["gradcheck.mesh"])
    assert mesh == {"shape": [2 if how == "fsdp" else 1, world // (2 if how == "fsdp" else 1)], "names": ["dp", "tp"],
                    "coords": [0, 0], "ranks": list(range(world))}, mesh
    shards = json.loads(meta["gradcheck.shards"])
    if how == "tp":
        assert shards["norm.weight"]["placements"] == [{"kind": "replicate"}, {"kind": "partial", "op": "sum"}]
        assert shards["fc2.weight"]["placements"] == [{"kind": "replicate"}, {"kind": "shard", "dim": 1}]
        assert shards["fc1.weight"] == {"shape": [_ffn(world, how), H], "start": 0}   # Shard(0) alone: format 1's flat run, as FSDP2's
    else:
        assert shards["fc1.weight"]["placements"] == [{"kind": "strided_shard", "dim": 0, "split_factor": 2},
                                                      {"kind": "shard", "dim": 0}]
    whole, copies = assemble(paths)
    ref = reference(2 if how == "fsdp" else 1, _ffn(world, how))
    _close(whole, ref)
    assert max(copies.values()) < 1e-6, copies
    check(str(tmp_path), world, ref, 0, "result: pass")


@pytest.mark.parametrize("world,how,seed", [(2, "tp", 2), (2, "tp", 3), (4, "fsdp", 2), (4, "fsdp", 3)])
def test_torch_tp_should_pass_check_on_other_seeds(tmp_path, world, how, seed):
    _spawn(_torch_tp, world, how, str(tmp_path), seed=seed)
    check(str(tmp_path), world, reference(2 if how == "fsdp" else 1, _ffn(world, how), seed), 0, "result: pass")


@pytest.mark.parametrize("fault,words", [
    ("partial_as_replicated", ("norm.weight and norm.bias: replicated across the tensor-parallel ranks, but the copies differ",
                               "rank 1 (dp 0, tp 1) against rank 0 (dp 0, tp 0)")),
    ("zero_shard", ("fc2.weight",)),
    ("bias_twice", ("fc2.bias", "x2"))])
def test_torch_tp_faults_should_be_caught_and_named(tmp_path, fault, words):
    _spawn(_torch_tp, 2, "tp", str(tmp_path), seed=1, fault=fault)
    check(str(tmp_path), 2, reference(1, _ffn(2, "tp")), 1, *words)


# ---- the harness in one line: check_tp (issue 39 item 5), called as docs/python.md shows


def tp_sp(m, mesh):
    """TP + SP on mesh["tp"]: the block's input arrives whole on every tp rank and is split along the sequence;
    FSDP2 over mesh["dp"] when dp > 1."""
    from torch.distributed.tensor import Replicate, Shard as TShard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    parallelize_module(m, mesh["tp"], PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(TShard(1),)))
    parallelize_module(m, mesh["tp"], {"norm": SequenceParallel(), "fc1": ColwiseParallel(input_layouts=TShard(1)),
                                       "fc2": RowwiseParallel(output_layouts=TShard(1))})
    if mesh["dp"].size() > 1:
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
        fully_shard(m, mesh=mesh["dp"])


def tp_sp_norm_unreduced(m, mesh):
    """tp_sp, but the norm's Partial gradient is re-labelled Replicate as it lands: never all-reduced over tp."""
    tp_sp(m, mesh)
    for p in m.norm.parameters():
        p.register_post_accumulate_grad_hook(_as_replicated)


def _as_replicated(p):
    from torch.distributed.tensor import DTensor, Replicate

    p.grad = DTensor.from_local(p.grad.to_local(), p.grad.device_mesh, [Replicate()], run_check=False)


def sp_step(m, x, rank, world):
    """Each tp rank's loss is its sequence shard's sum (the tp ranks' losses add up to the replica's), per row."""
    return m(x).pow(2).sum() / x.shape[0]


@pytest.mark.parametrize("mesh", [(1, 2), (2, 2)])
def test_check_tp_should_pass_tp_sp(mesh):
    report = check_tp(Block, tp_sp, sp_step, data(), mesh=mesh)
    assert not [f for f in report["runs"][0]["findings"] if f.get("counts")], report


def test_check_tp_should_name_a_norm_left_partial(tmp_path):
    with pytest.raises(GradcheckFailure) as e:
        check_tp(Block, tp_sp_norm_unreduced, sp_step, data(), mesh=(1, 2), workdir=tmp_path)
    text = re.sub(r"\s+", " ", str(e.value))
    assert "norm.weight and norm.bias: replicated across the tensor-parallel ranks, but the copies differ" in text, text
    assert "fc1" not in text and "fc2" not in text, text


# ---- DTensors placed by hand: Shard(d) for every d, on 1-D and 2-D meshes


class Cube(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(5, 6, 7, generator=torch.Generator().manual_seed(2)))

    def forward(self, x):   # x (6, 7): every element of w gets its own gradient
        return (self.w * x).sin().sum()


def _cube_x():
    return torch.randn(6, 7, generator=torch.Generator().manual_seed(5)) + 1


def _placed(rank, world, placements, outdir, port):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard as TShard, distribute_tensor

    _init(rank, world, port)
    shape = (2, 2) if len(placements) == 2 else (world,)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("a", "b")[:len(shape)])
    m = Cube()
    pls = [TShard(p) if isinstance(p, int) else Replicate() for p in placements]
    m.w = torch.nn.Parameter(distribute_tensor(m.w.detach(), mesh, pls))
    from torch.distributed.tensor import DTensor

    m(DTensor.from_local(_cube_x(), mesh, [Replicate()] * len(shape))).backward()
    dump_grads(m, os.path.join(outdir, f"rank{rank}.safetensors"))
    dist.barrier()  # no rank tears gloo down while another still talks
    dist.destroy_process_group()
    leave()   # tests/torch/spawned.py: past interpreter exit


@pytest.mark.parametrize("placements", [(1,), (2,), (0, 2), (2, 1), ("r", 1)])
def test_shard_of_every_dim_should_assemble(tmp_path, placements):
    world = 4 if len(placements) == 2 or placements == (1,) else 2
    _spawn(_placed, world, placements, str(tmp_path))
    whole, copies = assemble([str(tmp_path / f"rank{r}.safetensors") for r in range(world)])
    m = Cube()
    m(_cube_x()).backward()
    _close(whole, {"w": m.w.grad})
    assert copies["w"] < 1e-12


# ---- hand-written tensor parallelism (Megatron / nanotron / picotron style)


class _GatherSeq(torch.autograd.Function):
    """all_gather along the sequence; backward: reduce_scatter (Megatron gather_from_sequence_parallel_region)."""

    @staticmethod
    def forward(ctx, x, group):
        import torch.distributed as dist

        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter_seq(g, ctx.group), None


def _reduce_scatter_seq(x, group):
    import torch.distributed as dist

    parts = [p.contiguous() for p in x.chunk(dist.get_world_size(group), dim=1)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts, group=group)
    return out


class _ScatterSeq(torch.autograd.Function):
    """reduce_scatter along the sequence; backward: all_gather (Megatron reduce_scatter_to_sequence_parallel_region)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_seq(x, group)

    @staticmethod
    def backward(ctx, g):
        return _GatherSeq.apply(g, ctx.group), None


class MegatronBlock(torch.nn.Module):
    """Block split by hand: norm replicated (sequence-parallel), fc1 column-parallel (rows), fc2 row-parallel
    (columns), fc2.bias replicated and added after the reduce-scatter."""

    def __init__(self, group, tp, t):
        super().__init__()
        torch.manual_seed(0)
        full = Block()
        rows = list(torch.arange(F).chunk(tp))[t]
        self.group = group
        self.norm = full.norm
        self.fc1_weight = torch.nn.Parameter(full.fc1.weight.detach()[rows].clone())
        self.fc1_bias = torch.nn.Parameter(full.fc1.bias.detach()[rows].clone())
        self.fc2_weight = torch.nn.Parameter(full.fc2.weight.detach()[:, rows].clone())
        self.fc2_bias = full.fc2.bias

    def forward(self, x):
        h = _GatherSeq.apply(self.norm(x), self.group)
        y = torch.relu(h @ self.fc1_weight.T + self.fc1_bias) @ self.fc2_weight.T
        return _ScatterSeq.apply(y, self.group) + self.fc2_bias


NAMES = {"fc1_weight": "fc1.weight", "fc1_bias": "fc1.bias", "fc2_weight": "fc2.weight", "fc2_bias": "fc2.bias"}


def _megatron(rank, world, how, outdir, port):
    """world 2: one tp group; world 4: (dp 2) x (tp 2), DDP's all-reduce over dp done by hand. how: declared
    (tp_layout with names), attrs (megatron-core's attributes), skip_norm (a finalizer that forgets the norm)."""
    import torch.distributed as dist

    _init(rank, world, port)
    dp = world // 2
    tp_groups = [dist.new_group(list(range(d * 2, d * 2 + 2))) for d in range(dp)]
    dp_groups = [dist.new_group(list(range(t, world, 2))) for t in range(2)]
    d, t = rank // 2, rank % 2
    group = tp_groups[d]
    m = MegatronBlock(group, 2, t)
    if how == "attrs":
        for p, dim in ((m.fc1_weight, 0), (m.fc1_bias, 0), (m.fc2_weight, 1)):
            p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, 1
        for p in (m.norm.weight, m.norm.bias):
            p.tensor_model_parallel, p.sequence_parallel = False, True
        tp_layout(m, None, group=group)
    else:
        tp_layout(m, {"fc1_weight": Shard(0), "fc1_bias": Shard(0), m.fc2_weight: Shard(1), "norm.weight": "replicate"},
                  group=group)
    x = data().chunk(dp)[d].chunk(2, dim=1)[t]
    m(x).pow(2).sum().backward()
    for p in (m.norm.weight, m.norm.bias, m.fc2_bias):   # finalize_model_grads: the sequence-parallel grads summed over tp
        if how != "skip_norm" or p is m.fc2_bias:
            dist.all_reduce(p.grad, group=group)
    for p in m.parameters():   # DDP over dp: the mean
        dist.all_reduce(p.grad, group=dp_groups[t])
        p.grad /= dp
    dump_grads(m, os.path.join(outdir, f"rank{rank}.safetensors"))
    dist.barrier()  # no rank tears gloo down while another still talks
    dist.destroy_process_group()
    leave()   # tests/torch/spawned.py: past interpreter exit


@pytest.mark.parametrize("world,how", [(2, "declared"), (4, "declared"), (4, "attrs"), (2, "skip_norm")])
def test_hand_written_tp_should_assemble_to_the_unsplit_gradient(tmp_path, world, how):
    _spawn(_megatron, world, how, str(tmp_path))
    paths = [str(tmp_path / f"rank{r}.safetensors") for r in range(world)]
    meta = read_dump(paths[-1])[1]
    assert json.loads(meta["gradcheck.mesh"]) == {"shape": [world // 2, 2], "names": ["dp", "tp"],
                                                  "coords": [world // 2 - 1, 1], "ranks": list(range(world))}
    shards = json.loads(meta["gradcheck.shards"])
    assert shards["fc2_weight"] == {"shape": [H, F], "placements": [{"kind": "replicate"}, {"kind": "shard", "dim": 1}],
                                    "offsets": [0, F // 2], "lengths": [H, F // 2]}
    assert set(shards) == {"fc1_weight", "fc1_bias", "fc2_weight"}   # the rest whole: replicated on every rank
    whole, copies = assemble(paths)
    ref = reference(world // 2)
    whole = {NAMES.get(n, n): g for n, g in whole.items()}
    copies = {NAMES.get(n, n): c for n, c in copies.items()}
    back = {v: k for k, v in NAMES.items()}
    if how == "skip_norm":   # each tp rank kept its own sequence shard's share: the copies differ, the rest is right
        assert copies["norm.weight"] > 0.1 and copies["norm.bias"] > 0.1, copies
        assert not torch.allclose(whole["norm.weight"].double(), ref["norm.weight"].double(), rtol=1e-3)
        check(str(tmp_path), world, ref, 1, "norm.weight and norm.bias: replicated across the tensor-parallel ranks, but the copies differ",
              "rank 1 (dp 0, tp 1) against rank 0 (dp 0, tp 0)", rename=back)
        ref = {n: g for n, g in ref.items() if not n.startswith("norm.")}
    else:
        assert max(copies.values()) < 1e-6, copies
        check(str(tmp_path), world, ref, 0, "result: pass", rename=back)
    _close(whole, ref)


def test_tp_layout_should_refuse_what_it_cannot_place(tmp_path):
    _spawn(_refusals, 2, str(tmp_path))
    assert open(tmp_path / "ok").read() == "ok"


def _refusals(rank, world, outdir, port):
    import torch.distributed as dist

    _init(rank, world, port)
    m = MegatronBlock(None, 2, rank)
    for layout, words in (({"nope": Shard(0)}, "not trainable parameters"), ({"fc1_bias": Shard(1)}, "Shard(1) of a 1-D"),
                          ({"fc1_weight": "split"}, "is not Shard(dim) or 'replicate'")):
        with pytest.raises(ValueError, match=re.escape(words)):
            tp_layout(m, layout)
    m.fc1_weight.tensor_model_parallel, m.fc1_weight.partition_dim, m.fc1_weight.partition_stride = True, 0, 2
    with pytest.raises(ValueError, match="partition_stride"):
        tp_layout(m, None)
    if rank == 0:
        open(os.path.join(outdir, "ok"), "w").write("ok")
    dist.barrier()  # no rank tears gloo down while another still talks
    dist.destroy_process_group()
    leave()   # tests/torch/spawned.py: past interpreter exit
