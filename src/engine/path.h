/*
 * path: a route through the forward graph, read off the tape. Every op is on the tape, also those with
 * no backward (detached), so the route from a parameter to the loss exists even where the gradient has
 * no edge; the first detached node on it is where the gradient was cut, and the node says why. A path
 * starts with the parameter itself (node 0) and ends at the node that made the target.
 */
#pragma once
#include "engine/autograd.h"

#define GCD_PATH_MAX 32
#define GCD_PATH_PARAM (-1)                      // node 0's op: the parameter
#define GCD_PATH_PACKED (1 + 3 * GCD_PATH_MAX)   // doubles of one packed path (gcd_path_pack)

typedef struct {
    int op;      // gcd_op, or GCD_PATH_PARAM
    int label;   // the leaf that names it (linear(fc1): fc1.weight's index; node 0: the parameter's), a gather's mode, or -1
    int cut;     // gcd_cut: GCD_CUT_NONE, or why the node has no backward
} gcd_path_node;

typedef struct {
    int n;   // nodes; 0: no path (the parameter does not reach the target)
    gcd_path_node node[GCD_PATH_MAX];
} gcd_path;

// A path of one node: leaf `leaf` of the leaves passed to gcd_path_find.
void gcd_path_start(gcd_path *p, int leaf);
// Appends the nodes of the shortest forward route from `from` to `to` on c's tape (the fewest ops;
// among equals, the earliest recorded inputs) and returns how many; -1, with p unchanged, when `to` is
// not reached. leaves (nleaves) label the nodes they feed.
int gcd_path_find(const gcd_ctx *c, const gcd_tensor *from, const gcd_tensor *to, gcd_tensor *const *leaves, int nleaves, gcd_path *p);
int gcd_path_first_cut(const gcd_path *p);   // index of the first detached node, or -1
int gcd_path_find_op(const gcd_path *p, int op);   // index of the first node of op, or -1

// Why a detached node cut the gradient, from what was recorded: "under no_grad (Lightning
// sync_grads=False)" for an all_gather run under no_grad, "under no_grad", "detach()"; NULL when not cut.
const char *gcd_path_cut_reason(const gcd_path_node *nd);
const char *gcd_path_op(const gcd_path_node *nd);   // "linear", "all_gather", "parameter"
// The node's name: the parameter's for node 0, the module of the leaf it uses ("fc1" for fc1.weight,
// "logit_scale"), a gather's mode ("off"); "" when it has none.
char *gcd_path_name(const gcd_path_node *nd, const char *const *leaf_names, char *buf, size_t len);
// "linear(fc1)", "all_gather[off]", "relu", "fc1.weight"
void gcd_path_node_str(gcd_sb *b, const gcd_path_node *nd, const char *const *leaf_names);

// as doubles, for a collective: GCD_PATH_PACKED values
void gcd_path_pack(const gcd_path *p, double *buf);
void gcd_path_unpack(gcd_path *p, const double *buf);
