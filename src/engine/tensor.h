/*
 * tensor: a row-major float64 array with an optional gradient. A gradient is either NULL, which is
 * PyTorch's None (backward never reached the tensor), or a buffer of n values, possibly all zeros.
 * The two are never conflated. Tensors live in the arena of the context that made them.
 */
#pragma once
#include <stddef.h>

#include "util.h"

#define GCD_MAX_DIM 2

struct gcd_node;

typedef struct gcd_tensor {
    int ndim;                  // 0 for a scalar
    int shape[GCD_MAX_DIM];
    size_t n;                  // number of elements
    double *data;              // (n)
    double *grad;              // (n), or NULL: None
    int requires_grad;         // a parameter, or computed from one with grad enabled
    struct gcd_node *node;     // the op that made it (NULL for leaves and untracked results)
} gcd_tensor;

// A context holds one pass: its arena, its tape (newest node last) and the grad mode.
typedef struct gcd_ctx {
    gcd_arena *arena;
    struct gcd_node *tape;     // newest node; nodes link to older ones through prev
    int grad_enabled;
} gcd_ctx;

gcd_ctx gcd_ctx_make(gcd_arena *arena);
gcd_tensor *gcd_tensor_new(gcd_ctx *c, int ndim, const int *shape);   // zeroed
gcd_tensor *gcd_tensor_empty(gcd_ctx *c, int ndim, const int *shape);   // not zeroed: for outputs written whole
gcd_tensor *gcd_tensor_from(gcd_ctx *c, int ndim, const int *shape, const double *data);
gcd_tensor *gcd_tensor_like(gcd_ctx *c, const gcd_tensor *t);   // t's shape, not zeroed
int gcd_rows(const gcd_tensor *t);   // shape[0], or 1 for a scalar
int gcd_cols(const gcd_tensor *t);   // n / rows
double *gcd_grad_buf(gcd_ctx *c, gcd_tensor *t);   // t's gradient, allocated zeroed on first use
char *gcd_shape_str(char *buf, size_t len, int ndim, const int *shape);   // "(4,8)", "()"
