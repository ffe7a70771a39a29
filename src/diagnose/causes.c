#include "diagnose/findings.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The judgements (rows of judgements.c's table) that write their own findings: a cause named once for
// many parameters, one finding per distinct scale, the mismatches grouped by name prefix.

// ----------------------------------------------------------------------------
// both stages: the cause first. A parameter None on some ranks before DDP's all-reduce (their local
// dumps lack it) has, after it, the mean with zeros in their place on every rank: the reduced dumps
// alone show a wrong or scaled gradient and not why.

typedef struct {
    const gcd_param_result *p;   // the first of the cut
    int world;
    gcd_pick_fn pick;            // the cut ones
} cut_like;

static int same_cut(const gcd_param_result *q, const void *arg) {
    const cut_like *c = arg;
    return c->pick(q, NULL) && !memcmp(q->local_has, c->p->local_has, (size_t)c->world);
}

// "so every rank holds ... after it": what the averaged zeros left, over the parameters cut alike
static void stage_after(const gcd_verdict_ctx *v, const cut_like *cut, int n, gcd_sb *m) {
    const gcd_param_result *p = cut->p;
    int scaled = 0, alike = 1;
    double clo = INFINITY, chi = -INFINITY, elo = INFINITY, ehi = -INFINITY;
    for (int j = 0; j < v->res->nparam; j++) {
        const gcd_param_result *q = &v->res->param[j];
        if (!same_cut(q, cut)) continue;
        scaled += q->status == GCD_ST_SCALED;
        if (q->status == GCD_ST_SCALED && !gcd_same_shown(q->scale, p->scale, fmax(q->allowed, p->allowed))) alike = 0;
        if (isfinite(q->cosine)) clo = fmin(clo, q->cosine), chi = fmax(chi, q->cosine);
        if (isfinite(q->rel_err)) elo = fmin(elo, q->rel_err), ehi = fmax(ehi, q->rel_err);
    }
    gcd_sb_printf(m, "so every rank holds ");
    if (scaled == n && alike) {
        gcd_sb_printf(m, "the reference x%.6g", gcd_shown_scale(p->scale, p->allowed));
        return;
    }
    gcd_sb_printf(m, "a gradient that is not the reference's");
    if (clo <= chi) {
        gcd_sb_printf(m, " (cosine ");
        gcd_finding_range(m, clo, chi);
        gcd_sb_printf(m, ", relative error ");
        gcd_finding_range(m, elo, ehi);
        gcd_sb_printf(m, ")");
    }
}

void gcd_cause_stage(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    gcd_run_result *res = v->res;
    int W = res->world;
    unsigned char *done = gcd_malloc((size_t)res->nparam + 1);
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (!j->pick(p, NULL) || done[i]) continue;
        cut_like cut = { p, W, j->pick };
        gcd_sb who = { 0 };
        int n = gcd_names_words(v, same_cut, &cut, &who, ids), ok = 0;
        for (int k = 0; k < res->nparam; k++)
            if (same_cut(&res->param[k], &cut)) done[k] = 1, ok += res->param[k].status == GCD_ST_OK;
        int missing = W - p->local_nhave;
        gcd_sb_printf(m, "%s %s no gradient on rank%s ", who.s, gcd_plural(n, "gets", "get"), gcd_plural(missing, "", "s"));
        gcd_ranks_list(m, p->local_has, 0, W);
        gcd_sb_printf(m, " before %s (None in %s local dump%s): the all-reduce averaged zeros in %s place, ",
                      gcd_reducer_words(res->wrapper), gcd_plural(missing, "its", "their"), gcd_plural(missing, "", "s"), gcd_plural(missing, "its", "their"));
        if (ok == n) {   // what the reference computes too (it skips them there as well): a note
            gcd_sb_printf(m, "and the result still matches %s", gcd_ref_words(res));
            gcd_finding_emit(res, "note", 0, ids, m);
        } else {
            for (int k = 0; k < res->nparam; k++) res->param[k].explained |= same_cut(&res->param[k], &cut);
            stage_after(v, &cut, n, m);
            gcd_sb_printf(m, " after it (the reduced dumps): the cause is upstream of DDP, where %s rank%s computed no gradient for %s",
                          gcd_plural(missing, "that", "those"), gcd_plural(missing, "", "s"), gcd_plural(n, "it", "them"));
            gcd_finding_emit(res, "local_none", 1, ids, m);
        }
        gcd_sb_free(&who);
    }
    free(done);
}

// ----------------------------------------------------------------------------
// a scale: one finding per distinct scale, with what it usually means

// A double reduction, from the losses check_ddp records: every rank's loss is the same value, the mean of what
// the ranks' batches give alone in one process, while those differ: the loss was averaged over the ranks in the
// forward. (A loss over a gathered batch is the same on every rank too, but not the mean of the batches' own.)
static int double_reduced(const gcd_run_result *res) {
    const double *l = res->rank_loss, *s = res->shard_loss;
    if (!l || !s || res->world < 2) return 0;
    double mean = 0, lo = INFINITY, hi = -INFINITY, tol = fmax(1e-4, 10 * res->tol);
    for (int k = 0; k < res->world; k++) mean += s[k] / res->world, lo = fmin(lo, s[k]), hi = fmax(hi, s[k]);
    double scale = fmax(fabs(mean), 1e-30);
    if (!(hi - lo > tol * scale)) return 0;   // the batches give the same loss: equal losses say nothing
    for (int k = 0; k < res->world; k++)
        if (!(fabs(l[k] - l[0]) <= 1e-6 * fmax(fabs(l[0]), 1e-30) && fabs(l[k] - mean) <= tol * scale)) return 0;
    return 1;
}

// The forward right per the losses check records: the ranks' mean loss is the single-process objective
static int loss_is_objective(const gcd_run_result *res, double factor) {
    return res->loss_known && fabs(res->loss_mean * factor - res->loss_ref) <= fmax(1e-4, 10 * res->tol) * fmax(1e-30, fabs(res->loss_ref));
}

// A gather whose backward keeps only the own rows, from the losses: every rank's loss is the same value, the
// single-process objective (the forward gathered the world's batch), and not the mean of what the batches give
// alone (that would be a loss all-reduced in the forward): without those (check_ddp records them) nothing is named
static int gathered_own_rows(const gcd_run_result *res) {
    const double *l = res->rank_loss, *s = res->shard_loss;
    if (!l || res->world < 2 || !loss_is_objective(res, 1) || double_reduced(res)) return 0;
    for (int k = 0; k < res->world; k++)
        if (!(fabs(l[k] - l[0]) <= 1e-6 * fmax(fabs(l[0]), 1e-30))) return 0;
    if (!s) return 0;
    double mean = 0;
    for (int k = 0; k < res->world; k++) mean += s[k] / res->world;
    return fabs(l[0] - mean) > fmax(1e-4, 10 * res->tol) * fmax(fabs(mean), 1e-30);
}

// every rank's loss is f x what its batch gives alone in one process (check_ddp's gradcheck.shard_losses)
static int rank_loss_is_shard(const gcd_run_result *res, double f) {
    const double *l = res->rank_loss, *s = res->shard_loss;
    if (!l || !s) return 0;
    for (int k = 0; k < res->world; k++)
        if (!(fabs(l[k] - f * s[k]) <= fmax(1e-4, 10 * res->tol) * fmax(fabs(f * s[k]), 1e-30))) return 0;
    return 1;
}

// A loss summed over rows, from the losses: each rank's loss is what its batch gives alone, and their mean x f is the
// reference's objective, where that objective is the step's own on the whole batch (a step that divides a mean
// itself, checked against another objective given with check_ddp(reference=fn), reads alike: not named)
static int summed_rows(const gcd_run_result *res, double f) {
    return !res->ref_objective && loss_is_objective(res, f) && rank_loss_is_shard(res, 1);
}

// every rank recorded the same loss (to 1e-6 relative): the loss was computed from the world's batch, or all-reduced
static int same_losses(const gcd_run_result *res) {
    const double *l = res->rank_loss;
    if (!l || res->world < 2) return 0;
    for (int k = 0; k < res->world; k++)
        if (!(fabs(l[k] - l[0]) <= 1e-6 * fmax(fabs(l[0]), 1e-30))) return 0;
    return 1;
}

// What a scale c (as shown) usually means, after "the reference xC"; the probes' (words 0) say only
// "(= 1/world)": their cause is the gather mode, which the table names
static void scale_cause(gcd_sb *m, const gcd_run_result *res, double c, int words) {
    int e, world = res->world, acc = res->accumulate > 1 ? res->accumulate : 1;
    double f = frexp(c, &e), k = round(c), inv = round(1 / c);
    if (!words) {
        if (fabs(c * world - 1) <= 1e-6) gcd_sb_printf(m, " (= 1/world)");
    } else if (fabs(c * world - 1) <= 1e-6 && double_reduced(res)) {
        double lo = INFINITY, hi = -INFINITY;
        for (int r = 0; r < world; r++) lo = fmin(lo, res->shard_loss[r]), hi = fmax(hi, res->shard_loss[r]);
        gcd_sb_printf(m, " (= 1/world): a double reduction: every rank's loss is the same value, %.6g, the mean of what the ranks' "
                         "batches give alone (%.6g to %.6g): the loss was all-reduced with a collective autograd does not see "
                         "(dist.all_reduce(loss); loss /= world) before backward, so each rank's backward ran on its own loss "
                         "divided by the world, and DDP averaged over the ranks again. Fix: backward each rank's own loss (DDP "
                         "averages the gradients); all-reduce a detached copy for logging (l = loss.detach().clone(); "
                         "dist.all_reduce(l); l /= world)", res->rank_loss[0], lo, hi);
    } else if (fabs(c * world - 1) <= 1e-6 && gathered_own_rows(res)) {
        gcd_sb_printf(m, " (= 1/world): a collective in the loss whose backward keeps only the rank's own part: every rank's loss "
                         "is the same value, %.6g, the single-process objective (the forward combined the world's batch, and is "
                         "right), but each rank's backward reached only its own rows: a gather whose backward keeps only the rank's "
                         "own rows (dist.all_gather with the own slot put back, Lightning's all_gather(sync_grads=False), lightly's "
                         "GatherLayer before its fix), or a statistic summed over the ranks with dist.all_reduce, which autograd "
                         "does not see (lightly's BarlowTwins loss before its fix). Fix: the collectives whose backward sums every "
                         "rank's gradient: torch.distributed.nn.functional.all_gather / all_reduce (Lightning's "
                         "all_gather(sync_grads=True), gradcheck_dist.all_gather_with_grad)", res->rank_loss[0]);
    } else if (fabs(c * world - 1) <= 1e-6 && world > 1 && summed_rows(res, world))
        gcd_sb_printf(m, " (= 1/world): a loss summed over rows where the reference averages: each rank's loss is what its batch "
                         "gives alone, and their mean %.6g is the single-process objective %.6g / world. Fix: average the loss over "
                         "the rank's rows (.mean(), reduction=\"mean\"), or sum in the reference too", res->loss_mean, res->loss_ref);
    else if (acc > 1 && world > 1 && fabs(c * world * acc - 1) <= 1e-6 && summed_rows(res, world * acc))
        gcd_sb_printf(m, " (= 1/(world x %d accumulation steps)): a loss summed over rows: the single-process objective %.6g sums "
                         "the whole batch, each rank's micro-batch losses sum theirs, each divided by the %d steps, and DDP averages "
                         "over the world (the ranks' mean loss %.6g is the objective / %.0f). Fix: average each micro-batch's loss "
                         "over its rows (.mean(), reduction=\"mean\"), or sum in the reference too", acc, res->loss_ref, acc,
                      res->loss_mean, (double)world * acc);
    else if (fabs(c * world - 1) <= 1e-6 && world > 1 && loss_is_objective(res, world) && rank_loss_is_shard(res, 1.0 / world))
        gcd_sb_printf(m, " (= 1/world): each rank's loss is what its batch gives alone divided by the world: a loss divided by the "
                         "world before backward, where DDP already averages the gradients over the ranks. Fix: backward each rank's "
                         "own loss, undivided");
    else if (acc > 1 && fabs(c * acc - 1) <= 1e-6 && loss_is_objective(res, acc))
        gcd_sb_printf(m, " (= 1/%d, the accumulation steps check_ddp ran): the ranks' mean loss %.6g is the objective %.6g / %d: the "
                         "step's loss already holds the 1/%d (a loss normalised over the whole accumulated batch, as HF Trainer's "
                         "num_items_in_batch does), and check_ddp divided each micro-batch's loss by %d again, as a loop of "
                         "micro-batch means does. Fix: a loss normalised over the accumulated batch is not divided by the steps in "
                         "training; for check_ddp(accumulate=K), return it times K (docs/python.md: HF's num_items_in_batch)",
                      acc, res->loss_mean, res->loss_ref, acc, acc, acc);
    else if (fabs(c * world - 1) <= 1e-6 && world > 1 && same_losses(res))
        gcd_sb_printf(m, " (= 1/world): every rank's loss is the same value, %.6g, so the loss combined the world's batch: a collective in "
                         "the loss whose backward keeps only the rank's own part (a gather keeping the own rows, a statistic summed "
                         "with dist.all_reduce: use torch.distributed.nn.functional's all_gather / all_reduce), or a loss all-reduced "
                         "before backward and averaged by DDP again (backward each rank's own loss). What each rank's batch gives "
                         "alone (gradcheck.shard_losses, which check_ddp records where the step runs without a process group) "
                         "would tell the two apart", res->rank_loss[0]);
    else if (fabs(c * world - 1) <= 1e-6)
        gcd_sb_printf(m, " (= 1/world): what a loss summed over rows gives where the reference averages, a gather whose backward keeps "
                         "only the rank's own rows, or a gradient divided by the world twice");
    else if (world > 1 && fabs(c - world) <= 1e-6 * world && rank_loss_is_shard(res, world))
        gcd_sb_printf(m, " (= world): each rank's loss is what its batch gives alone times the world (rank 0: %.6g, against %.6g): a "
                         "loss multiplied by the world (the data-parallel size) before backward, which only a loss divided by a count "
                         "all-reduced over the ranks wants, as DDP averages. Fix: backward the rank's own mean loss, or divide its "
                         "summed loss by the count all-reduced over the ranks before multiplying by the world",
                      res->rank_loss[0], res->shard_loss[0]);
    else if (world > 1 && fabs(c - world) <= 1e-6 * world)
        gcd_sb_printf(m, " (= world): a gradient all-reduced with SUM and not divided by the world");
    else if (f == 0.5 && abs(e - 1) >= 8)
        gcd_sb_printf(m, ": a power of two, as a loss scale is: the gradients were taken before GradScaler's scaler.unscale_(optimizer) "
                         "(dump after it, or divide by scaler.get_scale())");
    else if (k >= 2 && k <= 16 && fabs(c - k) <= 1e-6 * k)
        gcd_sb_printf(m, ": an integer factor, as a loss not divided by the gradient accumulation steps gives (summed over %.0f "
                         "micro-batches), or a gradient added %.0f times", k, k);
    else if (inv >= 2 && inv <= 16 && fabs(c * inv - 1) <= 1e-6)
        gcd_sb_printf(m, " (= 1/%.0f): a loss divided by %.0f gradient accumulation steps where the objective is not, or divided twice", inv, inv);
}

typedef struct {
    const gcd_param_result *p;   // the finding's first tensor
    gcd_pick_fn pick;            // the scaled ones
} scale_like;

static int same_scale(const gcd_param_result *q, const void *arg) {
    const scale_like *s = arg;
    return s->pick(q, NULL) && gcd_same_shown(q->scale, s->p->scale, fmax(q->allowed, s->p->allowed));
}

// x1 only where that was measured: a tensor ok only within its measured noise (about zero) shows no scale
static int is_ok(const gcd_param_result *p, const void *arg) {
    (void)arg;
    return p->status == GCD_ST_OK && !p->explained && p->tol_source != GCD_TOL_MEASURED;
}

void gcd_cause_scaled(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    gcd_run_result *res = v->res;
    double *scales = NULL;   // the distinct scales named so far
    int nscales = 0;
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (!j->pick(p, NULL)) continue;
        int seen = 0;
        for (int k = 0; k < nscales && !seen; k++) seen = gcd_same_shown(p->scale, scales[k], p->allowed);
        if (seen) continue;
        scales = realloc(scales, (size_t)(nscales + 1) * sizeof *scales);
        mallocCheck(scales);
        scales[nscales++] = p->scale;
        int n = gcd_names_words(v, same_scale, &(scale_like){ p, j->pick }, m, ids);
        double c = gcd_shown_scale(p->scale, p->allowed);
        gcd_sb_printf(m, " %s the reference x%.6g", gcd_plural(n, "gradient is", "gradients are"), c);
        scale_cause(m, res, c, v->check);
        int ok = gcd_names_count(res, is_ok, NULL);
        if (ok) {
            gcd_sb others = { 0 };
            gcd_names_words(v, is_ok, NULL, &others, NULL);
            gcd_sb_printf(m, " while %s %s x1", others.s, gcd_plural(ok, "is", "are"));
            gcd_sb_free(&others);
        }
        gcd_finding_emit(res, "scaled", 1, ids, m);
    }
    free(scales);
}

// ----------------------------------------------------------------------------
// Plain BatchNorm in training mode under DDP normalises each rank's rows by their own statistics: the
// ranks and the reference compute different objectives, and every parameter upstream differs. One
// finding says so and takes over the mismatches.

void gcd_cause_batchnorm(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    gcd_run_result *res = v->res;
    int n = 0;
    for (int i = 0; i < res->nparam; i++) {
        gcd_param_result *p = &res->param[i];
        if (!j->pick(p, NULL)) continue;
        p->explained = 1, n++;
        gcd_sb_printf(ids, "%s%s", ids->len ? "," : "", p->name);
    }
    if (!n) return;
    gcd_sb_printf(m, "%d %s from the reference (or cannot be judged from one), and the step ran plain BatchNorm in training mode (%s): under DDP each rank "
                      "normalises its rows by their own mean and variance, %s, so the two "
                      "compute different objectives; use torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) (SyncBatchNorm runs on "
                      "CUDA), or check with those layers in eval mode",
                  n, gcd_plural(n, "parameter differs", "parameters differ"), res->batchnorm,
                  res->ref_multi ? "the reference run's ranks by other splits of the batch"
                                 : "the single-process reference by the whole batch's");
    gcd_finding_emit(res, "mismatch", 1, ids, m);
}

// ----------------------------------------------------------------------------
// many wrong gradients: one finding per name prefix, with the range of their figures

// the first `depth` dotted components of name with their dot ("visual.transformer."), or the whole name
static size_t prefix_len(const char *name, int depth) {
    const char *s = name;
    for (int d = 0; d < depth; d++) {
        const char *dot = strchr(s, '.');
        if (!dot) return strlen(name);
        s = dot + 1;
    }
    return (size_t)(s - name);
}

typedef struct {
    const char *name;
    size_t len;   // the prefix: name's first len bytes
    int param;    // its index in res->param
} prefix_key;

static int by_prefix(const void *a, const void *b) {
    const prefix_key *x = a, *y = b;
    int c = strncmp(x->name, y->name, x->len < y->len ? x->len : y->len);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

// keys: the picked parameters' prefixes at depth, sorted; returns how many distinct
static int distinct_at(const gcd_run_result *res, const int *pick, int n, int depth, prefix_key *keys) {
    for (int i = 0; i < n; i++) keys[i] = (prefix_key){ res->param[pick[i]].name, prefix_len(res->param[pick[i]].name, depth), pick[i] };
    qsort(keys, (size_t)n, sizeof *keys, by_prefix);
    int k = n ? 1 : 0;
    for (int i = 1; i < n; i++) k += by_prefix(&keys[i - 1], &keys[i]) != 0;
    return k;
}

// The mismatches being grouped: pick (n of them), each one's group (grp, by parameter), the groups kept
// by name (own) and the depth of their prefix; the rest are one group of their own.
typedef struct {
    int *pick, n, depth, *grp;
    unsigned char *own;
} grouping;

// the finding of one kept group g (own[g]), or of the rest (g < 0)
static void mismatch_group(const gcd_verdict_ctx *v, const grouping *G, int g, gcd_sb *m, gcd_sb *ids) {
    gcd_run_result *res = v->res;
    double clo = INFINITY, chi = -INFINITY, elo = INFINITY, ehi = -INFINITY;
    int cnt = 0, away = 0;
    const gcd_param_result *first = NULL;
    for (int i = 0; i < G->n; i++) {
        gcd_param_result *p = &res->param[G->pick[i]];
        if (g >= 0 ? G->grp[G->pick[i]] != g : G->own[G->grp[G->pick[i]]]) continue;
        first = first ? first : p;
        p->grouped = 1, cnt++;
        away += p->scale <= 0;
        clo = fmin(clo, p->cosine), chi = fmax(chi, p->cosine), elo = fmin(elo, p->rel_err), ehi = fmax(ehi, p->rel_err);
        gcd_sb_printf(ids, "%s%s", ids->len ? "," : "", p->name);
    }
    if (!cnt) return;
    if (g >= 0) {
        size_t k = prefix_len(first->name, G->depth);
        int lo, hi;
        gcd_names_prefix_run(v, first->name, k, &lo, &hi);
        if (cnt == 1) gcd_sb_printf(m, "%s: wrong gradient", first->name);
        else gcd_sb_printf(m, "%.*s*: %d of %d parameters with wrong gradients", (int)k, first->name, cnt, hi - lo);
    } else if (cnt <= 3) {   // a few: by name
        for (int i = 0, c = 0; i < G->n; i++)
            if (!G->own[G->grp[G->pick[i]]])
                gcd_sb_printf(m, "%s%s", c == 0 ? "" : c == cnt - 1 ? " and " : ", ", res->param[G->pick[i]].name), c++;
        gcd_sb_printf(m, ": %s with wrong gradients", cnt == 1 ? "one" : cnt == 2 ? "two" : "three");
    } else gcd_sb_printf(m, "%d more parameters under other names with wrong gradients (the report lists them)", cnt);
    gcd_sb_printf(m, ", neither the reference nor a multiple of it%s: cosine ", away ? " (some pointing away from it)" : "");
    gcd_finding_range(m, clo, chi);
    gcd_sb_printf(m, ", relative error ");
    gcd_finding_range(m, elo, ehi);
    gcd_finding_emit(res, "mismatch", 1, ids, m);
}

// The deepest prefix that splits the wrong gradients into at most GCD_MISMATCH_GROUPS groups; where even
// the first component gives more, the largest GCD_MISMATCH_GROUPS - 1 groups and one of the rest. Marks
// them p->grouped.
void gcd_cause_mismatch_groups(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    const gcd_run_result *res = v->res;
    enum { GROUPS = GCD_MISMATCH_GROUPS };
    grouping G = { .pick = gcd_malloc((size_t)res->nparam * sizeof *G.pick), .depth = 1 };
    prefix_key *keys = gcd_malloc((size_t)(res->nparam ? res->nparam : 1) * sizeof *keys);
    int maxd = 1;
    for (int i = 0; i < res->nparam; i++)
        if (j->pick(&res->param[i], NULL)) {
            G.pick[G.n++] = i;
            int d = 1;
            for (const char *c = res->param[i].name; *c; c++) d += *c == '.';
            maxd = d > maxd ? d : maxd;
        }
    for (int d = maxd; d >= 1; d--)
        if (distinct_at(res, G.pick, G.n, d, keys) <= GROUPS) { G.depth = d; break; }
    int ng = distinct_at(res, G.pick, G.n, G.depth, keys);
    // groups in order of their first parameter: grp[pick[i]] for pick[i]
    G.grp = gcd_malloc((size_t)res->nparam * sizeof *G.grp);
    int *size = gcd_malloc((size_t)(ng + 1) * sizeof *size);
    for (int i = 0, gi = -1; i < G.n; i++) {
        if (i == 0 || by_prefix(&keys[i - 1], &keys[i])) gi++, size[gi] = 0;
        G.grp[keys[i].param] = gi, size[gi]++;
    }
    int *order = gcd_malloc((size_t)(ng + 1) * sizeof *order), no = 0;   // group ids by first appearance
    unsigned char *listed = gcd_malloc((size_t)ng + 1);
    for (int i = 0; i < G.n; i++)
        if (!listed[G.grp[G.pick[i]]]) listed[G.grp[G.pick[i]]] = 1, order[no++] = G.grp[G.pick[i]];
    int keep = ng <= GROUPS ? ng : GROUPS - 1;   // too many at depth 1: the largest keep, then the rest
    G.own = gcd_malloc((size_t)ng + 1);
    for (int k = 0; k < keep; k++) {
        int best = -1;
        for (int o = 0; o < no; o++)
            if (!G.own[order[o]] && (best < 0 || size[order[o]] > size[best])) best = order[o];
        G.own[best] = 1;
    }
    for (int o = 0; o < no; o++)   // the kept groups in order, then the rest as one
        if (G.own[order[o]]) mismatch_group(v, &G, order[o], m, ids);
    mismatch_group(v, &G, -1, m, ids);
    free(G.pick), free(keys), free(G.grp), free(size), free(order), free(listed), free(G.own);
}

// ----------------------------------------------------------------------------
// A gather whose backward keeps only this rank's slot (run's mode local: open_clip's gather_with_grad=False
// without local_loss, torchmetrics >= 1.6, lightly's GatherLayer before its fix) drops the other ranks'
// gradients for each rank's rows. What check sees: the forward is right (the ranks' mean loss, as the dumps
// record it, is the reference objective; the parameters after the gather match), and the wrong gradients, each along its
// reference (cosine > 0), are together a part of it: sum <g, r> / sum <r, r> over them in [1/world, 1)
// (one tensor alone may reach past 1: a bias whose dropped terms point against the rest). One finding names
// them all.

enum { OWN_SLOT_LOSS = 1, OWN_SLOT_AFTER = 2 };   // the evidence that the forward is right

// the wrong gradients' part of their references, c = sum <g, r> / sum <r, r>, and the loosest tolerance among them
static double part_of_ref(const gcd_run_result *res, double *slack) {
    double gr = 0, rr = 0;
    *slack = 1e-6;
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (p->status != GCD_ST_MISMATCH || p->explained || p->ref_none) continue;
        gr += p->scale * p->ref_norm * p->ref_norm, rr += p->ref_norm * p->ref_norm, *slack = fmax(*slack, p->allowed);
    }
    return rr > 0 ? gr / rr : NAN;
}

// matched by its own tolerance (not only within measured noise), with a real reference
static int exact(const gcd_param_result *p) { return p->status == GCD_ST_OK && p->tol_source != GCD_TOL_MEASURED && p->ref_norm > 0; }

int gcd_own_slot_evidence(const gcd_verdict_ctx *v) {
    const gcd_run_result *res = v->res;
    if (!v->check || res->world < 2 || res->nondeterministic || res->batchnorm || res->no_ref) return 0;
    int nwrong = 0, after = 0;
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (p->status == GCD_ST_MISMATCH && !p->explained && !p->ref_none && p->cosine > 0 && isfinite(p->scale)) nwrong++;
        else if (exact(p)) after++;
        else if (!(p->status == GCD_ST_OK || (p->status == GCD_ST_NONE && p->ref_none))) return 0;   // another finding: another cause
    }
    double slack, c = part_of_ref(res, &slack);
    if (!nwrong || !(c * res->world >= 1 - slack && c < 1 - slack)) return 0;
    // the forward must be right: recorded losses, the ranks' mean the objective. A forward that differs is another
    // cause (a rank's temperature, a per-rank normalisation); parameters that match are no proof alone (a module some
    // ranks never used, averaged with zeros, leaves the others exact too)
    if (!res->loss_known || !(fabs(res->loss_mean - res->loss_ref) <= res->tol * fmax(1.0, fabs(res->loss_ref)))) return 0;
    return OWN_SLOT_LOSS | (after ? OWN_SLOT_AFTER : 0);
}

static int is_exact(const gcd_param_result *p, const void *arg) { (void)arg; return exact(p); }

void gcd_cause_own_slot(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    gcd_run_result *res = v->res;
    double clo = INFINITY, chi = -INFINITY, slo = INFINITY, shi = -INFINITY, slack, c = part_of_ref(res, &slack);
    int ev = gcd_own_slot_evidence(v);
    gcd_sb who = { 0 };
    int n = gcd_names_words(v, j->pick, NULL, &who, ids);
    for (int i = 0; i < res->nparam; i++) {
        gcd_param_result *p = &res->param[i];
        if (!j->pick(p, NULL)) continue;
        clo = fmin(clo, p->cosine), chi = fmax(chi, p->cosine), slo = fmin(slo, p->scale), shi = fmax(shi, p->scale);
    }
    gcd_sb_printf(m, "%s: wrong gradient%s like a gather whose backward keeps only this rank's slot gives (run's mode local: the other "
                     "ranks' gradients for this rank's rows are dropped, as lightly's GatherLayer before its fix, open_clip's "
                     "gather_with_grad=False without local_loss and torchmetrics >= 1.6's gather_all_tensors do): %s %d point%s along the "
                     "reference (cosine ", who.s, gcd_plural(n, "", "s"), gcd_plural(n, "the", "all"), n, gcd_plural(n, "s", ""));
    gcd_finding_range(m, clo, chi);
    gcd_sb_printf(m, ") and together hold %.3g of it (x", c);
    gcd_finding_range(m, slo, shi);
    gcd_sb_printf(m, " per tensor), while the forward is right (");
    if (ev & OWN_SLOT_LOSS) gcd_sb_printf(m, "the ranks' mean loss %.7g is the single-process objective %.7g%s", res->loss_mean, res->loss_ref, ev & OWN_SLOT_AFTER ? "; " : "");
    if (ev & OWN_SLOT_AFTER) {
        gcd_sb after = { 0 };
        int k = gcd_names_words(v, is_exact, NULL, &after, NULL);
        gcd_sb_printf(m, "%s %s the reference", after.s, gcd_plural(k, "matches", "match"));
        gcd_sb_free(&after);
    }
    gcd_sb_printf(m, "); gather with a backward that sums every rank's gradient for each slot: torch.distributed.nn.functional.all_gather "
                     "(Lightning's all_gather(sync_grads=True), gradcheck_dist.all_gather_with_grad)");
    gcd_sb_free(&who);
    gcd_finding_emit(res, "own_slot", 1, ids, m);
    for (int i = 0; i < res->nparam; i++) res->param[i].explained |= j->pick(&res->param[i], NULL);
}
