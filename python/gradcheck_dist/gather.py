"""A gather whose backward carries gradients, spelled as each torch version wants it (issue 24 item 8).

recent torch 2.x (2.15): torch.distributed._functional_collectives.all_gather_single_autograd(x, 0, group), what
  torch's own deprecation warning recommends;
torch 1.13 and the 2.x without it: torch.distributed.nn.functional.all_gather(x) (deprecated on recent torch).
Backward: each rank's slice gets the sum over ranks of the gradient that reached it (reduce-scatter SUM), the
same as Lightning's all_gather(sync_grads=True) and open_clip's gather_with_grad=True.
"""


def all_gather_with_grad(x, group=None):
    """torch.cat of every rank's x along dim 0, differentiable; x itself when no process group is up."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return x
    group = group if group is not None else dist.group.WORLD
    try:
        from torch.distributed import _functional_collectives as fc
    except ImportError:
        fc = None
    fn = getattr(fc, "all_gather_single_autograd", None) if fc is not None else None
    if fn is not None:
        out = fn(x.contiguous(), 0, group)
        return out.wait() if hasattr(out, "wait") and not isinstance(out, torch.Tensor) else out
    import torch.distributed.nn.functional as dnn

    return torch.cat(dnn.all_gather(x, group=group))
