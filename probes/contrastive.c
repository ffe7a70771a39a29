/*
 * contrastive: a CLIP-like toy. I_r = normalize(img(x_img_r)), T_r = normalize(txt(x_txt_r)) are
 * gathered with the run's mode; logits = exp(logit_scale) * I T^T; the loss is the mean of the image
 * and text cross-entropies. With --local-loss (open_clip local_loss=True) each rank scores only its own
 * rows against everyone's: I_r T^T and T_r I^T, labels r*B + 0..B-1.
 */
#include <math.h>

#include "engine/ops.h"
#include "probes/probe.h"

static void init(gcd_ctx *c, const gcd_probe_cfg *cfg, gcd_params *p) {
    int E = cfg->dim_emb, D[2] = { cfg->dim_img, cfg->dim_txt };
    static const char *names[2][2] = { { "img.weight", "img.bias" }, { "txt.weight", "txt.bias" } };
    gcd_rng r = gcd_rng_make(cfg->seed, 0);
    for (int e = 0; e < 2; e++) {   // nn.Linear's default: U(-1/sqrt(in), 1/sqrt(in))
        double bound = 1.0 / sqrt(D[e]);
        gcd_tensor *w = gcd_param_add(c, p, names[e][0], 2, (int[]){ E, D[e] }, NULL);
        gcd_tensor *b = gcd_param_add(c, p, names[e][1], 1, (int[]){ E }, NULL);
        for (size_t i = 0; i < w->n; i++) w->data[i] = bound * (2 * gcd_rng_uniform(&r) - 1);
        for (size_t i = 0; i < b->n; i++) b->data[i] = bound * (2 * gcd_rng_uniform(&r) - 1);
    }
    gcd_param_add(c, p, "logit_scale", 0, NULL, (double[]){ log(1 / 0.07) });
}

static void inputs(gcd_ctx *c, const gcd_probe_cfg *cfg, int rank, gcd_tensor **in) {
    gcd_rng r = gcd_rng_make(cfg->seed, 1 + (uint64_t)rank);
    in[0] = gcd_tensor_empty(c, 2, (int[]){ cfg->batch, cfg->dim_img });
    in[1] = gcd_tensor_empty(c, 2, (int[]){ cfg->batch, cfg->dim_txt });
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < in[k]->n; i++) in[k]->data[i] = gcd_rng_normal(&r);
}

static void encode(gcd_ctx *c, const gcd_params *p, gcd_tensor **in, gcd_tensor **feat) {
    feat[0] = gcd_normalize(c, gcd_linear(c, in[0], p->t[0], p->t[1]));   // I_r (B,E)
    feat[1] = gcd_normalize(c, gcd_linear(c, in[1], p->t[2], p->t[3]));   // T_r (B,E)
}

// mean of the cross-entropies of (a b^T) * scale and its text-side counterpart, labels first + 0..
static gcd_tensor *clip_loss(gcd_ctx *c, gcd_tensor *scale, gcd_tensor *img_rows, gcd_tensor *txt_all,
                             gcd_tensor *txt_rows, gcd_tensor *img_all, int first) {
    int N = img_rows->shape[0];
    int *label = gcd_arena_alloc(c->arena, (size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) label[i] = first + i;
    gcd_tensor *li = gcd_matmul_nt(c, img_rows, txt_all, scale);
    gcd_tensor *lt = txt_rows ? gcd_matmul_nt(c, txt_rows, img_all, scale) : NULL, *both[2];
    both[0] = gcd_cross_entropy(c, li, label);
    both[1] = lt ? gcd_cross_entropy(c, lt, label) : gcd_cross_entropy_cols(c, li, label);   // li^T's rows: li's columns
    return gcd_mean(c, gcd_concat(c, 2, both));
}

static gcd_tensor *loss(gcd_ctx *c, const gcd_params *p, const gcd_probe_cfg *cfg, int rank, int world,
                        gcd_tensor **gathered, gcd_tensor **own) {
    (void)world;
    gcd_tensor *scale = gcd_exp(c, p->t[4]);
    if (cfg->local_loss) return clip_loss(c, scale, own[0], gathered[1], own[1], gathered[0], rank * cfg->batch);
    return clip_loss(c, scale, gathered[0], gathered[1], NULL, NULL, 0);
}

static int loss_per_rank(const gcd_probe_cfg *cfg) { return cfg->local_loss; }

const gcd_probe gcd_probe_contrastive = {
    .name = "contrastive",
    .nfeat = 2,
    .feat_follows_mode = { 1, 1 },
    .before_gather = 0xf,   // img.*, txt.*; logit_scale comes after
    .ninput = 2,
    .input_name = { "x_img", "x_txt" },
    .init = init,
    .inputs = inputs,
    .encode = encode,
    .loss = loss,
    .loss_per_rank = loss_per_rank,
};
