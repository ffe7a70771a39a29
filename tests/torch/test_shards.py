"""FSDP dumps (issue 24 item 6): each rank writes its own shard of each original parameter under its original
name with `gradcheck.shards`; assembled, the shards are the reference's gradient. Needs torch >= 2.4 (FSDP on
Debian's torch 1.13 cannot even be imported on Python 3.11): run it in the torch 2.x tier.

usage: python -m pytest -q tests/torch/test_shards.py
"""
import json
import os
import sys

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python"))
from gradcheck_dist import dump_grads, read_dump  # noqa: E402
from spawned import free_port, leave  # noqa: E402  (tests/torch)

WORLD = 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)])  # 5 rows: uneven over 2
        self.out = torch.nn.Linear(3, 1)

    def forward(self, x):
        for l in self.layers:
            x = torch.tanh(l(x))
        return self.out(x).pow(2).mean()


def batch():
    return torch.randn(8, 6, generator=torch.Generator().manual_seed(3))


def _worker(rank, how, outdir, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = Net()
    if how == "fsdp2":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
        for l in model.layers:
            fully_shard(l)
        fully_shard(model)
        wrapped = model
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        for i, l in enumerate(model.layers):
            model.layers[i] = FSDP(l, use_orig_params=(how == "fsdp1-orig"), device_id=torch.device("cpu"))
        wrapped = FSDP(model, use_orig_params=(how == "fsdp1-orig"), device_id=torch.device("cpu"))
    x = batch().chunk(WORLD)[rank]
    wrapped(x).backward()
    dump_grads(wrapped, os.path.join(outdir, f"rank{rank}.safetensors"))
    dist.barrier()  # no rank tears gloo down while another still talks
    dist.destroy_process_group()
    leave()   # tests/torch/spawned.py: past interpreter exit


def assemble(paths):
    """{name: full tensor} from the ranks' dumps; every element must be covered exactly once (no overlap)."""
    full, seen = {}, {}
    for p in paths:
        tensors, meta = read_dump(p)
        shards = json.loads(meta.get("gradcheck.shards", "{}"))
        for n, t in tensors.items():
            if n not in shards:
                full[n] = t
                continue
            s = shards[n]
            numel = 1
            for d in s["shape"]:
                numel *= d
            flat = full.setdefault(n, torch.zeros(numel, dtype=t.dtype))
            cov = seen.setdefault(n, torch.zeros(numel, dtype=torch.int32))
            flat[s["start"]:s["start"] + t.numel()] = t.reshape(-1)
            cov[s["start"]:s["start"] + t.numel()] += 1
    for n, cov in seen.items():
        assert bool((cov == 1).all()), f"{n}: elements covered {cov.tolist()}"
        full[n] = full[n].reshape(json.loads(read_dump(paths[0])[1]["gradcheck.shards"])[n]["shape"]) \
            if n in json.loads(read_dump(paths[0])[1]["gradcheck.shards"]) else full[n]
    return full


@pytest.mark.parametrize("how", ["fsdp2", "fsdp1", "fsdp1-orig"])
def test_fsdp_shards_should_assemble_to_the_reference(tmp_path, how):
    mp.start_processes(_worker, args=(how, str(tmp_path), free_port()), nprocs=WORLD, start_method="spawn")
    torch.manual_seed(0)
    ref = Net()
    ref(batch()).backward()
    paths = [str(tmp_path / f"rank{r}.safetensors") for r in range(WORLD)]
    meta = read_dump(paths[0])[1]
    names = [n for n, _ in ref.named_parameters()]
    assert sorted(json.loads(meta["gradcheck.params"])) == sorted(names)  # original names: no _fsdp_wrapped_module, no _flat_param
    assert set(json.loads(meta["gradcheck.shards"])) == set(names)
    full = assemble(paths)
    for n, p in ref.named_parameters():
        assert full[n].reshape(p.shape).shape == p.grad.shape, n
        assert torch.allclose(full[n].reshape(p.shape), p.grad, rtol=1e-5, atol=1e-7), (n, full[n], p.grad)


@pytest.mark.parametrize("how,words", [("fsdp2", "FSDP2's reduce-scatter"), ("fsdp1", "FSDP's reduce-scatter")])
def test_check_should_name_the_wrapper_the_dumps_record(tmp_path, how, words):
    # issue 38 (1f): check's header said "after DDP's all-reduce" for FSDP dumps, where no DDP ran
    import subprocess

    mp.start_processes(_worker, args=(how, str(tmp_path), free_port()), nprocs=WORLD, start_method="spawn")
    torch.manual_seed(0)
    ref = Net()
    ref(batch()).backward()
    dump_grads(ref, str(tmp_path / "ref.safetensors"), rank=0, world=1)
    paths = [str(tmp_path / f"rank{r}.safetensors") for r in range(WORLD)]
    assert read_dump(paths[0])[1]["gradcheck.wrapper"] == how.rstrip("1")
    assert "gradcheck.wrapper" not in read_dump(str(tmp_path / "ref.safetensors"))[1]   # a plain model records none
    p = subprocess.run([os.environ["GRADCHECK_DIST"], "check", *paths, "--ref", str(tmp_path / "ref.safetensors"), "--no-json"],
                       capture_output=True, text=True, timeout=120)
    out = " ".join((p.stdout + p.stderr).split())   # the text report wraps at 80 columns
    assert p.returncode == 0, out
    assert f"stage reduced: the dumps were written after {words}" in out, out
    assert "DDP" not in out, out


# ---- issue 38: check_ddp(..., strategy="fsdp"|"fsdp2"), with accumulation, as docs/python.md writes it

def make_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def step_mean(model, batch, rank, world):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x).squeeze(-1), y)


def step_sum(model, batch, rank, world):
    x, y = batch
    return ((model(x).squeeze(-1) - y) ** 2).sum()


def mlp_batch():
    g = torch.Generator().manual_seed(2)
    return torch.randn(16, 6, generator=g), torch.randn(16, generator=g)


def test_fsdp_recipes_in_python_md_as_written():
    from doc_recipes import run_section

    got = run_section("FSDP and FSDP2", globals())   # each call's trailing comment checked (x0.5 (= 1/world) named)
    assert len(got) == 2 and got[0][1]["result"] == "pass", got
    run = got[1][1].report["runs"][0]
    assert run["wrapper"] == "fsdp2" and "FSDP2" in run["reduced_by"], run["reduced_by"]


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_check_ddp_strategy_should_pass_a_right_step_and_name_its_wrapper(strategy):
    from gradcheck_dist import GradcheckFailure, check_ddp

    for k in (1, 2):
        check_ddp(make_mlp, step_mean, mlp_batch(), world=2, strategy=strategy, accumulate=k)
    with pytest.raises(GradcheckFailure) as e:
        check_ddp(make_mlp, step_sum, mlp_batch(), world=2, strategy=strategy)
    run = e.value.report["runs"][0]
    assert run["wrapper"] == strategy and "DDP" not in run["reduced_by"], run["reduced_by"]
    assert all(p["status"] == "scaled" and abs(p["scale"] - 0.5) < 1e-4 for p in run["params"]), run["params"]
