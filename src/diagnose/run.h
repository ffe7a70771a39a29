/*
 * run: one probe under one gather mode, start to finish. Every rank runs forward and backward with the
 * real collectives, DDP averages the gradients, rank 0 computes the single-process reference, and with
 * steps > 0 the ranks take that many SGD steps. The result holds the numbers; verdict.c reads them.
 */
#pragma once
#include "engine/gather.h"
#include "engine/path.h"
#include "probes/probe.h"

typedef enum {
    GCD_ST_NONE, GCD_ST_PARTIAL, GCD_ST_ZERO, GCD_ST_NONFINITE, GCD_ST_OK, GCD_ST_SCALED, GCD_ST_MISMATCH,
    GCD_ST_DISAGREE,   // check, stage reduced: ranks hold different gradients after DDP's all-reduce
    GCD_ST_PRESENT,    // check without a reference: finite, non-zero, the same on every rank
    GCD_ST_UNDECIDED,  // check with one reference: a small, uncorrelated difference no claimed tolerance can judge
    GCD_ST_COUNT
} gcd_status;

// check with both stages, a tensor whose ranks disagree after the reduce: what each rank's reduced gradient
// R_k equals (check/stages.c)
typedef enum {
    GCD_SC_NONE,           // not measured (one stage, a sharded or partial tensor, ranks that agree)
    GCD_SC_UNREDUCED,      // R_k = L_k, its own local gradient, on every rank: no all-reduce ran for it
    GCD_SC_LAST_UNSYNCED,  // R_k = mean_j E_j + (L_k - E_k): the backward after E (the last) did not sync
    GCD_SC_PART,           // mean_k R_k = mean_k L_k, R_k neither: part averaged, part the rank's own
    GCD_SC_OTHER,          // none of these: changed after the all-reduce, or outside it
} gcd_stage_cause;

// What the classifier reads of one gradient g against its reference r, summed in float64 over the
// finite values, chunk by chunk (verdict.c: gcd_sums_add, gcd_sums_resid).
typedef struct {
    double gg, gr, rr, dd;   // <g,g>, <g,r>, <r,r>, ||g - r||^2
    double ee;               // ||g - c r||^2 for c = gr / rr: a second pass, when gcd_sums_need_resid
    double nn, db, bb;       // second reference b: ||r - b||^2 (the measured noise), <g - r, b>, <b,b>
    long nonfinite, first_nonfinite;
    int allzero;             // every finite value of g is 0
    int has_ref;             // r was given (a missing reference counts as zeros)
    int has_ref2;            // b was read (gcd_sums_noise): the same reference computed in another order
    int masks;               // the step drew random numbers (dropout): the ranks' and the references' masks differ, and
                             // a difference made by masks follows the reference: the correlation test does not apply
} gcd_sums;

// Where a tensor's tolerance came from (check: the report says it per tensor)
typedef enum { GCD_TOL_CLAIMED, GCD_TOL_MEASURED, GCD_TOL_GIVEN } gcd_tol_source;

#define GCD_PARAM_MAX_DIM 8

typedef struct {
    const char *name;
    int ndim, shape[GCD_PARAM_MAX_DIM];
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
    unsigned char *local_has;     // check with both stages: (world) 1 where rank k's local dump has it, else NULL
    int local_nhave;              // ranks whose local dump has it
    int explained;                // verdict.c: its reduced figures are told in the finding of their cause (local None)
    int grouped;                  // verdict.c: named in a finding of many mismatches under one prefix
    // the tolerance, per tensor: tol (relative) is set before classifying (0: the run's); the classifier
    // sets allowed (the relative error it accepted: tol, or k x the measured noise) and where it came from
    double tol, noise, allowed;   // noise: ||r - b|| / ||r|| between the two references, NAN without b
    gcd_tol_source tol_source;
    double corr;                  // <g - r, b> / (||g - r|| ||b||): rounding noise is uncorrelated; NAN where not taken
    int ran;                      // check: a dump recorded that its module ran in the forward (gradcheck.ran)
    const char *held_attr;        // check: .grad None while the wrapper's buffer of this name held a tensor (gradcheck.held), or NULL
    double held_norm;             // its largest norm over the ranks (NAN: not recorded)
    int held_filled;              // the ranks whose buffer was not zero
    // check only (dumps): NULL / 0 for the probes
    const char *dtype;            // the dumps' dtype, "F32"
    int ref_none;                 // the reference has no gradient (None) for it
    double *rank_norm;            // (world) ||g_k||, NAN where None
    long *rank_nonfinite;         // (world) NaN/Inf values on rank k
    long *rank_first_nonfinite;   // (world) index of the first, -1 if none
    unsigned char *differs;       // (world) stage reduced: 1 where rank k's gradient is not rank first's
    int first;                    // stage reduced: the first rank with a gradient, g's source
    double max_diff, diff_rel;    // largest |g_k - g_first| and ||g_k - g_first|| / ||g_first||
    int diff_base;                // the rank those are against: first, or (sharded, HSDP) the first holder of the differing replica's run
    gcd_stage_cause stage_cause;  // check, both stages, status disagree: what the reduced gradients equal
    double *own_rel;              // (world) stage_cause set: ||R_k - L_k|| / max(||R_k||, ||L_k||), else NULL
    double *ref_rel;              // (world) stage_cause set: ||R_k - r|| / ||r|| (NAN without a reference), else NULL
    double split_rel;             // stage_cause set: max_k ||R_k - (mean E + L_k - E_k)|| / max(..), NAN without E
    int accumulated;              // stage_cause set: 1 where some rank's gradient accumulated before the last backward (E) is not zero
    int tp_split;                 // run, a tensor-parallel probe: 1 sharded (reduced is the sum of the ranks' pieces), 2 replicated, else 0
    // run only (probes): the forward graph (run.c), and where the gradient goes wrong (blame.c)
    gcd_path *rank_path;          // (world) each rank's shortest path to its loss; n 0 where it does not use the parameter
    gcd_path *via;                // (nfeat) rank 0's path through gathered feature f; n 0 when the parameter does not feed f
    gcd_path path;                // what the report shows; n 0 for check
    int breaks_at;                // the node of path where the gradient is cut or departs; -1: nowhere
    char *reason;                 // why, in words (malloc'd), or NULL
} gcd_param_result;

// One gathered feature at the gather's two sides, where blame.c measures: the gradient arriving at the
// gathered tensor and what the gather's backward returned to each rank's own rows, on every rank, and
// the reference's at its concatenation of every rank's features (rank r's rows are slot r).
typedef struct {
    size_t n;                     // values of one rank's features; the gathered tensor holds world * n
    double *arrive;               // (world, world * n) each rank's gradient at the gathered features; zeros where None
    unsigned char *arrive_has;    // (world)
    double *leave;                // (world, n) the gather backward's gradient for each rank's own features
    unsigned char *leave_has;     // (world)
    double *ref;                  // (world * n) the reference's gradient at the concatenation
} gcd_feat_grads;

typedef struct {
    char kind[24];          // none, partial, zero, nonfinite, disagree, scaled, mismatch, local_none, held, own_slot, learning_stopped, forward, note
    int counts;             // 1: a gradient finding; 0: a note
    char *params;           // comma-separated names (malloc'd)
    char *message;          // (malloc'd)
} gcd_finding;

#define GCD_MESH_MAX_DIM 4

typedef struct {
    const char *probe;
    int mode, world, steps;
    int finalize;                     // run: a tensor-parallel probe, whose mode reduced its replicated parameters' gradients
    int mesh_nd;                      // the ranks on a mesh (check: gradcheck.mesh; run: the tp probe's (dp, tp)), else 0
    char mesh_names[GCD_MESH_MAX_DIM][16];   // (mesh_nd) its dimensions' names ("dp", "tp")
    int *mesh_coords;                 // (world * mesh_nd) each rank's coordinates, or NULL
    double lr, tol;
    int tol_given;                    // check --tol: every tensor's tolerance is tol
    int nref;                         // check: references given (0, 1 or 2)
    const char *nondeterministic;     // check: the layers the dumps say drew random numbers (gradcheck.nondeterministic), or NULL
    const char *batchnorm;            // check: plain BatchNorm layers in training mode (gradcheck.batchnorm), or NULL
    const char *wrapper;              // check: what reduced the gradients, as the dumps record it (gradcheck.wrapper), or NULL
    const char *reduced_by;           // check: that step in words (gcd_reducer_words), or NULL outside check
    double sensitivity;               // check: the largest relative error a tensor could hide (its allowed), NAN: none judged
    int ref_multi;                    // check: the reference is a rank of a run of several (gradcheck.world > 1: a sketch
                                      // reference at world W/2), not a single process
    int loss_known;                   // check: every rank's dump and the reference record the step's loss (gradcheck.loss)
    double loss_mean, loss_ref;       // check, loss_known: the ranks' mean loss and the reference's objective
    const double *rank_loss;          // check: (world) the loss each rank's synced backward ran on (gradcheck.loss), or NULL
    const double *shard_loss;         // check: (world) what each rank's batch gives alone in one process (the reference's
                                      // gradcheck.shard_losses), or NULL
    int accumulate;                   // check: the micro-batches each rank's step was cut into (gradcheck.accumulate; 1: none)
    int ref_objective;                // check: the reference's loss is a given objective (gradcheck.objective), not the step's
    gcd_probe_cfg cfg;
    int nparam;
    gcd_param_result *param;          // (nparam)
    int classified;                   // check: statuses already set from streamed sums
    int no_ref;                       // check without --ref
    int guard;                        // a guarded training step (src/guard): words name the step and ranks, not check's options
    long long guard_step;             // guard: the training step judged
    int ninput;
    const char *input_name[GCD_MAX_INPUTS];
    int input_ndim[GCD_MAX_INPUTS], input_shape[GCD_MAX_INPUTS][GCD_MAX_DIM];
    size_t input_n[GCD_MAX_INPUTS];
    double *inputs[GCD_MAX_INPUTS];   // (world, input_n) every rank's inputs, rebuilt from (seed, rank)
    int nloss;                        // steps recorded (max(steps, 1))
    double *loss;                     // (nloss, world), rank 0 only
    double ref_loss;                  // the reference objective: mean over ranks of loss_r
    int nfeat;                        // run only: the gathered features
    gcd_feat_grads feat[GCD_MAX_FEATS];
    int nfinding, cap_finding;
    gcd_finding *finding;             // (nfinding)
    double seconds;                   // wall time of the run (or check's load and scan) on rank 0; set by the caller
} gcd_run_result;

// The single-process reference does not depend on the gather mode: the first run of a probe and
// configuration keeps it here, and the runs of its other modes copy it instead of recomputing it.
// Rank 0 only; the holder must pass it only to runs of that same probe, configuration and world.
typedef struct {
    int done;
    double loss;                      // gcd_run_result.ref_loss
    double *feat[GCD_MAX_FEATS];      // (world * n) gcd_feat_grads.ref
    double *param[GCD_MAX_PARAMS];    // (n) gcd_param_result.reference
    double *inputs[GCD_MAX_INPUTS];   // (world, input_n) gcd_run_result.inputs
} gcd_reference;

typedef struct {
    const gcd_probe *probe;
    gcd_probe_cfg cfg;
    gcd_gather_mode mode;
    int steps;
    double lr;
    gcd_reference *ref;   // optional: reused when done, kept otherwise; NULL computes it for this run alone
    gcd_arena *arena;     // optional: the passes' memory, reset (not freed) at the end for the next run; NULL: this run's own
    void (*progress)(int step, int nstep);   // optional: rank 0 calls it after each step (1..nstep)
} gcd_run_opts;

// Collective: every rank calls it. Rank 0's result is complete; the other ranks' lack local, inputs
// and reference.
void gcd_run(gcd_comm *comm, const gcd_run_opts *o, gcd_run_result *res);
void gcd_run_result_free(gcd_run_result *res);
void gcd_reference_free(gcd_reference *ref);
