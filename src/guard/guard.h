/*
 * guard: the judgement of `gradcheck_dist.guard`, inside training. Every rank summarises each parameter's
 * reduced gradient in a row of numbers (present, non-finite count and first index, norm, whether its module
 * ran, and a K-value linear sketch); the rows of every rank, all-gathered, come here. This fills a
 * gcd_run_result from them (ranks that disagree: their sketches and norms differ beyond tol), lets
 * gcd_verdict judge it, and writes the same JSON report as `check`, with the step and the ranks.
 * A plain C ABI for ctypes (python/gradcheck_dist/guard.py): libgradcheck_dist.so.
 */
#pragma once
#include <stddef.h>

// a summary row: GCD_GUARD_COLS numbers, then the sketch's k values
// NAME: a 32-bit hash of the parameter's name (every rank must list the same parameters in the same order);
// SHARDED: 1 where the rank holds a piece of the parameter (FSDP): the pieces are combined (norms as the root of
// the sum of squares, sketches added), not compared
enum { GCD_GUARD_NAME, GCD_GUARD_PRESENT, GCD_GUARD_NONFINITE, GCD_GUARD_FIRST_NONFINITE, GCD_GUARD_NORM, GCD_GUARD_RAN,
       GCD_GUARD_SHARDED, GCD_GUARD_COLS };

#define GCD_GUARD_ABI 1   // gcd_guard_abi(): the package refuses a library of another ABI

int gcd_guard_abi(void);
// summary: (world, nparam, GCD_GUARD_COLS + k). names: (nparam). ndim (nparam), shape (nparam, 8). tol: the relative difference between two ranks'
// gradients (estimated from the sketch, and the norms) that counts as disagreement.
// Returns 0 (clean), 1 (findings), 2 (bad input, such as ranks listing other parameters: err says why). *json (malloc'd, gcd_guard_free) gets the
// report; it is also written to report (NULL or "": not written; a write that fails: 3, err says why).
int gcd_guard_judge(const double *summary, int world, int nparam, int k, const char *const *names, const int *ndim,
                    const long long *shape, long long step, int every, double tol,
                    const char *report, char **json, char *err, size_t errlen);
void gcd_guard_free(char *p);
// the sketch's pass on the CPU: v[r] = sum_c g[r row + c] w[c] for r < rows, and *ss = sum of g's squares
void gcd_guard_rows_f32(const float *g, long long rows, int row, const float *w, float *v, double *ss);
