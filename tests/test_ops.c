// Every op's backward against central differences in float64, and None versus zero.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "check.h"
#include "ops.h"

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
static gcd_tensor *f_matmul_nt(gcd_ctx *c, gcd_tensor **in) { return gcd_matmul_nt(c, in[0], in[1]); }
static gcd_tensor *f_transpose(gcd_ctx *c, gcd_tensor **in) { return gcd_transpose(c, in[0]); }
static gcd_tensor *f_normalize(gcd_ctx *c, gcd_tensor **in) { return gcd_normalize(c, in[0]); }
static gcd_tensor *f_exp(gcd_ctx *c, gcd_tensor **in) { return gcd_exp(c, in[0]); }
static gcd_tensor *f_scale(gcd_ctx *c, gcd_tensor **in) { return gcd_scale(c, in[0], in[1]); }
static gcd_tensor *f_cross_entropy(gcd_ctx *c, gcd_tensor **in) { return gcd_cross_entropy(c, in[0], labels); }

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
    { "transpose", f_transpose, 1, { 2 }, { { 3, 5 } }, 1e-6, 1e-8, 0 },
    { "normalize", f_normalize, 1, { 2 }, { { 4, 6 } }, 1e-6, 1e-7, 0 },
    { "exp", f_exp, 1, { 2 }, { { 3, 3 } }, 1e-6, 1e-8, 0 },
    { "scale", f_scale, 2, { 2, 0 }, { { 3, 4 }, { 0 } }, 1e-6, 1e-8, 0 },
    { "cross_entropy", f_cross_entropy, 1, { 2 }, { { 4, 5 } }, 1e-6, 1e-8, 0 },
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

int main(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (uint64_t seed = 1; seed <= 3; seed++) check_op(&cases[i], seed);
    // relu at its kink: the gradient at exactly 0 is 0, as in torch
    double dx = 0;
    relu_backward(&dx, (double[]){ 1.0 }, (double[]){ 0.0 }, 1);
    CHECK(dx == 0, "relu'(0) = %g, expected 0", dx);
    // normalize of a zero row: the denominator is the constant eps, no NaN
    double out[3], norm, g[3] = { 0 };
    normalize_forward(out, &norm, (double[]){ 0, 0, 0 }, 1, 3);
    normalize_backward(g, (double[]){ 1, 1, 1 }, out, &norm, 1, 3);
    CHECK(out[0] == 0 && isfinite(g[0]) && g[0] == 1e12, "normalize(0): out %g grad %g", out[0], g[0]);
    none_should_differ_from_zero();
    no_grad_and_detach_should_cut_the_graph();
    printf("%s: %d failure(s)\n", check_failures ? "FAILED" : "passed", check_failures);
    return check_failures != 0;
}
