/*
 * tp: a sequence-parallel block split across the ranks as Megatron-LM splits it (one tensor-parallel
 * group, sequence_parallel=True). Rank k holds rows k of the sequence x (S/W, H):
 *   h_k = LayerNorm(x_k)                       norm.weight, norm.bias replicated (sequence-parallel)
 *   h   = all_gather(h_k)                      backward: reduce_scatter (SUM)
 *   y   = relu(h fc1.weight_k^T + fc1.bias_k)  column-parallel: rows k of fc1 (Shard(0))
 *   z_k = reduce_scatter(y fc2.weight_k^T)     row-parallel: columns k of fc2 (Shard(1))
 *   loss = mean(all_gather(z)^2)               the same on every rank; backward: each rank's own rows
 * Pieces are torch.chunk's (the last may be smaller). Each rank's norm gradient comes from its own rows
 * of the sequence only: the group must sum it (Megatron's finalize_model_grads), the run's mode does or
 * does not. The reference is the same block unsplit, on the whole sequence.
 */
#include <math.h>

#include "comm/comm.h"
#include "engine/gather.h"
#include "engine/ops.h"
#include "probes/probe.h"

// the ffn width, split over the ranks
static int ffn(const gcd_probe_cfg *cfg) { return 4 * cfg->dim_img; }

static void init(gcd_ctx *c, const gcd_probe_cfg *cfg, gcd_params *p) {
    int H = cfg->dim_img, F = ffn(cfg);
    gcd_rng r = gcd_rng_make(cfg->seed, 0);
    gcd_tensor *w = gcd_param_add(c, p, "norm.weight", 1, (int[]){ H }, NULL);
    gcd_tensor *b = gcd_param_add(c, p, "norm.bias", 1, (int[]){ H }, NULL);
    for (int i = 0; i < H; i++) w->data[i] = 1 + 0.1 * gcd_rng_normal(&r), b->data[i] = 0.1 * gcd_rng_normal(&r);   // not 1 and 0: every term shows
    gcd_tensor *t[3] = { gcd_param_add(c, p, "fc1.weight", 2, (int[]){ F, H }, NULL), gcd_param_add(c, p, "fc1.bias", 1, (int[]){ F }, NULL),
                         gcd_param_add(c, p, "fc2.weight", 2, (int[]){ H, F }, NULL) };
    double bound[3] = { 1 / sqrt(H), 1 / sqrt(H), 1 / sqrt(F) };   // nn.Linear's U(-1/sqrt(in), 1/sqrt(in))
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < t[k]->n; i++) t[k]->data[i] = bound[k] * (2 * gcd_rng_uniform(&r) - 1);
}

static void inputs(gcd_ctx *c, const gcd_probe_cfg *cfg, int rank, gcd_tensor **in) {
    gcd_rng r = gcd_rng_make(cfg->seed, 1 + (uint64_t)rank);
    in[0] = gcd_tensor_empty(c, 2, (int[]){ cfg->batch, cfg->dim_img });
    for (size_t i = 0; i < in[0]->n; i++) in[0]->data[i] = gcd_rng_normal(&r);
}

static gcd_tensor *mlp(gcd_ctx *c, gcd_tensor *h, gcd_tensor *w1, gcd_tensor *b1, gcd_tensor *w2) {
    return gcd_linear(c, gcd_relu(c, gcd_linear(c, h, w1, b1)), w2, NULL);
}

static gcd_tensor *split(gcd_ctx *c, gcd_comm *comm, const gcd_params *p, const gcd_probe_cfg *cfg, gcd_tensor **in) {
    int F = ffn(cfg), W = comm->world, per = (F + W - 1) / W, start = comm->rank * per;   // torch.chunk
    int len = start < F ? (F - start < per ? F - start : per) : 0;
    if ((W - 1) * per >= F)
        GCD_FATAL("probe tp: torch.chunk leaves a rank without a piece of the ffn width %d at world %d (--dim-img sets it: 4 x D)", F, W);
    gcd_tensor *h = gcd_all_gather(c, comm, gcd_layernorm(c, in[0], p->t[0], p->t[1]), GCD_GATHER_ON);
    gcd_tensor *partial = mlp(c, h, gcd_narrow(c, p->t[2], 0, start, len), gcd_narrow(c, p->t[3], 0, start, len),
                              gcd_narrow(c, p->t[4], 1, start, len));
    gcd_tensor *z = gcd_all_gather(c, comm, gcd_reduce_scatter(c, comm, partial), GCD_GATHER_LOCAL);
    return gcd_mse(c, z, NULL);
}

static gcd_tensor *whole(gcd_ctx *c, const gcd_params *p, const gcd_probe_cfg *cfg, int world, gcd_tensor **in) {
    (void)cfg;
    gcd_tensor **x = gcd_arena_alloc(c->arena, (size_t)world * sizeof *x);
    for (int k = 0; k < world; k++) x[k] = in[k * GCD_MAX_INPUTS];
    gcd_tensor *h = gcd_layernorm(c, gcd_concat(c, world, x), p->t[0], p->t[1]);
    return gcd_mse(c, mlp(c, h, p->t[2], p->t[3], p->t[4]), NULL);
}

const gcd_probe gcd_probe_tp = {
    .name = "tp",
    .before_gather = 0x3,   // the norm: what the run's mode reduces
    .ninput = 1,
    .input_name = { "x" },
    .init = init,
    .inputs = inputs,
    .sharded = 0x1c,        // fc1.weight, fc1.bias (dim 0), fc2.weight (dim 1)
    .replicated = 0x3,      // norm.weight, norm.bias
    .split = split,
    .whole = whole,
};
