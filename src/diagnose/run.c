#include "diagnose/run.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/autograd.h"
#include "diagnose/blame.h"
#include "comm/ddp.h"
#include "engine/ops.h"
#include "diagnose/verdict.h"

static double *copy(const double *src, size_t n) {
    double *p = gcd_malloc(n * sizeof(double));
    return memcpy(p, src, n * sizeof(double));
}

// ----------------------------------------------------------------------------
// the single-process reference: every rank's features, concatenated in place of the collective;
// the objective is the mean over ranks of each rank's loss (what DDP's gradient mean optimises).
// It builds its own parameters at their starting values, so rank 0 runs it on a thread of its own
// while it takes its part in the first step (no MPI call, no shared tensor; it writes only res's
// reference fields and inputs).

static void reference(const gcd_run_opts *o, int world, gcd_run_result *res) {
    const gcd_probe *pr = o->probe;
    gcd_arena arena = { 0 };
    gcd_ctx c = gcd_ctx_make(&arena);
    gcd_params params = { 0 }, *P = &params;
    pr->init(&c, &o->cfg, P);
    gcd_tensor **in = gcd_arena_alloc(&arena, (size_t)world * GCD_MAX_INPUTS * sizeof *in);
    gcd_tensor **feat = gcd_arena_alloc(&arena, (size_t)world * GCD_MAX_FEATS * sizeof *feat);
    gcd_tensor **losses = gcd_arena_alloc(&arena, (size_t)world * sizeof *losses);
    gcd_tensor *all[GCD_MAX_FEATS], **col = gcd_arena_alloc(&arena, (size_t)world * sizeof *col);
    for (int k = 0; k < world; k++) {
        pr->inputs(&c, &o->cfg, k, in + k * GCD_MAX_INPUTS);
        if (!pr->whole) pr->encode(&c, P, in + k * GCD_MAX_INPUTS, feat + k * GCD_MAX_FEATS);
        for (int j = 0; j < pr->ninput; j++) {   // the report's replay setup: rank k's inputs
            size_t n = res->input_n[j];
            memcpy(res->inputs[j] + (size_t)k * n, in[k * GCD_MAX_INPUTS + j]->data, n * sizeof(double));
        }
    }
    for (int f = 0; f < pr->nfeat; f++) {
        for (int k = 0; k < world; k++) col[k] = feat[k * GCD_MAX_FEATS + f];
        all[f] = gcd_concat(&c, world, col);
    }
    gcd_tensor *obj;
    if (pr->whole) obj = pr->whole(&c, P, &o->cfg, world, in);   // tensor parallel: the block unsplit
    else {
        int n = pr->loss_per_rank && pr->loss_per_rank(&o->cfg) ? world : 1;   // identical losses: their mean is one of them
        for (int k = 0; k < n; k++) losses[k] = pr->loss(&c, P, &o->cfg, k, world, all, feat + k * GCD_MAX_FEATS);
        obj = gcd_mean(&c, gcd_concat(&c, n, losses));
    }
    gcd_backward(&c, obj);
    res->ref_loss = obj->data[0];
    for (int f = 0; f < pr->nfeat; f++)   // the gradient at the concatenation: the gather's counterpart
        res->feat[f].ref = all[f]->grad ? copy(all[f]->grad, all[f]->n) : gcd_malloc(all[f]->n * sizeof(double));
    for (int i = 0; i < P->n; i++) {
        gcd_param_result *p = &res->param[i];
        p->reference = P->t[i]->grad ? copy(P->t[i]->grad, p->n) : gcd_malloc(p->n * sizeof(double));
    }
    gcd_arena_free(&arena);
}

typedef struct {
    const gcd_run_opts *o;
    int world;
    gcd_run_result *res;
} reference_job;

static void *reference_thread(void *arg) {
    reference_job *j = arg;
    reference(j->o, j->world, j->res);
    return NULL;
}

// the same reference for another mode: copied out of (keep 0) or into (keep 1) the holder

static void reference_copy(gcd_reference *r, gcd_run_result *res, int keep) {
    for (int f = 0; f < res->nfeat; f++) {
        size_t n = (size_t)res->world * res->feat[f].n;
        if (keep) r->feat[f] = copy(res->feat[f].ref, n);
        else res->feat[f].ref = copy(r->feat[f], n);
    }
    for (int i = 0; i < res->nparam; i++) {
        gcd_param_result *p = &res->param[i];
        if (keep) r->param[i] = copy(p->reference, p->n);
        else p->reference = copy(r->param[i], p->n);
    }
    for (int j = 0; j < res->ninput; j++) {   // allocated by gcd_run, filled by reference()
        size_t n = (size_t)res->world * res->input_n[j];
        if (keep) r->inputs[j] = copy(res->inputs[j], n);
        else memcpy(res->inputs[j], r->inputs[j], n * sizeof(double));
    }
    if (keep) r->loss = res->ref_loss, r->done = 1;
    else res->ref_loss = r->loss;
}

void gcd_reference_free(gcd_reference *r) {
    for (int f = 0; f < GCD_MAX_FEATS; f++) free(r->feat[f]);
    for (int i = 0; i < GCD_MAX_PARAMS; i++) free(r->param[i]);
    for (int j = 0; j < GCD_MAX_INPUTS; j++) free(r->inputs[j]);
    memset(r, 0, sizeof *r);
}

// ----------------------------------------------------------------------------
// one forward/backward on this rank with the real collectives; the pass's tape stays in ps until the
// arena is reset

typedef struct {
    gcd_ctx c;
    gcd_tensor *loss, *feat[GCD_MAX_FEATS], *gathered[GCD_MAX_FEATS];
} pass;

// tensor parallel: the replicated parameters' gradients reduced across the group with the run's mode,
// as Megatron's finalize_model_grads all-reduces the sequence-parallel ones (on); every rank takes part
static void finalize(gcd_ctx *c, gcd_comm *comm, gcd_gather_mode mode, unsigned replicated, gcd_params *P) {
    for (int i = 0; i < P->n; i++) {
        if (!((replicated >> i) & 1) || (mode != GCD_GATHER_ON && mode != GCD_GATHER_AVG)) continue;   // off, local: each rank's own share
        gcd_tensor *t = P->t[i];
        double *buf = gcd_arena_alloc(c->arena, (t->n + 1) * sizeof(double));   // the values, then how many ranks have one
        if (t->grad) memcpy(buf, t->grad, t->n * sizeof(double)), buf[t->n] = 1;
        comm->all_reduce(comm, buf, t->n + 1);
        if (buf[t->n] == 0) continue;   // None on every rank stays None
        double *g = gcd_grad_buf(c, t);
        for (size_t k = 0; k < t->n; k++) g[k] = mode == GCD_GATHER_AVG ? buf[k] / comm->world : buf[k];
    }
}

static void step(gcd_comm *comm, const gcd_run_opts *o, gcd_params *P, gcd_arena *arena, pass *ps) {
    const gcd_probe *pr = o->probe;
    gcd_tensor *in[GCD_MAX_INPUTS];
    ps->c = gcd_ctx_make(arena);
    for (int i = 0; i < P->n; i++) P->t[i]->grad = NULL;   // zero_grad(set_to_none=True)
    pr->inputs(&ps->c, &o->cfg, comm->rank, in);
    if (pr->split) {
        ps->loss = pr->split(&ps->c, comm, P, &o->cfg, in);
        gcd_backward(&ps->c, ps->loss);
        finalize(&ps->c, comm, o->mode, pr->replicated, P);
        return;
    }
    pr->encode(&ps->c, P, in, ps->feat);
    gcd_gather_mode mode[GCD_MAX_FEATS];
    for (int f = 0; f < pr->nfeat; f++) mode[f] = pr->feat_follows_mode[f] ? o->mode : GCD_GATHER_ON;
    gcd_all_gather_many(&ps->c, comm, pr->nfeat, ps->feat, mode, ps->gathered);
    ps->loss = pr->loss(&ps->c, P, &o->cfg, comm->rank, comm->world, ps->gathered, ps->feat);
    gcd_backward(&ps->c, ps->loss);
}

// ----------------------------------------------------------------------------
// After each step one collective, as DDP's gradient bucket (ddp.c): every parameter's gradient, this
// rank's loss and, on the first step, what blame.c reads of it: every rank's shortest path from each
// parameter to its loss, and every rank's gradients on both sides of each gather. Without SGD steps
// only rank 0 reads it, and it goes to rank 0 alone.

#define BUCKET_MAX (GCD_MAX_PARAMS + 2 + 2 * GCD_MAX_FEATS)   // parameters, the loss, the paths, both sides of each gather

typedef struct {   // gcd_ddp_mean_bucket's arguments, one tensor at a time
    int k;
    const double *local[BUCKET_MAX];
    size_t n[BUCKET_MAX];
    double *mean[BUCKET_MAX], *all[BUCKET_MAX];
    unsigned char *has[BUCKET_MAX];
    int nhave[BUCKET_MAX];
} bucket;

static void bucket_add(bucket *b, const double *local, size_t n, double *mean, double *all, unsigned char *has) {
    b->local[b->k] = local, b->n[b->k] = n, b->mean[b->k] = mean, b->all[b->k] = all, b->has[b->k] = has;
    b->k++;
}

// the first step's part: this rank's paths (mine, P->n packed paths) and the gathers' gradients
static void trace_add(bucket *b, gcd_comm *comm, const gcd_probe *pr, const gcd_params *P, const pass *ps, gcd_run_result *res,
                      double *mine, double *every) {
    for (int i = 0; i < P->n; i++) {
        gcd_path p;
        gcd_path_start(&p, i);
        if (gcd_path_find(&ps->c, P->t[i], ps->loss, P->t, P->n, &p) < 0) p.n = 0;   // this rank's loss does not use it
        gcd_path_pack(&p, mine + (size_t)i * GCD_PATH_PACKED);
    }
    bucket_add(b, mine, (size_t)P->n * GCD_PATH_PACKED, NULL, every, NULL);
    res->nfeat = pr->nfeat;
    for (int f = 0; f < pr->nfeat; f++) {
        gcd_feat_grads *g = &res->feat[f];
        const gcd_tensor *x = ps->feat[f], *all = ps->gathered[f];
        const double *back = all->node->saved;   // the gather backward's (n values, then how many ranks gave one)
        if (back && back[x->n] == 0) back = NULL;
        g->n = x->n;
        if (comm->rank == 0) {
            g->arrive = gcd_malloc((size_t)comm->world * all->n * sizeof(double)), g->arrive_has = gcd_malloc((size_t)comm->world);
            g->leave = gcd_malloc((size_t)comm->world * x->n * sizeof(double)), g->leave_has = gcd_malloc((size_t)comm->world);
        }
        bucket_add(b, all->grad, all->n, NULL, g->arrive, g->arrive_has);
        bucket_add(b, back, x->n, NULL, g->leave, g->leave_has);
    }
}

// rank 0, once the bucket is in: every rank's paths, and its own through each gathered feature
static void trace_read(const gcd_probe *pr, const gcd_params *P, const pass *ps, gcd_run_result *res, const double *every) {
    int W = res->world;
    size_t per = (size_t)P->n * GCD_PATH_PACKED;
    for (int i = 0; i < P->n; i++) {
        gcd_param_result *p = &res->param[i];
        p->rank_path = gcd_malloc((size_t)W * sizeof *p->rank_path);
        for (int k = 0; k < W; k++) gcd_path_unpack(&p->rank_path[k], every + (size_t)k * per + (size_t)i * GCD_PATH_PACKED);
        p->via = gcd_malloc((size_t)pr->nfeat * sizeof *p->via);
        for (int f = 0; f < pr->nfeat; f++) {
            gcd_path_start(&p->via[f], i);
            if (gcd_path_find(&ps->c, P->t[i], ps->gathered[f], P->t, P->n, &p->via[f]) < 0 ||
                gcd_path_find(&ps->c, ps->gathered[f], ps->loss, P->t, P->n, &p->via[f]) < 0)
                p->via[f].n = 0;
        }
    }
}

// tensor parallel, rank 0: every copy of a replicated parameter's gradient against the first rank's,
// in the figures check fills for ranks that must hold the same (verdict.c: disagree)
static void copies(gcd_param_result *p, int W) {
    p->differs = gcd_malloc((size_t)W);
    p->first = -1, p->diff_base = -1;
    for (int k = 0; k < W && p->first < 0; k++)
        if (p->has[k]) p->first = k;
    if (p->first < 0) return;
    const double *g0 = p->local + (size_t)p->first * p->n;
    double n0 = 0;
    for (size_t i = 0; i < p->n; i++) n0 += g0[i] * g0[i];
    for (int k = 0; k < W; k++) {
        const double *g = p->local + (size_t)k * p->n;
        double d2 = 0;
        for (size_t i = 0; p->has[k] && i < p->n; i++) {
            double d = fabs(g[i] - g0[i]);
            d2 += d * d;
            if (d > p->max_diff) p->max_diff = d;
        }
        double rel = n0 > 0 ? sqrt(d2 / n0) : (d2 > 0 ? INFINITY : 0);
        p->differs[k] = rel > GCD_TOL;
        if (rel > p->diff_rel) p->diff_rel = rel;
    }
}

// the tensor-parallel probe's ranks on a mesh: every rank in one tp group, rank k at (dp 0, tp k)
static void tp_mesh(gcd_run_result *res, int W) {
    res->mesh_nd = 2;
    memcpy(res->mesh_names[0], "dp", 3), memcpy(res->mesh_names[1], "tp", 3);
    res->mesh_coords = gcd_malloc((size_t)W * 2 * sizeof(int));
    for (int k = 0; k < W; k++) res->mesh_coords[2 * k] = 0, res->mesh_coords[2 * k + 1] = k;
}

// the run's identity and rank 0's loss history (steps x world)
static void result_start(const gcd_run_opts *o, int W, int root, gcd_run_result *res) {
    memset(res, 0, sizeof *res);
    res->probe = o->probe->name;
    res->mode = o->mode;
    res->finalize = o->probe->split != NULL;
    if (o->probe->replicated && root) tp_mesh(res, W);
    res->world = W;
    res->steps = o->steps;
    res->lr = o->lr;
    res->cfg = o->cfg;
    res->nloss = o->steps > 0 ? o->steps : 1;
    res->loss = gcd_malloc((size_t)(root ? res->nloss : 1) * W * sizeof(double));   // the history lives on rank 0 only
}

// each parameter's name, shape and starting values; on rank 0 room for every rank's gradient
static void result_params(const gcd_probe *pr, const gcd_params *P, int root, gcd_run_result *res) {
    int W = res->world;
    res->nparam = P->n;
    res->param = gcd_malloc((size_t)P->n * sizeof *res->param);
    for (int i = 0; i < P->n; i++) {
        gcd_param_result *p = &res->param[i];
        p->name = P->name[i];
        p->ndim = P->t[i]->ndim;
        memcpy(p->shape, P->t[i]->shape, sizeof P->t[i]->shape);
        p->n = P->t[i]->n;
        p->init = copy(P->t[i]->data, p->n);
        p->tp_split = (pr->sharded >> i) & 1 ? 1 : (pr->replicated >> i) & 1 ? 2 : 0;
        if (root) {
            p->local = gcd_malloc((size_t)W * p->n * sizeof(double));
            p->has = gcd_malloc((size_t)W);
        }
    }
}

// the inputs' shapes, from rank 0's own (every rank's are alike); on rank 0 room for every rank's values
static void result_inputs(const gcd_run_opts *o, gcd_arena *arena, int root, gcd_run_result *res) {
    const gcd_probe *pr = o->probe;
    res->ninput = pr->ninput;
    gcd_ctx c = gcd_ctx_make(arena);
    gcd_tensor *in[GCD_MAX_INPUTS];
    pr->inputs(&c, &o->cfg, 0, in);
    for (int j = 0; j < pr->ninput; j++) {
        res->input_name[j] = pr->input_name[j];
        res->input_ndim[j] = in[j]->ndim;
        memcpy(res->input_shape[j], in[j]->shape, sizeof res->input_shape[j]);
        res->input_n[j] = in[j]->n;
        if (root) res->inputs[j] = gcd_malloc((size_t)res->world * in[j]->n * sizeof(double));
    }
    gcd_arena_reset(arena);
}

// how far each parameter moved from its starting values over the steps
static void result_moved(const gcd_params *P, gcd_run_result *res) {
    for (int i = 0; i < P->n; i++) {
        gcd_param_result *p = &res->param[i];
        double d2 = 0;
        for (size_t k = 0; k < p->n; k++) d2 += (P->t[i]->data[k] - p->init[k]) * (P->t[i]->data[k] - p->init[k]);
        p->moved = sqrt(d2);
        p->moved_any = memcmp(P->t[i]->data, p->init, p->n * sizeof(double)) != 0;
    }
}

void gcd_run(gcd_comm *comm, const gcd_run_opts *o, gcd_run_result *res) {
    const gcd_probe *pr = o->probe;
    int W = comm->world, root = comm->rank == 0;
    result_start(o, W, root, res);

    gcd_arena params_arena = { 0 }, own = { 0 }, *arena = o->arena ? o->arena : &own;
    gcd_ctx pc = gcd_ctx_make(&params_arena);
    gcd_params P = { 0 };
    pr->init(&pc, &o->cfg, &P);
    result_params(pr, &P, root, res);
    result_inputs(o, arena, root, res);

    // rank 0's reference, on its own thread from here to the end of the first step (inline when no
    // thread can be started); a later mode of the same probe copies the one already computed
    int computes = root && !(o->ref && o->ref->done), threaded = 0;
    reference_job job = { o, W, res };
    pthread_t ref_thread;
    if (computes) threaded = pthread_create(&ref_thread, NULL, reference_thread, &job) == 0;

    double *mean[GCD_MAX_PARAMS];
    for (int i = 0; i < P.n; i++) mean[i] = gcd_malloc(P.t[i]->n * sizeof(double));
    for (int s = 0; s < res->nloss; s++) {
        pass ps;
        step(comm, o, &P, arena, &ps);
        bucket b = { 0 };
        for (int i = 0; i < P.n; i++)
            bucket_add(&b, P.t[i]->grad, P.t[i]->n, mean[i], s == 0 ? res->param[i].local : NULL, s == 0 ? res->param[i].has : NULL);
        bucket_add(&b, ps.loss->data, 1, NULL, res->loss + (root ? (size_t)s * W : 0), NULL);
        double *paths = NULL, *every = NULL;
        if (s == 0) {
            paths = gcd_malloc((size_t)P.n * GCD_PATH_PACKED * sizeof(double));
            every = root ? gcd_malloc((size_t)W * P.n * GCD_PATH_PACKED * sizeof(double)) : NULL;
            trace_add(&b, comm, pr, &P, &ps, res, paths, every);
        }
        gcd_ddp_mean_bucket(comm, b.k, b.local, b.n, b.mean, b.all, b.has, b.nhave, o->steps == 0);   // no update: rank 0 alone reads it
        if (s == 0 && root) trace_read(pr, &P, &ps, res, every);
        free(paths), free(every);
        for (int i = 0; i < P.n; i++)   // tensor parallel: disjoint pieces, whose sum is the whole
            for (size_t k = 0; ((pr->sharded >> i) & 1) && k < P.t[i]->n; k++) mean[i][k] *= b.nhave[i];
        for (int i = 0; i < P.n && s == 0; i++) {
            gcd_param_result *p = &res->param[i];
            p->nhave = b.nhave[i];   // ranks with a gradient
            p->reduced = b.nhave[i] ? copy(mean[i], p->n) : NULL;
            if (root && ((pr->replicated >> i) & 1)) copies(p, W);
        }
        gcd_arena_reset(arena);
        if (s == 0 && root) {   // at the starting values, before any update
            if (!computes) reference_copy(o->ref, res, 0);
            else {
                if (threaded) pthread_join(ref_thread, NULL);
                else reference(o, W, res);
                if (o->ref) reference_copy(o->ref, res, 1);
            }
        }
        for (int i = 0; i < P.n && o->steps > 0; i++)    // plain SGD on the reduced gradient; None: no update
            for (size_t k = 0; b.nhave[i] && k < P.t[i]->n; k++) P.t[i]->data[k] -= o->lr * mean[i][k];
        if (root && o->progress) o->progress(s + 1, res->nloss);
    }
    for (int i = 0; i < P.n; i++) free(mean[i]);
    result_moved(&P, res);
    gcd_arena_free(&own);   // o->arena's chunks stay, reset, for the next run's passes
    gcd_arena_free(&params_arena);
    res->tol = GCD_TOL;
    if (root) gcd_verdict(res), gcd_blame(res);
}

void gcd_run_result_free(gcd_run_result *res) {
    for (int i = 0; i < res->nparam; i++) {
        gcd_param_result *p = &res->param[i];
        free(p->init), free(p->local), free(p->has), free(p->reduced), free(p->reference);
        free(p->rank_norm), free(p->rank_nonfinite), free(p->rank_first_nonfinite), free(p->differs);
        free(p->rank_path), free(p->via), free(p->reason), free(p->local_has), free(p->own_rel), free(p->ref_rel);
    }
    for (int f = 0; f < res->nfeat; f++) {
        gcd_feat_grads *g = &res->feat[f];
        free(g->arrive), free(g->arrive_has), free(g->leave), free(g->leave_has), free(g->ref);
    }
    for (int i = 0; i < res->nfinding; i++) free(res->finding[i].params), free(res->finding[i].message);
    free(res->finding);
    free(res->param);
    for (int j = 0; j < res->ninput; j++) free(res->inputs[j]);
    free(res->loss), free(res->mesh_coords);
    memset(res, 0, sizeof *res);
}
