#include "run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "ddp.h"
#include "ops.h"
#include "verdict.h"

static double *copy(const double *src, size_t n) {
    double *p = gcd_malloc(n * sizeof(double));
    return memcpy(p, src, n * sizeof(double));
}

// ----------------------------------------------------------------------------
// the single-process reference: every rank's features, concatenated in place of the collective;
// the objective is the mean over ranks of each rank's loss (what DDP's gradient mean optimises)

static void reference(const gcd_run_opts *o, int world, gcd_params *P, gcd_run_result *res) {
    const gcd_probe *pr = o->probe;
    gcd_arena arena = { 0 };
    gcd_ctx c = gcd_ctx_make(&arena);
    gcd_tensor **in = gcd_arena_alloc(&arena, (size_t)world * GCD_MAX_INPUTS * sizeof *in);
    gcd_tensor **feat = gcd_arena_alloc(&arena, (size_t)world * GCD_MAX_FEATS * sizeof *feat);
    gcd_tensor **losses = gcd_arena_alloc(&arena, (size_t)world * sizeof *losses);
    gcd_tensor *all[GCD_MAX_FEATS], **col = gcd_arena_alloc(&arena, (size_t)world * sizeof *col);
    for (int i = 0; i < P->n; i++) P->t[i]->grad = NULL;
    for (int k = 0; k < world; k++) {
        pr->inputs(&c, &o->cfg, k, in + k * GCD_MAX_INPUTS);
        pr->encode(&c, P, in + k * GCD_MAX_INPUTS, feat + k * GCD_MAX_FEATS);
        for (int j = 0; j < pr->ninput; j++) {   // the report's replay setup: rank k's inputs
            size_t n = res->input_n[j];
            memcpy(res->inputs[j] + (size_t)k * n, in[k * GCD_MAX_INPUTS + j]->data, n * sizeof(double));
        }
    }
    for (int f = 0; f < pr->nfeat; f++) {
        for (int k = 0; k < world; k++) col[k] = feat[k * GCD_MAX_FEATS + f];
        all[f] = gcd_concat(&c, world, col);
    }
    int n = pr->loss_per_rank && pr->loss_per_rank(&o->cfg) ? world : 1;   // identical losses: their mean is one of them
    for (int k = 0; k < n; k++) losses[k] = pr->loss(&c, P, &o->cfg, k, world, all, feat + k * GCD_MAX_FEATS);
    gcd_tensor *obj = gcd_mean(&c, gcd_concat(&c, n, losses));
    gcd_backward(&c, obj);
    res->ref_loss = obj->data[0];
    for (int i = 0; i < P->n; i++) {
        gcd_param_result *p = &res->param[i];
        p->reference = P->t[i]->grad ? copy(P->t[i]->grad, p->n) : gcd_malloc(p->n * sizeof(double));
        P->t[i]->grad = NULL;
    }
    gcd_arena_free(&arena);
}

// ----------------------------------------------------------------------------
// one forward/backward on this rank with the real collectives; returns the loss

static double step(gcd_comm *comm, const gcd_run_opts *o, gcd_params *P, gcd_arena *arena) {
    const gcd_probe *pr = o->probe;
    gcd_ctx c = gcd_ctx_make(arena);
    gcd_tensor *in[GCD_MAX_INPUTS], *feat[GCD_MAX_FEATS], *gathered[GCD_MAX_FEATS];
    for (int i = 0; i < P->n; i++) P->t[i]->grad = NULL;   // zero_grad(set_to_none=True)
    pr->inputs(&c, &o->cfg, comm->rank, in);
    pr->encode(&c, P, in, feat);
    for (int f = 0; f < pr->nfeat; f++)
        gathered[f] = gcd_all_gather(&c, comm, feat[f], pr->feat_follows_mode[f] ? o->mode : GCD_GATHER_ON);
    gcd_tensor *loss = pr->loss(&c, P, &o->cfg, comm->rank, comm->world, gathered, feat);
    gcd_backward(&c, loss);
    return loss->data[0];
}

void gcd_run(gcd_comm *comm, const gcd_run_opts *o, gcd_run_result *res) {
    const gcd_probe *pr = o->probe;
    int W = comm->world, root = comm->rank == 0;
    memset(res, 0, sizeof *res);
    res->probe = pr->name;
    res->mode = o->mode;
    res->world = W;
    res->steps = o->steps;
    res->lr = o->lr;
    res->cfg = o->cfg;
    res->nloss = o->steps > 0 ? o->steps : 1;
    res->loss = gcd_malloc((size_t)(root ? res->nloss : 1) * W * sizeof(double));   // the history lives on rank 0 only

    gcd_arena params_arena = { 0 }, pass = { 0 };
    gcd_ctx pc = gcd_ctx_make(&params_arena);
    gcd_params P = { 0 };
    pr->init(&pc, &o->cfg, &P);
    res->nparam = P.n;
    res->param = gcd_malloc((size_t)P.n * sizeof *res->param);
    for (int i = 0; i < P.n; i++) {
        gcd_param_result *p = &res->param[i];
        p->name = P.name[i];
        p->ndim = P.t[i]->ndim;
        memcpy(p->shape, P.t[i]->shape, sizeof P.t[i]->shape);
        p->n = P.t[i]->n;
        p->init = copy(P.t[i]->data, p->n);
        if (root) {
            p->local = gcd_malloc((size_t)W * p->n * sizeof(double));
            p->has = gcd_malloc((size_t)W);
        }
    }
    // the inputs' shapes, from rank 0's own (every rank's are alike)
    res->ninput = pr->ninput;
    {
        gcd_ctx c = gcd_ctx_make(&pass);
        gcd_tensor *in[GCD_MAX_INPUTS];
        pr->inputs(&c, &o->cfg, 0, in);
        for (int j = 0; j < pr->ninput; j++) {
            res->input_name[j] = pr->input_name[j];
            res->input_ndim[j] = in[j]->ndim;
            memcpy(res->input_shape[j], in[j]->shape, sizeof res->input_shape[j]);
            res->input_n[j] = in[j]->n;
            if (root) res->inputs[j] = gcd_malloc((size_t)W * in[j]->n * sizeof(double));
        }
        gcd_arena_reset(&pass);
    }

    double *mean[GCD_MAX_PARAMS];
    int got[GCD_MAX_PARAMS];   // ranks with a gradient, this step
    for (int i = 0; i < P.n; i++) mean[i] = gcd_malloc(P.t[i]->n * sizeof(double));
    for (int s = 0; s < res->nloss; s++) {
        double loss = step(comm, o, &P, &pass);
        comm->all_gather(comm, &loss, res->loss + (root ? (size_t)s * W : 0), 1);
        for (int i = 0; i < P.n; i++) {
            gcd_param_result *p = &res->param[i];
            int first = s == 0;
            got[i] = gcd_ddp_mean(comm, P.t[i]->grad, p->n, mean[i], first ? p->local : NULL, first ? p->has : NULL);
            if (first) {
                p->nhave = got[i];
                p->reduced = got[i] ? copy(mean[i], p->n) : NULL;
            }
        }
        gcd_arena_reset(&pass);
        if (s == 0 && root) reference(o, W, &P, res);   // at the starting values, before any update
        for (int i = 0; i < P.n && o->steps > 0; i++)    // plain SGD on the reduced gradient; None: no update
            for (size_t k = 0; got[i] && k < P.t[i]->n; k++) P.t[i]->data[k] -= o->lr * mean[i][k];
    }
    for (int i = 0; i < P.n; i++) free(mean[i]);
    for (int i = 0; i < P.n; i++) {
        gcd_param_result *p = &res->param[i];
        double d2 = 0;
        for (size_t k = 0; k < p->n; k++) d2 += (P.t[i]->data[k] - p->init[k]) * (P.t[i]->data[k] - p->init[k]);
        p->moved = sqrt(d2);
        p->moved_any = memcmp(P.t[i]->data, p->init, p->n * sizeof(double)) != 0;
    }
    gcd_arena_free(&pass);
    gcd_arena_free(&params_arena);
    res->tol = GCD_TOL;
    if (root) gcd_verdict(res);
}

void gcd_run_result_free(gcd_run_result *res) {
    for (int i = 0; i < res->nparam; i++) {
        gcd_param_result *p = &res->param[i];
        free(p->init), free(p->local), free(p->has), free(p->reduced), free(p->reference);
        free(p->rank_norm), free(p->rank_nonfinite), free(p->rank_first_nonfinite), free(p->differs);
    }
    for (int i = 0; i < res->nfinding; i++) free(res->finding[i].params), free(res->finding[i].message);
    free(res->finding);
    free(res->param);
    for (int j = 0; j < res->ninput; j++) free(res->inputs[j]);
    free(res->loss);
    memset(res, 0, sizeof *res);
}
