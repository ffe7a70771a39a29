#include "engine/gather.h"

#include <stdlib.h>
#include <string.h>

static const char *const mode_names[] = { [GCD_GATHER_OFF] = "off", [GCD_GATHER_ON] = "on", [GCD_GATHER_LOCAL] = "local", [GCD_GATHER_AVG] = "avg" };
_Static_assert(sizeof mode_names / sizeof *mode_names == GCD_GATHER_COUNT, "mode_names: one name per gather mode");
// Whose real code computes these numbers, per (mode, local loss): read from each library's source.
static const char *const mode_library[][2] = {
    [GCD_GATHER_OFF] = { "Lightning all_gather(sync_grads=False), also in a one-rank process group; torchmetrics gather_all_tensors <= 1.5",
      "open_clip gather_features(local_loss=True, gather_with_grad=False); Lightning all_gather(sync_grads=False)" },
    [GCD_GATHER_ON] = { "Lightning all_gather(sync_grads=True) = torch.distributed.nn.functional.all_gather; open_clip gather_with_grad=True; "
      "lightly GatherLayer",
      "open_clip gather_features(local_loss=True, gather_with_grad=True); torch.distributed.nn.functional.all_gather" },
    [GCD_GATHER_LOCAL] = { "open_clip gather_features(gather_with_grad=False) without local_loss; torchmetrics gather_all_tensors >= 1.6",
      "torchmetrics gather_all_tensors >= 1.6 (the rank's own rows put back) under a local loss; not open_clip, which puts no slot back with "
      "local_loss" },
    [GCD_GATHER_AVG] = { "Horovod allgather (backward averages over ranks); open_clip use_horovod=True, gather_with_grad=True",
      "Horovod allgather under a local loss; open_clip use_horovod=True, gather_with_grad=True, local_loss=True" },
};
_Static_assert(sizeof mode_library / sizeof *mode_library == GCD_GATHER_COUNT, "mode_library: one row per gather mode");

const char *gcd_gather_mode_name(int mode) { return mode >= 0 && mode < GCD_GATHER_COUNT && mode_names[mode] ? mode_names[mode] : "?"; }
const char *gcd_gather_mode_library(int mode, int local_loss) {
    return mode >= 0 && mode < GCD_GATHER_COUNT && mode_library[mode][local_loss != 0] ? mode_library[mode][local_loss != 0] : "?";
}

// Megatron-LM (core/distributed/finalize_model_grads.py, _allreduce_layernorm_grads) sums the gradients
// of the parameters marked sequence_parallel over the tensor-parallel group
static const char *const finalize_library[] = {
    [GCD_GATHER_OFF] = "no all-reduce of the sequence-parallel norm's gradient across the tensor-parallel group (Megatron-LM #1446, gpt-neox #1257)",
    [GCD_GATHER_ON] = "Megatron-LM finalize_model_grads: all_reduce SUM of the sequence-parallel parameters' gradients over the tensor-parallel group",
    [GCD_GATHER_LOCAL] = "each rank keeps its own sequence shard's share of the norm's gradient (the same numbers as off)",
    [GCD_GATHER_AVG] = "all_reduce AVG of the sequence-parallel norm's gradient over the tensor-parallel group, where the sum is right",
};
_Static_assert(sizeof finalize_library / sizeof *finalize_library == GCD_GATHER_COUNT, "finalize_library: one row per mode");

const char *gcd_finalize_mode_library(int mode) { return mode >= 0 && mode < GCD_GATHER_COUNT ? finalize_library[mode] : "?"; }

int gcd_gather_mode_parse(const char *s) {
    for (int m = 0; m < GCD_GATHER_COUNT; m++)
        if (!strcmp(s, mode_names[m])) return m;
    return -1;
}

// ----------------------------------------------------------------------------
// forward

void gcd_all_gather_many(gcd_ctx *c, gcd_comm *comm, int k, gcd_tensor *const *x, const gcd_gather_mode *mode, gcd_tensor **out) {
    int W = comm->world;
    size_t per = 0;   // one rank's part: its k tensors one after another
    for (int i = 0; i < k; i++) {
        int shape[GCD_MAX_DIM] = { gcd_rows(x[i]) * W, x[i]->ndim == 2 ? x[i]->shape[1] : 0 };
        out[i] = gcd_tensor_empty(c, x[i]->ndim ? x[i]->ndim : 1, shape);   // written whole below
        per += x[i]->n;
    }
    if (k == 1) comm->all_gather(comm, x[0]->data, out[0]->data, per);
    else {   // one collective, then each tensor's slots out of every rank's part
        double *mine = gcd_malloc(per * sizeof(double)), *every = gcd_malloc((size_t)W * per * sizeof(double));
        for (size_t i = 0, off = 0; i < (size_t)k; off += x[i]->n, i++) memcpy(mine + off, x[i]->data, x[i]->n * sizeof(double));
        comm->all_gather(comm, mine, every, per);
        for (int r = 0; r < W; r++)
            for (size_t i = 0, off = 0; i < (size_t)k; off += x[i]->n, i++)
                memcpy(out[i]->data + (size_t)r * x[i]->n, every + (size_t)r * per + off, x[i]->n * sizeof(double));
        free(mine), free(every);
    }
    for (int i = 0; i < k; i++) {
        int prev = gcd_set_grad_enabled(c, c->grad_enabled && mode[i] != GCD_GATHER_OFF);   // off: under no_grad, as Lightning
        gcd_node *nd = gcd_record(c, GCD_OP_GATHER, out[i], 1, (gcd_tensor *[]){ x[i] });  // off: detached, no graph
        nd->backward = gcd_gather_backward;
        gcd_set_grad_enabled(c, prev);
        nd->comm = comm;
        nd->mode = mode[i];
    }
}

gcd_tensor *gcd_all_gather(gcd_ctx *c, gcd_comm *comm, gcd_tensor *x, gcd_gather_mode mode) {
    gcd_tensor *out;
    gcd_all_gather_many(c, comm, 1, &x, &mode, &out);
    return out;
}

// ----------------------------------------------------------------------------
// backward: g (n+1) receives this rank's input gradient and, in g[n], how many ranks had one to give

// slots of W*n values with a "present" flag after each: (W, n+1)
static double *pack(gcd_ctx *c, const double *dout, int W, size_t n) {
    double *buf = gcd_arena_alloc(c->arena, (size_t)W * (n + 1) * sizeof(double));
    for (int k = 0; k < W && dout; k++) {
        memcpy(buf + k * (n + 1), dout + k * n, n * sizeof(double));
        buf[k * (n + 1) + n] = 1.0;
    }
    return buf;
}

static void backward_on(gcd_ctx *c, gcd_comm *comm, const double *dout, size_t n, double *g) {
    comm->reduce_scatter(comm, pack(c, dout, comm->world, n), g, n + 1);
}

static void backward_avg(gcd_ctx *c, gcd_comm *comm, const double *dout, size_t n, double *g) {
    double *buf = pack(c, dout, comm->world, n);
    comm->all_reduce(comm, buf, (size_t)comm->world * (n + 1));
    const double *own = buf + (size_t)comm->rank * (n + 1);
    for (size_t i = 0; i < n; i++) g[i] = own[i] / comm->world;
#ifdef GCD_TEST_WRONG_AVG   // built only into tests/test_expect: a wrong backward, which its control must not pass
    for (size_t i = 0; i < n; i++) g[i] *= -7;
#endif
    g[n] = own[n];
}

static void backward_local(const gcd_comm *comm, const double *dout, size_t n, double *g) {
    if (!dout) return;
    memcpy(g, dout + (size_t)comm->rank * n, n * sizeof(double));
    g[n] = 1.0;
}

void gcd_gather_backward(gcd_ctx *c, gcd_node *nd) {
    gcd_tensor *x = nd->in[0];
    size_t n = x->n;
    double *g = gcd_arena_alloc(c->arena, (n + 1) * sizeof(double));
    switch (nd->mode) {
    case GCD_GATHER_ON: backward_on(c, nd->comm, nd->out->grad, n, g); break;
    case GCD_GATHER_AVG: backward_avg(c, nd->comm, nd->out->grad, n, g); break;
    case GCD_GATHER_LOCAL: backward_local(nd->comm, nd->out->grad, n, g); break;
    default: GCD_FATAL("all_gather backward: mode %s has no backward", gcd_gather_mode_name(nd->mode));
    }
    nd->saved = g;           // for the report's checkpoints (run.c): what went back to this rank's features
    if (g[n] == 0) return;   // no rank reached the gathered result: the input keeps None
    double *dx = gcd_grad_buf(c, x);
    for (size_t i = 0; i < n; i++) dx[i] += g[i];
}

// ----------------------------------------------------------------------------
// reduce_scatter: the sequence-parallel counterpart of the row-parallel all_reduce

static void reduce_scatter_backward(gcd_ctx *c, gcd_node *nd) {
    gcd_comm *comm = nd->comm;
    size_t n = nd->out->n;
    double *every = pack(c, nd->out->grad, 1, n), *all = gcd_arena_alloc(c->arena, (size_t)comm->world * (n + 1) * sizeof(double));
    comm->all_gather(comm, every, all, n + 1);   // every rank's (n values, present)
    int any = 0;
    for (int k = 0; k < comm->world; k++) any |= all[(size_t)k * (n + 1) + n] != 0;
    if (!any) return;   // no rank reached the result: the input keeps None
    double *dx = gcd_grad_buf(c, nd->in[0]);
    for (int k = 0; k < comm->world; k++)
        for (size_t i = 0; i < n; i++) dx[(size_t)k * n + i] += all[(size_t)k * (n + 1) + i];
}

gcd_tensor *gcd_reduce_scatter(gcd_ctx *c, gcd_comm *comm, gcd_tensor *x) {
    int W = comm->world;
    if (x->ndim != 2 || x->shape[0] % W) GCD_FATAL("reduce_scatter: x is not (world*m, C) with world %d", W);
    gcd_tensor *out = gcd_tensor_empty(c, 2, (int[]){ x->shape[0] / W, x->shape[1] });
    comm->reduce_scatter(comm, x->data, out->data, out->n);
    gcd_node *nd = gcd_record(c, GCD_OP_REDUCE_SCATTER, out, 1, &x);
    nd->backward = reduce_scatter_backward;
    nd->comm = comm;
    return out;
}
