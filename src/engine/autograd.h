/*
 * autograd: the tape and reverse-mode backward. Every op records one node (its inputs, its output, what
 * it saved). A node recorded with grad disabled, from inputs that require no grad, or by detach() is
 * "detached": it is part of the forward graph (path.c reads it) but has no backward, so its output
 * carries no graph. Backward walks the tape newest first, skips detached nodes, and calls each node's
 * backward (set by the op that recorded it: ops.c, gather.c). A tensor backward never reaches keeps grad == NULL (None).
 */
#pragma once
#include "engine/tensor.h"

typedef enum {
    GCD_OP_LINEAR, GCD_OP_RELU, GCD_OP_VIEW, GCD_OP_CONCAT, GCD_OP_MUL, GCD_OP_MEAN, GCD_OP_MSE,
    GCD_OP_MATMUL_NT, GCD_OP_NORMALIZE, GCD_OP_EXP,
    GCD_OP_CROSS_ENTROPY, GCD_OP_GATHER, GCD_OP_DETACH,
    GCD_OP_LAYERNORM, GCD_OP_NARROW, GCD_OP_REDUCE_SCATTER,
    GCD_OP_COUNT
} gcd_op;

// why a node has no backward
typedef enum {
    GCD_CUT_NONE,       // differentiated
    GCD_CUT_NO_GRAD,    // recorded with grad disabled (torch.no_grad())
    GCD_CUT_DETACH,     // detach()
    GCD_CUT_NO_INPUT,   // no input requires grad: nothing to differentiate
} gcd_cut;

struct gcd_comm;
struct gcd_node;
typedef void (*gcd_backward_fn)(gcd_ctx *c, struct gcd_node *nd);

typedef struct gcd_node {
    gcd_op op;
    gcd_backward_fn backward;  // accumulates the inputs' gradients from out's
    struct gcd_node *prev;     // the node recorded before this one
    int id;                    // its place on the tape, from 0 (oldest)
    gcd_cut cut;               // GCD_CUT_NONE, or why the node is detached (never differentiated)
    gcd_tensor *out;
    gcd_tensor **in;           // (nin); an input may be NULL (linear without bias, mse against zero)
    int nin;
    double *saved;             // op-specific: row norms, cross-entropy max and sum, layernorm mean and 1/std; gather: what its backward returned (n+1, gather.c)
    const int *labels;         // cross-entropy targets
    struct gcd_comm *comm;     // gather: the communicator
    int mode;                  // gather: the gradient mode; cross_entropy: 1 over columns; narrow: the dim
    int start;                 // narrow: the first index kept
} gcd_node;

const char *gcd_op_name(gcd_op op);

// Records the node that made out and returns it. Detached (no backward, out requires no grad) when grad
// is disabled, no input requires grad, or op is GCD_OP_DETACH.
gcd_node *gcd_record(gcd_ctx *c, gcd_op op, gcd_tensor *out, int nin, gcd_tensor **in);

// Backward from a scalar: its gradient is set to 1, then the tape is walked newest first.
void gcd_backward(gcd_ctx *c, gcd_tensor *loss);
// Backward from any tensor whose grad the caller has set (tests: a random projection).
void gcd_backward_from(gcd_ctx *c, gcd_tensor *out);

int gcd_set_grad_enabled(gcd_ctx *c, int enabled);   // returns the previous mode (no_grad scopes)
gcd_tensor *gcd_detach(gcd_ctx *c, gcd_tensor *t);    // same values, no graph (a detached node on the tape)
