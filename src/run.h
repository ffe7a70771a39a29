/*
 * run: one probe under one gather mode, start to finish. Every rank runs forward and backward with the
 * real collectives, DDP averages the gradients, rank 0 computes the single-process reference, and with
 * steps > 0 the ranks take that many SGD steps. The result holds the numbers; verdict.c reads them.
 */
#pragma once
#include "gather.h"
#include "probe.h"

typedef enum {
    GCD_ST_NONE, GCD_ST_PARTIAL, GCD_ST_ZERO, GCD_ST_NONFINITE, GCD_ST_OK, GCD_ST_SCALED, GCD_ST_MISMATCH,
    GCD_ST_COUNT
} gcd_status;

typedef struct {
    const char *name;
    int ndim, shape[GCD_MAX_DIM];
    size_t n;
    double *init;           // (n) values at the start
    double *local;          // (world, n) each rank's own gradient (rows of None ranks are zeros)
    unsigned char *has;     // (world) 1 where that rank's gradient was not None
    int nhave;              // ranks with a gradient
    double *reduced;        // (n) DDP mean, NULL when None on every rank
    double *reference;      // (n) single-process gradient
    double moved;           // ||final - init|| after the steps
    int moved_any;          // final differs from init in any bit
    // filled by verdict.c
    gcd_status status;
    double norm, ref_norm, rel_err, scale, cosine;   // NAN where undefined
    long nonfinite, first_nonfinite;
} gcd_param_result;

#define GCD_MAX_FINDINGS 16

typedef struct {
    char kind[24];          // none, partial, zero, nonfinite, scaled, mismatch, learning_stopped, forward, note
    int counts;             // 1: a gradient finding; 0: a note
    char params[256];       // comma-separated
    char message[640];
} gcd_finding;

typedef struct {
    const char *probe;
    int mode, world, steps;
    double lr, tol;
    gcd_probe_cfg cfg;
    int nparam;
    gcd_param_result param[GCD_MAX_PARAMS];
    int ninput;
    const char *input_name[GCD_MAX_INPUTS];
    int input_ndim[GCD_MAX_INPUTS], input_shape[GCD_MAX_INPUTS][GCD_MAX_DIM];
    size_t input_n[GCD_MAX_INPUTS];
    double *inputs[GCD_MAX_INPUTS];   // (world, input_n) every rank's inputs, rebuilt from (seed, rank)
    int nloss;                        // steps recorded (max(steps, 1))
    double *loss;                     // (nloss, world)
    double ref_loss;                  // the reference objective: mean over ranks of loss_r
    int nfinding;
    gcd_finding finding[GCD_MAX_FINDINGS];
} gcd_run_result;

typedef struct {
    const gcd_probe *probe;
    gcd_probe_cfg cfg;
    gcd_gather_mode mode;
    int steps;
    double lr;
} gcd_run_opts;

// Collective: every rank calls it. Rank 0's result is complete; the other ranks' lack local, inputs
// and reference.
void gcd_run(gcd_comm *comm, const gcd_run_opts *o, gcd_run_result *res);
void gcd_run_result_free(gcd_run_result *res);
