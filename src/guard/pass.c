/*
 * The guard's one pass over a float32 gradient on the CPU (python/gradcheck_dist/guard.py, _sketch): read as
 * rows of `row` values, each row's product with the column signs w and its sum of squares, in one read of the
 * gradient, where torch needs two (a matrix-vector product and a norm). Each row is summed in float32 over 32
 * lanes, the rows' squares in float64.
 */
#include "guard/guard.h"
#include "util.h"

enum { LANES = 32 };   // independent partial sums: 4 AVX registers each, so the adds do not wait on one another

GCD_CLONES void gcd_guard_rows_f32(const float *g, long long rows, int row, const float *w, float *v, double *ss) {
    double acc = 0;
    int whole = row - row % LANES;
    for (long long r = 0; r < rows; r++) {
        const float *x = g + r * (long long)row;
        float d[LANES] = { 0 }, q[LANES] = { 0 };
        for (int c = 0; c < whole; c += LANES)
#pragma omp simd
            for (int j = 0; j < LANES; j++) d[j] += x[c + j] * w[c + j], q[j] += x[c + j] * x[c + j];
        for (int c = whole; c < row; c++) d[0] += x[c] * w[c], q[0] += x[c] * x[c];
        float dd = 0, qq = 0;
        for (int j = 0; j < LANES; j++) dd += d[j], qq += q[j];
        v[r] = dd;
        acc += qq;
    }
    *ss = acc;
}
