#define _GNU_SOURCE   // sched_getaffinity, CPU_COUNT
#include "engine/ops.h"

#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#include "engine/autograd.h"
#include "engine/exp.h"

// ----------------------------------------------------------------------------
// kernels

// The products go through CBLAS (row-major dgemm): out = x w^T, dx += dout w, dw += dout^T x. OpenBLAS
// splits a product over the output's rows and columns, not over the sum, so each element's sum keeps
// one order: the same shapes and values give the same bits on every rank, run to run, with one thread
// or two (tests/test_ops.c). beta 0 ignores what out held: outputs need no zeroing.

void linear_forward(double *out, const double *x, const double *w, const double *b, int N, int C, int OC) {
    if (b)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, b, (size_t)OC * sizeof(double));
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0, x, C, w, C, b ? 1.0 : 0.0, out, OC);
}

void linear_backward(double *dx, double *dw, double *db, const double *dout, const double *x, const double *w,
                     int N, int C, int OC) {
    if (db)
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) db[o] += dout[(size_t)n * OC + o];
    if (dx) cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0, dout, OC, w, C, 1.0, dx, C);
    if (dw) cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0, dout, OC, x, C, 1.0, dw, C);
}

const char *gcd_blas_config(void) { return openblas_get_config(); }

void gcd_blas_share_cpus(int ranks) {
    cpu_set_t set;
    int bound = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int share = (int)sysconf(_SC_NPROCESSORS_ONLN) / ranks;
    openblas_set_num_threads(share < bound ? (share > 1 ? share : 1) : bound);
}

void relu_forward(double *out, const double *x, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = x[i] > 0 ? x[i] : 0.0;
}

void relu_backward(double *dx, const double *dout, const double *x, size_t n) {
    for (size_t i = 0; i < n; i++) dx[i] += x[i] > 0 ? dout[i] : 0.0;
}

void mul_forward(double *out, const double *a, const double *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] * b[i];
}

void mul_backward(double *da, double *db, const double *dout, const double *a, const double *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (da) da[i] += dout[i] * b[i];
        if (db) db[i] += dout[i] * a[i];
    }
}

void mse_forward(double *out, const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = a[i] - (b ? b[i] : 0.0);
        s += d * d;
    }
    out[0] = s / (double)n;
}

void mse_backward(double *da, double *db, const double *dout, const double *a, const double *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double g = dout[0] * 2.0 * (a[i] - (b ? b[i] : 0.0)) / (double)n;
        if (da) da[i] += g;
        if (db) db[i] -= g;
    }
}

// s is dgemm's alpha: no second pass over out. A zero or non-finite s multiplies afterwards, as
// s * (a b^T) does: dgemm with alpha 0 reads neither input, and a NaN in them must still reach out.
void matmul_nt_forward(double *out, const double *a, const double *b, int M, int N, int K, double s) {
    int plain = s != 0 && isfinite(s);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, plain ? s : 1.0, a, K, b, K, 0.0, out, N);
    for (size_t i = 0; !plain && i < (size_t)M * N; i++) out[i] *= s;
}

void matmul_nt_backward(double *da, double *db, const double *dout, const double *a, const double *b, int M, int N, int K) {
    if (da) cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0, dout, N, b, K, 1.0, da, K);
    if (db) cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0, dout, N, a, K, 1.0, db, K);
}

#define NORMALIZE_EPS 1e-12

void normalize_forward(double *out, double *norm, const double *x, int N, int D) {
    for (int n = 0; n < N; n++) {
        double s = 0;
        for (int d = 0; d < D; d++) s += x[n * D + d] * x[n * D + d];
        norm[n] = sqrt(s);
        double den = norm[n] > NORMALIZE_EPS ? norm[n] : NORMALIZE_EPS;
        for (int d = 0; d < D; d++) out[n * D + d] = x[n * D + d] / den;
    }
}

void normalize_backward(double *dx, const double *dout, const double *out, const double *norm, int N, int D) {
    for (int n = 0; n < N; n++) {
        const double *y = out + n * D, *dy = dout + n * D;
        if (norm[n] <= NORMALIZE_EPS) {   // the denominator is the constant eps
            for (int d = 0; d < D; d++) dx[n * D + d] += dy[d] / NORMALIZE_EPS;
            continue;
        }
        double dot = 0;
        for (int d = 0; d < D; d++) dot += y[d] * dy[d];
        for (int d = 0; d < D; d++) dx[n * D + d] += (dy[d] - y[d] * dot) / norm[n];
    }
}

// Cross-entropy keeps each row's max and sum of exp(z - max) (its log-sum-exp) and, where e is given,
// the exp(z - max) themselves, for backward's exp(z - max) / sum. Without them backward recomputes each
// exp with the forward's operations in the forward's order, so the gradient has the same bits either
// way; cross_entropy() keeps them up to CE_KEEP values (8 MiB) and recomputes past that: for the
// contrastive probe at B=1024, world 4 that is two (4096 x 4096) float64 buffers (256 MiB) fewer per
// pass, and below it the exps (most of the loss's time) once instead of twice. The column-wise pair
// scores z's columns, as cross_entropy of z^T would, without the transpose: the same sums in the same order.

// exp(z - m) of len values into v, in gcd_exp_n's batches: m (len) per value, or m0 for all
#define EXP_CHUNK 256   // values a stack buffer holds where the exps are not kept
#define ROWS 4          // rows whose running sums interleave: four chains of additions in flight, each in its row's order

static int chunk(int C, int c0) { return C - c0 < EXP_CHUNK ? C - c0 : EXP_CHUNK; }   // the batch from c0 of C

static const double *exps(double *v, const double *z, const double *m, double m0, int len) {
    if (m) {   // two loops: a vectorised m ? m[j] : m0 may read m[j] whatever m is
#pragma omp simd
        for (int j = 0; j < len; j++) v[j] = z[j] - m[j];
    } else {
#pragma omp simd
        for (int j = 0; j < len; j++) v[j] = z[j] - m0;
    }
    gcd_exp_n(v, v, (size_t)len);
    return v;
}

// max(z (C)) with the bits of the serial mx = z[c] > mx ? z[c] : mx from z[0]: CHAINS such chains from
// z[0], then the same over their results. A value replaces a max only when greater, so the value is
// the serial one and so are its bits, but for a zero max (which sign came first): that takes the
// serial loop. z[0] NaN stays in every chain, as in the serial loop.
#define CHAINS 4

static double row_max(const double *z, int C) {
    double m[CHAINS];
    for (int k = 0; k < CHAINS; k++) m[k] = z[0];
    int c = 1;
    for (; c + CHAINS <= C; c += CHAINS)
        for (int k = 0; k < CHAINS; k++) m[k] = z[c + k] > m[k] ? z[c + k] : m[k];
    for (; c < C; c++) m[0] = z[c] > m[0] ? z[c] : m[0];
    double mx = m[0];
    for (int k = 1; k < CHAINS; k++) mx = m[k] > mx ? m[k] : mx;
    if (mx == 0)
        for (mx = z[0], c = 1; c < C; c++) mx = z[c] > mx ? z[c] : mx;
    return mx;
}

void cross_entropy_forward(double *out, double *lse, double *e, const double *z, const int *label, int N, int C) {
    double loss = 0, buf[ROWS][EXP_CHUNK];
    for (int n0 = 0; n0 < N; n0 += ROWS) {
        int r1 = N - n0 < ROWS ? N - n0 : ROWS;   // rows in this group; the chains past r1 add its last row's exps again, unkept
        const double *zr[ROWS];
        double mx[ROWS], s[ROWS] = { 0 };
        for (int r = 0; r < r1; r++) zr[r] = z + (size_t)(n0 + r) * C, mx[r] = row_max(zr[r], C);
        for (int c0 = 0; c0 < C; c0 += EXP_CHUNK) {
            int len = chunk(C, c0);
            const double *v[ROWS];
            for (int r = 0; r < ROWS; r++) v[r] = r < r1 ? exps(e ? e + (size_t)(n0 + r) * C + c0 : buf[r], zr[r] + c0, NULL, mx[r], len) : v[r1 - 1];
            for (int j = 0; j < len; j++)
                for (int r = 0; r < ROWS; r++) s[r] += v[r][j];
        }
        for (int r = 0; r < r1; r++) {
            lse[2 * (n0 + r)] = mx[r], lse[2 * (n0 + r) + 1] = s[r];
            loss += mx[r] + log(s[r]) - zr[r][label[n0 + r]];
        }
    }
    out[0] = loss / N;
}

void cross_entropy_backward(double *dz, const double *dout, const double *lse, const double *e, const double *z, const int *label, int N,
                            int C) {
    double k = dout[0] / N, buf[EXP_CHUNK];
    for (int n = 0; n < N; n++) {
        const double *zr = z + (size_t)n * C, mx = lse[2 * n], s = lse[2 * n + 1];
        double *dr = dz + (size_t)n * C;
        for (int c0 = 0; c0 < C; c0 += EXP_CHUNK) {
            int len = chunk(C, c0), at = label[n] - c0;
            const double *v = e ? e + (size_t)n * C + c0 : exps(buf, zr + c0, NULL, mx, len);
#pragma omp simd
            for (int j = 0; j < len; j++) dr[c0 + j] += k * (v[j] / s - (j == at));
        }
    }
}

void cross_entropy_cols_forward(double *out, double *lse, double *e, const double *z, const int *label, int N, int C) {
    double *mx = lse, *s = lse + C, loss = 0, buf[EXP_CHUNK];
    for (int c = 0; c < C; c++) mx[c] = z[c], s[c] = 0;
    for (size_t n = 1; n < (size_t)N; n++) {
        const double *zr = z + n * C;
#pragma omp simd
        for (int c = 0; c < C; c++) mx[c] = zr[c] > mx[c] ? zr[c] : mx[c];
    }
    for (size_t n = 0; n < (size_t)N; n++)
        for (int c0 = 0; c0 < C; c0 += EXP_CHUNK) {
            int len = chunk(C, c0);
            const double *v = exps(e ? e + n * C + c0 : buf, z + n * C + c0, mx + c0, 0, len);
            double *sc = s + c0;
#pragma omp simd
            for (int j = 0; j < len; j++) sc[j] += v[j];
        }
    for (int c = 0; c < C; c++) loss += mx[c] + log(s[c]) - z[(size_t)label[c] * C + c];
    out[0] = loss / C;
}

void cross_entropy_cols_backward(double *dz, const double *dout, const double *lse, const double *e, const double *z, const int *label,
                                 int N, int C) {
    double k = dout[0] / C, buf[EXP_CHUNK];
    const double *mx = lse, *s = lse + C;
    for (size_t n = 0; n < (size_t)N; n++)
        for (int c0 = 0; c0 < C; c0 += EXP_CHUNK) {
            int len = chunk(C, c0);
            const double *v = e ? e + n * C + c0 : exps(buf, z + n * C + c0, mx + c0, 0, len);
            const double *sc = s + c0;
            const int *lc = label + c0;
            double *dr = dz + n * C + c0;
#pragma omp simd
            for (int j = 0; j < len; j++) dr[j] += k * (v[j] / sc[j] - (n == (size_t)lc[j]));
        }
}


void layernorm_forward(double *out, double *saved, const double *x, const double *w, const double *b, int N, int C, double eps) {
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C;
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += xr[i];
        m /= C;
        for (int i = 0; i < C; i++) v += (xr[i] - m) * (xr[i] - m);
        double rstd = 1.0 / sqrt(v / C + eps);
        for (int i = 0; i < C; i++) out[(size_t)n * C + i] = (xr[i] - m) * rstd * w[i] + b[i];
        saved[2 * n] = m, saved[2 * n + 1] = rstd;
    }
}

// llm.c's layernorm_backward: with xhat = (x - mean) rstd and g = dout w,
// dx = rstd (g - mean(g) - xhat mean(g xhat))
void layernorm_backward(double *dx, double *dw, double *db, const double *dout, const double *x, const double *saved,
                        const double *w, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C, *dr = dout + (size_t)n * C;
        double m = saved[2 * n], rstd = saved[2 * n + 1], mg = 0, mgx = 0;
        for (int i = 0; i < C; i++) {
            double xhat = (xr[i] - m) * rstd, g = dr[i] * w[i];
            mg += g, mgx += g * xhat;
            if (dw) dw[i] += dr[i] * xhat;
            if (db) db[i] += dr[i];
        }
        mg /= C, mgx /= C;
        for (int i = 0; dx && i < C; i++) {
            double xhat = (xr[i] - m) * rstd;
            dx[(size_t)n * C + i] += rstd * (dr[i] * w[i] - mg - xhat * mgx);
        }
    }
}

#define CE_KEEP ((size_t)1 << 20)   // cross_entropy keeps up to this many exps (8 MiB) for its backward

static size_t ce_kept(const gcd_tensor *z) { return z->n <= CE_KEEP ? z->n : 0; }   // the exps cross_entropy() keeps, after lse

static void op_backward(gcd_ctx *c, gcd_node *nd);

// every op's node: recorded on the tape, differentiated by op_backward's switch below
static gcd_node *record(gcd_ctx *c, gcd_op op, gcd_tensor *out, int nin, gcd_tensor **in) {
    gcd_node *nd = gcd_record(c, op, out, nin, in);
    nd->backward = op_backward;
    return nd;
}

// ----------------------------------------------------------------------------
// autograd ops

static void need(int ok, const char *op, const char *what) {
    if (!ok) GCD_FATAL("%s: %s", op, what);
}

static gcd_tensor *scalar(gcd_ctx *c) { return gcd_tensor_empty(c, 0, NULL); }

gcd_tensor *gcd_linear(gcd_ctx *c, gcd_tensor *x, gcd_tensor *w, gcd_tensor *b) {
    need(x->ndim == 2 && w->ndim == 2 && x->shape[1] == w->shape[1], "linear", "x (N,C) and w (OC,C) do not match");
    need(!b || (b->ndim == 1 && b->shape[0] == w->shape[0]), "linear", "bias is not (OC)");
    int shape[2] = { x->shape[0], w->shape[0] };
    gcd_tensor *out = gcd_tensor_empty(c, 2, shape);
    linear_forward(out->data, x->data, w->data, b ? b->data : NULL, x->shape[0], x->shape[1], w->shape[0]);
    record(c, GCD_OP_LINEAR, out, 3, (gcd_tensor *[]){ x, w, b });
    return out;
}

gcd_tensor *gcd_relu(gcd_ctx *c, gcd_tensor *x) {
    gcd_tensor *out = gcd_tensor_like(c, x);
    relu_forward(out->data, x->data, x->n);
    record(c, GCD_OP_RELU, out, 1, &x);
    return out;
}

gcd_tensor *gcd_view(gcd_ctx *c, gcd_tensor *x, int ndim, const int *shape) {
    int s[GCD_MAX_DIM], infer = -1;
    size_t known = 1;
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (s[i] == -1) infer = i;
        else known *= (size_t)s[i];
    }
    if (infer >= 0) s[infer] = (int)(x->n / known);
    gcd_tensor *out = gcd_tensor_empty(c, ndim, s);
    need(out->n == x->n, "view", "the new shape has another number of elements");
    memcpy(out->data, x->data, x->n * sizeof(double));
    record(c, GCD_OP_VIEW, out, 1, &x);
    return out;
}

gcd_tensor *gcd_concat(gcd_ctx *c, int k, gcd_tensor **xs) {
    int rows = 0, cols = gcd_cols(xs[0]);
    for (int i = 0; i < k; i++) {
        need(gcd_cols(xs[i]) == cols && xs[i]->ndim == xs[0]->ndim, "concat", "inputs differ past dim 0");
        rows += gcd_rows(xs[i]);
    }
    int ndim = xs[0]->ndim ? xs[0]->ndim : 1;
    int shape[GCD_MAX_DIM] = { rows, xs[0]->ndim == 2 ? xs[0]->shape[1] : 0 };
    gcd_tensor *out = gcd_tensor_empty(c, ndim, shape);
    for (int i = 0, off = 0; i < k; off += (int)xs[i]->n, i++) memcpy(out->data + off, xs[i]->data, xs[i]->n * sizeof(double));
    record(c, GCD_OP_CONCAT, out, k, xs);
    return out;
}

gcd_tensor *gcd_mul(gcd_ctx *c, gcd_tensor *a, gcd_tensor *b) {
    need(a->n == b->n, "mul", "shapes differ");
    gcd_tensor *out = gcd_tensor_like(c, a);
    mul_forward(out->data, a->data, b->data, a->n);
    record(c, GCD_OP_MUL, out, 2, (gcd_tensor *[]){ a, b });
    return out;
}

gcd_tensor *gcd_mean(gcd_ctx *c, gcd_tensor *x) {
    gcd_tensor *out = scalar(c);
    double s = 0;
    for (size_t i = 0; i < x->n; i++) s += x->data[i];
    out->data[0] = s / (double)x->n;
    record(c, GCD_OP_MEAN, out, 1, &x);
    return out;
}

gcd_tensor *gcd_mse(gcd_ctx *c, gcd_tensor *a, gcd_tensor *target) {
    need(!target || target->n == a->n, "mse", "target's shape differs");
    gcd_tensor *out = scalar(c);
    mse_forward(out->data, a->data, target ? target->data : NULL, a->n);
    record(c, GCD_OP_MSE, out, 2, (gcd_tensor *[]){ a, target });
    return out;
}

gcd_tensor *gcd_matmul_nt(gcd_ctx *c, gcd_tensor *a, gcd_tensor *b, gcd_tensor *s) {
    need(a->ndim == 2 && b->ndim == 2 && a->shape[1] == b->shape[1], "matmul_nt", "a (M,K) and b (N,K) do not match");
    need(!s || s->n == 1, "matmul_nt", "the factor is not a scalar");
    int shape[2] = { a->shape[0], b->shape[0] };
    gcd_tensor *out = gcd_tensor_empty(c, 2, shape);
    matmul_nt_forward(out->data, a->data, b->data, a->shape[0], b->shape[0], a->shape[1], s ? s->data[0] : 1.0);
    record(c, GCD_OP_MATMUL_NT, out, s ? 3 : 2, (gcd_tensor *[]){ a, b, s });
    return out;
}

gcd_tensor *gcd_normalize(gcd_ctx *c, gcd_tensor *x) {
    gcd_tensor *out = gcd_tensor_like(c, x);
    double *norm = gcd_arena_alloc_raw(c->arena, (size_t)gcd_rows(x) * sizeof(double));
    normalize_forward(out->data, norm, x->data, gcd_rows(x), gcd_cols(x));
    record(c, GCD_OP_NORMALIZE, out, 1, &x)->saved = norm;
    return out;
}

gcd_tensor *gcd_exp(gcd_ctx *c, gcd_tensor *x) {
    gcd_tensor *out = gcd_tensor_like(c, x);
    for (size_t i = 0; i < x->n; i++) out->data[i] = exp(x->data[i]);
    record(c, GCD_OP_EXP, out, 1, &x);
    return out;
}

gcd_tensor *gcd_layernorm(gcd_ctx *c, gcd_tensor *x, gcd_tensor *w, gcd_tensor *b) {
    need(x->ndim == 2 && w->ndim == 1 && b->ndim == 1 && w->shape[0] == x->shape[1] && b->shape[0] == x->shape[1], "layer_norm",
         "x (N,C) with w and b (C) do not match");
    gcd_tensor *out = gcd_tensor_like(c, x);
    double *saved = gcd_arena_alloc_raw(c->arena, 2 * (size_t)x->shape[0] * sizeof(double));
    layernorm_forward(out->data, saved, x->data, w->data, b->data, x->shape[0], x->shape[1], 1e-5);
    record(c, GCD_OP_LAYERNORM, out, 3, (gcd_tensor *[]){ x, w, b })->saved = saved;
    return out;
}

// (outer, inner) blocks of x's row-major data that dim's [start, start + len) selects
static void narrow_geometry(const gcd_tensor *x, int dim, size_t *outer, size_t *stride, size_t *inner) {
    *outer = dim == 0 ? 1 : (size_t)x->shape[0];
    *stride = dim == 0 ? x->n : (size_t)x->shape[1];
    *inner = dim == 0 ? (x->shape[0] ? x->n / (size_t)x->shape[0] : 0) : 1;
}

gcd_tensor *gcd_narrow(gcd_ctx *c, gcd_tensor *x, int dim, int start, int len) {
    need(x->ndim >= 1 && (dim == 0 || (dim == 1 && x->ndim == 2)), "narrow", "dim is not 0, or 1 of an (N,C) tensor");
    need(start >= 0 && len >= 0 && start <= x->shape[dim] - len, "narrow", "[start, start + len) is out of range");
    int shape[GCD_MAX_DIM];
    memcpy(shape, x->shape, sizeof shape);
    shape[dim] = len;
    gcd_tensor *out = gcd_tensor_empty(c, x->ndim, shape);
    size_t outer, stride, inner;
    narrow_geometry(x, dim, &outer, &stride, &inner);
    for (size_t o = 0; o < outer; o++)
        memcpy(out->data + o * len * inner, x->data + o * stride + (size_t)start * inner, (size_t)len * inner * sizeof(double));
    gcd_node *nd = record(c, GCD_OP_NARROW, out, 1, &x);
    nd->mode = dim, nd->start = start;
    return out;
}

// rows: label (N), a class per row; cols: label (C), a row per column
static gcd_tensor *cross_entropy(gcd_ctx *c, gcd_tensor *z, const int *label, int cols) {
    need(z->ndim == 2, "cross_entropy", "logits are not (N,C)");
    int N = z->shape[0], C = z->shape[1], nlab = cols ? C : N, nclass = cols ? N : C;
    int *lab = gcd_arena_alloc_raw(c->arena, (size_t)nlab * sizeof(int));
    for (int i = 0; i < nlab; i++) {
        need(label[i] >= 0 && label[i] < nclass, "cross_entropy", "a label is out of range");
        lab[i] = label[i];
    }
    gcd_tensor *out = scalar(c);
    size_t keep = ce_kept(z);
    double *lse = gcd_arena_alloc_raw(c->arena, (2 * (size_t)nlab + keep) * sizeof(double));   // (nlab, 2) or (2, C), then (N, C)
    (cols ? cross_entropy_cols_forward : cross_entropy_forward)(out->data, lse, keep ? lse + 2 * nlab : NULL, z->data, lab, N, C);
    gcd_node *nd = record(c, GCD_OP_CROSS_ENTROPY, out, 1, &z);
    nd->saved = lse;
    nd->labels = lab;
    nd->mode = cols;
    return out;
}

gcd_tensor *gcd_cross_entropy(gcd_ctx *c, gcd_tensor *z, const int *label) { return cross_entropy(c, z, label, 0); }
gcd_tensor *gcd_cross_entropy_cols(gcd_ctx *c, gcd_tensor *z, const int *label) { return cross_entropy(c, z, label, 1); }

// ----------------------------------------------------------------------------
// backward dispatch: one switch over the op

// input i's gradient buffer, or NULL when that input takes no gradient
static double *din(gcd_ctx *c, gcd_node *nd, int i) {
    gcd_tensor *t = nd->in[i];
    return t && t->requires_grad ? gcd_grad_buf(c, t) : NULL;
}

#ifdef GCD_TEST_WRONG_OP   // built only into tests/test_blame: one op's backward off by a factor the test sets
// process-wide test hooks (tests/test_blame sets them before a run; not in the program)
int gcd_test_wrong_op = -1;
double gcd_test_wrong_factor = 1;

static const double *wrong(gcd_ctx *c, const gcd_node *nd, const double *dout) {
    if ((int)nd->op != gcd_test_wrong_op) return dout;
    double *d = gcd_arena_alloc(c->arena, nd->out->n * sizeof(double));
    for (size_t i = 0; i < nd->out->n; i++) d[i] = gcd_test_wrong_factor * dout[i];
    return d;
}
#endif

static void op_backward(gcd_ctx *c, gcd_node *nd) {
    gcd_tensor *out = nd->out, **in = nd->in;
    const double *dout = out->grad;
#ifdef GCD_TEST_WRONG_OP
    dout = wrong(c, nd, dout);
#endif
    switch (nd->op) {
    case GCD_OP_LINEAR:
        linear_backward(din(c, nd, 0), din(c, nd, 1), din(c, nd, 2), dout, in[0]->data, in[1]->data,
                        in[0]->shape[0], in[0]->shape[1], in[1]->shape[0]);
        break;
    case GCD_OP_RELU:
        relu_backward(din(c, nd, 0), dout, in[0]->data, out->n);
        break;
    case GCD_OP_VIEW: {
        double *dx = din(c, nd, 0);
        for (size_t i = 0; i < out->n; i++) dx[i] += dout[i];
        break;
    }
    case GCD_OP_CONCAT:
        for (int k = 0, off = 0; k < nd->nin; off += (int)in[k]->n, k++) {
            double *dx = din(c, nd, k);
            for (size_t i = 0; dx && i < in[k]->n; i++) dx[i] += dout[off + i];
        }
        break;
    case GCD_OP_MUL:
        mul_backward(din(c, nd, 0), din(c, nd, 1), dout, in[0]->data, in[1]->data, out->n);
        break;
    case GCD_OP_MEAN: {
        double *dx = din(c, nd, 0);
        for (size_t i = 0; i < in[0]->n; i++) dx[i] += dout[0] / (double)in[0]->n;
        break;
    }
    case GCD_OP_MSE:
        mse_backward(din(c, nd, 0), din(c, nd, 1), dout, in[0]->data, in[1] ? in[1]->data : NULL, in[0]->n);
        break;
    case GCD_OP_MATMUL_NT: {
        int M = in[0]->shape[0], N = in[1]->shape[0], K = in[0]->shape[1];
        double *da = din(c, nd, 0), *db = din(c, nd, 1);
        if (nd->nin == 2) {
            matmul_nt_backward(da, db, dout, in[0]->data, in[1]->data, M, N, K);
            break;
        }
        // s a b^T: the unscaled products t = dout b and u = dout^T a once, then da += s t, db += s u, and
        // d/ds = <dout, a b^T> = <a, t>: exact at any s, and a NaN in dout reaches them at s = 0 too
        double s = in[2]->data[0], *ds = din(c, nd, 2);
        double *t = da || ds ? gcd_arena_alloc(c->arena, (size_t)M * K * sizeof(double)) : NULL;
        double *u = db ? gcd_arena_alloc(c->arena, (size_t)N * K * sizeof(double)) : NULL;
        matmul_nt_backward(t, u, dout, in[0]->data, in[1]->data, M, N, K);
        double dot = 0;
        for (size_t i = 0; t && i < (size_t)M * K; i++) {
            if (da) da[i] += s * t[i];
            dot += in[0]->data[i] * t[i];
        }
        for (size_t i = 0; u && i < (size_t)N * K; i++) db[i] += s * u[i];
        if (ds) ds[0] += dot;
        break;
    }
    case GCD_OP_NORMALIZE:
        normalize_backward(din(c, nd, 0), dout, out->data, nd->saved, gcd_rows(out), gcd_cols(out));
        break;
    case GCD_OP_EXP: {
        double *dx = din(c, nd, 0);
        for (size_t i = 0; i < out->n; i++) dx[i] += dout[i] * out->data[i];
        break;
    }
    case GCD_OP_CROSS_ENTROPY: {
        int N = in[0]->shape[0], C = in[0]->shape[1];
        const double *e = ce_kept(in[0]) ? nd->saved + 2 * (size_t)(nd->mode ? C : N) : NULL;   // kept by cross_entropy()
        (nd->mode ? cross_entropy_cols_backward : cross_entropy_backward)(din(c, nd, 0), dout, nd->saved, e, in[0]->data, nd->labels, N, C);
        break;
    }
    case GCD_OP_LAYERNORM:
        layernorm_backward(din(c, nd, 0), din(c, nd, 1), din(c, nd, 2), dout, in[0]->data, nd->saved, in[1]->data,
                           in[0]->shape[0], in[0]->shape[1]);
        break;
    case GCD_OP_NARROW: {
        double *dx = din(c, nd, 0);
        size_t outer, stride, inner, len = (size_t)out->shape[nd->mode];
        narrow_geometry(in[0], nd->mode, &outer, &stride, &inner);
        for (size_t o = 0; o < outer; o++)
            for (size_t i = 0; i < len * inner; i++) dx[o * stride + (size_t)nd->start * inner + i] += dout[o * len * inner + i];
        break;
    }
    default:
        GCD_FATAL("backward: no rule for op %s", gcd_op_name(nd->op));
    }
}
