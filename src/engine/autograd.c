#include "engine/autograd.h"


static const char *const op_names[] = {
    [GCD_OP_LINEAR] = "linear",       [GCD_OP_RELU] = "relu",           [GCD_OP_VIEW] = "view",
    [GCD_OP_CONCAT] = "concat",       [GCD_OP_MUL] = "mul",             [GCD_OP_MEAN] = "mean",
    [GCD_OP_MSE] = "mse_loss",        [GCD_OP_MATMUL_NT] = "matmul_nt", [GCD_OP_NORMALIZE] = "normalize",
    [GCD_OP_EXP] = "exp",             [GCD_OP_CROSS_ENTROPY] = "cross_entropy",
    [GCD_OP_GATHER] = "all_gather",   [GCD_OP_DETACH] = "detach",       [GCD_OP_LAYERNORM] = "layer_norm",
    [GCD_OP_NARROW] = "narrow",       [GCD_OP_REDUCE_SCATTER] = "reduce_scatter",
};
_Static_assert(sizeof op_names / sizeof *op_names == GCD_OP_COUNT, "op_names: one name per gcd_op");

const char *gcd_op_name(gcd_op op) { return op >= 0 && op < GCD_OP_COUNT && op_names[op] ? op_names[op] : "?"; }

gcd_node *gcd_record(gcd_ctx *c, gcd_op op, gcd_tensor *out, int nin, gcd_tensor **in) {
    int any = 0;
    for (int i = 0; i < nin; i++) any |= in[i] && in[i]->requires_grad;
    gcd_node *nd = gcd_arena_alloc(c->arena, sizeof *nd);
    nd->op = op;
    nd->backward = NULL;   // the op sets it
    nd->cut = op == GCD_OP_DETACH ? GCD_CUT_DETACH : !c->grad_enabled ? GCD_CUT_NO_GRAD : !any ? GCD_CUT_NO_INPUT : GCD_CUT_NONE;
    nd->out = out;
    nd->nin = nin;
    nd->in = gcd_arena_alloc(c->arena, (size_t)nin * sizeof *nd->in);
    for (int i = 0; i < nin; i++) nd->in[i] = in[i];
    nd->id = c->tape ? c->tape->id + 1 : 0;
    nd->prev = c->tape;
    c->tape = nd;
    out->requires_grad = nd->cut == GCD_CUT_NONE;
    out->node = nd;
    return nd;
}

void gcd_backward_from(gcd_ctx *c, gcd_tensor *out) {
    (void)out;
    for (gcd_node *nd = c->tape; nd; nd = nd->prev) {
        if (nd->cut) continue;   // detached: in the forward graph only
        // a collective's backward runs on every rank even where nothing reached it, or ranks would
        // wait on each other forever; gather.c keeps the input's gradient None in that case
        if (!nd->out->grad && nd->op != GCD_OP_GATHER && nd->op != GCD_OP_REDUCE_SCATTER) continue;
        if (!nd->backward) GCD_FATAL("backward: no rule for op %s", gcd_op_name(nd->op));
        nd->backward(c, nd);
    }
}

void gcd_backward(gcd_ctx *c, gcd_tensor *loss) {
    if (loss->n != 1) GCD_FATAL("backward: the loss has %zu elements, not 1", loss->n);
    if (!loss->requires_grad) return;   // no graph: every parameter keeps None
    gcd_grad_buf(c, loss)[0] = 1.0;
    gcd_backward_from(c, loss);
}

int gcd_set_grad_enabled(gcd_ctx *c, int enabled) {
    int prev = c->grad_enabled;
    c->grad_enabled = enabled;
    return prev;
}

gcd_tensor *gcd_detach(gcd_ctx *c, gcd_tensor *t) {
    gcd_tensor *d = gcd_arena_alloc(c->arena, sizeof *d);
    *d = *t;
    d->grad = NULL;
    gcd_record(c, GCD_OP_DETACH, d, 1, &t);
    return d;
}
