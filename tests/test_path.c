// The forward graph without MPI: ops under no_grad and detach() stay on the tape as detached nodes that
// backward never differentiates; the shortest path from a parameter to the loss, its first cut and the
// words for it; node names; a path survives packing into doubles.
#include <string.h>

#include "engine/autograd.h"
#include "check.h"
#include "engine/gather.h"
#include "engine/ops.h"
#include "engine/path.h"

static gcd_tensor *leaf(gcd_ctx *c, int n, const double *v) {
    gcd_tensor *t = gcd_tensor_from(c, 2, (int[]){ 1, n }, v);
    t->requires_grad = 1;
    return t;
}

static char *chain(const gcd_path *p, const char *const *names) {
    static gcd_sb b;
    gcd_sb_free(&b);
    for (int i = 0; i < p->n; i++) {
        if (i) gcd_sb_printf(&b, " -> ");
        gcd_path_node_str(&b, &p->node[i], names);
        if (p->node[i].cut) gcd_sb_printf(&b, " [%s]", gcd_path_cut_reason(&p->node[i]));
    }
    return b.s ? b.s : "";
}

// h = relu(fc1(x)); loss = mean(h * exp(exp(h)) under no_grad * detach(h) + ...): three routes to the loss
static void path_should_be_shortest_and_cut_where_recorded(void) {
    gcd_arena a = { 0 };
    gcd_ctx c = gcd_ctx_make(&a);
    const char *names[] = { "fc1.weight", "unused.weight" };
    gcd_tensor *w = leaf(&c, 2, (double[]){ 0.5, -0.25 }), *unused = leaf(&c, 1, (double[]){ 1 }), *leaves[] = { w, unused };
    gcd_tensor *x = gcd_tensor_from(&c, 2, (int[]){ 3, 2 }, (double[]){ 1, 2, 3, 4, -1, 0.5 });
    gcd_tensor *h = gcd_relu(&c, gcd_linear(&c, x, w, NULL));   // (3,1)
    int prev = gcd_set_grad_enabled(&c, 0);
    gcd_tensor *e = gcd_exp(&c, gcd_exp(&c, h));
    gcd_set_grad_enabled(&c, prev);
    gcd_tensor *d = gcd_detach(&c, h);
    gcd_tensor *loss = gcd_mean(&c, gcd_mul(&c, gcd_mul(&c, h, e), d));

    gcd_path p;
    gcd_path_start(&p, 0);
    CHECK(gcd_path_find(&c, w, loss, leaves, 2, &p) == 5, "w -> loss: %d nodes", p.n - 1);
    CHECK(!strcmp(chain(&p, names), "fc1.weight -> linear(fc1) -> relu -> mul -> mul -> mean"), "shortest path: %s", chain(&p, names));
    CHECK(gcd_path_first_cut(&p) == -1, "the path through h itself is not cut: %s", chain(&p, names));

    gcd_path_start(&p, 0);   // through the no_grad branch: w -> ... -> e
    CHECK(gcd_path_find(&c, w, e, leaves, 2, &p) == 4, "w -> e: %d nodes", p.n - 1);
    CHECK(!strcmp(chain(&p, names), "fc1.weight -> linear(fc1) -> relu -> exp [under no_grad] -> exp [under no_grad]"), "no_grad: %s",
          chain(&p, names));
    CHECK(gcd_path_first_cut(&p) == 3, "the first cut is the first exp, not %d", gcd_path_first_cut(&p));
    gcd_path_start(&p, 0);
    gcd_path_find(&c, w, d, leaves, 2, &p);
    CHECK(!strcmp(chain(&p, names), "fc1.weight -> linear(fc1) -> relu -> detach [detach()]"), "detach: %s", chain(&p, names));
    CHECK(gcd_path_first_cut(&p) == 3, "the first cut is the detach(), not %d", gcd_path_first_cut(&p));

    gcd_path_start(&p, 1);
    CHECK(gcd_path_find(&c, unused, loss, leaves, 2, &p) == -1 && p.n == 1, "an unused leaf has no path (n %d)", p.n);

    // after a cut, an op on values that need no grad is detached too: it has nothing to differentiate
    gcd_tensor *after = gcd_exp(&c, e);
    CHECK(after->node->cut == GCD_CUT_NO_INPUT && !after->requires_grad, "exp of a detached value: cut %d", after->node->cut);

    // backward is unchanged: the detached branches count as constants
    gcd_backward(&c, loss);
    gcd_arena b = { 0 };
    gcd_ctx c2 = gcd_ctx_make(&b);
    gcd_tensor *w2 = leaf(&c2, 2, w->data);
    gcd_tensor *h2 = gcd_relu(&c2, gcd_linear(&c2, x, w2, NULL));
    gcd_tensor *e2 = gcd_tensor_from(&c2, 2, e->shape, e->data), *d2 = gcd_tensor_from(&c2, 2, d->shape, d->data);
    gcd_backward(&c2, gcd_mean(&c2, gcd_mul(&c2, gcd_mul(&c2, h2, e2), d2)));
    CHECK(w->grad && !memcmp(w->grad, w2->grad, 2 * sizeof(double)), "w's gradient %.17g %.17g, with constants %.17g %.17g",
          w->grad ? w->grad[0] : 0, w->grad ? w->grad[1] : 0, w2->grad[0], w2->grad[1]);
    CHECK(unused->grad == NULL, "the unused leaf keeps None");
    gcd_arena_free(&b);

    // a detached node is never differentiated, even when its output holds a gradient
    gcd_tensor *v = leaf(&c, 2, (double[]){ 1, 2 });
    prev = gcd_set_grad_enabled(&c, 0);
    gcd_tensor *ev = gcd_exp(&c, v);
    gcd_set_grad_enabled(&c, prev);
    gcd_grad_buf(&c, ev)[0] = 1;
    gcd_backward_from(&c, ev);
    CHECK(v->grad == NULL, "backward went through a node recorded under no_grad: %g %g", v->grad ? v->grad[0] : 0, v->grad ? v->grad[1] : 0);

    gcd_path q;   // packing round trip
    double buf[GCD_PATH_PACKED];
    gcd_path_start(&p, 0);
    gcd_path_find(&c, w, e, leaves, 2, &p);
    gcd_path_pack(&p, buf);
    gcd_path_unpack(&q, buf);
    CHECK(q.n == p.n && !memcmp(q.node, p.node, (size_t)p.n * sizeof p.node[0]), "a path changed through pack/unpack");
    gcd_arena_free(&a);
}

static void names_should_say_module_and_mode(void) {
    const char *names[] = { "logit_scale", "visual.proj.weight" };
    gcd_sb b = { 0 };
    gcd_path_node gather = { GCD_OP_GATHER, GCD_GATHER_OFF, GCD_CUT_NO_GRAD }, lin = { GCD_OP_LINEAR, 1, 0 }, ex = { GCD_OP_EXP, 0, 0 };
    gcd_path_node_str(&b, &gather, names), gcd_sb_printf(&b, " ");
    gcd_path_node_str(&b, &lin, names), gcd_sb_printf(&b, " ");
    gcd_path_node_str(&b, &ex, names);
    CHECK(!strcmp(b.s, "all_gather[off] linear(visual.proj) exp(logit_scale)"), "names: %s", b.s);
    CHECK(!strcmp(gcd_path_cut_reason(&gather), "under no_grad (Lightning sync_grads=False)"), "gather under no_grad: %s", gcd_path_cut_reason(&gather));
    CHECK(gcd_path_cut_reason(&lin) == NULL, "a differentiated node has no reason");
    gcd_sb_free(&b);
}

int main(void) {
    path_should_be_shortest_and_cut_where_recorded();
    names_should_say_module_and_mode();
    printf("test_path: %s, %d failure(s)\n", check_failures ? "FAILED" : "passed", check_failures);
    return check_failures != 0;
}
