#include "diagnose/verdict.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diagnose/findings.h"

static const char *const status_names[] = {
    [GCD_ST_NONE] = "none", [GCD_ST_PARTIAL] = "partial",   [GCD_ST_ZERO] = "zero",         [GCD_ST_NONFINITE] = "nonfinite",
    [GCD_ST_OK] = "ok",     [GCD_ST_SCALED] = "scaled",     [GCD_ST_MISMATCH] = "mismatch", [GCD_ST_DISAGREE] = "disagree",
    [GCD_ST_PRESENT] = "present", [GCD_ST_UNDECIDED] = "undecided",
};
_Static_assert(sizeof status_names / sizeof *status_names == GCD_ST_COUNT, "status_names: one name per gcd_status");

const char *gcd_status_str(gcd_status s) { return s < GCD_ST_COUNT && status_names[s] ? status_names[s] : "?"; }

// ----------------------------------------------------------------------------
// one gradient: sums streamed chunk by chunk, then one decision

void gcd_sums_init(gcd_sums *s, int has_ref) {
    memset(s, 0, sizeof *s);
    s->first_nonfinite = -1;
    s->allzero = 1;
    s->has_ref = has_ref;
}

GCD_CLONES void gcd_sums_add(gcd_sums *s, const double *g, const double *r, size_t n, size_t at) {
    double gg = 0, gr = 0, rr = 0, dd = 0, ga = 0;   // ga = sum |g|: zero exactly when g is (no underflow)
    if (r) {
#pragma omp simd reduction(+ : gg, gr, rr, dd, ga)
        for (size_t i = 0; i < n; i++) {
            double x = g[i], y = r[i], d = x - y;
            gg += x * x, gr += x * y, rr += y * y, dd += d * d, ga += fabs(x);
        }
    } else {
#pragma omp simd reduction(+ : gg, ga)
        for (size_t i = 0; i < n; i++) gg += g[i] * g[i], ga += fabs(g[i]);
    }
    long bad = 0;
    if (!isfinite(gg + ga)) {   // rare: a NaN or infinity (or a square beyond 1e308): finite values only
        gg = gr = rr = dd = ga = 0;
        for (size_t i = 0; i < n; i++) {
            double x = g[i], y = r ? r[i] : 0;
            if (!isfinite(x)) {
                if (s->first_nonfinite < 0) s->first_nonfinite = (long)(at + i);
                bad++;
                continue;
            }
            gg += x * x, gr += x * y, rr += y * y, dd += (x - y) * (x - y), ga += fabs(x);
        }
    }
    s->gg += gg, s->gr += gr, s->rr += rr, s->dd += dd;
    s->nonfinite += bad;
    s->allzero &= ga == 0;
}

int gcd_sums_need_noise(const gcd_sums *s, double tol) {
    return s->has_ref && !s->nonfinite && !(sqrt(s->dd) <= tol * sqrt(s->rr));
}

GCD_CLONES void gcd_sums_noise(gcd_sums *s, const double *g, const double *r, const double *b, size_t n) {
    double nn = 0, db = 0, bb = 0;
#pragma omp simd reduction(+ : nn, db, bb)
    for (size_t i = 0; i < n; i++) {
        double x = g[i], y = r[i], z = b[i], e = y - z;
        nn += e * e, db += (x - y) * z, bb += z * z;
    }
    if (!isfinite(nn + db + bb)) {   // rare: a non-finite second reference (or one whose square is) measures no noise there
        nn = db = bb = 0;
        for (size_t i = 0; i < n; i++) {
            double x = g[i], y = r[i], z = b[i];
            if (!isfinite(x) || !isfinite(z) || !isfinite(z * z + (y - z) * (y - z) + (x - y) * z)) continue;
            nn += (y - z) * (y - z), db += (x - y) * z, bb += z * z;
        }
    }
    s->nn += nn, s->db += db, s->bb += bb;
    s->has_ref2 = 1;
}

int gcd_sums_need_resid(const gcd_sums *s, double tol) {
    return gcd_sums_need_noise(s, tol) && s->rr > 0 && !s->allzero && s->gr > 0;
}

// g = c r + e with e orthogonal to r: ||e|| summed directly (gg - gr^2/rr cancels)
GCD_CLONES void gcd_sums_resid(gcd_sums *s, const double *g, const double *r, size_t n) {
    double c = s->gr / s->rr, ee = 0;
#pragma omp simd reduction(+ : ee)
    for (size_t i = 0; i < n; i++) ee += (g[i] - c * r[i]) * (g[i] - c * r[i]);
    s->ee += ee;
}

// Rounding noise is uncorrelated with the reference: <g - r, b> over n values is of the order
// ||g - r|| ||b|| / sqrt(n). Beyond GCD_CORR_SIGMAS of that (and a floor for the few-valued tensors,
// whose figures say little), the difference follows the reference: signal, not noise.
static int correlated(double corr, size_t n) {
    if (!(n >= GCD_CORR_MIN_N) || !isfinite(corr)) return 0;
    return fabs(corr) > fmax(GCD_CORR_SIGMAS / sqrt((double)n), GCD_CORR_FLOOR);
}

// The tolerance of one tensor against its reference r (norm A): the claimed one (tol x A, from its
// dtypes and the recorded precision, or --tol), or with a second reference b, k x ||r - b|| where that
// is larger. p->allowed, p->tol_source and p->noise say which.
static double allowance(gcd_param_result *p, const gcd_sums *s, double A, double tol) {
    double allow = tol * A;
    p->allowed = tol;
    if (!s->has_ref2) return allow;
    p->noise = A > 0 ? sqrt(s->nn) / A : NAN;
    if (p->tol_source == GCD_TOL_GIVEN || !(GCD_NOISE_K * sqrt(s->nn) > allow)) return allow;
    p->tol_source = GCD_TOL_MEASURED;
    p->allowed = A > 0 ? GCD_NOISE_K * sqrt(s->nn) / A : INFINITY;
    return GCD_NOISE_K * sqrt(s->nn);
}

void gcd_classify_sums(gcd_param_result *p, const gcd_sums *s, int world, double tol) {
    p->norm = p->rel_err = p->scale = p->cosine = p->noise = p->corr = NAN;
    p->allowed = NAN;
    if (!(p->tol > 0)) p->tol = tol;
    tol = p->tol;
    p->ref_norm = s->has_ref ? sqrt(s->rr) : NAN;
    p->nonfinite = s->nonfinite;
    p->first_nonfinite = s->first_nonfinite;
    if (p->nhave == 0) { p->status = GCD_ST_NONE; return; }
    if (s->nonfinite) { p->status = GCD_ST_NONFINITE; return; }
    p->norm = sqrt(s->gg);
    if (p->n == 0) {   // no values: nothing can be wrong with them
        p->status = s->has_ref ? GCD_ST_OK : GCD_ST_PRESENT;
        if (p->nhave < world) p->status = GCD_ST_PARTIAL;
        return;
    }
    if (s->has_ref) {
        double rr = s->rr, gg = s->gg, A = p->ref_norm, err = sqrt(s->dd);
        p->rel_err = rr > 0 ? err / A : (gg > 0 ? INFINITY : 0);
        p->cosine = gg > 0 && rr > 0 ? s->gr / (p->norm * A) : NAN;
        double allow = allowance(p, s, A, tol), noise = s->has_ref2 ? sqrt(s->nn) : 0;
        if (s->has_ref2 && err > 0 && s->bb > 0) p->corr = s->db / (err * sqrt(s->bb));
        if (rr > 0) {
            p->scale = s->gr / rr;
            int signal = !s->masks && correlated(p->corr, p->n) && err > tol * A;   // accepted only by the measured noise, yet it follows the reference
            double resid = fmax(tol * p->norm, GCD_NOISE_K * noise * fmax(1, fabs(p->scale)));
            if (s->allzero) p->status = s->has_ref2 && A <= GCD_NOISE_K * noise ? GCD_ST_OK : GCD_ST_ZERO;   // zero where the reference is more than noise
            else if (err <= allow && !signal) p->status = GCD_ST_OK;
            else if (p->scale > 0 && sqrt(s->ee) <= resid && fabs(p->scale - 1) > tol) p->status = GCD_ST_SCALED;
            else p->status = GCD_ST_MISMATCH;   // c <= 0 too: the wrong direction is no scale
        } else {
            p->status = s->allzero || err <= allow ? GCD_ST_OK : GCD_ST_MISMATCH;   // the reference is zero: only zero (or noise) is right
        }
    } else {
        p->status = s->allzero ? GCD_ST_ZERO : GCD_ST_PRESENT;
    }
    if (p->diff_rel > tol) p->status = GCD_ST_DISAGREE;   // the figures are kept; the cause comes first
    if (p->nhave < world) p->status = GCD_ST_PARTIAL;
}

void gcd_classify(gcd_param_result *p, int world, double tol) {
    gcd_sums s;
    gcd_sums_init(&s, 1);
    if (p->nhave > 0 && p->reduced) {
        gcd_sums_add(&s, p->reduced, p->reference, p->n, 0);
        if (gcd_sums_need_resid(&s, p->tol > 0 ? p->tol : tol)) gcd_sums_resid(&s, p->reduced, p->reference, p->n);
    } else {
        p->nhave = 0;
        for (size_t i = 0; i < p->n; i++) s.rr += p->reference[i] * p->reference[i];
    }
    gcd_classify_sums(p, &s, world, tol);
}

// ----------------------------------------------------------------------------
// judgement over the whole model: what one tensor's figures cannot say alone

// The model's gradient scale: the RMS over every element of every parameter whose reference is not zero.
static double model_rms(const gcd_run_result *res) {
    double rr = 0, n = 0;
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (p->ref_norm > 0 && isfinite(p->ref_norm) && p->n) rr += p->ref_norm * p->ref_norm, n += (double)p->n;
    }
    return n > 0 ? sqrt(rr / n) : 0;
}

// ||g - r|| / sqrt(n): the error per element, NAN where there is none to take
static double err_rms(const gcd_param_result *p) {
    if (!p->n || !(p->ref_norm >= 0)) return NAN;
    double e = p->ref_norm > 0 ? p->rel_err * p->ref_norm : p->norm;
    return e / sqrt((double)p->n);
}

// One reference cannot tell a tensor whose true gradient is about zero (a bias before normalize or
// BatchNorm, a BERT key bias: rounding noise on the ranks and in the reference alike) from a small wrong
// one. A mismatch that is uncorrelated with its reference (|cos| < 0.5, as noise is) and whose error per
// element is within its own tolerance x the model's RMS gradient is undecided: not ok, not a defect; a
// second reference measures its noise. Signal is never undecided: a zero, a sign flip, a scale.
static void undecided(gcd_run_result *res) {
    double rms = model_rms(res);
    for (int i = 0; i < res->nparam; i++) {
        gcd_param_result *p = &res->param[i];
        if (p->status != GCD_ST_MISMATCH || p->ref_none || p->tol_source == GCD_TOL_MEASURED || p->noise > 0) continue;   // no noise measured: no second reference, or one identical to the first
        if (fabs(p->cosine) < 0.5 && err_rms(p) <= p->tol * rms) p->status = GCD_ST_UNDECIDED;
    }
}

// One value's ratio to its reference is no evidence of a scale factor (any two values of one sign are
// multiples): a scalar is scaled only by a factor a tensor of several values shows too.
static void scalars(gcd_run_result *res) {
    for (int i = 0; i < res->nparam; i++) {
        gcd_param_result *p = &res->param[i];
        if (p->status != GCD_ST_SCALED || p->n != 1) continue;
        int backed = 0;
        for (int j = 0; j < res->nparam && !backed; j++) {
            const gcd_param_result *q = &res->param[j];
            backed = q->status == GCD_ST_SCALED && q->n > 1 && gcd_same_shown(p->scale, q->scale, fmax(p->allowed, q->allowed));
        }
        if (!backed) p->status = GCD_ST_MISMATCH;
    }
}

// The largest relative error the check could have missed: the loosest tensor's accepted error
static double sensitivity(const gcd_run_result *res, const gcd_param_result **worst) {
    double s = NAN;
    *worst = NULL;
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (p->status != GCD_ST_OK || !(p->ref_norm > 0) || !isfinite(p->allowed)) continue;
        if (!(p->allowed <= s)) s = p->allowed, *worst = p;
    }
    return s;
}

// ----------------------------------------------------------------------------
// the run's findings: judgements.c's table, row by row

void gcd_verdict(gcd_run_result *res) {
    if (!res->classified)
        for (int i = 0; i < res->nparam; i++) gcd_classify(&res->param[i], res->world, res->tol);
    for (int i = 0; i < res->nfinding; i++) free(res->finding[i].params), free(res->finding[i].message);
    res->nfinding = 0;
    gcd_verdict_ctx v = { .res = res, .check = !strcmp(res->probe, "check") };
    scalars(res);
    if (v.check) undecided(res);   // the probes' float64 reference is exact: nothing there is undecided
    res->sensitivity = sensitivity(res, &v.loosest);
    gcd_names_index(&v);
    gcd_judgements_run(&v);
    gcd_names_index_free(&v);
}

int gcd_run_has_finding(const gcd_run_result *res) {
    for (int i = 0; i < res->nfinding; i++)
        if (res->finding[i].counts) return 1;
    return 0;
}
