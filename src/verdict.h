/*
 * verdict: what the numbers say. Each parameter's DDP-mean gradient g is classified against the
 * single-process reference r (none, partial, zero, nonfinite, ok, scaled, mismatch), then the run's
 * findings are written in words. Nothing here looks at the gather mode: only at the numbers.
 */
#pragma once
#include "run.h"

#define GCD_TOL 1e-9   // float64 end to end: a different summation order costs ~1e-15 relative

const char *gcd_status_str(gcd_status s);

// Classifies one gradient: g (n) or NULL (None on every rank), nhave of world ranks had one.
void gcd_classify(gcd_param_result *p, int world, double tol);
// Classifies every parameter and writes res->finding.
void gcd_verdict(gcd_run_result *res);
// 1 when the run has a gradient finding (notes do not count)
int gcd_run_has_finding(const gcd_run_result *res);
