#include "diagnose/blame.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "diagnose/verdict.h"

// g (n) against r as the one classifier sees it; g NULL: None
static gcd_param_result compare(const double *g, const double *r, size_t n, int world, double tol) {
    gcd_param_result q = { .n = n, .nhave = g ? world : 0, .reduced = (double *)g, .reference = (double *)r };
    gcd_classify(&q, world, tol);
    return q;
}

// None where the reference is zero too agrees: nothing was to arrive
static int agrees(const gcd_param_result *q) { return q->status == GCD_ST_OK || (q->status == GCD_ST_NONE && !(q->ref_norm > 0)); }

// "x0.25 = 1/world", "None", "cosine 0.87, relative error 0.51"
static void describe(gcd_sb *b, const gcd_param_result *q, int world) {
    if (q->status == GCD_ST_NONE) gcd_sb_printf(b, "None");
    else if (q->status == GCD_ST_ZERO) gcd_sb_printf(b, "zero");
    else if (q->status == GCD_ST_SCALED) gcd_sb_printf(b, "x%.6g%s", q->scale, fabs(q->scale * world - 1) <= 1e-6 ? " = 1/world" : "");
    else gcd_sb_printf(b, "cosine %.3g, relative error %.3g", q->cosine, q->rel_err);
}

static void on_ranks(gcd_sb *b, const unsigned char *flag, int n, int world) {
    gcd_sb_printf(b, " on rank%s ", n > 1 ? "s" : "");
    gcd_ranks_list(b, flag, 1, world);
}

// ----------------------------------------------------------------------------
// none, partial: where the path was cut, and on which ranks

static void cut(const gcd_run_result *res, gcd_param_result *p, int i, gcd_sb *why) {
    int W = res->world, shown = -1, used = -1, nunused = 0, nsame = 0;
    unsigned char *unused = gcd_malloc((size_t)W), *same = gcd_malloc((size_t)W);
    for (int k = 0; k < W; k++) {
        if (p->rank_path[k].n && used < 0) used = k;
        if (p->has[k]) continue;
        if (!p->rank_path[k].n) unused[k] = 1, nunused++;
        else if (shown < 0) shown = k;
    }
    if (shown >= 0) {   // the first rank without a gradient whose loss uses the parameter: its path, where it was cut
        p->path = p->rank_path[shown];
        p->breaks_at = gcd_path_first_cut(&p->path);
        if (p->breaks_at >= 0) {
            const gcd_path_node *at = &p->path.node[p->breaks_at];
            for (int k = 0; k < W; k++) {   // the ranks cut the same way
                const gcd_path *rp = &p->rank_path[k];
                int c = p->has[k] || !rp->n ? -1 : gcd_path_first_cut(rp);
                same[k] = c >= 0 && rp->node[c].op == at->op && rp->node[c].cut == at->cut;
                nsame += same[k];
            }
            gcd_sb_printf(why, "%s", gcd_path_cut_reason(at));
            if (nsame < W) on_ranks(why, same, nsame, W);
        }
    } else {   // every rank without a gradient leaves the parameter out: a user's path, cut at the parameter
        if (used >= 0) p->path = p->rank_path[used];
        else gcd_path_start(&p->path, i);
        p->breaks_at = 0;
    }
    if (nunused == W) gcd_sb_printf(why, "not used by the loss on any rank");
    else if (nunused) gcd_sb_printf(why, "%snot used", why->len ? "; " : ""), on_ranks(why, unused, nunused, W);
    free(unused), free(same);
}

// ----------------------------------------------------------------------------
// scaled, mismatch: the first checkpoint, over every gathered feature the parameter feeds, where the
// gradient stops agreeing with the reference. With J = mean over ranks of L_r and DDP's mean over
// ranks of the gradients: (1) the mean over ranks of dL_r/d(gathered) equals dJ/d(concatenation);
// (2) the gather's backward into rank r's own rows equals world x slot r of dJ/d(concatenation);
// (3) what is left between the gather and the parameter is the encode side.

// (1): the gradient arriving at the gathered features, averaged over ranks; 1 when it departs
static int loss_side(const gcd_run_result *res, gcd_param_result *p, int f, gcd_sb *why) {
    const gcd_feat_grads *g = &res->feat[f];
    int W = res->world, any = 0;
    size_t m = (size_t)W * g->n;
    double *mean = gcd_malloc(m * sizeof(double));
    for (int k = 0; k < W; k++) {
        any |= g->arrive_has[k];
        for (size_t j = 0; j < m; j++) mean[j] += g->arrive[k * m + j] / W;
    }
    gcd_param_result q = compare(any ? mean : NULL, g->ref, m, W, res->tol);
    free(mean);
    if (agrees(&q)) return 0;
    p->path = p->via[f];
    int cut = gcd_path_first_cut(&p->path), at = gcd_path_find_op(&p->path, GCD_OP_GATHER);
    p->breaks_at = cut >= 0 ? cut : (at + 1 < p->path.n ? at + 1 : at);
    if (cut >= 0) gcd_sb_printf(why, "%s; ", gcd_path_cut_reason(&p->path.node[cut]));
    if (q.status == GCD_ST_NONE) gcd_sb_printf(why, "the loss side already differs: no gradient arrives at the gathered features (None)");
    else {
        gcd_sb_printf(why, "the loss side already differs: the gradient arriving at the gathered features departs from the reference (");
        describe(why, &q, W);
        gcd_sb_printf(why, ")");
    }
    return 1;
}

// (2): per rank, what the gather's backward returned to its own rows; 1 when it departs
static int gather_backward(const gcd_run_result *res, gcd_param_result *p, int f, gcd_sb *why) {
    const gcd_feat_grads *g = &res->feat[f];
    int W = res->world, noff = 0, any = 0, right = 0;   // right: ranks with something to get that got it right
    size_t n = g->n, m = (size_t)W * n;
    double *want = gcd_malloc(m * sizeof(double)), *own = gcd_malloc(m * sizeof(double)), *avg = gcd_malloc(m * sizeof(double));
    unsigned char *off = gcd_malloc((size_t)W);
    for (size_t j = 0; j < m; j++) want[j] = W * g->ref[j];
    for (int k = 0; k < W; k++) {
        gcd_param_result q = compare(g->leave_has[k] ? g->leave + k * n : NULL, want + k * n, n, W, res->tol);
        off[k] = !agrees(&q);
        noff += off[k], any |= g->leave_has[k], right += !off[k] && q.ref_norm > 0;
        for (size_t j = 0; j < n; j++) {   // what arrived for slot k: on rank k alone, and averaged over ranks
            own[k * n + j] = g->arrive[k * m + k * n + j];
            for (int r = 0; r < W; r++) avg[k * n + j] += g->arrive[r * m + k * n + j] / W;
        }
    }
    if (noff) {
        const double *leave = any ? g->leave : NULL;
        gcd_param_result q = compare(leave, want, m, W, res->tol), q_own = compare(leave, own, m, W, res->tol),
                         q_avg = compare(leave, avg, m, W, res->tol);
        p->path = p->via[f];
        p->breaks_at = gcd_path_find_op(&p->path, GCD_OP_GATHER);
        // every rank sends the same gradient under a loss they all compute alike: then both explain the numbers
        int is_own = agrees(&q_own), is_avg = agrees(&q_avg);
        gcd_sb_printf(why, "backward: %s (", is_own && is_avg ? "each rank's own rows get one rank's gradient, not the sum over ranks"
                                              : is_own      ? "the gradient from the other ranks' slots is dropped"
                                              : is_avg      ? "the ranks' gradients for each slot are averaged, not summed"
                                                            : "the gradient for each rank's own rows departs from the reference");
        describe(why, &q, W);
        if (right) on_ranks(why, off, noff, W);
        gcd_sb_printf(why, ")");
    }
    free(want), free(own), free(avg), free(off);
    return noff > 0;
}

// (3): right at the gather, wrong at the parameter: the ops between
static void encode_side(const gcd_run_result *res, gcd_param_result *p, int f, gcd_sb *why) {
    const char *names[GCD_MAX_PARAMS];
    for (int i = 0; i < res->nparam && i < GCD_MAX_PARAMS; i++) names[i] = res->param[i].name;
    p->path = p->via[f];
    int at = gcd_path_find_op(&p->path, GCD_OP_GATHER);
    p->breaks_at = at > 0 ? at - 1 : 0;
    gcd_sb_printf(why, "the encode side's backward (");
    for (int j = 1; j < at; j++) {
        if (j > 1) gcd_sb_printf(why, " -> ");
        gcd_path_node_str(why, &p->path.node[j], names);
    }
    gcd_sb_printf(why, "): the gradient leaving the gather matches the reference, the parameter's departs (");
    describe(why, p, res->world);
    gcd_sb_printf(why, ")");
}

static void depart(const gcd_run_result *res, gcd_param_result *p, gcd_sb *why) {
    int first = -1;
    for (int f = 0; f < res->nfeat; f++)
        if (p->via[f].n && first < 0) first = f;
    if (first < 0) {   // it feeds no gathered feature: only the loss side is left
        p->breaks_at = p->path.n > 1 ? 1 : 0;
        gcd_sb_printf(why, "the loss side: the parameter is used after the gather only, and its gradient departs there (");
        describe(why, p, res->world);
        gcd_sb_printf(why, ")");
        return;
    }
    for (int f = 0; f < res->nfeat; f++)
        if (p->via[f].n && loss_side(res, p, f, why)) return;
    for (int f = 0; f < res->nfeat; f++)
        if (p->via[f].n && gather_backward(res, p, f, why)) return;
    encode_side(res, p, first, why);
}

// ----------------------------------------------------------------------------

void gcd_blame(gcd_run_result *res) {
    for (int i = 0; i < res->nparam; i++) {
        gcd_param_result *p = &res->param[i];
        gcd_sb why = { 0 };
        free(p->reason);
        p->reason = NULL;
        p->breaks_at = -1;
        if (!p->rank_path) continue;
        gcd_path_start(&p->path, i);   // shown without a break: a user's path (rank 0's first)
        for (int k = res->world - 1; k >= 0; k--)
            if (p->rank_path[k].n) p->path = p->rank_path[k];
        if (p->status == GCD_ST_NONE || p->status == GCD_ST_PARTIAL) cut(res, p, i, &why);
        else if (p->status == GCD_ST_SCALED || p->status == GCD_ST_MISMATCH) depart(res, p, &why);
        p->reason = why.s;
    }
}
