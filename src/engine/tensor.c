#include "engine/tensor.h"

#include <stdio.h>
#include <string.h>

gcd_ctx gcd_ctx_make(gcd_arena *arena) {
    gcd_ctx c = { arena, NULL, 1 };
    return c;
}

static gcd_tensor *make(gcd_ctx *c, int ndim, const int *shape, int zero) {
    if (ndim < 0 || ndim > GCD_MAX_DIM) GCD_FATAL("tensor: %d dimensions, at most %d", ndim, GCD_MAX_DIM);
    gcd_tensor *t = gcd_arena_alloc(c->arena, sizeof *t);
    t->ndim = ndim;
    t->n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1) GCD_FATAL("tensor: dimension %d has size %d", i, shape[i]);
        t->shape[i] = shape[i];
        t->n *= (size_t)shape[i];
    }
    t->data = (zero ? gcd_arena_alloc : gcd_arena_alloc_raw)(c->arena, t->n * sizeof(double));
    return t;
}

gcd_tensor *gcd_tensor_new(gcd_ctx *c, int ndim, const int *shape) { return make(c, ndim, shape, 1); }
gcd_tensor *gcd_tensor_empty(gcd_ctx *c, int ndim, const int *shape) { return make(c, ndim, shape, 0); }

gcd_tensor *gcd_tensor_from(gcd_ctx *c, int ndim, const int *shape, const double *data) {
    gcd_tensor *t = gcd_tensor_empty(c, ndim, shape);
    memcpy(t->data, data, t->n * sizeof(double));
    return t;
}

gcd_tensor *gcd_tensor_like(gcd_ctx *c, const gcd_tensor *t) { return gcd_tensor_empty(c, t->ndim, t->shape); }

int gcd_rows(const gcd_tensor *t) { return t->ndim == 0 ? 1 : t->shape[0]; }
int gcd_cols(const gcd_tensor *t) { return (int)(t->n / (size_t)gcd_rows(t)); }

double *gcd_grad_buf(gcd_ctx *c, gcd_tensor *t) {
    if (!t->grad) t->grad = gcd_arena_alloc(c->arena, t->n * sizeof(double));
    return t->grad;
}

char *gcd_shape_str(char *buf, size_t len, int ndim, const int *shape) {
    int k = snprintf(buf, len, "(");
    for (int i = 0; i < ndim && k < (int)len; i++) k += snprintf(buf + k, len - k, i ? ",%d" : "%d", shape[i]);
    if (k < (int)len) snprintf(buf + k, len - k, ")");
    return buf;
}
