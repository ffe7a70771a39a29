/*
 * probe: one situation to check, split where the gather happens. Each rank builds its inputs from
 * (seed, rank) alone, encodes them into the features it gathers, and computes its loss from the
 * gathered features (and its own, for losses that use them directly). The distributed run puts the
 * real collective between encode and loss; the single-process reference puts a plain concatenation
 * of every rank's features there, so both compute the same objective.
 */
#pragma once
#include <stdint.h>

#include "engine/tensor.h"

#define GCD_MAX_PARAMS 8
#define GCD_MAX_FEATS 4
#define GCD_MAX_INPUTS 4

typedef struct {
    uint64_t seed;
    int inputs_random;   // simplenet: rank-distinct inputs from the seed instead of the seed's example
    int local_loss;      // contrastive: open_clip local_loss=True
    int batch, dim_img, dim_txt, dim_emb;
} gcd_probe_cfg;

typedef struct {
    int n;
    const char *name[GCD_MAX_PARAMS];
    gcd_tensor *t[GCD_MAX_PARAMS];
} gcd_params;

struct gcd_comm;

typedef struct gcd_probe {
    const char *name;
    int nfeat;                               // tensors each rank gathers
    int feat_follows_mode[GCD_MAX_FEATS];    // 1: gathered with the run's mode; 0: always with grad (on)
    unsigned before_gather;                  // bit i: parameter i feeds a tensor gathered with the run's mode
    int ninput;
    const char *input_name[GCD_MAX_INPUTS];
    void (*init)(gcd_ctx *c, const gcd_probe_cfg *cfg, gcd_params *p);   // leaves with requires_grad
    void (*inputs)(gcd_ctx *c, const gcd_probe_cfg *cfg, int rank, gcd_tensor **in);
    void (*encode)(gcd_ctx *c, const gcd_params *p, gcd_tensor **in, gcd_tensor **feat);
    gcd_tensor *(*loss)(gcd_ctx *c, const gcd_params *p, const gcd_probe_cfg *cfg, int rank, int world,
                        gcd_tensor **gathered, gcd_tensor **own);
    // 1 when loss_r differs between ranks (it uses own or rank); NULL: every rank's loss is the same
    // function of the gathered features, and the reference computes it once
    int (*loss_per_rank)(const gcd_probe_cfg *cfg);
    // A tensor-parallel probe (split set; no encode, loss or gathered features): the ranks are one
    // tensor-parallel group running one model split across them, every rank's loss is the same whole
    // objective, and the run's mode is how the replicated parameters' gradients are reduced across the
    // group after backward (run.c: off and local leave each rank's own share, on sums, avg averages).
    unsigned sharded;      // bit i: each rank uses a piece of parameter i (its gradient is zero elsewhere): the whole is their sum
    unsigned replicated;   // bit i: every rank uses parameter i whole: its copies must agree after the reduction
    gcd_tensor *(*split)(gcd_ctx *c, struct gcd_comm *comm, const gcd_params *p, const gcd_probe_cfg *cfg, gcd_tensor **in);
    // the same model unsplit in one process; in: (world, GCD_MAX_INPUTS) every rank's inputs
    gcd_tensor *(*whole)(gcd_ctx *c, const gcd_params *p, const gcd_probe_cfg *cfg, int world, gcd_tensor **in);
} gcd_probe;

extern const gcd_probe gcd_probe_simplenet, gcd_probe_contrastive, gcd_probe_tp;
extern const gcd_probe *const gcd_probes[];   // NULL-terminated
const gcd_probe *gcd_probe_find(const char *name);

// a parameter leaf from values (probes' init helper)
gcd_tensor *gcd_param_add(gcd_ctx *c, gcd_params *p, const char *name, int ndim, const int *shape, const double *init);
