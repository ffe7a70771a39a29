/*
 * guard/rows: one parameter judged from its summary rows, for the guard (rows all-gathered inside training)
 * and for `check` on sketch dumps (rows read from the files). A row is GCD_GUARD_COLS numbers (guard.h) then
 * a K-value linear sketch s = P g: K seeded projections with E[s_j^2] = ||g||^2.
 */
#pragma once
#include "diagnose/run.h"
#include "guard/guard.h"

// p's per-rank figures and s's (gg, allzero, non-finite) from one row per rank (rows[r]: NULL or a row with
// PRESENT 0 for a rank without the gradient). Sharded: the ranks' pieces combine (norms as the root of the sum
// of squares, non-finite counts add), nothing compared. Replicated: every rank with a gradient must hold the
// first one's, within p->tol relative, by its sketch (||s_a - s_b|| / sqrt(k)) and its norm.
// Allocates p->has, differs, rank_norm, rank_nonfinite, rank_first_nonfinite (gcd_guard_param_free).
void gcd_guard_fill(gcd_param_result *p, gcd_sums *s, const double *const *rows, int world, int k, int sharded);
void gcd_guard_param_free(gcd_param_result *p);

// s's reference sums from sketches: g's sketch sg and norm ng (its exact float64 norm), the reference's sr and
// nr (sr NULL: no gradient in the reference, which counts as zeros). The scale a = <sg, sr> / <sr, sr> is fitted
// on the sketch (gr = a ||r||^2), and the distances are the sketch's unbiased estimates, never below what the
// exact norms prove (the triangle inequality):
//   ||g - r||^2   = max(||sg - sr||^2 / k,   (||g|| - ||r||)^2)
//   ||g - a r||^2 = max(||sg - a sr||^2 / k, (||g|| - |a| ||r||)^2)
// docs/check-verdicts.md gives the false-alarm and miss probabilities these estimates carry.
void gcd_sketch_ref_sums(gcd_sums *s, const double *sg, double ng, const double *sr, double nr, int k);
