/*
 * ops: the differentiable operations. Each is a pair of plain kernels, forward and backward, with a
 * fixed argument order (outputs, saved values, inputs, sizes); backward adds into gradients (+=) and
 * skips a gradient pointer that is NULL. Above the kernels, gcd_<op>() runs forward on tensors and
 * records the node that autograd.c dispatches to the backward kernel.
 */
#pragma once
#include "engine/tensor.h"

// ----------------------------------------------------------------------------
// kernels

// BLAS threads for one of `ranks` processes on this node: its share of the online CPUs, at most the
// CPUs it may run on, at least 1 (a rank started by a plain mpirun; the launcher sets OPENBLAS_NUM_THREADS)
void gcd_blas_share_cpus(int ranks);
const char *gcd_blas_config(void);   // OpenBLAS's own words: version, build options, the CPU's kernels

void linear_forward(double *out, const double *x, const double *w, const double *b, int N, int C, int OC);
void linear_backward(double *dx, double *dw, double *db, const double *dout, const double *x, const double *w,
                     int N, int C, int OC);   // out (N,OC), x (N,C), w (OC,C), b (OC) or NULL
void relu_forward(double *out, const double *x, size_t n);
void relu_backward(double *dx, const double *dout, const double *x, size_t n);   // d/dx at 0 is 0, as torch
void mul_forward(double *out, const double *a, const double *b, size_t n);
void mul_backward(double *da, double *db, const double *dout, const double *a, const double *b, size_t n);
void mse_forward(double *out, const double *a, const double *b, size_t n);   // out (1); b NULL: zero target
void mse_backward(double *da, double *db, const double *dout, const double *a, const double *b, size_t n);
void matmul_nt_forward(double *out, const double *a, const double *b, int M, int N, int K, double s);   // out (M,N) = s a (M,K) b (N,K)^T
void matmul_nt_backward(double *da, double *db, const double *dout, const double *a, const double *b, int M, int N, int K);   // of a b^T
void normalize_forward(double *out, double *norm, const double *x, int N, int D);   // rows: x / max(||x||, 1e-12)
void normalize_backward(double *dx, const double *dout, const double *out, const double *norm, int N, int D);
// lse (N,2): each row's max and sum of exp(z - max); e (N,C): exp(z - max), or NULL: backward recomputes them
void cross_entropy_forward(double *out, double *lse, double *e, const double *z, const int *label, int N, int C);   // out (1): mean over rows
void cross_entropy_backward(double *dz, const double *dout, const double *lse, const double *e, const double *z, const int *label, int N, int C);
// over z's columns, as cross_entropy of z^T: label (C), a row per column; out (1): mean over columns;
// lse (2,C): the columns' maxima, then their sums; e as above
void cross_entropy_cols_forward(double *out, double *lse, double *e, const double *z, const int *label, int N, int C);
void cross_entropy_cols_backward(double *dz, const double *dout, const double *lse, const double *e, const double *z, const int *label, int N, int C);

// rows of x (N,C) over C: out = (x - mean) / sqrt(var + eps) * w + b (torch's biased var); saved (N,2): mean, 1/std
void layernorm_forward(double *out, double *saved, const double *x, const double *w, const double *b, int N, int C, double eps);
void layernorm_backward(double *dx, double *dw, double *db, const double *dout, const double *x, const double *saved,
                        const double *w, int N, int C);

// ----------------------------------------------------------------------------
// autograd ops on tensors

gcd_tensor *gcd_linear(gcd_ctx *c, gcd_tensor *x, gcd_tensor *w, gcd_tensor *b);   // x (N,C) w (OC,C) b (OC)|NULL -> (N,OC)
gcd_tensor *gcd_relu(gcd_ctx *c, gcd_tensor *x);
gcd_tensor *gcd_view(gcd_ctx *c, gcd_tensor *x, int ndim, const int *shape);   // -1 in shape: infer (view(-1))
gcd_tensor *gcd_concat(gcd_ctx *c, int k, gcd_tensor **xs);   // along dim 0; scalars count as one row
gcd_tensor *gcd_mul(gcd_ctx *c, gcd_tensor *a, gcd_tensor *b);   // elementwise, same shape
gcd_tensor *gcd_mean(gcd_ctx *c, gcd_tensor *x);   // -> scalar
gcd_tensor *gcd_mse(gcd_ctx *c, gcd_tensor *a, gcd_tensor *target);   // mean((a - target)^2); target NULL: zeros
// a (M,K) b (N,K) -> (M,N) = s a b^T, s a scalar tensor (NULL: 1): one product, no second (M,N) pass
gcd_tensor *gcd_matmul_nt(gcd_ctx *c, gcd_tensor *a, gcd_tensor *b, gcd_tensor *s);
gcd_tensor *gcd_normalize(gcd_ctx *c, gcd_tensor *x);   // per row, as torch.nn.functional.normalize
gcd_tensor *gcd_exp(gcd_ctx *c, gcd_tensor *x);
gcd_tensor *gcd_cross_entropy(gcd_ctx *c, gcd_tensor *z, const int *label);   // z (N,C), label (N) -> scalar
gcd_tensor *gcd_layernorm(gcd_ctx *c, gcd_tensor *x, gcd_tensor *w, gcd_tensor *b);   // x (N,C) w, b (C): nn.LayerNorm(C), eps 1e-5
// x.narrow(dim, start, len): dim 0 of any tensor or dim 1 of an (N,C) one; backward puts dout back in place
gcd_tensor *gcd_narrow(gcd_ctx *c, gcd_tensor *x, int dim, int start, int len);
gcd_tensor *gcd_cross_entropy_cols(gcd_ctx *c, gcd_tensor *z, const int *label);   // z (N,C), label (C) -> scalar: cross_entropy(z^T)
