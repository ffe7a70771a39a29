#include "guard/guard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "report/report.h"
#include "diagnose/verdict.h"

int gcd_guard_abi(void) { return GCD_GUARD_ABI; }

void gcd_guard_free(char *p) { free(p); }

// ----------------------------------------------------------------------------
// one parameter from its world rows

static const double *row(const double *summary, int nparam, int k, int rank, int i) {
    return summary + ((size_t)rank * nparam + i) * (size_t)(GCD_GUARD_COLS + k);
}

// ||a - b|| / sqrt(k): the sketch's estimate of the distance between the two gradients (E[s_j^2] = ||g||^2)
static double sketch_dist(const double *a, const double *b, int k) {
    double ss = 0;
    for (int j = 0; j < k; j++) ss += (a[j] - b[j]) * (a[j] - b[j]);
    return sqrt(ss / k);
}

// Sharded: every rank's piece is part of one gradient: norms combine as the root of the sum of squares, the
// non-finite counts add, nothing is compared. Replicated: rank first's gradient is g; every other rank with
// one must hold the same, within tol (relative to ||g||) both by its sketch and by its norm.
static void fill(gcd_param_result *p, gcd_sums *s, const double *summary, int world, int nparam, int k, int i, int sharded) {
    p->has = gcd_malloc((size_t)world);
    p->differs = gcd_malloc((size_t)world);
    p->rank_norm = gcd_malloc((size_t)world * sizeof *p->rank_norm);
    p->rank_nonfinite = gcd_malloc((size_t)world * sizeof *p->rank_nonfinite);
    p->rank_first_nonfinite = gcd_malloc((size_t)world * sizeof *p->rank_first_nonfinite);
    p->first = p->diff_base = -1;
    p->max_diff = p->diff_rel = 0;
    double ss = 0;
    for (int r = 0; r < world; r++) {
        const double *x = row(summary, nparam, k, r, i);
        p->has[r] = x[GCD_GUARD_PRESENT] != 0;
        p->ran |= x[GCD_GUARD_RAN] != 0;
        p->rank_norm[r] = p->has[r] ? x[GCD_GUARD_NORM] : NAN;
        p->rank_nonfinite[r] = p->has[r] ? (long)x[GCD_GUARD_NONFINITE] : 0;
        p->rank_first_nonfinite[r] = p->rank_nonfinite[r] ? (long)x[GCD_GUARD_FIRST_NONFINITE] : -1;
        if (!p->has[r]) continue;
        p->nhave++;
        s->nonfinite += p->rank_nonfinite[r];
        if (p->rank_nonfinite[r] && s->first_nonfinite < 0) s->first_nonfinite = p->rank_first_nonfinite[r];
        if (p->first < 0) p->first = r;
        if (sharded) ss += x[GCD_GUARD_NORM] * x[GCD_GUARD_NORM];
    }
    if (p->first < 0) return;
    const double *g = row(summary, nparam, k, p->first, i);
    double norm = sharded ? sqrt(ss) : g[GCD_GUARD_NORM];
    s->gg = norm * norm;
    s->allzero = norm == 0;
    if (sharded || s->nonfinite) return;   // a NaN differs from everything: non-finite comes first
    p->diff_base = p->first;
    for (int r = p->first + 1; r < world; r++) {
        if (!p->has[r]) continue;
        const double *x = row(summary, nparam, k, r, i);
        double d = fmax(sketch_dist(x + GCD_GUARD_COLS, g + GCD_GUARD_COLS, k), fabs(x[GCD_GUARD_NORM] - norm));
        double rel = norm > 0 ? d / norm : (d > 0 ? INFINITY : 0);
        p->max_diff = fmax(p->max_diff, d);
        p->diff_rel = fmax(p->diff_rel, rel);
        p->differs[r] = rel > p->tol;
    }
}

static void free_params(gcd_run_result *res) {
    for (int i = 0; i < res->nparam; i++) {
        gcd_param_result *p = &res->param[i];
        free(p->has), free(p->differs), free(p->rank_norm), free(p->rank_nonfinite), free(p->rank_first_nonfinite);
    }
    free(res->param);
    for (int i = 0; i < res->nfinding; i++) free(res->finding[i].params), free(res->finding[i].message);
    free(res->finding);
}

// the ranks a finding points at: without the gradient, holding a different one, non-finite values, or zeros
static cJSON *ranks_named(const gcd_run_result *res) {
    unsigned char *named = gcd_malloc((size_t)res->world);
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (p->status == GCD_ST_PRESENT) continue;
        for (int r = 0; r < res->world; r++)   // a zero: every rank that holds it (none holds anything else)
            named[r] |= !p->has[r] || p->differs[r] || p->rank_nonfinite[r] || (p->status == GCD_ST_ZERO && p->has[r]);
    }
    cJSON *a = cJSON_CreateArray();
    for (int r = 0; a && r < res->world; r++)
        if (named[r]) cJSON_AddItemToArray(a, cJSON_CreateNumber(r));
    free(named);
    return a;
}

// ----------------------------------------------------------------------------

int gcd_guard_judge(const double *summary, int world, int nparam, int k, const char *const *names, const int *ndim,
                    const long long *shape, long long step, int every, double tol,
                    const char *report, char **json, char *err, size_t errlen) {
    *json = NULL;
    if (!summary || !names || !ndim || !shape || world < 1 || nparam < 0 || k < 1 || !(tol > 0)) {
        snprintf(err, errlen, "guard: bad arguments (world %d, %d parameters, sketch %d, tol %g)", world, nparam, k, tol);
        return 2;
    }
    for (int i = 0; i < nparam; i++)
        if (ndim[i] < 0 || ndim[i] > GCD_PARAM_MAX_DIM || !names[i]) {
            snprintf(err, errlen, "guard: parameter %d (%s): %d dimensions, at most %d", i, names[i] ? names[i] : "?", ndim[i],
                     GCD_PARAM_MAX_DIM);
            return 2;
        }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    gcd_run_result res = { 0 };
    res.probe = "check";
    res.world = world;
    res.tol = tol;
    res.no_ref = res.classified = res.guard = 1;
    res.guard_step = step;
    res.sensitivity = NAN;
    res.param = gcd_malloc((size_t)(nparam ? nparam : 1) * sizeof *res.param);
    for (int i = 0; i < nparam; i++) {
        gcd_param_result *p = &res.param[res.nparam];
        gcd_sums s;
        gcd_sums_init(&s, 0);
        p->name = names[i];
        p->ndim = ndim[i];
        p->n = 1;
        for (int d = 0; d < ndim[i]; d++) p->shape[d] = (int)shape[(size_t)i * GCD_PARAM_MAX_DIM + d], p->n *= (size_t)p->shape[d];
        p->tol = tol;
        p->tol_source = GCD_TOL_GIVEN;
        int sharded = 0;
        for (int r = 0; r < world; r++) {
            const double *x = row(summary, nparam, k, r, i);
            sharded |= x[GCD_GUARD_SHARDED] != 0;
            if (x[GCD_GUARD_NAME] != row(summary, nparam, k, 0, i)[GCD_GUARD_NAME]) {
                snprintf(err, errlen, "guard: rank %d lists another parameter than rank 0 (%s) at position %d: every rank must "
                         "summarise the same parameters in the same order", r, names[i], i);
                free(p->has), free(p->differs), free(p->rank_norm), free(p->rank_nonfinite), free(p->rank_first_nonfinite);
                free_params(&res);
                return 2;
            }
        }
        fill(p, &s, summary, world, nparam, k, i, sharded);
        if (!p->ran) {   // its module ran on no rank this step: no gradient is owed (a zero left by zero_grad neither)
            free(p->has), free(p->differs), free(p->rank_norm), free(p->rank_nonfinite), free(p->rank_first_nonfinite);
            memset(p, 0, sizeof *p);
            continue;
        }
        gcd_classify_sums(p, &s, world, tol);
        res.nparam++;
    }
    gcd_verdict(&res);
    int code = gcd_run_has_finding(&res) ? 1 : 0;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    res.seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);

    gcd_env env = { .backend = "torch.distributed", .world = world };
    time_t now = time(NULL);
    struct tm tm;
    strftime(env.start_time, sizeof env.start_time, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    char arg[64];
    snprintf(arg, sizeof arg, "every=%d", every);
    char *argv[] = { "gradcheck_dist.guard", arg };
    cJSON *doc = gcd_report_new(2, argv, &env);
    cJSON *run = gcd_report_add_guard(doc, &res);
    cJSON *g = cJSON_AddObjectToObject(run, "guard");
    if (!g || !cJSON_AddNumberToObject(g, "step", (double)step) || !cJSON_AddNumberToObject(g, "every", every) ||
        !cJSON_AddNumberToObject(g, "sketch", k) || !cJSON_AddItemToObject(g, "ranks", ranks_named(&res)))
        GCD_FATAL("guard: cJSON out of memory");
    gcd_report_finish(doc, code, NULL, 0, res.seconds);
    *json = gcd_json_print(doc);
    if (report && *report && gcd_report_write(doc, report, err, errlen) != 0) code = 3;
    cJSON_Delete(doc);
    free_params(&res);
    return code;
}
