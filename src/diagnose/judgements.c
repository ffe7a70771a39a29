#include "diagnose/findings.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The verdict's judgements, in the order their findings are written (the table at the end): one row
// is what it looks at (the run's condition `when`, the parameters `pick`), what it concludes (`kind`:
// a finding, or a "note" that counts as none), how many findings (`per`), and its words (`say`).
// Adding a judgement is adding a row. Each looks only at the numbers, never at a mode's or file's name.

typedef enum {
    PER_RUN,   // one finding about the run as a whole (no pick)
    PER_ALL,   // one finding naming every picked parameter (when any is picked)
    PER_ONE,   // one finding per picked parameter
    PER_OWN,   // the row's say walks the picked and writes its findings itself (causes.c)
} per_what;

typedef struct {
    const char *kind;                          // the finding's kind; "note": told, not a finding
    int (*when)(const gcd_verdict_ctx *v);     // the run's condition (NULL: always)
    gcd_pick_fn pick;                          // the parameters it looks at (PER_RUN: NULL)
    per_what per;
    // its words into m (and ids: PER_ALL and PER_ONE have them filled, PER_RUN may name some)
    void (*say)(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids);
} judgement;

// ----------------------------------------------------------------------------
// what the judgements look at: the run

static int in_check(const gcd_verdict_ctx *v) { return v->check; }
static int probe_world1(const gcd_verdict_ctx *v) { return v->res->world == 1 && !v->check; }
static int ran_batchnorm(const gcd_verdict_ctx *v) { return v->res->batchnorm != NULL; }
static int own_slot_like(const gcd_verdict_ctx *v) { return gcd_own_slot_evidence(v) != 0; }

static double mean_loss(const gcd_run_result *res, const double *loss) {
    double l = 0;
    for (int k = 0; k < res->world; k++) l += loss[k];
    return l / res->world;
}

// the distributed loss must equal the reference objective, or the gather is wrong
static int forward_differs(const gcd_verdict_ctx *v) {
    const gcd_run_result *res = v->res;
    return res->loss && fabs(mean_loss(res, res->loss) - res->ref_loss) > res->tol * fmax(1.0, fabs(res->ref_loss));
}

// check: the ranks' mean loss (gradcheck.loss) is not the reference's objective while some gradient is wrong (neither
// the reference nor a multiple of it): the ranks together computed another objective. Not where the step drew
// random masks or normalised with per-rank batch statistics (their own findings say so)
static int is_wrong(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_MISMATCH && !p->explained; }
static int objective_differs(const gcd_verdict_ctx *v) {
    const gcd_run_result *res = v->res;
    if (!v->check || !res->loss_known || res->nondeterministic || res->batchnorm || res->no_ref) return 0;
    double tol = fmax(1e-4, 10 * res->tol) * fmax(1e-30, fabs(res->loss_ref));
    return fabs(res->loss_mean - res->loss_ref) > tol && gcd_names_count(res, is_wrong, NULL) > 0;
}

// the first step whose loss is not finite on some rank (-1: none)
static int diverged_at(const gcd_run_result *res) {
    for (int s = 0; s < res->nloss; s++)
        for (int k = 0; k < res->world; k++)
            if (!isfinite(res->loss[(size_t)s * res->world + k])) return s;
    return -1;
}

static int nonfinite_params(const gcd_run_result *res) {
    int n = 0;
    for (int i = 0; i < res->nparam; i++) n += !isfinite(res->param[i].moved);
    return n;
}

static int diverged(const gcd_verdict_ctx *v) { return v->res->steps > 0 && (diverged_at(v->res) >= 0 || nonfinite_params(v->res)); }

// the ranks' mean loss at the first and the last step (each rank's term over world, summed)
static void loss_ends(const gcd_run_result *res, double *l0, double *l1) {
    const double *first = res->loss, *last = res->loss + (size_t)(res->nloss - 1) * res->world;
    *l0 = *l1 = 0;
    for (int k = 0; k < res->world; k++) *l0 += first[k] / res->world, *l1 += last[k] / res->world;
}

static int loss_moved(const gcd_verdict_ctx *v) {
    double l0, l1;
    if (!(v->res->steps > 0)) return 0;
    loss_ends(v->res, &l0, &l1);
    return l1 != l0;
}

static int insensitive(const gcd_verdict_ctx *v) {
    return v->loosest && (v->res->nondeterministic || v->res->sensitivity > GCD_INSENSITIVE);
}

static int many_mismatches(const gcd_verdict_ctx *v);

// ----------------------------------------------------------------------------
// what the judgements look at: the parameters

// None in .grad on every rank while the wrapper's own buffer (main_grad) was filled: kept there, not cut
static int none_held(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_NONE && p->held_filled > 0; }
static int none_real(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_NONE && !p->ref_none && !p->held_filled; }
static int ran_none(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_NONE && p->ref_none && p->ran && !p->held_filled; }
static int none_in_ref(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_NONE && p->ref_none && !p->ran && !p->held_filled; }
static int held_empty(const gcd_param_result *p, const void *arg) { return none_real(p, arg) && p->held_attr; }
static int with_grad(const gcd_param_result *p, const void *arg) { (void)arg; return p->status != GCD_ST_NONE; }
static int grad_somewhere(const gcd_param_result *p, const void *arg) { return with_grad(p, arg) || none_held(p, arg); }   // in .grad, or in main_grad
static int stuck(const gcd_param_result *p, const void *arg) { (void)arg; return !p->moved_any; }
static int measured_ok(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_OK && p->tol_source == GCD_TOL_MEASURED; }
static int local_cut(const gcd_param_result *p, const void *arg) { (void)arg; return p->local_has && p->local_nhave < p->nhave && p->status != GCD_ST_NONE; }
static int grouped_mismatch(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_MISMATCH && !p->ref_none && !p->explained; }
static int mismatch_alone(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_MISMATCH && !p->grouped && !p->explained; }
static int batchnorm_differs(const gcd_param_result *p, const void *arg) {
    (void)arg;
    return (p->status == GCD_ST_MISMATCH || p->status == GCD_ST_UNDECIDED) && !p->explained && !p->ref_none;
}
#define STATUS_PICK(fn, st) \
    static int fn(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == st && !p->explained; }
STATUS_PICK(is_partial, GCD_ST_PARTIAL)
STATUS_PICK(is_zero, GCD_ST_ZERO)
STATUS_PICK(is_nonfinite, GCD_ST_NONFINITE)
static int is_disagree(const gcd_param_result *p, const void *arg) {
    (void)arg;
    return p->status == GCD_ST_DISAGREE && !p->explained && p->tp_split != 2 && (p->stage_cause == GCD_SC_NONE || p->stage_cause == GCD_SC_OTHER);
}
#define CAUSE_PICK(fn, sc) \
    static int fn(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_DISAGREE && !p->explained && p->stage_cause == sc; }
CAUSE_PICK(unreduced, GCD_SC_UNREDUCED)
CAUSE_PICK(last_unsynced, GCD_SC_LAST_UNSYNCED)
CAUSE_PICK(part_own, GCD_SC_PART)
static int tp_copies(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_DISAGREE && !p->explained && p->tp_split == 2; }
STATUS_PICK(is_scaled, GCD_ST_SCALED)
STATUS_PICK(is_undecided, GCD_ST_UNDECIDED)
// ok by its own tolerance; those ok only within their measured noise are measured_ok's (their error says nothing)
static int is_ok(const gcd_param_result *p, const void *arg) {
    (void)arg;
    return p->status == GCD_ST_OK && !p->explained && p->tol_source != GCD_TOL_MEASURED;
}
STATUS_PICK(is_present, GCD_ST_PRESENT)

static int many_mismatches(const gcd_verdict_ctx *v) { return gcd_names_count(v->res, grouped_mismatch, NULL) > GCD_MISMATCH_GROUPS; }

// ----------------------------------------------------------------------------
// their words

static void say_forward(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)j, (void)ids;
    gcd_sb_printf(m, "the ranks' mean loss %.9g differs from the single-process objective %.9g: the forward itself is wrong",
                  mean_loss(v->res, v->res->loss), v->res->ref_loss);
}

static void say_objective(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)j, (void)ids;
    gcd_sb_printf(m, "the ranks' mean loss %.7g is not the single-process objective %.7g (gradcheck.loss), and %d gradient%s "
                     "neither the reference nor a multiple of it: the ranks together computed another objective. Likely a loss "
                     "normalised by each rank's own count (a per-rank token or sample mean where the global mean is meant: with "
                     "unequal counts the ranks' mean is not the mean over the world), or a forward that differs on some ranks. Fix: "
                     "divide the rank's summed loss by the world's count (all_reduce the count) times the world, as DDP averages, and "
                     "give check_ddp reference= that objective; if the per-rank objective is meant, give it as reference=",
                  v->res->loss_mean, v->res->loss_ref, gcd_names_count(v->res, is_wrong, NULL),
                  gcd_plural(gcd_names_count(v->res, is_wrong, NULL), " is", "s are"));
    if (v->res->accumulate > 1)   // the step ran as micro-batches: their own counts are as likely
        gcd_sb_printf(m, ". Under gradient accumulation (%d micro-batches a rank), a loss normalised by each micro-batch's own "
                         "count reads the same (a micro-batch mean divided by the steps where the mean over the whole accumulated "
                         "batch is meant: HF Trainer before num_items_in_batch): before the loop count the tokens of the whole "
                         "step, every micro-batch on every rank (all_reduce the count), divide each micro-batch's summed loss by it "
                         "and multiply by the world (DDP averages), without dividing by the steps; give check_ddp that loss times "
                         "K and reference= the mean over the whole batch (docs/python.md: HF's num_items_in_batch)", v->res->accumulate);
}

static void say_none(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {   // None on every rank where the reference has one (or there is none to ask)
    (void)ids;
    const gcd_run_result *res = v->res;
    int n = j->n, have = gcd_names_count(res, grad_somewhere, NULL), check = v->check;
    gcd_sb others = { 0 };
    gcd_names_words(v, grad_somewhere, NULL, &others, NULL);
    if (have == 0) gcd_sb_printf(m, "no parameter receives a gradient on any rank (None): nothing is learned");
    else if (have < res->nparam / 2 + 1 && have < n)
        gcd_sb_printf(m, "only %d of %d parameters %s a gradient: %s; %s %s None on every rank%s", have, res->nparam,
                      gcd_plural(have, "receives", "receive"), others.s, j->names, gcd_plural(n, "gets", "get"),
                      check ? "" : ": the gather detached everything before it");
    else {
        gcd_sb_printf(m, "%s %s no gradient on any rank (None)", j->names, gcd_plural(n, "receives", "receive"));
        if (res->guard) gcd_sb_printf(m, " of ranks 0-%d", res->world - 1);
        gcd_sb_printf(m, "; %s %s one", others.s, gcd_plural(have, "still gets", "still get"));
    }
    if (check && !res->no_ref)   // the reference has them: cut on the way
        gcd_sb_printf(m, "; %s has a gradient for %s: something between %s and the loss cut the graph "
                         "(a gather under no_grad, such as Lightning's all_gather(sync_grads=False); a plain torch.distributed.all_gather, "
                         "which has no autograd: use torch.distributed.nn.functional.all_gather; or a detach())",
                      gcd_ref_words(res), gcd_plural(n, "it", "them"), gcd_plural(n, "it", "them"));
    int empty = gcd_names_count(res, held_empty, NULL);
    if (empty) {   // a wrapper's buffer was recorded, and it is zero: no gradient reached it either
        gcd_sb held = { 0 };
        gcd_names_words(v, held_empty, NULL, &held, NULL);
        gcd_sb_printf(m, "; the wrapper's own buffer of %s is recorded and zero on every rank: no gradient reached it either", held.s);
        gcd_sb_free(&held);
    }
    gcd_sb_free(&others);
}

// None in .grad on every rank, and the dumps record the wrapper's own buffer filled (gradcheck.held)
static void say_held(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    const gcd_run_result *res = v->res;
    const gcd_param_result *p = NULL;
    double most = 0;
    int all = 1;
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *q = &res->param[i];
        if (!none_held(q, NULL)) continue;
        p = p ? p : q;
        most = fmax(most, q->held_norm), all &= q->held_filled >= res->world;
    }
    gcd_sb_printf(m, "%s %s no gradient in .grad on any rank (None), but the dumps record %s %s filled on %s (norm up to %.3g): "
                     "nothing cut the graph: the gradients are in the wrapper's own buffer (%s), never copied to .grad: dump or step "
                     "from %s, or let the wrapper copy them back to .grad before the check",
                  j->names, gcd_plural(j->n, "gets", "get"), gcd_plural(j->n, "its", "their"), p->held_attr,
                  all ? "every rank" : "some ranks", most, p->held_attr, p->held_attr);
}

static void say_ran_none(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {   // None everywhere, reference included, though its module ran
    (void)ids;
    int n = j->n;
    gcd_sb_printf(m, "%s %s in the forward (the dumps recorded %s module's forward) but %s no gradient on any rank nor in "
                     "%s: something cut %s from the loss in both: torch.utils.checkpoint(use_reentrant=True) "
                     "over inputs that do not require grad (use use_reentrant=False), a torch.no_grad() block, or a detach(); or "
                     "the output is computed and never used by the loss (then freeze %s, requires_grad_(False), or --ignore %s)",
                  j->names, "ran", gcd_plural(n, "its", "their"), gcd_plural(n, "gets", "get"), gcd_ref_words(v->res), gcd_plural(n, "it", "them"),
                  gcd_plural(n, "it", "them"), gcd_plural(n, "it", "them"));
}

static void say_none_in_ref(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {   // the model's, not the distribution's
    (void)ids;
    gcd_sb_printf(m, "%s %s no gradient on any rank nor in %s: unused by the loss, not a "
                     "distributed-training defect (--ignore %s to leave %s out)",
                  j->names, gcd_plural(j->n, "has", "have"), gcd_ref_words(v->res), gcd_plural(j->n, "it", "them"), gcd_plural(j->n, "it", "them"));
}

static void say_partial(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    const gcd_param_result *p = j->p;
    gcd_sb_printf(m, "%s has a gradient on %d of %d ranks; None on rank%s ", p->name, p->nhave, v->res->world,
                  gcd_plural(v->res->world - p->nhave, "", "s"));
    gcd_ranks_list(m, p->has, 0, v->res->world);
}

static void say_zero(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    gcd_sb_printf(m, "%s", j->names);
    if (!v->res->no_ref) gcd_sb_printf(m, " %s a gradient of exactly zero where the reference's is not", gcd_plural(j->n, "gets", "get"));
    else gcd_sb_printf(m, " %s a gradient of exactly zero on every rank that has one", gcd_plural(j->n, "gets", "get"));
    if (v->res->guard) gcd_sb_printf(m, " (ranks 0-%d)", v->res->world - 1);
}

static void say_nonfinite(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    const gcd_param_result *p = j->p;
    if (p->rank_nonfinite) {
        gcd_sb_printf(m, "%s: NaN or infinite gradient values", p->name);
        for (int k = 0, c = 0; k < v->res->world; k++)
            if (p->rank_nonfinite[k])
                gcd_sb_printf(m, "%s on rank %d: %ld of %zu (first at index %ld)", c++ ? ";" : "", k, p->rank_nonfinite[k], p->n,
                              p->rank_first_nonfinite[k]);
    } else {
        gcd_sb_printf(m, "%s: %ld of %zu gradient values are NaN or infinite (first at index %ld)", p->name, p->nonfinite, p->n,
                      p->first_nonfinite);
    }
}

static void say_against_ref(const gcd_run_result *res, const gcd_param_result *p, gcd_sb *m);

// of the parameters a judgement picked, the one whose ranks differ most
static const gcd_param_result *most_different(const gcd_run_result *res, const gcd_judged *j) {
    const gcd_param_result *worst = NULL;
    for (int i = 0; i < res->nparam; i++)
        if (j->pick(&res->param[i], NULL) && (!worst || res->param[i].diff_rel > worst->diff_rel)) worst = &res->param[i];
    return worst;
}

static void say_disagree(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    const gcd_run_result *res = v->res;
    const gcd_param_result *worst = most_different(res, j);
    gcd_sb_printf(m, "%s %s different gradients on different ranks after %s, where every rank must hold the same: ", j->names,
                  gcd_plural(j->n, "holds", "hold"), gcd_reducer_words(res->wrapper));
    if (j->n > 1) gcd_sb_printf(m, "%s differs most, ", worst->name);
    gcd_sb_printf(m, "by up to %.3g (relative %.3g) between rank %d and rank", worst->max_diff, worst->diff_rel,
                  worst->diff_base >= 0 ? worst->diff_base : worst->first);
    int nd = 0;
    for (int k = 0; k < res->world; k++) nd += worst->differs[k];
    gcd_sb_printf(m, "%s ", gcd_plural(nd, "", "s"));
    gcd_ranks_list(m, worst->differs, 1, res->world);
    gcd_sb_printf(m, " (a parameter outside DDP, a no_sync misuse, a gradient changed after the all-reduce, "
                     "torch.utils.checkpoint(use_reentrant=True) around code that runs more than once per step, or, in sharded "
                     "dumps, replicas of one shard (HSDP) that differ)");
    say_against_ref(res, worst, m);
}

// the disagreeing tensor against the reference: which ranks, if any, hold it
static void say_against_ref(const gcd_run_result *res, const gcd_param_result *p, gcd_sb *m) {
    if (!p->ref_rel || res->no_ref || !isfinite(p->ref_rel[0])) return;
    double ok = fmax(p->tol, isfinite(p->allowed) ? p->allowed : 0), lo = INFINITY, hi = 0;
    unsigned char *match = gcd_malloc((size_t)res->world);
    int n = 0;
    for (int k = 0; k < res->world; k++) {
        n += match[k] = p->ref_rel[k] <= ok;
        if (!match[k]) lo = fmin(lo, p->ref_rel[k]), hi = fmax(hi, p->ref_rel[k]);
    }
    gcd_sb_printf(m, "; against %s (%s): ", gcd_ref_words(res), p->name);
    if (n) {
        gcd_sb_printf(m, "rank%s ", gcd_plural(n, "", "s"));
        gcd_ranks_list(m, match, 1, res->world);
        gcd_sb_printf(m, " %s it", gcd_plural(n, "holds", "hold"));
        if (n < res->world) gcd_sb_printf(m, ", the other%s not", gcd_plural(res->world - n, "", "s"));
    } else {
        gcd_sb_printf(m, "no rank holds it (relative error ");
        gcd_finding_range(m, lo, hi);
        gcd_sb_printf(m, ")");
    }
    free(match);
}

// of the parameters a judgement picked, the largest of a per-parameter figure
static double most(const gcd_run_result *res, const gcd_judged *j, int split) {
    double x = 0;
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (!j->pick(p, NULL)) continue;
        for (int k = 0; !split && k < res->world; k++) x = fmax(x, p->own_rel[k]);
        if (split) x = fmax(x, p->split_rel);
    }
    return x;
}

// some picked parameter's local dumps hold a gradient accumulated before the last backward
static int accumulated(const gcd_run_result *res, const gcd_judged *j) {
    for (int i = 0; i < res->nparam; i++)
        if (j->pick(&res->param[i], NULL) && res->param[i].accumulated) return 1;
    return 0;
}

static void say_unreduced(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    const gcd_run_result *res = v->res;
    int all = gcd_names_count(res, with_grad, NULL) == j->n;
    gcd_sb_printf(m, "%s: no all-reduce ran for %s: on every rank the gradient after %s is that rank's own local one, from before "
                     "it (relative difference %.2g at most), so the ranks hold different gradients",
                  j->names, gcd_plural(j->n, "it", "them"), gcd_reducer_words(res->wrapper), most(res, j, 0));
    say_against_ref(res, most_different(res, j), m);
    if (all && accumulated(res, j))
        gcd_sb_printf(m, ". No parameter was all-reduced, and the local dumps show backward calls before the last one (a gradient "
                         "accumulated before it: NAME@earlier): every backward of the accumulation ran unsynced, the last micro-batch's "
                         "forward inside model.no_sync() too (or with require_backward_grad_sync False), or the forward went around the "
                         "DDP wrapper (a method of model.module). Fix: run every micro-batch but the last, forward and backward, inside "
                         "model.no_sync(), and the last one outside it (or set model.require_backward_grad_sync = (i == K - 1) before "
                         "each forward); reach the model through model(...)");
    else if (all)
        gcd_sb_printf(m, ". No parameter was all-reduced: the forward went around the DDP wrapper (a method of model.module called "
                         "directly, e.g. model.module.loss(...)), or every backward of the step ran under no_sync(). Fix: call the "
                         "wrapper, model(...), and compute the loss from its output (or move that method into forward): DDP syncs "
                         "only the backward of its own forward call");
    else
        gcd_sb_printf(m, ". The other parameters were all-reduced: these are outside DDP (left out with "
                         "_ddp_params_and_buffers_to_ignore, or added to the model after it was wrapped), or their forward ran "
                         "around the wrapper (a submodule of model.module called directly). Fix: wrap the model once it is complete "
                         "and reach every parameter through model(...)");
}

static void say_last_unsynced(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    const gcd_run_result *res = v->res;
    gcd_sb_printf(m, "%s: the last backward of the gradient accumulation did not sync: on every rank the gradient after %s is the "
                     "mean over the ranks of what was accumulated before the last backward, plus that rank's own last backward "
                     "(relative difference %.2g at most), so the ranks hold different gradients",
                  j->names, gcd_reducer_words(res->wrapper), most(res, j, 1));
    say_against_ref(res, most_different(res, j), m);
    gcd_sb_printf(m, ". The last micro-batch ran under no_sync(), or require_backward_grad_sync was set after its forward (DDP "
                     "reads the flag in the forward: set after micro-batch i's forward, it decides micro-batch i+1's). Fix: "
                     "decide before each forward: model.require_backward_grad_sync = (i == K - 1), or every micro-batch but "
                     "the last, forward and backward, inside model.no_sync()");
}

static void say_part_own(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    const gcd_run_result *res = v->res;
    gcd_sb_printf(m, "%s: each rank's gradient after %s is part the ranks' mean and part its own: the ranks' gradients still "
                     "average to the mean of their local ones, yet each differs from that mean and from its own local one",
                  j->names, gcd_reducer_words(res->wrapper));
    say_against_ref(res, most_different(res, j), m);
    gcd_sb_printf(m, ". A backward that was not all-reduced added to one that was: usually the last backward of a gradient "
                     "accumulation that did not sync (no_sync() around it, or require_backward_grad_sync set after its forward: "
                     "DDP reads it in the forward), or torch.utils.checkpoint(use_reentrant=True) recomputing after DDP's "
                     "reduction. Fix: decide the sync before each forward, syncing the last micro-batch (the local dumps hold no "
                     "gradient from before the last backward, NAME@earlier from LocalGradCapture.mark(), that would say which)");
}

// rank k, and where it sits on the mesh: "rank 1 (dp 0, tp 1)"
static void say_rank_at(const gcd_run_result *res, gcd_sb *m, int k) {
    gcd_sb_printf(m, "rank %d", k);
    for (int i = 0; res->mesh_coords && i < res->mesh_nd; i++)
        gcd_sb_printf(m, "%s%s %d%s", i ? ", " : " (", res->mesh_names[i][0] ? res->mesh_names[i] : "dim", res->mesh_coords[k * res->mesh_nd + i],
                      i == res->mesh_nd - 1 ? ")" : "");
}

static void say_tp_copies(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    const gcd_run_result *res = v->res;
    const gcd_param_result *worst = most_different(res, j);
    int base = worst->diff_base >= 0 ? worst->diff_base : worst->first, nd = 0;
    gcd_sb_printf(m, "%s: replicated across the tensor-parallel ranks, but the copies differ: a partial sum never all-reduced "
                     "(e.g. a sequence-parallel norm): ", j->names);
    if (j->n > 1) gcd_sb_printf(m, "%s differs most, ", worst->name);
    for (int k = 0; k < res->world; k++)
        if (worst->differs[k] && k != base) {
            gcd_sb_printf(m, "%s", nd++ ? ", " : "");
            say_rank_at(res, m, k);
        }
    gcd_sb_printf(m, " against ");
    say_rank_at(res, m, base);
    gcd_sb_printf(m, " by up to %.3g (relative %.3g)", worst->max_diff, worst->diff_rel);
}

static void say_mismatch(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    const gcd_param_result *p = j->p;
    if (p->ref_none) gcd_sb_printf(m, "%s: the ranks have a gradient but %s has none (None)", p->name, gcd_ref_words(v->res));
    else if (p->n == 1 && p->scale > 0)
        gcd_sb_printf(m, "%s: wrong value: %.6g times the reference's (one value: its ratio is no evidence of a scale factor, and no "
                         "other gradient shows it)", p->name, p->scale);
    else if (p->scale < 0 && fabs(p->scale + 1) <= fmax(0.05, p->allowed) && p->cosine <= -0.95)
        gcd_sb_printf(m, "%s: negated: the reference x-1 (cosine %.3g): a gradient subtracted where it is added, or a loss with the "
                         "wrong sign", p->name, p->cosine);
    else if (p->scale <= 0)
        gcd_sb_printf(m, "%s: wrong gradient, pointing away from the reference (scale %.3g, cosine %.3g, relative error %.3g)", p->name,
                      p->scale, p->cosine, p->rel_err);
    else
        gcd_sb_printf(m, "%s: wrong gradient, neither the reference nor a multiple of it: relative error %.3g, cosine %.3g", p->name,
                      p->rel_err, p->cosine);
}

static void say_undecided(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)v, (void)ids;
    gcd_sb_printf(m, "%s cannot be judged from one reference: %s from it by no more than rounding noise does where a true gradient is "
                     "about zero, and not in its direction; give a second reference computed in another order (rows permuted: "
                     "check_ddp does; check DUMPS --ref A --ref B) to measure %s noise", j->names,
                  gcd_plural(j->n, "it differs", "they differ"), gcd_plural(j->n, "its", "their"));
}

static void say_diverged(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {   // a loss or a parameter that stopped being a number
    (void)j, (void)ids;
    const gcd_run_result *res = v->res;
    int at = diverged_at(res), bad_params = nonfinite_params(res);
    if (at >= 0) gcd_sb_printf(m, "training diverged: the loss is not finite from step %d of %d (lr %g)", at + 1, res->steps, res->lr);
    else gcd_sb_printf(m, "training diverged: the loss stayed finite, but parameters did not (lr %g)", res->lr);
    if (bad_params) gcd_sb_printf(m, "; %d of %d parameters hold NaN or infinite values at the end", bad_params, res->nparam);
}

static void say_learning_stopped(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    double l0, l1;
    loss_ends(v->res, &l0, &l1);
    gcd_sb_printf(m, "learning stopped: the loss went %.6g -> %.6g over %d steps while %s never moved (bit-identical to the start)", l0, l1,
                  v->res->steps, j->names);
}

static void say_ok(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    const gcd_run_result *res = v->res;
    double worst = 0;
    for (int i = 0; i < res->nparam; i++)
        if (is_ok(&res->param[i], NULL) && res->param[i].rel_err > worst) worst = res->param[i].rel_err;
    if (j->n == res->nparam) gcd_sb_printf(m, "every parameter matches %s (max relative error %.2g)", gcd_ref_words(res), worst);
    else gcd_sb_printf(m, "%s %s the reference (max relative error %.2g)", j->names, gcd_plural(j->n, "matches", "match"), worst);
}

static void say_measured_ok(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)v, (void)ids;
    gcd_sb_printf(m, "%s %s within %g x %s measured noise (what the two references differ by) and not correlated with the reference: "
                     "rounding noise, judged ok (%s own relative error says nothing where the true gradient is about zero)",
                  j->names, gcd_plural(j->n, "is", "are"), GCD_NOISE_K, gcd_plural(j->n, "its", "their"), gcd_plural(j->n, "its", "their"));
}

static void say_insensitive(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)j;
    const gcd_run_result *res = v->res;
    const gcd_param_result *loosest = v->loosest;
    gcd_sb_printf(ids, "%s", loosest->name);
    gcd_sb_printf(m, "insensitive: this check accepted differences of up to %.3g relative (%s, %s)", res->sensitivity, loosest->name,
                  loosest->tol_source == GCD_TOL_MEASURED ? "its measured noise" : "its tolerance");
    if (res->nondeterministic)
        gcd_sb_printf(m, "; the step ran layers that draw random numbers (%s): the ranks and the reference draw different masks, so "
                         "their noise hides real errors; put them in eval mode (or p=0) for the check", res->nondeterministic);
    else gcd_sb_printf(m, ": an error smaller than that there could not have been seen");
}

static void say_present(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)ids;
    if (v->res->guard) {   // the guard has no reference by design: what it saw is that the ranks agree
        gcd_sb_printf(m, "%s %s a finite, non-zero gradient on every rank, the same on ranks 0-%d after the reduce", j->names,
                      gcd_plural(j->n, "has", "have"), v->res->world - 1);
        return;
    }
    gcd_sb_printf(m, "%s %s a finite, non-zero gradient%s; no reference (--ref) to compare %s values with", j->names,
                  gcd_plural(j->n, "has", "have"), v->res->world > 1 ? " on every rank" : "", gcd_plural(j->n, "its", "their"));
}

static void say_world1(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids) {
    (void)v, (void)j, (void)ids;
    gcd_sb_printf(m, "world 1: a one-rank process group still detaches under sync_grads=False; putting the rank's own rows back "
                     "and averaging are exact here (1/world = 1), so their defects appear only with world > 1");
}

// ----------------------------------------------------------------------------
// the table: the causes first, then the defects, then what the check could and could not see

static const judgement judgements[] = {
    // kind               when              pick                per      say
    { "forward",          forward_differs,  NULL,               PER_RUN, say_forward },
    { "local_none",       in_check,         local_cut,          PER_OWN, gcd_cause_stage },   // or a note where the result still matches
    { "held",             NULL,             none_held,          PER_ALL, say_held },
    { "none",             NULL,             none_real,          PER_ALL, say_none },
    { "ran_none",         NULL,             ran_none,           PER_ALL, say_ran_none },
    { "note",             NULL,             none_in_ref,        PER_ALL, say_none_in_ref },
    { "partial",          NULL,             is_partial,         PER_ONE, say_partial },
    { "zero",             NULL,             is_zero,            PER_ALL, say_zero },
    { "nonfinite",        NULL,             is_nonfinite,       PER_ONE, say_nonfinite },
    { "disagree",         NULL,             tp_copies,          PER_ALL, say_tp_copies },
    { "disagree",         NULL,             unreduced,          PER_ALL, say_unreduced },
    { "disagree",         NULL,             last_unsynced,      PER_ALL, say_last_unsynced },
    { "disagree",         NULL,             part_own,           PER_ALL, say_part_own },
    { "disagree",         NULL,             is_disagree,        PER_ALL, say_disagree },
    { "scaled",           NULL,             is_scaled,          PER_OWN, gcd_cause_scaled },   // one per distinct scale
    { "mismatch",         objective_differs, NULL,              PER_RUN, say_objective },   // before the tensors it explains
    { "own_slot",         own_slot_like,    grouped_mismatch,   PER_OWN, gcd_cause_own_slot },   // one finding for the cause
    { "mismatch",         ran_batchnorm,    batchnorm_differs,  PER_OWN, gcd_cause_batchnorm },
    { "mismatch",         many_mismatches,  grouped_mismatch,   PER_OWN, gcd_cause_mismatch_groups },
    { "mismatch",         NULL,             mismatch_alone,     PER_ONE, say_mismatch },
    { "undecided",        NULL,             is_undecided,       PER_ALL, say_undecided },
    { "diverged",         diverged,         NULL,               PER_RUN, say_diverged },
    { "learning_stopped", loss_moved,       stuck,              PER_ALL, say_learning_stopped },
    { "note",             NULL,             is_ok,              PER_ALL, say_ok },
    { "note",             NULL,             measured_ok,        PER_ALL, say_measured_ok },
    { "note",             insensitive,      NULL,               PER_RUN, say_insensitive },
    { "note",             NULL,             is_present,         PER_ALL, say_present },
    { "note",             probe_world1,     NULL,               PER_RUN, say_world1 },
};

// a guarded step's findings open with the step (the ranks are in their words)
static void step_words(const gcd_verdict_ctx *v, gcd_sb *m) {
    if (v->res->guard) gcd_sb_printf(m, "step %lld: ", v->res->guard_step);
}

// one row's findings
static void judge(const gcd_verdict_ctx *v, const judgement *row, gcd_sb *m, gcd_sb *ids) {
    gcd_run_result *res = v->res;
    int counts = strcmp(row->kind, "note") != 0;
    gcd_judged j = { .pick = row->pick };
    if (row->per == PER_RUN || row->per == PER_OWN) {
        if (row->per == PER_RUN) step_words(v, m);
        row->say(v, &j, m, ids);
        if (row->per == PER_RUN) gcd_finding_emit(res, row->kind, counts, ids, m);
    } else if (row->per == PER_ALL) {
        gcd_sb names = { 0 };
        if (!(j.n = gcd_names_count(res, row->pick, NULL))) return;
        gcd_names_words(v, row->pick, NULL, &names, ids);
        j.names = names.s;
        step_words(v, m);
        row->say(v, &j, m, ids);
        gcd_finding_emit(res, row->kind, counts, ids, m);
        gcd_sb_free(&names);
    } else {
        for (int i = 0; i < res->nparam; i++) {
            if (!row->pick(&res->param[i], NULL)) continue;
            j.p = &res->param[i];
            gcd_sb_printf(ids, "%s", j.p->name);
            step_words(v, m);
            row->say(v, &j, m, ids);
            gcd_finding_emit(res, row->kind, counts, ids, m);
        }
    }
}

void gcd_judgements_run(const gcd_verdict_ctx *v) {
    gcd_sb m = { 0 }, ids = { 0 };
    for (size_t r = 0; r < sizeof judgements / sizeof judgements[0]; r++)
        if (!judgements[r].when || judgements[r].when(v)) judge(v, &judgements[r], &m, &ids);
    gcd_sb_free(&m), gcd_sb_free(&ids);
}
