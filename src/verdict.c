#include "verdict.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *status_names[GCD_ST_COUNT] = { "none", "partial", "zero", "nonfinite", "ok", "scaled", "mismatch" };

const char *gcd_status_str(gcd_status s) { return s < GCD_ST_COUNT ? status_names[s] : "?"; }

// ----------------------------------------------------------------------------
// one parameter

void gcd_classify(gcd_param_result *p, int world, double tol) {
    const double *g = p->reduced, *r = p->reference;
    p->norm = p->ref_norm = p->rel_err = p->scale = p->cosine = NAN;
    p->nonfinite = 0;
    p->first_nonfinite = -1;
    double rr = 0;
    for (size_t i = 0; i < p->n; i++) rr += r[i] * r[i];
    p->ref_norm = sqrt(rr);
    if (p->nhave == 0 || !g) { p->status = GCD_ST_NONE; return; }

    double gg = 0, gr = 0, dd = 0;
    int allzero = 1;
    for (size_t i = 0; i < p->n; i++) {
        if (!isfinite(g[i])) {
            if (!p->nonfinite++) p->first_nonfinite = (long)i;
            continue;
        }
        allzero &= g[i] == 0;
        gg += g[i] * g[i];
        gr += g[i] * r[i];
        dd += (g[i] - r[i]) * (g[i] - r[i]);
    }
    if (p->nonfinite) { p->status = GCD_ST_NONFINITE; return; }
    p->norm = sqrt(gg);
    p->rel_err = rr > 0 ? sqrt(dd) / p->ref_norm : (gg > 0 ? INFINITY : 0);
    p->cosine = gg > 0 && rr > 0 ? gr / (p->norm * p->ref_norm) : NAN;
    if (rr > 0) {   // g = c r + e with e orthogonal to r; ||e|| summed directly (gg - gr^2/rr cancels)
        p->scale = gr / rr;
        double ee = 0;
        for (size_t i = 0; i < p->n; i++) ee += (g[i] - p->scale * r[i]) * (g[i] - p->scale * r[i]);
        if (sqrt(dd) <= tol * p->ref_norm) p->status = GCD_ST_OK;
        else if (allzero) p->status = GCD_ST_ZERO;
        else if (sqrt(ee) <= tol * p->norm && fabs(p->scale - 1) > tol) p->status = GCD_ST_SCALED;
        else p->status = GCD_ST_MISMATCH;
    } else {
        p->status = allzero ? GCD_ST_OK : GCD_ST_MISMATCH;   // the reference is zero: only zero is right
    }
    if (p->nhave < world) p->status = GCD_ST_PARTIAL;   // the values are kept; the cause comes first
}

// ----------------------------------------------------------------------------
// findings in words

static gcd_finding *add(gcd_run_result *res, const char *kind, int counts) {
    if (res->nfinding == GCD_MAX_FINDINGS) return NULL;
    gcd_finding *f = &res->finding[res->nfinding++];
    memset(f, 0, sizeof *f);
    snprintf(f->kind, sizeof f->kind, "%s", kind);
    f->counts = counts;
    return f;
}

static void say(gcd_finding *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(gcd_finding *f, const char *fmt, ...) {
    if (!f) return;
    size_t k = strlen(f->message);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->message + k, sizeof f->message - k, fmt, ap);
    va_end(ap);
}

// "a, b and c" of the parameters whose status matches, also into f->params
static int list(const gcd_run_result *res, int (*pick)(const gcd_param_result *, const void *), const void *arg,
                char *out, size_t len) {
    int n = 0, total = 0;
    for (int i = 0; i < res->nparam; i++) total += pick(&res->param[i], arg);
    out[0] = 0;
    for (int i = 0; i < res->nparam; i++) {
        if (!pick(&res->param[i], arg)) continue;
        size_t k = strlen(out);
        snprintf(out + k, len - k, "%s%s", n == 0 ? "" : (n == total - 1 ? " and " : ", "), res->param[i].name);
        n++;
    }
    return n;
}

static int by_status(const gcd_param_result *p, const void *arg) { return p->status == *(const gcd_status *)arg; }
static int with_grad(const gcd_param_result *p, const void *arg) { (void)arg; return p->status != GCD_ST_NONE; }
static int stuck(const gcd_param_result *p, const void *arg) { (void)arg; return !p->moved_any; }
static int is_param(const gcd_param_result *p, const void *arg) { return p == arg; }
static int same_scale(const gcd_param_result *p, const void *arg) {
    return p->status == GCD_ST_SCALED && fabs(p->scale - *(const double *)arg) <= 1e-6 * fabs(p->scale);
}

// f->params: the same parameters as list(), comma-separated ("a,b,c")
static void set_params(gcd_finding *f, const gcd_run_result *res, int (*pick)(const gcd_param_result *, const void *), const void *arg) {
    if (!f) return;
    for (int i = 0; i < res->nparam; i++) {
        if (!pick(&res->param[i], arg)) continue;
        size_t k = strlen(f->params);
        snprintf(f->params + k, sizeof f->params - k, "%s%s", k ? "," : "", res->param[i].name);
    }
}

static const char *plural(int n, const char *one, const char *many) { return n == 1 ? one : many; }

void gcd_verdict(gcd_run_result *res) {
    res->tol = GCD_TOL;
    res->nfinding = 0;
    for (int i = 0; i < res->nparam; i++) gcd_classify(&res->param[i], res->world, res->tol);
    char names[256], others[256];
    gcd_status st;
    int n;

    // the forward: the distributed loss must equal the reference objective, or the gather is wrong
    double mean = 0;
    for (int k = 0; k < res->world; k++) mean += res->loss[k];
    mean /= res->world;
    if (fabs(mean - res->ref_loss) > res->tol * fmax(1.0, fabs(res->ref_loss))) {
        gcd_finding *f = add(res, "forward", 1);
        say(f, "the ranks' mean loss %.9g differs from the single-process objective %.9g: the forward itself is wrong",
            mean, res->ref_loss);
    }

    st = GCD_ST_NONE;
    if ((n = list(res, by_status, &st, names, sizeof names))) {
        gcd_finding *f = add(res, "none", 1);
        set_params(f, res, by_status, &st);
        int have = list(res, with_grad, NULL, others, sizeof others);
        if (have == 0) say(f, "no parameter receives a gradient on any rank (None): nothing is learned");
        else if (have < res->nparam / 2 + 1 && have < n)
            say(f, "only %d of %d parameters %s a gradient: %s; %s %s None on every rank: the gather detached everything before it",
                have, res->nparam, plural(have, "receives", "receive"), others, names, plural(n, "gets", "get"));
        else
            say(f, "%s %s no gradient on any rank (None); %s %s one", names, plural(n, "receives", "receive"), others,
                plural(have, "still gets", "still get"));
    }
    st = GCD_ST_PARTIAL;
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (p->status != st) continue;
        gcd_finding *f = add(res, "partial", 1);
        set_params(f, res, is_param, p);
        say(f, "%s has a gradient on %d of %d ranks; None on rank", p->name, p->nhave, res->world);
        for (int k = 0, c = 0; k < res->world; k++)
            if (!p->has[k]) say(f, "%s %d", c++ ? "," : "", k);
    }
    st = GCD_ST_ZERO;
    if ((n = list(res, by_status, &st, names, sizeof names))) {
        gcd_finding *f = add(res, "zero", 1);
        set_params(f, res, by_status, &st);
        say(f, "%s %s a gradient of exactly zero where the reference's is not", names, plural(n, "gets", "get"));
    }
    st = GCD_ST_NONFINITE;
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (p->status != st) continue;
        gcd_finding *f = add(res, "nonfinite", 1);
        set_params(f, res, is_param, p);
        say(f, "%s: %ld of %zu gradient values are NaN or infinite (first at index %ld)", p->name, p->nonfinite, p->n,
            p->first_nonfinite);
    }
    for (int i = 0; i < res->nparam; i++) {   // one finding per distinct scale
        const gcd_param_result *p = &res->param[i];
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= same_scale(&res->param[j], &p->scale);
        if (p->status != GCD_ST_SCALED || seen) continue;
        n = list(res, same_scale, &p->scale, names, sizeof names);
        gcd_finding *f = add(res, "scaled", 1);
        set_params(f, res, same_scale, &p->scale);
        say(f, "%s %s %.6gx the reference", names, plural(n, "gradient is", "gradients are"), p->scale);
        if (fabs(p->scale * res->world - 1) <= 1e-6) say(f, " (= 1/world)");
        st = GCD_ST_OK;
        if (list(res, by_status, &st, others, sizeof others)) say(f, " while %s %s 1x", others, strstr(others, " and ") ? "are" : "is");
    }
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (p->status != GCD_ST_MISMATCH) continue;
        gcd_finding *f = add(res, "mismatch", 1);
        set_params(f, res, is_param, p);
        say(f, "%s: wrong gradient, neither the reference nor a multiple of it: relative error %.3g, cosine %.3g",
            p->name, p->rel_err, p->cosine);
    }
    if (res->steps > 0 && (n = list(res, stuck, NULL, names, sizeof names))) {
        const double *first = res->loss, *last = res->loss + (size_t)(res->nloss - 1) * res->world;
        double l0 = 0, l1 = 0;
        for (int k = 0; k < res->world; k++) l0 += first[k] / res->world, l1 += last[k] / res->world;
        if (l1 != l0) {
            gcd_finding *f = add(res, "learning_stopped", 1);
            set_params(f, res, stuck, NULL);
            say(f, "learning stopped: the loss went %.6g -> %.6g over %d steps while %s never moved (bit-identical to the start)",
                l0, l1, res->steps, names);
        }
    }
    st = GCD_ST_OK;
    if ((n = list(res, by_status, &st, names, sizeof names))) {
        double worst = 0;
        for (int i = 0; i < res->nparam; i++)
            if (res->param[i].status == GCD_ST_OK && res->param[i].rel_err > worst) worst = res->param[i].rel_err;
        gcd_finding *f = add(res, "note", 0);
        set_params(f, res, by_status, &st);
        if (n == res->nparam) say(f, "every parameter matches the single-process reference (max relative error %.2g)", worst);
        else say(f, "%s %s the reference (max relative error %.2g)", names, plural(n, "matches", "match"), worst);
    }
    if (res->world == 1) {
        gcd_finding *f = add(res, "note", 0);
        say(f, "world 1: there is no process group, so the gather returns the tensor itself in every mode; "
               "the defect appears only with world > 1");
    }
}

int gcd_run_has_finding(const gcd_run_result *res) {
    for (int i = 0; i < res->nfinding; i++)
        if (res->finding[i].counts) return 1;
    return 0;
}
