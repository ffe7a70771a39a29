// Every op's backward against central differences in float64, and None versus zero; the CBLAS kernels
// (linear, matmul_nt) against the plain loops they replaced (ref_*, below), on odd shapes, bias or not,
// NULL gradients; column-wise cross-entropy against the row-wise one of the transpose, bit for bit;
// gcd_exp_n against libm's exp(), bit for bit.
#define _GNU_SOURCE   // sched_getaffinity, CPU_COUNT
#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__) && __has_include(<sys/platform/x86.h>)
#include <sys/platform/x86.h>   // CPU_FEATURE_ACTIVE (glibc 2.34 on): glibc's choice of its exp
#endif

#include "engine/autograd.h"
#include "check.h"
#include "engine/exp.h"
#include "engine/ops.h"

#define MAXIN 4

typedef gcd_tensor *(*op_fn)(gcd_ctx *c, gcd_tensor **in);

static const int labels[] = { 2, 0, 1, 3 };

static gcd_tensor *f_linear(gcd_ctx *c, gcd_tensor **in) { return gcd_linear(c, in[0], in[1], in[2]); }
static gcd_tensor *f_linear_nobias(gcd_ctx *c, gcd_tensor **in) { return gcd_linear(c, in[0], in[1], NULL); }
static gcd_tensor *f_relu(gcd_ctx *c, gcd_tensor **in) { return gcd_relu(c, in[0]); }
static gcd_tensor *f_view(gcd_ctx *c, gcd_tensor **in) { return gcd_view(c, in[0], 1, (int[]){ -1 }); }
static gcd_tensor *f_concat(gcd_ctx *c, gcd_tensor **in) { return gcd_concat(c, 3, in); }
static gcd_tensor *f_mul(gcd_ctx *c, gcd_tensor **in) { return gcd_mul(c, in[0], in[1]); }
static gcd_tensor *f_mean(gcd_ctx *c, gcd_tensor **in) { return gcd_mean(c, in[0]); }
static gcd_tensor *f_mse(gcd_ctx *c, gcd_tensor **in) { return gcd_mse(c, in[0], in[1]); }
static gcd_tensor *f_mse_zero(gcd_ctx *c, gcd_tensor **in) { return gcd_mse(c, in[0], NULL); }
static gcd_tensor *f_matmul_nt(gcd_ctx *c, gcd_tensor **in) { return gcd_matmul_nt(c, in[0], in[1], NULL); }
static gcd_tensor *f_matmul_nt_scaled(gcd_ctx *c, gcd_tensor **in) { return gcd_matmul_nt(c, in[0], in[1], in[2]); }
static gcd_tensor *f_normalize(gcd_ctx *c, gcd_tensor **in) { return gcd_normalize(c, in[0]); }
static gcd_tensor *f_exp(gcd_ctx *c, gcd_tensor **in) { return gcd_exp(c, in[0]); }
static gcd_tensor *f_cross_entropy(gcd_ctx *c, gcd_tensor **in) { return gcd_cross_entropy(c, in[0], labels); }
static gcd_tensor *f_cross_entropy_cols(gcd_ctx *c, gcd_tensor **in) { return gcd_cross_entropy_cols(c, in[0], labels); }
static gcd_tensor *f_layernorm(gcd_ctx *c, gcd_tensor **in) { return gcd_layernorm(c, in[0], in[1], in[2]); }
static gcd_tensor *f_narrow_rows(gcd_ctx *c, gcd_tensor **in) { return gcd_narrow(c, in[0], 0, 1, 2); }
static gcd_tensor *f_narrow_cols(gcd_ctx *c, gcd_tensor **in) { return gcd_narrow(c, in[0], 1, 2, 3); }
static gcd_tensor *f_narrow_1d(gcd_ctx *c, gcd_tensor **in) { return gcd_narrow(c, in[0], 0, 3, 2); }

typedef struct {
    const char *name;
    op_fn f;
    int nin, ndim[MAXIN], shape[MAXIN][2];
    double eps, tol;
    double away_from_zero;   // inputs with |x| below this are pushed away (kinks)
} op_case;

static const op_case cases[] = {
    { "linear", f_linear, 3, { 2, 2, 1 }, { { 3, 4 }, { 5, 4 }, { 5 } }, 1e-6, 1e-8, 0 },
    { "linear_nobias", f_linear_nobias, 2, { 2, 2 }, { { 3, 4 }, { 5, 4 } }, 1e-6, 1e-8, 0 },
    { "relu", f_relu, 1, { 2 }, { { 4, 5 } }, 1e-6, 1e-8, 1e-3 },
    { "view", f_view, 1, { 2 }, { { 3, 4 } }, 1e-6, 1e-8, 0 },
    { "concat", f_concat, 3, { 2, 2, 2 }, { { 1, 3 }, { 2, 3 }, { 4, 3 } }, 1e-6, 1e-8, 0 },
    { "mul", f_mul, 2, { 2, 2 }, { { 3, 4 }, { 3, 4 } }, 1e-6, 1e-8, 0 },
    { "mean", f_mean, 1, { 2 }, { { 3, 4 } }, 1e-6, 1e-8, 0 },
    { "mse", f_mse, 2, { 1, 1 }, { { 7 }, { 7 } }, 1e-6, 1e-8, 0 },
    { "mse_zero_target", f_mse_zero, 1, { 1 }, { { 7 } }, 1e-6, 1e-8, 0 },
    { "matmul_nt", f_matmul_nt, 2, { 2, 2 }, { { 3, 5 }, { 4, 5 } }, 1e-6, 1e-8, 0 },
    { "normalize", f_normalize, 1, { 2 }, { { 4, 6 } }, 1e-6, 1e-7, 0 },
    { "exp", f_exp, 1, { 2 }, { { 3, 3 } }, 1e-6, 1e-8, 0 },
    { "matmul_nt_scaled", f_matmul_nt_scaled, 3, { 2, 2, 0 }, { { 3, 5 }, { 4, 5 }, { 0 } }, 1e-6, 1e-8, 0 },
    { "cross_entropy", f_cross_entropy, 1, { 2 }, { { 4, 5 } }, 1e-6, 1e-8, 0 },
    { "cross_entropy_cols", f_cross_entropy_cols, 1, { 2 }, { { 5, 4 } }, 1e-6, 1e-8, 0 },
    { "linear_odd", f_linear, 3, { 2, 2, 1 }, { { 7, 3 }, { 5, 3 }, { 5 } }, 1e-6, 1e-8, 0 },
    { "matmul_nt_odd", f_matmul_nt, 2, { 2, 2 }, { { 7, 3 }, { 1, 3 } }, 1e-6, 1e-8, 0 },
    { "layer_norm", f_layernorm, 3, { 2, 1, 1 }, { { 4, 6 }, { 6 }, { 6 } }, 1e-6, 1e-7, 0 },
    { "narrow_rows", f_narrow_rows, 1, { 2 }, { { 4, 3 } }, 1e-6, 1e-8, 0 },
    { "narrow_cols", f_narrow_cols, 1, { 2 }, { { 3, 6 } }, 1e-6, 1e-8, 0 },
    { "narrow_1d", f_narrow_1d, 1, { 1 }, { { 6 } }, 1e-6, 1e-8, 0 },
};

// sum(w * f(x)) without a graph
static double project(const op_case *oc, gcd_tensor **in, const double *w) {
    gcd_arena a = { 0 };
    gcd_ctx c = gcd_ctx_make(&a);
    gcd_set_grad_enabled(&c, 0);
    gcd_tensor *out = oc->f(&c, in);
    double s = 0;
    for (size_t i = 0; i < out->n; i++) s += w[i] * out->data[i];
    gcd_arena_free(&a);
    return s;
}

static void check_op(const op_case *oc, uint64_t seed) {
    gcd_arena a = { 0 };
    gcd_ctx c = gcd_ctx_make(&a);
    gcd_rng r = gcd_rng_make(seed, 7);
    gcd_tensor *in[MAXIN];
    for (int i = 0; i < oc->nin; i++) {
        in[i] = gcd_tensor_new(&c, oc->ndim[i], oc->shape[i]);
        in[i]->requires_grad = 1;
        for (size_t k = 0; k < in[i]->n; k++) {
            double x = gcd_rng_normal(&r);
            if (fabs(x) < oc->away_from_zero * 100) x = x < 0 ? -0.5 : 0.5;
            in[i]->data[k] = x;
        }
    }
    gcd_tensor *out = oc->f(&c, in);
    double *w = malloc(out->n * sizeof(double));
    for (size_t k = 0; k < out->n; k++) w[k] = gcd_rng_normal(&r);
    memcpy(gcd_grad_buf(&c, out), w, out->n * sizeof(double));
    gcd_backward_from(&c, out);

    double maxdiff = 0;
    int bad = 0;
    for (int i = 0; i < oc->nin; i++) {
        CHECK(in[i]->grad != NULL, "%s: input %d got no gradient", oc->name, i);
        if (!in[i]->grad) continue;
        for (size_t k = 0; k < in[i]->n; k++) {
            double x0 = in[i]->data[k];
            in[i]->data[k] = x0 + oc->eps;
            double fp = project(oc, in, w);
            in[i]->data[k] = x0 - oc->eps;
            double fm = project(oc, in, w);
            in[i]->data[k] = x0;
            double num = (fp - fm) / (2 * oc->eps), ana = in[i]->grad[k];
            maxdiff = fmax(maxdiff, fabs(num - ana));
            if (!close_to(num, ana, oc->tol) && bad++ < 3)
                CHECK(0, "%s: d/d input%d[%zu]: backward %.12g, central difference %.12g", oc->name, i, k, ana, num);
        }
    }
    if (bad) fprintf(stderr, "  %s: %d values differ, max |difference| %.3g\n", oc->name, bad, maxdiff);
    else printf("ok   %-16s max |backward - central difference| = %.2e (tol %.0e)\n", oc->name, maxdiff, oc->tol);
    free(w);
    gcd_arena_free(&a);
}

// Outputs are not zeroed (gcd_tensor_empty): every op must write its whole output. The arena is
// dirtied with NaN and reset, so the op's outputs land on NaN; none may be left.
static void ops_should_write_outputs_whole(const op_case *oc) {
    gcd_arena a = { 0 };
    gcd_ctx c = gcd_ctx_make(&a);
    size_t dirty = 4u << 20;
    double *d = gcd_arena_alloc(&a, dirty);
    for (size_t i = 0; i < dirty / sizeof(double); i++) d[i] = NAN;
    gcd_arena_reset(&a);
    gcd_rng r = gcd_rng_make(9, 7);
    gcd_tensor *in[MAXIN];
    for (int i = 0; i < oc->nin; i++) {
        in[i] = gcd_tensor_new(&c, oc->ndim[i], oc->shape[i]);
        for (size_t k = 0; k < in[i]->n; k++) in[i]->data[k] = gcd_rng_normal(&r);
    }
    gcd_tensor *out = oc->f(&c, in);
    size_t nan = 0;
    for (size_t k = 0; k < out->n; k++) nan += isnan(out->data[k]);
    CHECK(nan == 0, "%s: %zu of %zu output values left unwritten (NaN from the arena)", oc->name, nan, out->n);
    gcd_arena_free(&a);
}

// ----------------------------------------------------------------------------
// the BLAS kernels against the loops they replaced: the same sums, in another order

static void ref_linear_forward(double *out, const double *x, const double *w, const double *b, int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int i = 0; i < C; i++) s += x[n * C + i] * w[o * C + i];
            out[n * OC + o] = s;
        }
}

static void ref_linear_backward(double *dx, double *dw, double *db, const double *dout, const double *x, const double *w,
                                int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double d = dout[n * OC + o];
            if (db) db[o] += d;
            if (dx)
                for (int i = 0; i < C; i++) dx[n * C + i] += d * w[o * C + i];
            if (dw)
                for (int i = 0; i < C; i++) dw[o * C + i] += d * x[n * C + i];
        }
}

static void ref_matmul_nt_forward(double *out, const double *a, const double *b, int M, int N, int K) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += a[m * K + k] * b[n * K + k];
            out[m * N + n] = s;
        }
}

static void ref_matmul_nt_backward(double *da, double *db, const double *dout, const double *a, const double *b, int M, int N, int K) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double d = dout[m * N + n];
            if (da)
                for (int k = 0; k < K; k++) da[m * K + k] += d * b[n * K + k];
            if (db)
                for (int k = 0; k < K; k++) db[n * K + k] += d * a[m * K + k];
        }
}

static double *randn(gcd_rng *r, size_t n) {
    double *p = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) p[i] = gcd_rng_normal(r);
    return p;
}

static double *dup_or_null(const double *p, size_t n) { return p ? memcpy(malloc(n * sizeof(double)), p, n * sizeof(double)) : NULL; }

// max |got - want| / max |want| over n values; got NULL: both must be NULL
static double rel_diff(const double *got, const double *want, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs(got[i] - want[i])), m = fmax(m, fabs(want[i]));
    return m > 0 ? d / m : d;
}

#define BLAS_TOL 1e-12

static void expect_close(const char *what, int N, int C, int OC, const double *got, const double *want, size_t n, double *worst) {
    if (!got && !want) return;
    CHECK(got && want, "%s (%d,%d,%d): a gradient is NULL on one side only", what, N, C, OC);
    if (!got || !want) return;
    double rd = rel_diff(got, want, n);
    *worst = fmax(*worst, rd);
    for (size_t i = 0, shown = 0; i < n && shown < 3; i++)
        if (!(fabs(got[i] - want[i]) <= BLAS_TOL * fmax(1, fabs(want[i])))) {
            shown++;
            CHECK(0, "%s (%d,%d,%d)[%zu]: blas %.17g, loops %.17g (max rel diff %.3g)", what, N, C, OC, i, got[i], want[i], rd);
        }
}

// linear (N,C)->(N,OC) with or without bias; backward into prefilled gradients (+=), each one NULL in turn
static void blas_should_match_loops(int N, int C, int OC, int bias, double *worst) {
    gcd_rng r = gcd_rng_make((uint64_t)(N * 10007 + C * 101 + OC), 3);
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    double *x = randn(&r, nx), *w = randn(&r, nw), *b = bias ? randn(&r, OC) : NULL, *dout = randn(&r, no);
    double *got = malloc(no * sizeof(double)), *want = malloc(no * sizeof(double));
    for (size_t i = 0; i < no; i++) got[i] = NAN;   // outputs are written whole: what was there must not leak in
    linear_forward(got, x, w, b, N, C, OC);
    ref_linear_forward(want, x, w, b, N, C, OC);
    expect_close(bias ? "linear forward" : "linear forward, no bias", N, C, OC, got, want, no, worst);
    for (size_t i = 0; i < no; i++) got[i] = NAN;
    matmul_nt_forward(got, x, w, N, OC, C, 1.0);
    ref_matmul_nt_forward(want, x, w, N, OC, C);
    expect_close("matmul_nt forward", N, C, OC, got, want, no, worst);
    const double s = 0.37;   // the factor as dgemm's alpha: s times the loops' product
    matmul_nt_forward(got, x, w, N, OC, C, s);
    for (size_t i = 0; i < no; i++) want[i] *= s;
    expect_close("matmul_nt forward x0.37", N, C, OC, got, want, no, worst);
    for (int drop = -1; drop < 3; drop++) {   // -1: every gradient; else gradient `drop` is NULL
        double *g0 = randn(&r, nx), *g1 = randn(&r, nw), *g2 = bias ? randn(&r, OC) : NULL;
        double *gx = drop == 0 ? NULL : dup_or_null(g0, nx), *gw = drop == 1 ? NULL : dup_or_null(g1, nw), *gb = drop == 2 ? NULL : dup_or_null(g2, OC);
        double *rx = drop == 0 ? NULL : dup_or_null(g0, nx), *rw = drop == 1 ? NULL : dup_or_null(g1, nw), *rb = drop == 2 ? NULL : dup_or_null(g2, OC);
        linear_backward(gx, gw, gb, dout, x, w, N, C, OC);
        ref_linear_backward(rx, rw, rb, dout, x, w, N, C, OC);
        expect_close("linear backward dx", N, C, OC, gx, rx, nx, worst);
        expect_close("linear backward dw", N, C, OC, gw, rw, nw, worst);
        expect_close("linear backward db", N, C, OC, gb, rb, OC, worst);
        if (drop < 2) {   // matmul_nt: a (N,C) = x, b (OC,C) = w
            double *ma = drop == 0 ? NULL : dup_or_null(g0, nx), *mb = drop == 1 ? NULL : dup_or_null(g1, nw);
            double *ra = drop == 0 ? NULL : dup_or_null(g0, nx), *rb2 = drop == 1 ? NULL : dup_or_null(g1, nw);
            matmul_nt_backward(ma, mb, dout, x, w, N, OC, C);
            ref_matmul_nt_backward(ra, rb2, dout, x, w, N, OC, C);
            expect_close("matmul_nt backward da", N, C, OC, ma, ra, nx, worst);
            expect_close("matmul_nt backward db", N, C, OC, mb, rb2, nw, worst);
            free(ma), free(mb), free(ra), free(rb2);
        }
        free(g0), free(g1), free(g2), free(gx), free(gw), free(gb), free(rx), free(rw), free(rb);
    }
    free(x), free(w), free(b), free(dout), free(got), free(want);
}

// the same product twice, and with one BLAS thread or two: the same bits (ranks must agree exactly)
static void blas_should_be_deterministic(void) {
    int N = 256, C = 192, OC = 160, threads = openblas_get_num_threads();
    gcd_rng r = gcd_rng_make(11, 3);
    double *x = randn(&r, (size_t)N * C), *w = randn(&r, (size_t)OC * C);
    double *out[3];
    for (int t = 0; t < 3; t++) {
        openblas_set_num_threads(t == 2 ? 2 : 1);
        out[t] = malloc((size_t)N * OC * sizeof(double));
        matmul_nt_forward(out[t], x, w, N, OC, C, 1.0);
    }
    openblas_set_num_threads(threads);
    CHECK(!memcmp(out[0], out[1], (size_t)N * OC * sizeof(double)), "matmul_nt: two runs differ");
    CHECK(!memcmp(out[0], out[2], (size_t)N * OC * sizeof(double)), "matmul_nt: one thread and two differ");
    for (int t = 0; t < 3; t++) free(out[t]);
    free(x), free(w);
}

// a rank's share of the CPUs: all it may run on when alone, one when the ranks outnumber the CPUs
static void blas_threads_should_share_cpus(void) {
    int before = openblas_get_num_threads();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    gcd_blas_share_cpus(1);
    int alone = openblas_get_num_threads();
    gcd_blas_share_cpus((int)online + 1);
    int crowded = openblas_get_num_threads();
    cpu_set_t set, one;   // bound to one CPU (as Open MPI binds a rank), alone: still one thread
    int mine = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1, bound = -1;
    CPU_ZERO(&one);
    for (int i = 0; i < CPU_SETSIZE && !CPU_COUNT(&one); i++)
        if (CPU_ISSET(i, &set)) CPU_SET(i, &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0) {
        gcd_blas_share_cpus(1);
        bound = openblas_get_num_threads();
        sched_setaffinity(0, sizeof set, &set);
    }
    openblas_set_num_threads(before);
    CHECK(alone == (mine < online ? mine : online), "one rank: %d BLAS threads, expected the %d CPUs it may run on", alone, mine);
    CHECK(crowded == 1, "%ld ranks on %ld CPUs: %d BLAS threads, expected 1", online + 1, online, crowded);
    CHECK(bound == 1, "one rank bound to one CPU: %d BLAS threads, expected 1", bound);
    printf("ok   blas threads: %d for one rank, %d bound to one CPU, %d for %ld ranks (%ld CPUs online)\n", alone, bound, crowded,
           online + 1, online);
}

// a NaN anywhere in an input reaches the output, even against zero weights (the verdict counts them)
static void blas_should_propagate_nan(void) {
    double x[6] = { 1, NAN, 2, 3, 4, 5 }, w[6] = { 0 }, out[4];
    linear_forward(out, x, w, NULL, 2, 3, 2);
    CHECK(isnan(out[0]) && isnan(out[1]) && !isnan(out[2]), "linear: NaN in x row 0 must reach out row 0 only: %g %g %g", out[0], out[1], out[2]);
}

// one row's max and sum of exp(z - max) as one serial loop gives them, from libm's exp(); p (C): the exps
static double serial_row(const double *z, int C, double *p, double *sum) {
    double mx = z[0], s = 0;
    for (int c = 1; c < C; c++) mx = z[c] > mx ? z[c] : mx;
    for (int c = 0; c < C; c++) {
        double v = exp(z[c] - mx);
        if (p) p[c] = v;
        s += v;
    }
    *sum = s;
    return mx;
}

// column-wise cross-entropy equals the row-wise one of the transpose, bit for bit (the contrastive
// probe's text side, and with it the reports, unchanged); and the gradient recomputed from the saved
// max and sum has the bits of the stored softmax's (exp(z - max) / sum with libm's exp, then
// k (p - onehot)), and so has the one from the kept exps; C past gcd_exp_n's batches too
static void cross_entropy_cols_should_equal_transposed_rows(int N, int C) {
    gcd_rng r = gcd_rng_make(5, 3);
    size_t nc = (size_t)N * C;
    double *z = malloc(nc * sizeof *z), *zt = malloc(nc * sizeof *zt), *e = malloc(nc * sizeof *e), *et = malloc(nc * sizeof *et);
    double *dz = calloc(nc, sizeof *dz), *dzt = calloc(nc, sizeof *dzt), *dzk = calloc(nc, sizeof *dzk), *dztk = calloc(nc, sizeof *dztk);
    double *lse = malloc(2 * (size_t)C * sizeof *lse), *lset = malloc(2 * (size_t)C * sizeof *lset);
    double *lsek = malloc(2 * (size_t)C * sizeof *lsek), *lsetk = malloc(2 * (size_t)C * sizeof *lsetk), *p = malloc((size_t)N * sizeof *p);
    int *label = malloc((size_t)C * sizeof *label);
    double out, outt, outk, outtk;
    for (size_t i = 0; i < nc; i++) z[i] = 3 * gcd_rng_normal(&r);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) zt[(size_t)c * N + n] = z[(size_t)n * C + c];
    for (int c = 0; c < C; c++) label[c] = (c * 5) % N;
    cross_entropy_cols_forward(&out, lse, NULL, z, label, N, C);
    cross_entropy_forward(&outt, lset, NULL, zt, label, C, N);
    cross_entropy_cols_forward(&outk, lsek, e, z, label, N, C);
    cross_entropy_forward(&outtk, lsetk, et, zt, label, C, N);
    CHECK(out == outt, "cross_entropy_cols (%d x %d): loss %.17g, rows of the transpose %.17g", N, C, out, outt);
    double dout = 0.7;
    cross_entropy_cols_backward(dz, &dout, lse, NULL, z, label, N, C);
    cross_entropy_backward(dzt, &dout, lset, NULL, zt, label, C, N);
    cross_entropy_cols_backward(dzk, &dout, lsek, e, z, label, N, C);
    cross_entropy_backward(dztk, &dout, lsetk, et, zt, label, C, N);
    int differ = 0, unlike = 0, kept = outk != out || outtk != outt;
    for (size_t i = 0; i < nc; i++) kept += dzk[i] != dz[i] || dztk[i] != dzt[i];
    for (int i = 0; i < 2 * C; i++) kept += lsek[i] != lse[i] || lsetk[i] != lset[i];
    CHECK(kept == 0, "cross_entropy (%d x %d): %d losses, max, sums or gradient values from the kept exps differ from the recomputed ones", N, C, kept);
    for (int c = 0; c < C; c++) differ += lse[c] != lset[2 * c] || lse[C + c] != lset[2 * c + 1];
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) differ += dz[(size_t)n * C + c] != dzt[(size_t)c * N + n];
    CHECK(differ == 0, "cross_entropy_cols (%d x %d): %d max, sum or gradient values differ from the transpose's", N, C, differ);
    for (int c = 0; c < C; c++) {   // the softmax as the forward computed it once, stored
        double s;
        serial_row(zt + (size_t)c * N, N, p, &s);
        unlike += lset[2 * c + 1] != s;
        for (int n = 0; n < N; n++) unlike += dzt[(size_t)c * N + n] != (dout / C) * (p[n] / s - (n == label[c]));
    }
    CHECK(unlike == 0, "cross_entropy (%d x %d): %d sums or gradient values differ from a stored softmax's", C, N, unlike);
    free(z), free(zt), free(e), free(et), free(dz), free(dzt), free(dzk), free(dztk);
    free(lse), free(lset), free(lsek), free(lsetk), free(p), free(label);
}

// The row forward's max and sums, row by row as one serial loop gives them, bit for bit: four rows at
// a time (every tail length), a max as four chains, C from 1 to past two batches of exps, and the rows
// where chains could differ: the max a zero whose sign came first in another chain, NaN first or
// later, infinities (the last rows: up to row 10 the loss is finite). A NaN must be a NaN: which one
// a + b gives is the compiler's choice.
static int same_value(double a, double b) { return isnan(a) ? isnan(b) : !memcmp(&a, &b, sizeof a); }

static void cross_entropy_rows_should_match_serial(int C) {
    enum { N = 15 };
    gcd_rng r = gcd_rng_make(9, (uint64_t)C);
    double *z = malloc((size_t)N * C * sizeof *z), *e = malloc((size_t)N * C * sizeof *e), lse[2 * N], lsek[2 * N], out, outk;
    int label[N], bad = 0;
    char first[160] = "";
    for (size_t i = 0; i < (size_t)N * C; i++) z[i] = 3 * gcd_rng_normal(&r);
    for (int n = 0; n < N; n++) label[n] = (n * 7) % C;
    if (C > 6) {
        double *zr = z + 9 * C;       // row 9: max zero, -0 at 2 (the second chain) before +0 at 5 (the first)
        for (int c = 0; c < C; c++) zr[c] = -1;
        zr[2] = -0.0, zr[5] = 0.0;
        zr = z + 10 * C;              // row 10: +0 first (at 1), -0 in another chain (at 6)
        for (int c = 0; c < C; c++) zr[c] = -2;
        zr[1] = 0.0, zr[6] = -0.0;
    }
    z[11 * C + (C > 4 ? 4 : 0)] = INFINITY;
    for (int c = 0; c < C; c++) z[12 * C + c] = -INFINITY;
    z[13 * C + (C > 3 ? 3 : 0)] = NAN;   // row 13: NaN later, passed over by the max (C > 3)
    z[14 * C] = NAN;                     // row 14: NaN first, the max stays NaN
    for (int rows = 1; rows <= N; rows++) {   // every tail length of the groups of four
        cross_entropy_forward(&out, lse, NULL, z, label, rows, C);
        cross_entropy_forward(&outk, lsek, e, z, label, rows, C);
        double want = 0;
        for (int n = 0; n < rows; n++) {
            const double *zn = z + (size_t)n * C;
            double s, mx = serial_row(zn, C, NULL, &s);
            want += mx + log(s) - zn[label[n]];
            double got[4] = { lse[2 * n], lsek[2 * n], lse[2 * n + 1], lsek[2 * n + 1] }, ref[4] = { mx, mx, s, s };
            for (int k = 0; k < 4; k++)
                if (!same_value(got[k], ref[k]) && !bad++)
                    snprintf(first, sizeof first, "row %d of %d: %s %a, serial %a", n, rows, k < 2 ? "max" : "sum", got[k], ref[k]);
            for (int c = 0; c < C; c++)
                if (!same_value(e[(size_t)n * C + c], exp(zn[c] - mx)) && !bad++)
                    snprintf(first, sizeof first, "row %d of %d: exp %d %a, serial %a", n, rows, c, e[(size_t)n * C + c], exp(zn[c] - mx));
        }
        want /= rows;
        if ((!same_value(out, want) || !same_value(outk, want)) && !bad++)
            snprintf(first, sizeof first, "%d rows: loss %a (kept exps %a), serial %a", rows, out, outk, want);
    }
    CHECK(bad == 0, "cross_entropy rows, C=%d: %d max, sum, exp or loss values differ from one serial loop's; first: %s", C, bad, first);
    free(z), free(e);
}

// gcd_exp_n against exp(), bit for bit: every range the loss meets and every other (tiny, huge, 0,
// subnormal results, infinities, NaN, any bit pattern), at every length modulo its four lanes
static void exp_n_should_match_libm(void) {
    enum { K = 1 << 16 };
    static double x[K], y[K];
    uint64_t s = 88172645463325252ull;
    long differ = 0, total = 0;
    static const double special[] = { 0.0, -0.0, 0x1p-54, -0x1p-55, 0x1p-1074, 511.99, 512.0, -512.0, 709.78, 709.79, -708.3, -745.1, -746.0,
                                      -1024.5, 1e300, -1e300, INFINITY, -INFINITY, NAN };
    for (int round = 0; round < 32; round++) {
        for (int i = 0; i < K; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            double u = (double)(s >> 11) * 0x1p-53;
            switch (round % 4) {
            case 0: x[i] = -40 * u; break;   // exp(z - max): the cross-entropy's arguments
            case 1: x[i] = 1500 * (u - 0.5); break;
            case 2: memcpy(&x[i], &s, sizeof s); break;
            default: x[i] = -u * ldexp(1.0, (int)(s % 64) - 56);
            }
        }
        for (size_t j = 0; j < sizeof special / sizeof *special; j++) x[(size_t)round * 131 + j * 7] = special[j];
        size_t n = K - (size_t)round % 4;   // a tail of 0 to 3 values past the last four
        gcd_exp_n(y, x, n);
        for (size_t i = 0; i < n; i++, total++) {
            double want = exp(x[i]);
            if (memcmp(&y[i], &want, sizeof want)) {   // NaN too: its payload as exp() gives it
                if (differ++ < 3) printf("FAIL exp(%a): %a, libm %a\n", x[i], y[i], want);
            }
        }
    }
    CHECK(differ == 0, "gcd_exp_n: %ld of %ld values differ from exp()", differ, total);
#if defined(__x86_64__) && defined(CPU_FEATURE_ACTIVE)
    CHECK(gcd_exp_fast() == (CPU_FEATURE_ACTIVE(AVX2) && CPU_FEATURE_ACTIVE(FMA)),
          "gcd_exp_n: four at a time %d, where glibc runs __exp_fma %d (a batch that failed its own check against exp()?)", gcd_exp_fast(),
          CPU_FEATURE_ACTIVE(AVX2) && CPU_FEATURE_ACTIVE(FMA));
#endif
    printf("%s exp: %ld values as libm's, %s\n", differ ? "FAIL" : "ok  ", total,
           gcd_exp_fast() ? "four at a time (glibc's __exp_fma)" : "one exp() call each (this CPU or libm has no bit-exact batch)");
}

// ----------------------------------------------------------------------------
// None is absence, zero is a value

static void none_should_differ_from_zero(void) {
    gcd_arena a = { 0 };
    gcd_ctx c = gcd_ctx_make(&a);
    gcd_tensor *w = gcd_tensor_from(&c, 2, (int[]){ 1, 2 }, (double[]){ -1, -1 });
    gcd_tensor *unused = gcd_tensor_from(&c, 1, (int[]){ 2 }, (double[]){ 1, 1 });
    w->requires_grad = unused->requires_grad = 1;
    gcd_tensor *x = gcd_tensor_from(&c, 2, (int[]){ 1, 2 }, (double[]){ 1, 1 });
    gcd_tensor *loss = gcd_mean(&c, gcd_relu(&c, gcd_linear(&c, x, w, NULL)));   // relu(-2): dead
    gcd_backward(&c, loss);
    CHECK(w->grad != NULL, "a dead relu must give a zero gradient, not None");
    CHECK(w->grad && w->grad[0] == 0 && w->grad[1] == 0, "dead relu: gradient %g %g", w->grad[0], w->grad[1]);
    CHECK(unused->grad == NULL, "an unused parameter must keep None");
    gcd_arena_free(&a);
}

static void no_grad_and_detach_should_cut_the_graph(void) {
    gcd_arena a = { 0 };
    gcd_ctx c = gcd_ctx_make(&a);
    gcd_tensor *w = gcd_tensor_from(&c, 1, (int[]){ 3 }, (double[]){ 1, 2, 3 });
    w->requires_grad = 1;
    int prev = gcd_set_grad_enabled(&c, 0);
    gcd_tensor *e = gcd_exp(&c, w);
    gcd_set_grad_enabled(&c, prev);
    CHECK(!e->requires_grad && e->node && e->node->cut == GCD_CUT_NO_GRAD, "an op under no_grad must be a detached node, without grad");
    gcd_tensor *d = gcd_detach(&c, gcd_exp(&c, w));
    CHECK(!d->requires_grad && d->node && d->node->cut == GCD_CUT_DETACH, "detach must drop the graph and stay on the tape");
    gcd_tensor *loss = gcd_mean(&c, gcd_mul(&c, e, d));
    CHECK(!loss->requires_grad, "a loss from detached values must not require grad");
    gcd_backward(&c, loss);
    CHECK(w->grad == NULL, "w must keep None through no_grad and detach");
    gcd_arena_free(&a);
}

// s a b^T at any s: d/ds is <dout, a b^T> (never <dout, out> / s, which overflows at 1e300, loses
// digits at 1e-320 and is 0/0 at 0); at s = 0 a NaN in an input or in dout still reaches out and the
// inputs' gradients, as s * (a b^T) gives them (dgemm with alpha 0 reads nothing)
static void scaled_matmul_should_be_exact_at_any_scale(void) {
    static const double scales[] = { 0.0, INFINITY, 1e300, 1e-320 };
    for (int k = 0; k < 4; k++) {
        gcd_arena a = { 0 };
        gcd_ctx c = gcd_ctx_make(&a);
        gcd_tensor *x = gcd_tensor_new(&c, 2, (int[]){ 2, 3 }), *y = gcd_tensor_new(&c, 2, (int[]){ 4, 3 }), *s = gcd_tensor_new(&c, 0, NULL);
        gcd_rng r = gcd_rng_make(5, 1);
        for (size_t i = 0; i < x->n; i++) x->data[i] = gcd_rng_normal(&r);
        for (size_t i = 0; i < y->n; i++) y->data[i] = gcd_rng_normal(&r);
        s->data[0] = scales[k];
        s->requires_grad = 1;
        gcd_tensor *out = gcd_matmul_nt(&c, x, y, s);
        double *d = gcd_grad_buf(&c, out), want = 0, p[8];
        ref_matmul_nt_forward(p, x->data, y->data, 2, 4, 3);
        for (size_t i = 0; i < out->n; i++) d[i] = gcd_rng_normal(&r), want += d[i] * p[i];
        gcd_backward_from(&c, out);
        CHECK(s->grad && fabs(s->grad[0] - want) <= 1e-12 * fabs(want), "matmul_nt at s = %g: ds %.17g, expected <dout, a b^T> = %.17g", s->data[0],
              s->grad ? s->grad[0] : NAN, want);
        gcd_arena_free(&a);
    }
    gcd_arena a = { 0 };
    gcd_ctx c = gcd_ctx_make(&a);
    gcd_tensor *x = gcd_tensor_new(&c, 2, (int[]){ 2, 3 }), *y = gcd_tensor_new(&c, 2, (int[]){ 4, 3 }), *s = gcd_tensor_new(&c, 0, NULL);
    x->requires_grad = y->requires_grad = 1;
    x->data[0] = NAN;
    gcd_tensor *out = gcd_matmul_nt(&c, x, y, s);   // s = 0
    CHECK(isnan(out->data[0]) && isnan(out->data[3]) && out->data[4] == 0, "matmul_nt at s = 0: a NaN in a must reach its row of out (%g %g %g)",
          out->data[0], out->data[3], out->data[4]);
    double *d = gcd_grad_buf(&c, out);
    d[5] = NAN;   // row 1, column 1
    gcd_backward_from(&c, out);
    CHECK(isnan(x->grad[3]) && isnan(y->grad[3]), "matmul_nt at s = 0: a NaN in dout must reach da and db (%g %g)", x->grad[3], y->grad[3]);
    gcd_arena_free(&a);
}

int main(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (uint64_t seed = 1; seed <= 3; seed++) check_op(&cases[i], seed);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) ops_should_write_outputs_whole(&cases[i]);
    // relu at its kink: the gradient at exactly 0 is 0, as in torch
    double dx = 0;
    relu_backward(&dx, (double[]){ 1.0 }, (double[]){ 0.0 }, 1);
    CHECK(dx == 0, "relu'(0) = %g, expected 0", dx);
    // normalize of a zero row: the denominator is the constant eps, no NaN
    double out[3], norm, g[3] = { 0 };
    normalize_forward(out, &norm, (double[]){ 0, 0, 0 }, 1, 3);
    normalize_backward(g, (double[]){ 1, 1, 1 }, out, &norm, 1, 3);
    CHECK(out[0] == 0 && isfinite(g[0]) && g[0] == 1e12, "normalize(0): out %g grad %g", out[0], g[0]);
    static const int shapes[][3] = { { 1, 1, 1 }, { 3, 5, 7 }, { 64, 33, 17 }, { 17, 64, 33 }, { 1, 40, 3 }, { 129, 2, 65 } };
    double worst = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int bias = 0; bias < 2; bias++) blas_should_match_loops(shapes[i][0], shapes[i][1], shapes[i][2], bias, &worst);
    printf("%s blas vs loops: max relative difference %.2e (tol %.0e)\n", worst <= BLAS_TOL ? "ok  " : "FAIL", worst, BLAS_TOL);
    blas_should_be_deterministic();
    blas_should_propagate_nan();
    blas_threads_should_share_cpus();
    cross_entropy_cols_should_equal_transposed_rows(6, 9);
    cross_entropy_cols_should_equal_transposed_rows(5, 600);   // 600: batches of 256, 256 and 88
    cross_entropy_cols_should_equal_transposed_rows(600, 5);
    cross_entropy_cols_should_equal_transposed_rows(7, 11);   // 11 rows of the transpose: a group of three
    for (int i = 0; i < 8; i++) cross_entropy_rows_should_match_serial((int[]){ 1, 2, 3, 4, 5, 11, 257, 600 }[i]);
    exp_n_should_match_libm();
    scaled_matmul_should_be_exact_at_any_scale();
    none_should_differ_from_zero();
    no_grad_and_detach_should_cut_the_graph();
    printf("%s: %d failure(s)\n", check_failures ? "FAILED" : "passed", check_failures);
    return check_failures != 0;
}
