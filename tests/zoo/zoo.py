"""The zoo's models, batches and training steps: real models built from configs (nothing downloaded).

Every function here is top-level so that check_lightning's Trainer subprocesses (and spawned ranks)
can import it. run_pattern() is the zoo's own rank runner for training patterns check_ddp does not
express (no_sync accumulation, FSDP, bf16 parameters, torch.compile): forked gloo ranks, each dumps its
gradients with gradcheck_dist.dump_grads, then the one-process reference, then `gradcheck-dist check`.
"""
import math
import os
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
from gradcheck_dist.dump import LocalGradCapture, dump_grads  # noqa: E402
from gradcheck_dist.harness import run_check  # noqa: E402

WORLD = 4


def preload(*modules):
    """Imports the libraries a model needs in this process before the ranks are forked: each forked rank
    importing open_clip (torch._dynamo, sympy) or transformers on its own takes minutes on a loaded machine."""
    import importlib

    for m in modules:
        importlib.import_module(m)


def rank_world():
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def gen(seed=1):
    return torch.Generator().manual_seed(seed)


# run_pattern's second reference (issue 32): the same world-1 step with every batch's rows in the
# harness's fixed permuted order, dumped beside the first (ref-permuted.safetensors)
_PERMUTED = False


def rows(batch):
    """The batch as the reference of run_pattern sees it: in order, or permuted for the second reference."""
    if not _PERMUTED:
        return batch
    from gradcheck_dist.harness import _permute, permutation

    return _permute(batch, permutation(batch[0].shape[0]))


# ---- Hugging Face transformers: BERT and GPT-2, 2 layers, hidden 32, dropout 0


def bert_config(**kw):
    from transformers import BertConfig

    return BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                      max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **kw)


def make_bert_cls():
    from transformers import BertForSequenceClassification

    return BertForSequenceClassification(bert_config(num_labels=3))


def make_bert_mlm():
    from transformers import BertForMaskedLM

    return BertForMaskedLM(bert_config())


def bert_batch(n=16, seq=8):
    g = gen()
    return rows((torch.randint(0, 64, (n, seq), generator=g), torch.randint(0, 3, (n,), generator=g)))


def step_bert_cls(model, batch, rank, world):
    ids, labels = batch
    return model(input_ids=ids, labels=labels).loss


def step_bert_mlm(model, batch, rank, world):  # every token labelled: the same token count on every rank
    ids, _ = batch
    return model(input_ids=ids, labels=ids).loss


class BertAux(torch.nn.Module):
    """BERT classifier plus an auxiliary head on the (detached) pooled output: the head's gradient is
    ~1e-3 of the model's; aux="sum" sums its loss over the shard (x0.25 under 4 ranks), aux="even" uses
    it on even ranks only (None on ranks 1 and 3)."""

    def __init__(self):
        super().__init__()
        from transformers import BertForSequenceClassification

        self.bert = BertForSequenceClassification(bert_config(num_labels=3))
        self.aux = torch.nn.Linear(32, 2)

    def forward(self, ids, labels, aux, rank, world):
        out = self.bert(input_ids=ids, labels=labels, output_hidden_states=True)
        pooled = out.hidden_states[-1][:, 0]
        if aux == "sum":
            return out.loss + 1e-3 * self.aux(pooled.detach()).pow(2).sum()
        if aux == "even":
            if rank % 2 == 0:
                return out.loss + self.aux(pooled).pow(2).mean()
            return out.loss
        raise ValueError(aux)


def make_bert_aux():
    return BertAux()


def step_bert_aux_sum(model, batch, rank, world):
    return model(*batch, "sum", rank, world)


def step_bert_aux_even(model, batch, rank, world):
    return model(*batch, "even", rank, world)


class BertIgnoredHead(torch.nn.Module):
    """A head computed in forward whose output the loss ignores (no gradient anywhere, reference too)."""

    def __init__(self):
        super().__init__()
        from transformers import BertForSequenceClassification

        self.bert = BertForSequenceClassification(bert_config(num_labels=3))
        self.ignored = torch.nn.Linear(3, 2)

    def forward(self, ids, labels):
        out = self.bert(input_ids=ids, labels=labels)
        return out.loss, self.ignored(out.logits)


def make_bert_ignored():
    return BertIgnoredHead()


def step_bert_ignored(model, batch, rank, world):
    loss, _ = model(*batch)
    return loss


def make_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def step_gpt2(model, batch, rank, world):
    ids, _ = batch
    return model(input_ids=ids, labels=ids).loss


# ---- timm: a tiny ViT


def make_vit():
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)


def image_batch(n=16):
    g = gen()
    return rows((torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 5, (n,), generator=g)))


def step_vit(model, batch, rank, world):
    x, y = batch
    return F.cross_entropy(model(x), y)


# ---- open_clip: a tiny CLIP and every ClipLoss variant


def make_clip(bias=False):
    import open_clip
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg

    return open_clip.CLIP(embed_dim=16, vision_cfg=CLIPVisionCfg(layers=1, width=32, head_width=16, patch_size=8, image_size=32),
                          text_cfg=CLIPTextCfg(context_length=8, vocab_size=64, width=32, heads=2, layers=1),
                          init_logit_bias=-10.0 if bias else None)


def make_siglip():
    return make_clip(bias=True)


def clip_batch(n=16):
    g = gen()
    return rows((torch.randn(n, 3, 32, 32, generator=g), torch.randint(1, 64, (n, 8), generator=g)))


def _clip_step(model, batch, loss):
    image, text = batch
    out = model(image, text)
    return loss(*out)


def _clip_loss(local_loss, gather_with_grad):
    from open_clip.loss import ClipLoss

    rank, world = rank_world()
    return ClipLoss(local_loss=local_loss, gather_with_grad=gather_with_grad, rank=rank, world_size=world)


def step_clip_default(model, batch, rank, world):      # open_clip's default: x0.25 on the towers
    return _clip_step(model, batch, _clip_loss(False, False))


def step_clip_grad(model, batch, rank, world):         # gather_with_grad=True: the one-process gradient
    return _clip_step(model, batch, _clip_loss(False, True))


def step_clip_local_grad(model, batch, rank, world):   # local_loss + gather_with_grad: the one-process gradient
    return _clip_step(model, batch, _clip_loss(True, True))


def step_clip_local_nograd(model, batch, rank, world):  # local_loss without a gradient-carrying gather: mismatch
    return _clip_step(model, batch, _clip_loss(True, False))


def _siglip(model, batch, impl):
    from open_clip.loss import SigLipLoss

    rank, world = rank_world()
    return _clip_step(model, batch, SigLipLoss(rank=rank, world_size=world, dist_impl=impl))


def step_siglip_bidir(model, batch, rank, world):
    return _siglip(model, batch, "bidir")


def step_siglip_shift(model, batch, rank, world):
    return _siglip(model, batch, "shift")


def step_siglip_reduce(model, batch, rank, world):
    return _siglip(model, batch, "reduce")


def step_siglip_gather(model, batch, rank, world):
    return _siglip(model, batch, "gather")


# ---- a plain MLP (harness hangs) and the bf16 autocast cases


def make_mlp():
    return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 4))


def mlp_batch(n=256):
    g = gen()
    return rows((torch.randn(n, 32, generator=g), torch.randn(n, 4, generator=g)))


def step_mlp(model, batch, rank, world):
    x, y = batch
    return F.mse_loss(model(x), y)


def step_mlp_sum(model, batch, rank, world):  # summed over the shard: x0.25 under 4 ranks
    x, y = batch
    return F.mse_loss(model(x), y, reduction="sum")


def step_vit_bf16(model, batch, rank, world):
    x, y = batch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.cross_entropy(model(x), y)


def step_vit_bf16_sum(model, batch, rank, world):
    x, y = batch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.cross_entropy(model(x), y, reduction="sum")


def step_bert_bf16(model, batch, rank, world):
    ids, labels = batch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(input_ids=ids, labels=labels).loss


# ---- Lightning: self.all_gather with sync_grads False / True


def _lightning():
    import pytorch_lightning as pl

    return pl


class _LitClipBase:
    def __init__(self, sync_grads, aux_even=False):
        super().__init__()
        self.img, self.txt = torch.nn.Linear(6, 4), torch.nn.Linear(5, 4)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.sync_grads = sync_grads
        if aux_even:   # a head whose loss term only even ranks add (rank 0 alone: the reference adds it)
            self.aux = torch.nn.Linear(4, 1)

    def gathered(self, x):
        y = self.all_gather(x, sync_grads=self.sync_grads)
        return y.flatten(0, 1) if y.dim() == x.dim() + 1 else y

    def training_step(self, batch, batch_idx):
        x_img, x_txt = batch
        I, T = F.normalize(self.img(x_img), dim=-1), F.normalize(self.txt(x_txt), dim=-1)
        Ia, Ta = self.gathered(I), self.gathered(T)
        logits, labels = self.logit_scale.exp() * Ia @ Ta.T, torch.arange(Ia.shape[0])
        loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
        if hasattr(self, "aux") and self.global_rank % 2 == 0:
            loss = loss + self.aux(I).pow(2).mean()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _lit_class():
    pl = _lightning()
    return type("LitClip", (_LitClipBase, pl.LightningModule), {})


def make_lit_nosync():
    return _lit_class()(False)


def make_lit_sync():
    return _lit_class()(True)


def make_lit_aux_even():
    return _lit_class()(True, aux_even=True)


def make_lit_batch():
    g = gen()
    return torch.randn(8, 6, generator=g), torch.randn(8, 5, generator=g)


# ---- the zoo's own runner: forked gloo ranks running a whole training pattern


def _worker(rank, world, pattern, outdir, initfile):
    try:
        torch.set_num_threads(1)   # as check_ddp's children: a fork after the parent used its OpenMP pool hangs otherwise
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method="file://" + initfile, rank=rank, world_size=world)
        try:
            pattern(rank, world, outdir)
        finally:
            dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(outdir, f"error-rank{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        sys.exit(1)


def run_pattern(pattern, world=WORLD, timeout=240, ignore=()):
    """pattern(rank, world, outdir) runs one training step and writes outdir/reduced/rank{r}.safetensors
    (world 1, no process group: outdir/ref.safetensors). Returns (exit code, report, text) of the check.
    Raises RuntimeError naming the rank when a rank fails or runs past `timeout`."""
    import multiprocessing as mp

    outdir = tempfile.mkdtemp(prefix="gcd-zoo-")
    initfile = os.path.join(outdir, f"pg-init-{time.monotonic_ns()}")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(r, world, pattern, outdir, initfile)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join(10)
    errors = [open(os.path.join(outdir, f)).read() for f in sorted(os.listdir(outdir)) if f.startswith("error-rank")]
    if hung or any(p.exitcode for p in procs):
        raise RuntimeError(f"ranks hung {hung}, exit codes {[p.exitcode for p in procs]}:\n" + "\n".join(errors))
    global _PERMUTED
    pattern(0, 1, outdir)
    _PERMUTED = True   # the second reference: the same step, the batch's rows permuted
    try:
        pattern(0, 1, outdir)
    finally:
        _PERMUTED = False
    refs = [os.path.join(outdir, "ref.safetensors"), os.path.join(outdir, "ref-permuted.safetensors")]
    return run_check(os.path.join(outdir, "reduced"), ref=refs, ignore=ignore)


def dump_path(outdir, rank, world):
    if world == 1:
        return os.path.join(outdir, "ref-permuted.safetensors" if _PERMUTED else "ref.safetensors")
    return os.path.join(outdir, "reduced", f"rank{rank}.safetensors")


def _shard(t, rank, world):
    return t.chunk(world)[rank]


# no_sync accumulation: 2 micro-batches per rank; the first under ddp.no_sync(); each loss / 2 (or not)


def _accumulate(rank, world, outdir, divide):
    torch.manual_seed(0)
    model = make_vit()
    x, y = image_batch()
    if world == 1:  # the reference: the whole batch at once
        step_vit(model, (x, y), 0, 1).backward()
        dump_grads(model, dump_path(outdir, 0, 1))
        return
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    xs, ys = _shard(x, rank, world).chunk(2), _shard(y, rank, world).chunk(2)
    with ddp.no_sync():
        loss = step_vit(ddp, (xs[0], ys[0]), rank, world)
        (loss / 2 if divide else loss).backward()
    loss = step_vit(ddp, (xs[1], ys[1]), rank, world)
    (loss / 2 if divide else loss).backward()
    dump_grads(ddp, dump_path(outdir, rank, world))


def pattern_nosync_divided(rank, world, outdir):
    _accumulate(rank, world, outdir, True)


def pattern_nosync_undivided(rank, world, outdir):  # x2
    _accumulate(rank, world, outdir, False)


# bf16 parameters: the whole model in bfloat16 (BF16 dumps)


def pattern_bf16_params(rank, world, outdir):
    torch.manual_seed(0)
    model = make_vit().to(torch.bfloat16)
    x, y = image_batch()
    x = x.to(torch.bfloat16)
    if world == 1:
        step_vit(model, (x, y), 0, 1).backward()
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        step_vit(ddp, (_shard(x, rank, world), _shard(y, rank, world)), rank, world).backward()
    dump_grads(model, dump_path(outdir, rank, world))


# FSDP1 (use_orig_params False / True) and FSDP2 (fully_shard) on gloo CPU ranks


def _mlp_pattern(rank, world, outdir, wrap, loss_sum=False):
    """The MLP on the rank's shard, wrapped by wrap(model) (the reference: the plain model, the whole batch)."""
    torch.manual_seed(0)
    model = make_mlp()
    x, y = mlp_batch(64)
    step = step_mlp_sum if loss_sum else step_mlp
    if world == 1:
        step(model, (x, y), 0, 1).backward()
        dump_grads(model, dump_path(outdir, 0, 1))
        return
    model = wrap(model)
    step(model, (_shard(x, rank, world), _shard(y, rank, world)), rank, world).backward()
    dump_grads(model, dump_path(outdir, rank, world))


def _fsdp1(orig):
    def wrap(model):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP(model, device_id=torch.device("cpu"), use_orig_params=orig)
    return wrap


def _fsdp2(model):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def pattern_fsdp1(rank, world, outdir):
    _mlp_pattern(rank, world, outdir, _fsdp1(False))


def pattern_fsdp1_orig(rank, world, outdir):
    _mlp_pattern(rank, world, outdir, _fsdp1(True))


def pattern_fsdp2(rank, world, outdir):
    _mlp_pattern(rank, world, outdir, _fsdp2)


def pattern_fsdp2_sum(rank, world, outdir):  # x0.25
    _mlp_pattern(rank, world, outdir, _fsdp2, loss_sum=True)


# torch.compile: the ranks run DDP(torch.compile(model)); the reference is the plain model


def pattern_compile(rank, world, outdir):
    _mlp_pattern(rank, world, outdir, lambda m: torch.nn.parallel.DistributedDataParallel(torch.compile(m, backend="aot_eager")))


# DDP that leaves a parameter out of its all-reduce (_set_params_and_buffers_to_ignore_for_model): disagree


def _ddp_ignoring_4(model):
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["4.weight", "4.bias"])
    return torch.nn.parallel.DistributedDataParallel(model)


def pattern_ddp_ignored_param(rank, world, outdir):
    _mlp_pattern(rank, world, outdir, _ddp_ignoring_4)
