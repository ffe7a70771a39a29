/*
 * check: the verdict on the user's own gradients. Per-rank safetensors dumps (and an optional
 * single-process reference) are opened and validated whole before any value is read: metadata, ranks,
 * world, parameter lists, shapes and dtypes across files. Then one pass per parameter streams every
 * rank's values at once, a chunk at a time, into the sums the shared classifier (verdict.c) reads.
 * Memory is O(chunk), not O(model).
 */
#pragma once
#include "diagnose/run.h"
#include "check/safetensors.h"

typedef struct {
    const char *const *dumps;   // files or directories (every *.safetensors directly in it)
    int ndumps;
    const char *ref[2];         // the single-process reference, and the same computed in another order (measured noise)
    int nref;                   // 0, 1 or 2
    const char *const *ignore;  // fnmatch patterns over parameter names
    int nignore;
    double tol;                 // 0: from the dtypes read
    int no_hash;                // no digest of the files (no report is written to hold it)
    double timeout;             // seconds the scan may take (0: no limit): past it, exit 3
} gcd_check_opts;

typedef struct gcd_shard_map gcd_shard_map;

// gradcheck.held (held.c): a parameter whose .grad was None while its wrapper's own buffer held a tensor
typedef struct {
    char *name, *attr;          // the parameter, the buffer's attribute ("main_grad")
    double norm;                // the largest norm over the ranks (NAN: not recorded)
    int filled;                 // ranks whose buffer was not zero
} gcd_held;

typedef struct {
    int world;
    const char *stage;          // "local" or "reduced"
    gcd_st_file *rank;          // (world) rank k's dump (stage reduced when both stages are given)
    gcd_st_file *local;         // (world) rank k's local dump when both stages are given, else NULL
    gcd_st_file ref, ref2;      // has_ref, has_ref2: the reference, and the same in another order
    int has_ref, has_ref2;
    char (*digest)[33];         // (world + 2) XXH3-128 hex digests (xxh128sum), the references' last
    char (*local_digest)[33];   // (world) the local dumps' digests when both stages are given, else NULL
    int nparams;
    char **params;              // (nparams) gradcheck.params of rank 0, wrapper prefixes removed (module., _fsdp_wrapped_module., ...)
    struct gcd_shard_map *shards;   // (world + 1) each file's gradcheck.shards (n 0: none)
    unsigned char *sharded;     // (nparams) 1: every rank holds a run of it (FSDP), assembled as the scan streams
    double tol, tol_default;    // in force for the loosest tensor; what the precision and the dtypes give it
    double *ptol;               // (nparams) each tensor's claimed tolerance: its dtypes' and the recorded precision's
    char tol_reason[80];        // where tol_default comes from when the dumps name a precision, else ""
    const char *wrapper;        // gradcheck.wrapper of the judged rank 0 ("ddp", "fsdp2", ...); "sharded" where it records
                                // only shards (gradcheck.shards without gradcheck.mesh); else NULL
    const char *precision;      // the precision every file records (gradcheck.precision, canonical), or NULL
    char **ran;                 // (nran) sorted: parameters whose module ran in the forward (gradcheck.ran of any file)
    int nran;
    char *nondeterministic, *batchnorm;   // gradcheck.nondeterministic / .batchnorm of every file, ", "-joined, or NULL
    gcd_held *held;             // (nheld) sorted by name: gradcheck.held of the judged dumps
    int nheld;
    int loss_known;             // gradcheck.loss on every judged dump and the reference: their mean and the reference's
    double loss_mean, loss_ref;
    double *rank_loss;          // (world) gradcheck.loss of each rank's judged dump (the loss its synced backward ran on), or NULL
    double *shard_loss;         // (world) the reference's gradcheck.shard_losses: what each rank's batch gives alone, or NULL
    int accumulate;             // gradcheck.accumulate of rank 0's judged dump: the micro-batches of its step (1: none recorded)
    int ref_objective;          // the reference's gradcheck.objective is "reference": its loss is check_ddp(reference=fn)'s, not the step's
    uint64_t bytes;             // data bytes scanned
    int mesh_nd;                // gradcheck.mesh: its dimensions (0: none)
    char mesh_names[4][16];     // (mesh_nd)
    int mesh_shape[4];          // (mesh_nd)
    int *mesh_coords;           // (world * mesh_nd) each rank's coordinates
    int sketch_k;               // gradcheck.sketch: every file a sketch dump of this K (0: full dumps)
    long sketch_seed;           // gradcheck.seed of the sketch dumps
} gcd_check_set;

// Opens, validates and cross-checks every file. 0, or 2 with a message naming the file, rank or
// tensor in err.
int gcd_check_load(const gcd_check_opts *o, gcd_check_set *set, char *err, size_t len);
// Scans every parameter not ignored into res (probe "check") and gives the verdict. 0, or 2 when a
// file changed while being read.
int gcd_check_scan(const gcd_check_opts *o, gcd_check_set *set, gcd_run_result *res, char *err, size_t len);
void gcd_check_free(gcd_check_set *set);

extern const char gcd_check_snippet[];   // the recipe `check --snippet` prints
