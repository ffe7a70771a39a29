/*
 * verdict: what the numbers say, for `run` and `check` alike. Each parameter's gradient g is
 * classified against its reference r (none, partial, zero, nonfinite, disagree, ok, scaled, mismatch,
 * present) from sums streamed over its values, then the run's findings are written in words. Nothing
 * here looks at the gather mode or a file's name: only at the numbers.
 */
#pragma once
#include "diagnose/run.h"

#define GCD_TOL 1e-9   // float64 end to end: a different summation order costs ~1e-15 relative

// Measured noise (check with two references, docs/check-verdicts.md): a gradient within GCD_NOISE_K x
// ||r - b|| of the reference r is noise, unless its difference follows b: |corr| beyond GCD_CORR_SIGMAS
// standard deviations of uncorrelated noise (1/sqrt(n)), and beyond GCD_CORR_FLOOR, over at least
// GCD_CORR_MIN_N values.
#define GCD_NOISE_K 10.0
#define GCD_CORR_SIGMAS 6.0
#define GCD_CORR_FLOOR 0.05
#define GCD_CORR_MIN_N 16
#define GCD_INSENSITIVE 0.05   // a check that accepted more relative error than this somewhere says so (a note)

const char *gcd_status_str(gcd_status s);

// ---- the classifier, streamed: sums over chunks of (g, r), then one decision
void gcd_sums_init(gcd_sums *s, int has_ref);
// adds n values of g and r (r NULL: no reference, or a None one) that start at element `at`
void gcd_sums_add(gcd_sums *s, const double *g, const double *r, size_t n, size_t at);
// 1 when the claimed tolerance does not pass g: only then is the second reference read (gcd_sums_noise,
// a second pass), which costs a clean tensor nothing
int gcd_sums_need_noise(const gcd_sums *s, double tol);
// adds the second reference b's sums over n values of g and r: ||r - b||^2, <g - r, b>, <b,b>
void gcd_sums_noise(gcd_sums *s, const double *g, const double *r, const double *b, size_t n);
// 1 when the decision needs ee, the residual of g against c r (c = gr/rr): a second pass of sums_resid
int gcd_sums_need_resid(const gcd_sums *s, double tol);
void gcd_sums_resid(gcd_sums *s, const double *g, const double *r, size_t n);
// Sets p's status and figures from s. p->nhave, p->differs/diff_rel (check) and p->tol (this tensor's
// claimed relative tolerance; 0: tol) are read.
void gcd_classify_sums(gcd_param_result *p, const gcd_sums *s, int world, double tol);
// The same from p->reduced (NULL: None on every rank) and p->reference, in memory (the probes).
void gcd_classify(gcd_param_result *p, int world, double tol);

// "1, 2 and 3": the ranks k where flag[k] == want
void gcd_ranks_list(gcd_sb *m, const unsigned char *flag, int want, int world);

// Classifies every parameter (unless res->classified) and writes res->finding.
void gcd_verdict(gcd_run_result *res);
// 1 when the run has a gradient finding (notes do not count)
int gcd_run_has_finding(const gcd_run_result *res);
