#include "engine/path.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gather.h"

void gcd_path_start(gcd_path *p, int leaf) {
    memset(p, 0, sizeof *p);
    p->n = 1;
    p->node[0] = (gcd_path_node){ GCD_PATH_PARAM, leaf, GCD_CUT_NONE };
}

static int label(const gcd_node *nd, gcd_tensor *const *leaves, int nleaves) {
    if (nd->op == GCD_OP_GATHER) return nd->mode;
    for (int i = 0; i < nd->nin; i++)
        for (int k = 0; nd->in[i] && k < nleaves; k++)
            if (nd->in[i] == leaves[k]) return k;
    return -1;
}

// The tape is in recording order, so every input's producer comes before its consumers: one pass from
// the oldest node settles each node's distance from `from` (ops on the shortest route) and where it came from.
int gcd_path_find(const gcd_ctx *c, const gcd_tensor *from, const gcd_tensor *to, gcd_tensor *const *leaves, int nleaves, gcd_path *p) {
    if (to == from) return 0;
    if (!to->node) return -1;
    int N = c->tape ? c->tape->id + 1 : 0;
    gcd_node **at = gcd_malloc((size_t)N * sizeof *at);
    int *dist = gcd_malloc((size_t)N * sizeof *dist), *prev = gcd_malloc((size_t)N * sizeof *prev);   // prev: -1 = from
    for (gcd_node *nd = c->tape; nd; nd = nd->prev) at[nd->id] = nd;
    for (int id = 0; id < N; id++) {
        dist[id] = INT_MAX;
        for (int i = 0; i < at[id]->nin; i++) {
            const gcd_tensor *t = at[id]->in[i];
            int d = !t ? INT_MAX : t == from ? 0 : t->node ? dist[t->node->id] : INT_MAX;
            if (d != INT_MAX && d + 1 < dist[id]) dist[id] = d + 1, prev[id] = t == from ? -1 : t->node->id;
        }
    }
    int k = dist[to->node->id];
    if (k != INT_MAX) {
        if (p->n + k > GCD_PATH_MAX) GCD_FATAL("path: %d ops from a tensor to the loss, more than GCD_PATH_MAX (%d)", p->n + k, GCD_PATH_MAX);
        int id = to->node->id;
        for (int j = p->n + k - 1; j >= p->n; j--, id = prev[id])
            p->node[j] = (gcd_path_node){ at[id]->op, label(at[id], leaves, nleaves), at[id]->cut };
        p->n += k;
    }
    free(at), free(dist), free(prev);
    return k == INT_MAX ? -1 : k;
}

int gcd_path_first_cut(const gcd_path *p) {
    for (int i = 0; i < p->n; i++)
        if (p->node[i].cut) return i;
    return -1;
}

int gcd_path_find_op(const gcd_path *p, int op) {
    for (int i = 0; i < p->n; i++)
        if (p->node[i].op == op) return i;
    return -1;
}

const char *gcd_path_cut_reason(const gcd_path_node *nd) {
    switch (nd->cut) {
    case GCD_CUT_NO_GRAD: return nd->op == GCD_OP_GATHER ? "under no_grad (Lightning sync_grads=False)" : "under no_grad";
    case GCD_CUT_DETACH: return "detach()";
    case GCD_CUT_NO_INPUT: return "no input requires grad";   // never first on a parameter's path: its input there does
    default: return NULL;
    }
}

const char *gcd_path_op(const gcd_path_node *nd) { return nd->op == GCD_PATH_PARAM ? "parameter" : gcd_op_name(nd->op); }

char *gcd_path_name(const gcd_path_node *nd, const char *const *leaf_names, char *buf, size_t len) {
    buf[0] = 0;
    if (nd->op == GCD_OP_GATHER) snprintf(buf, len, "%s", gcd_gather_mode_name(nd->label));
    else if (nd->label >= 0 && nd->op == GCD_PATH_PARAM) snprintf(buf, len, "%s", leaf_names[nd->label]);
    else if (nd->label >= 0) {   // the module: up to the last dot
        const char *name = leaf_names[nd->label], *dot = strrchr(name, '.');
        snprintf(buf, len, "%.*s", dot ? (int)(dot - name) : (int)strlen(name), name);
    }
    return buf;
}

void gcd_path_node_str(gcd_sb *b, const gcd_path_node *nd, const char *const *leaf_names) {
    char name[128];
    gcd_path_name(nd, leaf_names, name, sizeof name);
    if (nd->op == GCD_PATH_PARAM) gcd_sb_printf(b, "%s", name);
    else if (!*name) gcd_sb_printf(b, "%s", gcd_path_op(nd));
    else gcd_sb_printf(b, nd->op == GCD_OP_GATHER ? "%s[%s]" : "%s(%s)", gcd_path_op(nd), name);
}

void gcd_path_pack(const gcd_path *p, double *buf) {
    memset(buf, 0, GCD_PATH_PACKED * sizeof(double));
    buf[0] = p->n;
    for (int i = 0; i < p->n; i++) {
        buf[1 + 3 * i] = p->node[i].op;
        buf[2 + 3 * i] = p->node[i].label;
        buf[3 + 3 * i] = p->node[i].cut;
    }
}

void gcd_path_unpack(gcd_path *p, const double *buf) {
    memset(p, 0, sizeof *p);
    p->n = (int)buf[0];
    for (int i = 0; i < p->n; i++) p->node[i] = (gcd_path_node){ (int)buf[1 + 3 * i], (int)buf[2 + 3 * i], (int)buf[3 + 3 * i] };
}
