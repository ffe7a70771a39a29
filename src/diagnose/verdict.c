#include "verdict.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
            int signal = correlated(p->corr, p->n) && err > tol * A;   // accepted only by the measured noise, yet it follows the reference
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
// names in words: "a, b and c"; a whole group of three or more under one dotted prefix is "prefix.*"

typedef int (*pick_fn)(const gcd_param_result *, const void *);

static int count(const gcd_run_result *res, pick_fn pick, const void *arg) {
    int n = 0;
    for (int i = 0; i < res->nparam; i++) n += pick(&res->param[i], arg);
    return n;
}

// The parameters sorted by name, built once per verdict: every name under a dotted prefix lies in one
// contiguous run of it, found by binary search, so naming a group costs O(log n), not a pass over all.
static struct {
    const gcd_run_result *res;
    int *sorted;   // (nparam) indices into res->param, by name
} idx;

static int by_name_idx(const void *a, const void *b) {
    return strcmp(idx.res->param[*(const int *)a].name, idx.res->param[*(const int *)b].name);
}

static void index_build(const gcd_run_result *res) {
    idx.res = res;
    idx.sorted = gcd_malloc((size_t)(res->nparam ? res->nparam : 1) * sizeof *idx.sorted);
    for (int i = 0; i < res->nparam; i++) idx.sorted[i] = i;
    qsort(idx.sorted, (size_t)res->nparam, sizeof *idx.sorted, by_name_idx);
}

static void index_free(void) {
    free(idx.sorted);
    idx.sorted = NULL, idx.res = NULL;
}

// [*lo, *hi): the run of sorted names that start with the k bytes of prefix
static void prefix_run(const char *prefix, size_t k, int *lo, int *hi) {
    const gcd_param_result *P = idx.res->param;
    int a = 0, b = idx.res->nparam;
    while (a < b) {   // the first name >= prefix
        int m = a + (b - a) / 2;
        if (strncmp(P[idx.sorted[m]].name, prefix, k) < 0) a = m + 1;
        else b = m;
    }
    *lo = a, b = idx.res->nparam;
    while (a < b) {   // the first name past the prefix
        int m = a + (b - a) / 2;
        if (strncmp(P[idx.sorted[m]].name, prefix, k) <= 0) a = m + 1;
        else b = m;
    }
    *hi = a;
}

// writes the words into out (and, when ids is given, every picked name comma-separated); returns how
// many parameters were picked
static int names(const gcd_run_result *res, pick_fn pick, const void *arg, gcd_sb *out, gcd_sb *ids) {
    enum { SHOWN = 12 };
    int n = 0, shown = 0, hidden = 0, np = res->nparam;
    unsigned char *done = gcd_malloc((size_t)np + 1), *picked = gcd_malloc((size_t)np + 1);
    int *before = gcd_malloc(((size_t)np + 1) * sizeof *before);   // picked among the first j sorted names
    for (int i = 0; i < np; i++) n += picked[i] = (unsigned char)(pick(&res->param[i], arg) != 0);
    before[0] = 0;
    for (int j = 0; j < np; j++) before[j + 1] = before[j] + picked[idx.sorted[j]];
    gcd_sb words[SHOWN] = { { 0 } };
    for (int i = 0; i < np; i++) {
        const gcd_param_result *p = &res->param[i];
        if (!picked[i]) continue;
        if (ids) gcd_sb_printf(ids, "%s%s", ids->len ? "," : "", p->name);
        if (done[i]) continue;
        gcd_sb w = { 0 };
        for (const char *dot = strchr(p->name, '.'); dot && !w.s; dot = strchr(dot + 1, '.')) {
            size_t k = (size_t)(dot - p->name) + 1;
            int lo, hi;
            prefix_run(p->name, k, &lo, &hi);
            int total = hi - lo, inside = before[hi] - before[lo];
            if (total != inside || total < 3) continue;
            gcd_sb_printf(&w, "%.*s*", (int)k, p->name);
            for (int j = lo; j < hi; j++) done[idx.sorted[j]] = 1;
        }
        if (!w.s) gcd_sb_printf(&w, "%s", p->name);
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

static int by_status(const gcd_param_result *p, const void *arg) { return p->status == *(const gcd_status *)arg && !p->explained; }
static int with_grad(const gcd_param_result *p, const void *arg) { (void)arg; return p->status != GCD_ST_NONE; }
static int stuck(const gcd_param_result *p, const void *arg) { (void)arg; return !p->moved_any; }
static int same_shown(double a, double b, double tol);
static int same_scale(const gcd_param_result *p, const void *arg) {   // arg: the finding's first tensor
    const gcd_param_result *q = arg;
    return p->status == GCD_ST_SCALED && !p->explained && same_shown(p->scale, q->scale, fmax(p->allowed, q->allowed));
}
static int none_in_ref(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_NONE && p->ref_none && !p->ran; }
static int none_real(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_NONE && !p->ref_none; }
static int measured_ok(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_OK && p->tol_source == GCD_TOL_MEASURED; }
static int ran_none(const gcd_param_result *p, const void *arg) { (void)arg; return p->status == GCD_ST_NONE && p->ref_none && p->ran; }

static const char *plural(int n, const char *one, const char *many) { return n == 1 ? one : many; }

// appends a finding that takes over the strings of msg and ids
static void emit(gcd_run_result *res, const char *kind, int counts, gcd_sb *ids, gcd_sb *msg) {
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

void gcd_ranks_list(gcd_sb *m, const unsigned char *flag, int want, int world) {
    int n = 0, total = 0;
    for (int k = 0; k < world; k++) total += flag[k] == want;
    for (int k = 0; k < world; k++)
        if (flag[k] == want) gcd_sb_printf(m, "%s%d", n == 0 ? "" : (n == total - 1 ? " and " : ", "), k), n++;
}

// ----------------------------------------------------------------------------
// judgement over the whole model: the noise floor, scalars, the scale a user reads

// The scale as a user reads it: the simple fraction p/q (p, q <= 16) or the power of two (a loss scale:
// GradScaler's 65536) within the tolerance, else c. Under bf16 a summed loss gives x0.249 or x0.251 per
// tensor: both are the x0.25 the step made.
static double shown_scale(double c, double tol) {
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

static int same_shown(double a, double b, double tol) {
    double x = shown_scale(a, tol), y = shown_scale(b, tol);
    return fabs(x - y) <= 1e-6 * fabs(x);
}

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
            backed = q->status == GCD_ST_SCALED && q->n > 1 && same_shown(p->scale, q->scale, fmax(p->allowed, q->allowed));
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
// many wrong gradients: one finding per name prefix, with the range of their figures

enum { GROUPS = 6 };   // more mismatches than this: grouped into at most this many findings

static int grouped_mismatch(const gcd_param_result *p, const void *arg) {
    (void)arg;
    return p->status == GCD_ST_MISMATCH && !p->ref_none && !p->explained;
}

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

static int by_key(const void *a, const void *b) {   // (name, len) pairs
    const gcd_param_result *x = idx.res->param + ((const int *)a)[0], *y = idx.res->param + ((const int *)b)[0];
    size_t lx = (size_t)((const int *)a)[1], ly = (size_t)((const int *)b)[1];
    int c = strncmp(x->name, y->name, lx < ly ? lx : ly);
    return c ? c : (lx > ly) - (lx < ly);
}

// distinct prefixes of the picked at depth d
static int distinct_at(const int *pick, int n, int depth, int *pairs) {
    for (int i = 0; i < n; i++) pairs[2 * i] = pick[i], pairs[2 * i + 1] = (int)prefix_len(idx.res->param[pick[i]].name, depth);
    qsort(pairs, (size_t)n, 2 * sizeof *pairs, by_key);
    int k = n ? 1 : 0;
    for (int i = 1; i < n; i++) k += by_key(pairs + 2 * i - 2, pairs + 2 * i) != 0;
    return k;
}

static void range(gcd_sb *m, double lo, double hi) {
    char a[32], b[32];
    snprintf(a, sizeof a, "%.3g", lo), snprintf(b, sizeof b, "%.3g", hi);
    if (!strcmp(a, b)) gcd_sb_printf(m, "%s", a);
    else gcd_sb_printf(m, "%s to %s", a, b);
}

// The deepest prefix that splits the wrong gradients into at most GROUPS groups; where even the first
// component gives more, the largest GROUPS - 1 groups and one of the rest. Marks them p->grouped.
static void mismatch_groups(gcd_run_result *res) {
    int n = 0, maxd = 1;
    int *pick = gcd_malloc((size_t)res->nparam * sizeof *pick), *pairs = gcd_malloc((size_t)res->nparam * 2 * sizeof *pairs);
    for (int i = 0; i < res->nparam; i++)
        if (grouped_mismatch(&res->param[i], NULL)) {
            pick[n++] = i;
            int d = 1;
            for (const char *c = res->param[i].name; *c; c++) d += *c == '.';
            maxd = d > maxd ? d : maxd;
        }
    int depth = 1;
    for (int d = maxd; d >= 1; d--)
        if (distinct_at(pick, n, d, pairs) <= GROUPS) { depth = d; break; }
    int ng = distinct_at(pick, n, depth, pairs);
    // groups in order of their first parameter: g[i] for pick[i]
    int *grp = gcd_malloc((size_t)res->nparam * sizeof *grp), *size = gcd_malloc((size_t)(ng + 1) * sizeof *size);
    for (int i = 0, gi = -1; i < n; i++) {
        if (i == 0 || by_key(pairs + 2 * i - 2, pairs + 2 * i)) gi++, size[gi] = 0;
        grp[pairs[2 * i]] = gi, size[gi]++;
    }
    int *order = gcd_malloc((size_t)(ng + 1) * sizeof *order), no = 0;   // group ids by first appearance
    unsigned char *listed = gcd_malloc((size_t)ng + 1);
    for (int i = 0; i < n; i++)
        if (!listed[grp[pick[i]]]) listed[grp[pick[i]]] = 1, order[no++] = grp[pick[i]];
    int keep = ng <= GROUPS ? ng : GROUPS - 1;   // too many at depth 1: the largest keep, then the rest
    unsigned char *own = gcd_malloc((size_t)ng + 1);
    for (int k = 0; k < keep; k++) {
        int best = -1;
        for (int j = 0; j < no; j++)
            if (!own[order[j]] && (best < 0 || size[order[j]] > size[best])) best = order[j];
        own[best] = 1;
    }
    for (int j = 0; j <= no; j++) {   // the kept groups in order (j < no), then the rest as one (j == no)
        int g = j < no ? order[j] : -1;
        if (j < no && !own[g]) continue;
        gcd_sb m = { 0 }, ids = { 0 };
        double clo = INFINITY, chi = -INFINITY, elo = INFINITY, ehi = -INFINITY;
        int cnt = 0, away = 0;
        const gcd_param_result *first = NULL;
        for (int i = 0; i < n; i++) {
            gcd_param_result *p = &res->param[pick[i]];
            if (j < no ? grp[pick[i]] != g : own[grp[pick[i]]]) continue;
            first = first ? first : p;
            p->grouped = 1, cnt++;
            away += p->scale <= 0;
            clo = fmin(clo, p->cosine), chi = fmax(chi, p->cosine), elo = fmin(elo, p->rel_err), ehi = fmax(ehi, p->rel_err);
            gcd_sb_printf(&ids, "%s%s", ids.len ? "," : "", p->name);
        }
        if (!cnt) continue;
        if (j < no) {
            size_t k = prefix_len(first->name, depth);
            int lo, hi;
            prefix_run(first->name, k, &lo, &hi);
            if (cnt == 1) gcd_sb_printf(&m, "%s: wrong gradient", first->name);
            else gcd_sb_printf(&m, "%.*s*: %d of %d parameters with wrong gradients", (int)k, first->name, cnt, hi - lo);
        } else if (cnt <= 3) {   // a few: by name
            for (int i = 0, c = 0; i < n; i++)
                if (!own[grp[pick[i]]])
                    gcd_sb_printf(&m, "%s%s", c == 0 ? "" : c == cnt - 1 ? " and " : ", ", res->param[pick[i]].name), c++;
            gcd_sb_printf(&m, ": %s with wrong gradients", cnt == 1 ? "one" : cnt == 2 ? "two" : "three");
        } else gcd_sb_printf(&m, "%d more parameters under other names with wrong gradients (the report lists them)", cnt);
        gcd_sb_printf(&m, ", neither the reference nor a multiple of it%s: cosine ", away ? " (some pointing away from it)" : "");
        range(&m, clo, chi);
        gcd_sb_printf(&m, ", relative error ");
        range(&m, elo, ehi);
        emit(res, "mismatch", 1, &ids, &m);
    }
    free(pick), free(pairs), free(grp), free(size), free(order), free(listed), free(own);
}

// ----------------------------------------------------------------------------
// both stages: the cause first. A parameter None on some ranks before DDP's all-reduce (their local
// dumps lack it) has, after it, the mean with zeros in their place on every rank: the reduced dumps
// alone show a wrong or scaled gradient and not why.

static int local_cut(const gcd_param_result *p) { return p->local_has && p->local_nhave < p->nhave && p->status != GCD_ST_NONE; }

static int cut_world;   // stage_cause's world, for same_cut
static int same_cut(const gcd_param_result *p, const void *arg) {
    return local_cut(p) && !memcmp(p->local_has, ((const gcd_param_result *)arg)->local_has, (size_t)cut_world);
}

static void stage_cause(gcd_run_result *res) {
    int W = cut_world = res->world;
    unsigned char *done = gcd_malloc((size_t)res->nparam + 1);
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (!local_cut(p) || done[i]) continue;
        gcd_sb m = { 0 }, ids = { 0 }, who = { 0 };
        int n = names(res, same_cut, p, &who, &ids), ok = 0, scaled = 0, alike = 1;
        double clo = INFINITY, chi = -INFINITY, elo = INFINITY, ehi = -INFINITY;
        for (int j = 0; j < res->nparam; j++) {
            const gcd_param_result *q = &res->param[j];
            if (!same_cut(q, p)) continue;
            done[j] = 1;
            ok += q->status == GCD_ST_OK, scaled += q->status == GCD_ST_SCALED;
            if (q->status == GCD_ST_SCALED && !same_shown(q->scale, p->scale, fmax(q->allowed, p->allowed))) alike = 0;
            if (isfinite(q->cosine)) clo = fmin(clo, q->cosine), chi = fmax(chi, q->cosine);
            if (isfinite(q->rel_err)) elo = fmin(elo, q->rel_err), ehi = fmax(ehi, q->rel_err);
        }
        int missing = W - p->local_nhave;
        gcd_sb_printf(&m, "%s %s no gradient on rank%s ", who.s, plural(n, "gets", "get"), plural(missing, "", "s"));
        gcd_ranks_list(&m, p->local_has, 0, W);
        gcd_sb_printf(&m, " before DDP's all-reduce (None in %s local dump%s): the all-reduce averaged zeros in %s place, ",
                      plural(missing, "its", "their"), plural(missing, "", "s"), plural(missing, "its", "their"));
        if (ok == n) {   // what the reference computes too (it skips them there as well): a note
            gcd_sb_printf(&m, "and the result still matches the single-process reference");
            emit(res, "note", 0, &ids, &m);
        } else {
            for (int j = 0; j < res->nparam; j++) res->param[j].explained |= same_cut(&res->param[j], p);
            gcd_sb_printf(&m, "so every rank holds ");
            if (scaled == n && alike) gcd_sb_printf(&m, "the reference x%.6g", shown_scale(p->scale, p->allowed));
            else {
                gcd_sb_printf(&m, "a gradient that is not the reference's");
                if (clo <= chi) {
                    gcd_sb_printf(&m, " (cosine ");
                    range(&m, clo, chi);
                    gcd_sb_printf(&m, ", relative error ");
                    range(&m, elo, ehi);
                    gcd_sb_printf(&m, ")");
                }
            }
            gcd_sb_printf(&m, " after it (the reduced dumps): the cause is upstream of DDP, where %s rank%s computed no gradient for %s",
                          plural(missing, "that", "those"), plural(missing, "", "s"), plural(n, "it", "them"));
            emit(res, "local_none", 1, &ids, &m);
        }
        gcd_sb_free(&who);
    }
    free(done);
}

// ----------------------------------------------------------------------------
// causes the numbers point at

// What a scale c (as shown) usually means, after "the reference xC"; the probes' (words 0) say only
// "(= 1/world)": their cause is the gather mode, which the table names
static void scale_cause(gcd_sb *m, double c, int world, int words) {
    int e;
    double f = frexp(c, &e), k = round(c), inv = round(1 / c);
    if (!words) {
        if (fabs(c * world - 1) <= 1e-6) gcd_sb_printf(m, " (= 1/world)");
    } else if (fabs(c * world - 1) <= 1e-6)
        gcd_sb_printf(m, " (= 1/world): what a loss summed over rows gives where the reference averages, a gather whose backward keeps "
                         "only the rank's own rows, or a gradient divided by the world twice");
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

// Plain BatchNorm in training mode under DDP normalises each rank's rows by their own statistics: the
// ranks and the reference compute different objectives, and every parameter upstream differs. One
// finding says so and takes over the mismatches.
static void batchnorm_cause(gcd_run_result *res) {
    gcd_sb m = { 0 }, ids = { 0 };
    int n = 0;
    for (int i = 0; i < res->nparam; i++) {
        gcd_param_result *p = &res->param[i];
        if ((p->status != GCD_ST_MISMATCH && p->status != GCD_ST_UNDECIDED) || p->explained || p->ref_none) continue;
        p->explained = 1, n++;
        gcd_sb_printf(&ids, "%s%s", ids.len ? "," : "", p->name);
    }
    if (!n) return;
    gcd_sb_printf(&m, "%d %s from the reference (or cannot be judged from one), and the step ran plain BatchNorm in training mode (%s): under DDP each rank "
                      "normalises its rows by their own mean and variance, the single-process reference by the whole batch's, so the two "
                      "compute different objectives; use torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) (SyncBatchNorm runs on "
                      "CUDA), or check with those layers in eval mode",
                  n, plural(n, "parameter differs", "parameters differ"), res->batchnorm);
    emit(res, "mismatch", 1, &ids, &m);
}

// ----------------------------------------------------------------------------
// the run's findings

void gcd_verdict(gcd_run_result *res) {
    if (!res->classified)
        for (int i = 0; i < res->nparam; i++) gcd_classify(&res->param[i], res->world, res->tol);
    for (int i = 0; i < res->nfinding; i++) free(res->finding[i].params), free(res->finding[i].message);
    res->nfinding = 0;
    int check = !strcmp(res->probe, "check");
    scalars(res);
    if (check) undecided(res);   // the probes' float64 reference is exact: nothing there is undecided
    index_build(res);
    gcd_sb m = { 0 }, ids = { 0 }, others = { 0 };
    gcd_status st;
    int n;

    // the forward: the distributed loss must equal the reference objective, or the gather is wrong
    if (res->loss) {
        double mean = 0;
        for (int k = 0; k < res->world; k++) mean += res->loss[k];
        mean /= res->world;
        if (fabs(mean - res->ref_loss) > res->tol * fmax(1.0, fabs(res->ref_loss))) {
            gcd_sb_printf(&m, "the ranks' mean loss %.9g differs from the single-process objective %.9g: the forward itself is wrong",
                          mean, res->ref_loss);
            emit(res, "forward", 1, NULL, &m);
        }
    }

    if (check) stage_cause(res);
    if ((n = count(res, none_real, NULL))) {   // None on every rank where the reference has one (or there is none to ask)
        int have = count(res, with_grad, NULL);
        gcd_sb words = { 0 };
        names(res, none_real, NULL, &words, &ids);
        names(res, with_grad, NULL, &others, NULL);
        if (have == 0) gcd_sb_printf(&m, "no parameter receives a gradient on any rank (None): nothing is learned");
        else if (have < res->nparam / 2 + 1 && have < n)
            gcd_sb_printf(&m, "only %d of %d parameters %s a gradient: %s; %s %s None on every rank%s", have, res->nparam,
                          plural(have, "receives", "receive"), others.s, words.s, plural(n, "gets", "get"),
                          check ? "" : ": the gather detached everything before it");
        else
            gcd_sb_printf(&m, "%s %s no gradient on any rank (None); %s %s one", words.s, plural(n, "receives", "receive"), others.s,
                          plural(have, "still gets", "still get"));
        if (check && !res->no_ref)   // the reference has them: cut on the way
            gcd_sb_printf(&m, "; the single-process reference has a gradient for %s: something between %s and the loss cut the graph "
                              "(a gather under no_grad, such as Lightning's all_gather(sync_grads=False); a plain torch.distributed.all_gather, "
                              "which has no autograd: use torch.distributed.nn.functional.all_gather; or a detach())",
                          plural(n, "it", "them"), plural(n, "it", "them"));
        gcd_sb_free(&words);
        gcd_sb_free(&others);
        emit(res, "none", 1, &ids, &m);
    }
    if ((n = count(res, ran_none, NULL))) {   // None everywhere, reference included, though its module ran
        gcd_sb u = { 0 };
        names(res, ran_none, NULL, &u, &ids);
        gcd_sb_printf(&m, "%s %s in the forward (the dumps recorded %s module's forward) but %s no gradient on any rank nor in the "
                          "single-process reference: something cut %s from the loss in both: torch.utils.checkpoint(use_reentrant=True) "
                          "over inputs that do not require grad (use use_reentrant=False), a torch.no_grad() block, or a detach(); or "
                          "the output is computed and never used by the loss (then freeze %s, requires_grad_(False), or --ignore %s)",
                      u.s, "ran", plural(n, "its", "their"), plural(n, "gets", "get"), plural(n, "it", "them"),
                      plural(n, "it", "them"), plural(n, "it", "them"));
        gcd_sb_free(&u);
        emit(res, "ran_none", 1, &ids, &m);
    }
    if ((n = count(res, none_in_ref, NULL))) {   // None in the reference too: the model's, not the distribution's
        gcd_sb u = { 0 };
        names(res, none_in_ref, NULL, &u, &ids);
        gcd_sb_printf(&m, "%s %s no gradient on any rank nor in the single-process reference: unused by the loss, not a "
                          "distributed-training defect (--ignore %s to leave %s out)",
                      u.s, plural(n, "has", "have"), plural(n, "it", "them"), plural(n, "it", "them"));
        gcd_sb_free(&u);
        emit(res, "note", 0, &ids, &m);
    }
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (p->status != GCD_ST_PARTIAL || p->explained) continue;
        gcd_sb_printf(&ids, "%s", p->name);
        gcd_sb_printf(&m, "%s has a gradient on %d of %d ranks; None on rank%s ", p->name, p->nhave, res->world,
                      plural(res->world - p->nhave, "", "s"));
        gcd_ranks_list(&m, p->has, 0, res->world);
        emit(res, "partial", 1, &ids, &m);
    }
    st = GCD_ST_ZERO;
    if ((n = count(res, by_status, &st))) {
        names(res, by_status, &st, &m, &ids);
        if (!res->no_ref)
            gcd_sb_printf(&m, " %s a gradient of exactly zero where the reference's is not", plural(n, "gets", "get"));
        else gcd_sb_printf(&m, " %s a gradient of exactly zero on every rank that has one", plural(n, "gets", "get"));
        emit(res, "zero", 1, &ids, &m);
    }
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (p->status != GCD_ST_NONFINITE || p->explained) continue;
        gcd_sb_printf(&ids, "%s", p->name);
        if (p->rank_nonfinite) {
            gcd_sb_printf(&m, "%s: NaN or infinite gradient values", p->name);
            for (int k = 0, c = 0; k < res->world; k++)
                if (p->rank_nonfinite[k])
                    gcd_sb_printf(&m, "%s on rank %d: %ld of %zu (first at index %ld)", c++ ? ";" : "", k,
                                  p->rank_nonfinite[k], p->n, p->rank_first_nonfinite[k]);
        } else {
            gcd_sb_printf(&m, "%s: %ld of %zu gradient values are NaN or infinite (first at index %ld)", p->name, p->nonfinite, p->n,
                          p->first_nonfinite);
        }
        emit(res, "nonfinite", 1, &ids, &m);
    }
    st = GCD_ST_DISAGREE;
    if ((n = count(res, by_status, &st))) {
        const gcd_param_result *worst = NULL;
        for (int i = 0; i < res->nparam; i++)
            if (by_status(&res->param[i], &st) && (!worst || res->param[i].diff_rel > worst->diff_rel)) worst = &res->param[i];
        names(res, by_status, &st, &m, &ids);
        gcd_sb_printf(&m, " %s different gradients on different ranks after DDP's all-reduce, where every rank must hold the same: ",
                      plural(n, "holds", "hold"));
        if (n > 1) gcd_sb_printf(&m, "%s differs most, ", worst->name);
        gcd_sb_printf(&m, "by up to %.3g (relative %.3g) between rank %d and rank", worst->max_diff, worst->diff_rel,
                      worst->diff_base >= 0 ? worst->diff_base : worst->first);
        int nd = 0;
        for (int k = 0; k < res->world; k++) nd += worst->differs[k];
        gcd_sb_printf(&m, "%s ", plural(nd, "", "s"));
        gcd_ranks_list(&m, worst->differs, 1, res->world);
        gcd_sb_printf(&m, " (a parameter outside DDP, a no_sync misuse, a gradient changed after the all-reduce, "
                          "torch.utils.checkpoint(use_reentrant=True) around code that runs more than once per step, or, in sharded "
                          "dumps, replicas of one shard (HSDP) that differ)");
        emit(res, "disagree", 1, &ids, &m);
    }
    double *scales = NULL;   // the distinct scales named so far
    int nscales = 0;
    for (int i = 0; i < res->nparam; i++) {   // one finding per distinct scale
        const gcd_param_result *p = &res->param[i];
        if (p->status != GCD_ST_SCALED || p->explained) continue;
        int seen = 0;
        for (int j = 0; j < nscales && !seen; j++) seen = same_shown(p->scale, scales[j], p->allowed);
        if (seen) continue;
        scales = realloc(scales, (size_t)(nscales + 1) * sizeof *scales);
        mallocCheck(scales);
        scales[nscales++] = p->scale;
        n = names(res, same_scale, p, &m, &ids);
        double c = shown_scale(p->scale, p->allowed);
        gcd_sb_printf(&m, " %s the reference x%.6g", plural(n, "gradient is", "gradients are"), c);
        scale_cause(&m, c, res->world, check);
        st = GCD_ST_OK;
        int ok = count(res, by_status, &st);
        if (ok) {
            names(res, by_status, &st, &others, NULL);
            gcd_sb_printf(&m, " while %s %s x1", others.s, plural(ok, "is", "are"));
            gcd_sb_free(&others);
        }
        emit(res, "scaled", 1, &ids, &m);
    }
    free(scales);
    if (res->batchnorm) batchnorm_cause(res);
    if (count(res, grouped_mismatch, NULL) > GROUPS) mismatch_groups(res);
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        if (p->status != GCD_ST_MISMATCH || p->grouped || p->explained) continue;
        gcd_sb_printf(&ids, "%s", p->name);
        if (p->ref_none) gcd_sb_printf(&m, "%s: the ranks have a gradient but the single-process reference has none (None)", p->name);
        else if (p->n == 1 && p->scale > 0)
            gcd_sb_printf(&m, "%s: wrong value: %.6g times the reference's (one value: its ratio is no evidence of a scale factor, and no "
                              "other gradient shows it)", p->name, p->scale);
        else if (p->scale < 0 && fabs(p->scale + 1) <= fmax(0.05, p->allowed) && p->cosine <= -0.95)
            gcd_sb_printf(&m, "%s: negated: the reference x-1 (cosine %.3g): a gradient subtracted where it is added, or a loss with the "
                              "wrong sign", p->name, p->cosine);
        else if (p->scale <= 0)
            gcd_sb_printf(&m, "%s: wrong gradient, pointing away from the reference (scale %.3g, cosine %.3g, relative error %.3g)", p->name,
                          p->scale, p->cosine, p->rel_err);
        else
            gcd_sb_printf(&m, "%s: wrong gradient, neither the reference nor a multiple of it: relative error %.3g, cosine %.3g", p->name,
                          p->rel_err, p->cosine);
        emit(res, "mismatch", 1, &ids, &m);
    }
    st = GCD_ST_UNDECIDED;
    if ((n = count(res, by_status, &st))) {
        names(res, by_status, &st, &m, &ids);
        gcd_sb_printf(&m, " cannot be judged from one reference: %s from it by no more than rounding noise does where a true gradient is "
                          "about zero, and not in its direction; give a second reference computed in another order (rows permuted: "
                          "check_ddp does; check DUMPS --ref A --ref B) to measure %s noise", plural(n, "it differs", "they differ"),
                      plural(n, "its", "their"));
        emit(res, "undecided", 1, &ids, &m);
    }
    if (res->steps > 0) {   // divergence: a loss or a parameter that stopped being a number
        int at = -1;
        for (int s = 0; s < res->nloss && at < 0; s++)
            for (int k = 0; k < res->world; k++)
                if (!isfinite(res->loss[(size_t)s * res->world + k])) at = s;
        int bad_params = 0;
        for (int i = 0; i < res->nparam; i++) bad_params += !isfinite(res->param[i].moved);
        if (at >= 0 || bad_params) {
            if (at >= 0) gcd_sb_printf(&m, "training diverged: the loss is not finite from step %d of %d (lr %g)", at + 1, res->steps, res->lr);
            else gcd_sb_printf(&m, "training diverged: the loss stayed finite, but parameters did not (lr %g)", res->lr);
            if (bad_params) gcd_sb_printf(&m, "; %d of %d parameters hold NaN or infinite values at the end", bad_params, res->nparam);
            emit(res, "diverged", 1, NULL, &m);
        }
    }
    if (res->steps > 0 && (n = count(res, stuck, NULL))) {
        const double *first = res->loss, *last = res->loss + (size_t)(res->nloss - 1) * res->world;
        double l0 = 0, l1 = 0;
        for (int k = 0; k < res->world; k++) l0 += first[k] / res->world, l1 += last[k] / res->world;
        if (l1 != l0) {
            gcd_sb w = { 0 };
            names(res, stuck, NULL, &w, &ids);
            gcd_sb_printf(&m, "learning stopped: the loss went %.6g -> %.6g over %d steps while %s never moved (bit-identical to the start)",
                          l0, l1, res->steps, w.s);
            gcd_sb_free(&w);
            emit(res, "learning_stopped", 1, &ids, &m);
        }
    }
    st = GCD_ST_OK;
    if ((n = count(res, by_status, &st))) {
        double worst = 0;
        for (int i = 0; i < res->nparam; i++)
            if (res->param[i].status == GCD_ST_OK && res->param[i].tol_source != GCD_TOL_MEASURED && res->param[i].rel_err > worst) worst = res->param[i].rel_err;
        gcd_sb w = { 0 };
        names(res, by_status, &st, &w, &ids);
        if (n == res->nparam) gcd_sb_printf(&m, "every parameter matches the single-process reference (max relative error %.2g)", worst);
        else gcd_sb_printf(&m, "%s %s the reference (max relative error %.2g)", w.s, plural(n, "matches", "match"), worst);
        gcd_sb_free(&w);
        emit(res, "note", 0, &ids, &m);
    }
    if ((n = count(res, measured_ok, NULL))) {
        gcd_sb w = { 0 };
        names(res, measured_ok, NULL, &w, &ids);
        gcd_sb_printf(&m, "%s %s within %g x %s measured noise (what the two references differ by) and not correlated with the reference: "
                          "rounding noise, judged ok (%s own relative error says nothing where the true gradient is about zero)",
                      w.s, plural(n, "is", "are"), GCD_NOISE_K, plural(n, "its", "their"), plural(n, "its", "their"));
        gcd_sb_free(&w);
        emit(res, "note", 0, &ids, &m);
    }
    const gcd_param_result *loosest;
    res->sensitivity = sensitivity(res, &loosest);
    if (loosest && (res->nondeterministic || res->sensitivity > GCD_INSENSITIVE)) {
        gcd_sb_printf(&ids, "%s", loosest->name);
        gcd_sb_printf(&m, "insensitive: this check accepted differences of up to %.3g relative (%s, %s)", res->sensitivity, loosest->name,
                      loosest->tol_source == GCD_TOL_MEASURED ? "its measured noise" : "its tolerance");
        if (res->nondeterministic)
            gcd_sb_printf(&m, "; the step ran layers that draw random numbers (%s): the ranks and the reference draw different masks, so "
                              "their noise hides real errors; put them in eval mode (or p=0) for the check", res->nondeterministic);
        else gcd_sb_printf(&m, ": an error smaller than that there could not have been seen");
        emit(res, "note", 0, &ids, &m);
    }
    st = GCD_ST_PRESENT;
    if ((n = count(res, by_status, &st))) {
        gcd_sb w = { 0 };
        names(res, by_status, &st, &w, &ids);
        gcd_sb_printf(&m, "%s %s a finite, non-zero gradient%s; no reference (--ref) to compare %s values with", w.s,
                      plural(n, "has", "have"), res->world > 1 ? " on every rank" : "", plural(n, "its", "their"));
        gcd_sb_free(&w);
        emit(res, "note", 0, &ids, &m);
    }
    if (res->world == 1 && !check) {
        gcd_sb_printf(&m, "world 1: a one-rank process group still detaches under sync_grads=False; putting the rank's own rows back "
                          "and averaging are exact here (1/world = 1), so their defects appear only with world > 1");
        emit(res, "note", 0, NULL, &m);
    }
    index_free();
}

int gcd_run_has_finding(const gcd_run_result *res) {
    for (int i = 0; i < res->nfinding; i++)
        if (res->finding[i].counts) return 1;
    return 0;
}
