// Both stages, where the ranks disagree after the reduce: each rank's reduced gradient R_k against its
// own local one L_k (before the all-reduce), the mean of the local ones, and, where the local dump
// holds it, the gradient accumulated before the last backward E_k (name@earlier). What they equal says
// why the ranks disagree (docs/check-verdicts.md, "Ranks that disagree: why"). A chunk at a time.
#include <math.h>

#include "check/internal.h"

#define SCHUNK 4096

typedef struct {
    const gcd_check_set *set;
    const gcd_param_result *p;
    const gcd_st_tensor **R, **L, **E;   // (world) each rank's reduced, local and earlier tensors (E: NULL where absent)
    const gcd_st_tensor *ref;
    double *mL, *mE, *mR, *r, *v, *w, *e;   // (SCHUNK) means over ranks, the reference, one rank's R, L and E
    double *own, *split, *dref, *rr, *ll, *ee;   // (world) ||R-L||^2, ||R-(mean E+L-E)||^2, ||R-r||^2, ||R||^2, ||L||^2, ||E||^2
    double cons, mll, refsq;   // ||mean R - mean L||^2, ||mean L||^2, ||r||^2
    char *err;
    size_t len;
} stages;

// m elements of t from `at`, converted into out
static int load(stages *s, const gcd_st_file *f, const gcd_st_tensor *t, uint64_t at, size_t m, double *out) {
    const unsigned char *b = gcd_st_bytes(f, t, at, m, s->err, s->len);
    if (!b) return 2;
    gcd_check_convert(t->dtype, b, m, out);
    return 0;
}

// the means over ranks of one chunk: L, R and (where every rank has it) E
static int means(stages *s, uint64_t at, size_t m, int with_e) {
    int W = s->set->world;
    memset(s->mL, 0, m * sizeof *s->mL), memset(s->mR, 0, m * sizeof *s->mR), memset(s->mE, 0, m * sizeof *s->mE);
    for (int k = 0; k < W; k++) {
        if (load(s, &s->set->local[k], s->L[k], at, m, s->v) || load(s, &s->set->rank[k], s->R[k], at, m, s->w)) return 2;
        for (size_t i = 0; i < m; i++) s->mL[i] += s->v[i] / W, s->mR[i] += s->w[i] / W;
        if (!with_e) continue;
        if (load(s, &s->set->local[k], s->E[k], at, m, s->e)) return 2;
        for (size_t i = 0; i < m; i++) s->mE[i] += s->e[i] / W;
    }
    return 0;
}

// one chunk: every rank's distances to the three hypotheses and to the reference
static int chunk(stages *s, uint64_t at, size_t m, int with_e) {
    int W = s->set->world;
    if (means(s, at, m, with_e)) return 2;
    if (s->ref && load(s, &s->set->ref, s->ref, at, m, s->r)) return 2;
    for (size_t i = 0; i < m; i++) {
        double d = s->mR[i] - s->mL[i];
        s->cons += d * d, s->mll += s->mL[i] * s->mL[i];
        if (s->ref) s->refsq += s->r[i] * s->r[i];
    }
    for (int k = 0; k < W; k++) {
        if (load(s, &s->set->rank[k], s->R[k], at, m, s->w) || load(s, &s->set->local[k], s->L[k], at, m, s->v)) return 2;
        if (with_e && load(s, &s->set->local[k], s->E[k], at, m, s->e)) return 2;
        double own = 0, split = 0, dref = 0, rr = 0, ll = 0, ee = 0;
        for (size_t i = 0; i < m; i++) {
            double R = s->w[i], L = s->v[i], a = R - L;
            own += a * a, rr += R * R, ll += L * L;
            if (with_e) {
                double c = R - (s->mE[i] + L - s->e[i]);
                split += c * c, ee += s->e[i] * s->e[i];
            }
            if (s->ref) {
                double c = R - s->r[i];
                dref += c * c;
            }
        }
        s->own[k] += own, s->split[k] += split, s->dref[k] += dref, s->rr[k] += rr, s->ll[k] += ll, s->ee[k] += ee;
    }
    return 0;
}

// The cause the sums show (GCD_SC_*), each figure relative to the larger of ||R_k|| and ||L_k||
static int decide(const stages *s, gcd_param_result *p, int with_e) {
    int W = s->set->world, unreduced = 1, split = with_e;
    double tol = p->tol;
    p->split_rel = with_e ? 0 : NAN;
    p->accumulated = 0;
    for (int k = 0; k < W; k++) {
        double base = fmax(sqrt(s->rr[k]), sqrt(s->ll[k]));
        p->own_rel[k] = base > 0 ? sqrt(s->own[k]) / base : 0;
        if (s->ref) p->ref_rel[k] = s->refsq > 0 ? sqrt(s->dref[k]) / sqrt(s->refsq) : NAN;
        unreduced &= p->own_rel[k] <= tol;
        if (with_e) {
            double rel = base > 0 ? sqrt(s->split[k]) / base : 0;
            p->split_rel = fmax(p->split_rel, rel);
            split &= rel <= tol;
            p->accumulated |= sqrt(s->ee[k]) > tol * base;   // a backward before the last one gave this rank a gradient
        }
    }
    if (unreduced) return GCD_SC_UNREDUCED;
    if (split) return GCD_SC_LAST_UNSYNCED;
    // the ranks' reduced gradients still average to the mean of their local ones: part of each was averaged
    if (sqrt(s->cons) <= tol * sqrt(s->mll)) return GCD_SC_PART;
    return GCD_SC_OTHER;
}

static int every_rank(const gcd_st_tensor **t, int W) {
    for (int k = 0; k < W; k++)
        if (!t[k]) return 0;
    return 1;
}

int gcd_check_stages(const gcd_check_set *set, gcd_param_result *p, int sharded, char *err, size_t len) {
    int W = set->world, rc = 0;
    if (!set->local || sharded || p->status != GCD_ST_DISAGREE || p->n == 0) return 0;
    stages s = { .set = set, .p = p, .err = err, .len = len };
    s.R = gcd_malloc((size_t)W * sizeof *s.R), s.L = gcd_malloc((size_t)W * sizeof *s.L), s.E = gcd_malloc((size_t)W * sizeof *s.E);
    char name[512];
    snprintf(name, sizeof name, "%s@earlier", p->name);
    for (int k = 0; k < W; k++) {
        s.R[k] = gcd_st_find(&set->rank[k], p->name), s.L[k] = gcd_st_find(&set->local[k], p->name);
        s.E[k] = gcd_st_find(&set->local[k], name);
        if (s.L[k] && s.R[k] && s.L[k]->n != s.R[k]->n) s.L[k] = NULL;   // not the same tensor: nothing to compare
        if (s.E[k] && ((s.L[k] && s.E[k]->n != s.L[k]->n) || s.E[k]->dtype == GCD_DT_OTHER)) s.E[k] = NULL;
    }
    s.ref = set->has_ref ? gcd_st_find(&set->ref, p->name) : NULL;
    if (s.ref && s.ref->n != p->n) s.ref = NULL;
    int with_e = every_rank(s.E, W);
    if (every_rank(s.R, W) && every_rank(s.L, W)) {
        double *buf = gcd_malloc(7 * SCHUNK * sizeof *buf), *acc = gcd_malloc(6 * (size_t)W * sizeof *acc);
        s.mL = buf, s.mE = buf + SCHUNK, s.mR = buf + 2 * SCHUNK, s.r = buf + 3 * SCHUNK, s.v = buf + 4 * SCHUNK, s.w = buf + 5 * SCHUNK, s.e = buf + 6 * SCHUNK;
        s.own = acc, s.split = acc + W, s.dref = acc + 2 * W, s.rr = acc + 3 * W, s.ll = acc + 4 * W, s.ee = acc + 5 * W;
        for (uint64_t at = 0; !rc && at < p->n; at += SCHUNK) rc = chunk(&s, at, p->n - at < SCHUNK ? (size_t)(p->n - at) : SCHUNK, with_e);
        if (!rc) p->stage_cause = decide(&s, p, with_e);
        for (int k = 0; k < W; k++) {
            gcd_st_release(&set->rank[k], s.R[k]), gcd_st_release(&set->local[k], s.L[k]);
            if (s.E[k]) gcd_st_release(&set->local[k], s.E[k]);
        }
        if (s.ref) gcd_st_release(&set->ref, s.ref);
        free(buf), free(acc);
    }
    free(s.R), free(s.L), free(s.E);
    return rc;
}
