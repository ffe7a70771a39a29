"""Dump writer throughput against safetensors.torch.save_file (for tests/bench; issue 22).

    from gradcheck_dist._bench import dump_throughput
    dump_throughput("/tmp/dir")  ->  {"bytes": ..., "dump_grads_s": [...], "save_file_s": [...],
                                      "dump_grads_GBps": best, "save_file_GBps": best, "ratio": dump/save}

python -m gradcheck_dist._bench [DIR] [REPEATS] prints it as JSON. The model: 4 x Linear(8192, 8192) without
bias, float32 gradients (1.07 GB), as in issue 22. Each file is removed after its timing; the timings include
the write to the page cache and the rename, not an fsync (save_file does not sync either).
"""
import json
import os
import sys
import time


def _model(layers, dim):
    import torch

    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(dim, dim, bias=False) for _ in range(layers)])
    for p in m.parameters():
        p.grad = torch.randn_like(p)
    return m


def dump_throughput(directory, repeats=3, layers=4, dim=8192, model=None):
    from safetensors.torch import save_file

    from .dump import dump_grads

    m = model if model is not None else _model(layers, dim)
    nbytes = sum(p.grad.numel() * p.grad.element_size() for p in m.parameters() if p.grad is not None)
    os.makedirs(directory, exist_ok=True)
    out = {"bytes": nbytes, "dump_grads_s": [], "save_file_s": []}
    for _ in range(repeats):
        for key in ("save_file_s", "dump_grads_s"):
            path = os.path.join(directory, f"bench-{key}.safetensors")
            t = time.perf_counter()
            if key == "dump_grads_s":
                dump_grads(m, path, rank=0, world=1)
            else:
                save_file({n: p.grad for n, p in m.named_parameters()}, path)
            out[key].append(time.perf_counter() - t)
            os.unlink(path)
    out["dump_grads_GBps"] = nbytes / min(out["dump_grads_s"]) / 1e9
    out["save_file_GBps"] = nbytes / min(out["save_file_s"]) / 1e9
    out["ratio"] = out["dump_grads_GBps"] / out["save_file_GBps"]
    return out


if __name__ == "__main__":
    d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/gcd-dump-bench"
    print(json.dumps(dump_throughput(d, int(sys.argv[2]) if len(sys.argv) > 2 else 3), indent=1))
