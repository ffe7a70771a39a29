#include "guard/rows.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "diagnose/verdict.h"

// ||a - c b||^2 / k: the sketch's estimate of ||x - c y||^2 (E[s_j^2] = ||x||^2)
static double sketch_d2(const double *a, const double *b, double c, int k) {
    double ss = 0;
    for (int j = 0; j < k; j++) ss += (a[j] - c * b[j]) * (a[j] - c * b[j]);
    return ss / k;
}

void gcd_guard_fill(gcd_param_result *p, gcd_sums *s, const double *const *rows, int world, int k, int sharded) {
    p->has = gcd_malloc((size_t)world);
    p->differs = gcd_malloc((size_t)world);
    p->rank_norm = gcd_malloc((size_t)world * sizeof *p->rank_norm);
    p->rank_nonfinite = gcd_malloc((size_t)world * sizeof *p->rank_nonfinite);
    p->rank_first_nonfinite = gcd_malloc((size_t)world * sizeof *p->rank_first_nonfinite);
    p->first = p->diff_base = -1;
    p->max_diff = p->diff_rel = 0;
    double ss = 0;
    for (int r = 0; r < world; r++) {
        const double *x = rows[r];
        p->has[r] = x && x[GCD_GUARD_PRESENT] != 0;
        p->ran |= x && x[GCD_GUARD_RAN] != 0;
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
    const double *g = rows[p->first];
    double norm = sharded ? sqrt(ss) : g[GCD_GUARD_NORM];
    s->gg = norm * norm;
    s->allzero = norm == 0;
    if (sharded || s->nonfinite) return;   // a NaN differs from everything: non-finite comes first
    p->diff_base = p->first;
    for (int r = p->first + 1; r < world; r++) {
        if (!p->has[r]) continue;
        const double *x = rows[r];
        double d = fmax(sqrt(sketch_d2(x + GCD_GUARD_COLS, g + GCD_GUARD_COLS, 1, k)), fabs(x[GCD_GUARD_NORM] - norm));
        double rel = norm > 0 ? d / norm : (d > 0 ? INFINITY : 0);
        p->max_diff = fmax(p->max_diff, d);
        p->diff_rel = fmax(p->diff_rel, rel);
        p->differs[r] = rel > p->tol;
    }
}

void gcd_guard_param_free(gcd_param_result *p) {
    free(p->has), free(p->differs), free(p->rank_norm), free(p->rank_nonfinite), free(p->rank_first_nonfinite);
    p->has = p->differs = NULL, p->rank_norm = NULL, p->rank_nonfinite = p->rank_first_nonfinite = NULL;
}

void gcd_sketch_ref_sums(gcd_sums *s, const double *sg, double ng, const double *sr, double nr, int k) {
    s->has_ref = 1;
    if (!sr || !(nr > 0)) {   // a zero (or None) reference: g - r is g, known exactly
        s->rr = sr ? nr * nr : 0;
        s->gr = 0, s->dd = s->ee = s->gg;
        return;
    }
    double ssr = 0, sgr = 0;
    for (int j = 0; j < k; j++) ssr += sr[j] * sr[j], sgr += sg[j] * sr[j];
    double a = ssr > 0 ? sgr / ssr : 0;
    s->rr = nr * nr;
    s->gr = a * s->rr;
    s->dd = fmax(sketch_d2(sg, sr, 1, k), (ng - nr) * (ng - nr));
    s->ee = fmax(sketch_d2(sg, sr, a, k), (ng - fabs(a) * nr) * (ng - fabs(a) * nr));
}
