#include "guard/guard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "report/report.h"
#include "diagnose/verdict.h"
#include "guard/rows.h"

int gcd_guard_abi(void) { return GCD_GUARD_ABI; }

void gcd_guard_free(char *p) { free(p); }

// ----------------------------------------------------------------------------
// one parameter from its world rows

static const double *row(const double *summary, int nparam, int k, int rank, int i) {
    return summary + ((size_t)rank * nparam + i) * (size_t)(GCD_GUARD_COLS + k);
}

static void free_params(gcd_run_result *res) {
    for (int i = 0; i < res->nparam; i++) {
        gcd_param_result *p = &res->param[i];
        gcd_guard_param_free(p);
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
    const double **rows = gcd_malloc((size_t)world * sizeof *rows);
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
                free(rows);
                free_params(&res);
                return 2;
            }
        }
        for (int r = 0; r < world; r++) rows[r] = row(summary, nparam, k, r, i);
        gcd_guard_fill(p, &s, rows, world, k, sharded);
        if (!p->ran) {   // its module ran on no rank this step: no gradient is owed (a zero left by zero_grad neither)
            gcd_guard_param_free(p);
            memset(p, 0, sizeof *p);
            continue;
        }
        gcd_classify_sums(p, &s, world, tol);
        res.nparam++;
    }
    free(rows);
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
