#include <string.h>

#include "probes/probe.h"

const gcd_probe *const gcd_probes[] = { &gcd_probe_simplenet, &gcd_probe_contrastive, &gcd_probe_tp, NULL };

const gcd_probe *gcd_probe_find(const char *name) {
    for (int i = 0; gcd_probes[i]; i++)
        if (!strcmp(gcd_probes[i]->name, name)) return gcd_probes[i];
    return NULL;
}

gcd_tensor *gcd_param_add(gcd_ctx *c, gcd_params *p, const char *name, int ndim, const int *shape, const double *init) {
    if (p->n == GCD_MAX_PARAMS) GCD_FATAL("probe: more than %d parameters", GCD_MAX_PARAMS);
    gcd_tensor *t = init ? gcd_tensor_from(c, ndim, shape, init) : gcd_tensor_new(c, ndim, shape);
    t->requires_grad = 1;
    p->name[p->n] = name;
    p->t[p->n++] = t;
    return t;
}
