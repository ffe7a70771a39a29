#include "diagnose/findings.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// names in words: "a, b and c"; a whole group of three or more under one dotted prefix is "prefix.*"

int gcd_names_count(const gcd_run_result *res, gcd_pick_fn pick, const void *arg) {
    int n = 0;
    for (int i = 0; i < res->nparam; i++) n += pick(&res->param[i], arg);
    return n;
}

// The parameters sorted by name, built once per verdict: every name under a dotted prefix lies in one
// contiguous run of it, found by binary search, so naming a group costs O(log n), not a pass over all.
typedef struct {
    const char *name;
    int param;   // its index in res->param
} named;

static int by_name(const void *a, const void *b) {
    const named *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->param > y->param) - (x->param < y->param);
}

void gcd_names_index(gcd_verdict_ctx *v) {
    int np = v->res->nparam;
    named *all = gcd_malloc((size_t)(np ? np : 1) * sizeof *all);
    for (int i = 0; i < np; i++) all[i] = (named){ v->res->param[i].name, i };
    qsort(all, (size_t)np, sizeof *all, by_name);
    v->by_name = gcd_malloc((size_t)(np ? np : 1) * sizeof *v->by_name);
    for (int i = 0; i < np; i++) v->by_name[i] = all[i].param;
    free(all);
}

void gcd_names_index_free(gcd_verdict_ctx *v) {
    free(v->by_name);
    v->by_name = NULL;
}

void gcd_names_prefix_run(const gcd_verdict_ctx *v, const char *prefix, size_t k, int *lo, int *hi) {
    const gcd_param_result *P = v->res->param;
    int a = 0, b = v->res->nparam;
    while (a < b) {   // the first name >= prefix
        int m = a + (b - a) / 2;
        if (strncmp(P[v->by_name[m]].name, prefix, k) < 0) a = m + 1;
        else b = m;
    }
    *lo = a, b = v->res->nparam;
    while (a < b) {   // the first name past the prefix
        int m = a + (b - a) / 2;
        if (strncmp(P[v->by_name[m]].name, prefix, k) <= 0) a = m + 1;
        else b = m;
    }
    *hi = a;
}

// p's words: "prefix.*" where every name under one of its dotted prefixes (three or more) is picked
// (marked done), else its name
static gcd_sb name_or_group(const gcd_verdict_ctx *v, const gcd_param_result *p, const int *before, unsigned char *done) {
    gcd_sb w = { 0 };
    for (const char *dot = strchr(p->name, '.'); dot && !w.s; dot = strchr(dot + 1, '.')) {
        size_t k = (size_t)(dot - p->name) + 1;
        int lo, hi;
        gcd_names_prefix_run(v, p->name, k, &lo, &hi);
        int total = hi - lo, inside = before[hi] - before[lo];
        if (total != inside || total < 3) continue;
        gcd_sb_printf(&w, "%.*s*", (int)k, p->name);
        for (int j = lo; j < hi; j++) done[v->by_name[j]] = 1;
    }
    if (!w.s) gcd_sb_printf(&w, "%s", p->name);
    return w;
}

int gcd_names_words(const gcd_verdict_ctx *v, gcd_pick_fn pick, const void *arg, gcd_sb *out, gcd_sb *ids) {
    enum { SHOWN = 12 };
    const gcd_run_result *res = v->res;
    int n = 0, shown = 0, hidden = 0, np = res->nparam;
    unsigned char *done = gcd_malloc((size_t)np + 1), *picked = gcd_malloc((size_t)np + 1);
    int *before = gcd_malloc(((size_t)np + 1) * sizeof *before);   // picked among the first j sorted names
    for (int i = 0; i < np; i++) n += picked[i] = (unsigned char)(pick(&res->param[i], arg) != 0);
    before[0] = 0;
    for (int j = 0; j < np; j++) before[j + 1] = before[j] + picked[v->by_name[j]];
    gcd_sb words[SHOWN] = { { 0 } };
    for (int i = 0; i < np; i++) {
        const gcd_param_result *p = &res->param[i];
        if (!picked[i]) continue;
        if (ids) gcd_sb_printf(ids, "%s%s", ids->len ? "," : "", p->name);
        if (done[i]) continue;
        gcd_sb w = name_or_group(v, p, before, done);
        if (shown < SHOWN) words[shown++] = w;
        else hidden++, gcd_sb_free(&w);
    }
    for (int i = 0; i < shown; i++) {
        const char *sep = i == 0 ? "" : (i == shown - 1 && !hidden ? " and " : ", ");
        gcd_sb_printf(out, "%s%s", sep, words[i].s);
        gcd_sb_free(&words[i]);
    }
    if (hidden) gcd_sb_printf(out, " and %d more (the report lists them all)", hidden);
    if (!out->s) gcd_sb_printf(out, "%s", "");
    free(done), free(picked), free(before);
    return n;
}

const char *gcd_reducer_words(const char *wrapper) {
    static const char *const words[][2] = { { "ddp", "DDP's all-reduce" }, { "fsdp", "FSDP's reduce-scatter" },
                                            { "fsdp2", "FSDP2's reduce-scatter (fully_shard)" },
                                            { "pipeline", "the pipeline's data-parallel all-reduce" },
                                            { "sharded", "the sharded wrapper's reduce-scatter" } };
    if (!wrapper) return words[0][1];
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (!strcmp(wrapper, words[i][0])) return words[i][1];
    return "the wrapper's gradient reduction";
}

const char *gcd_ref_words(const gcd_run_result *res) { return res->ref_multi ? "the reference run" : "the single-process reference"; }

const char *gcd_plural(int n, const char *one, const char *many) { return n == 1 ? one : many; }

void gcd_ranks_list(gcd_sb *m, const unsigned char *flag, int want, int world) {
    int n = 0, total = 0;
    for (int k = 0; k < world; k++) total += flag[k] == want;
    for (int k = 0; k < world; k++)
        if (flag[k] == want) gcd_sb_printf(m, "%s%d", n == 0 ? "" : (n == total - 1 ? " and " : ", "), k), n++;
}

// ----------------------------------------------------------------------------
// a finding

void gcd_finding_emit(gcd_run_result *res, const char *kind, int counts, gcd_sb *ids, gcd_sb *msg) {
    if (res->nfinding == res->cap_finding) {
        res->cap_finding = res->cap_finding ? 2 * res->cap_finding : 16;
        res->finding = realloc(res->finding, (size_t)res->cap_finding * sizeof *res->finding);
        mallocCheck(res->finding);
    }
    gcd_finding *f = &res->finding[res->nfinding++];
    memset(f, 0, sizeof *f);
    snprintf(f->kind, sizeof f->kind, "%s", kind);
    f->counts = counts;
    f->params = ids && ids->s ? ids->s : gcd_strdup("");
    f->message = msg->s ? msg->s : gcd_strdup("");
    if (ids) *ids = (gcd_sb){ 0 };
    *msg = (gcd_sb){ 0 };
}

void gcd_finding_range(gcd_sb *m, double lo, double hi) {
    char a[32], b[32];
    snprintf(a, sizeof a, "%.3g", lo), snprintf(b, sizeof b, "%.3g", hi);
    if (!strcmp(a, b)) gcd_sb_printf(m, "%s", a);
    else gcd_sb_printf(m, "%s to %s", a, b);
}

// ----------------------------------------------------------------------------
// the scale as a user reads it

// The simple fraction p/q (p, q <= 16) or the power of two (a loss scale: GradScaler's 65536) within
// the tolerance, else c. Under bf16 a summed loss gives x0.249 or x0.251 per tensor: both are the x0.25
// the step made.
double gcd_shown_scale(double c, double tol) {
    double best = c, off = INFINITY;
    for (int q = 1; q <= 16; q++)
        for (int pn = 1; pn <= 16; pn++) {
            double f = (double)pn / q, d = fabs(c - f);
            if (d <= tol * f && d < off) best = f, off = d;
        }
    for (int e = -24; e <= 24; e++) {
        double f = ldexp(1, e), d = fabs(c - f);
        if (d <= tol * f && d < off) best = f, off = d;
    }
    return best;
}

int gcd_same_shown(double a, double b, double tol) {
    double x = gcd_shown_scale(a, tol), y = gcd_shown_scale(b, tol);
    return fabs(x - y) <= 1e-6 * fabs(x);
}
