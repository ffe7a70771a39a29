/*
 * check/internal.h: what the check's files share and nothing outside check/ reads. The files of one
 * check (file_of, every_file), the shard maps, the error helper, and each file's entry points:
 * files.c (listing and opening dumps), shards.c (FSDP shard maps), load.c (gcd_check_load),
 * digest.c (the hashing pool), scan.c (gcd_check_scan).
 */
#pragma once
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check/check.h"
#include "diagnose/verdict.h"   // GCD_TOL

static inline int fail(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline int fail(char *err, size_t len, const char *fmt, ...) {   // the message in err; 2, bad input
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return 2;
}

static inline int by_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static inline int in_sorted(char *const *sorted, int n, const char *s) { return bsearch(&s, sorted, (size_t)n, sizeof *sorted, by_str) != NULL; }
static inline void free_strs(char **s, int n) {
    for (int i = 0; i < n; i++) free(s[i]);
    free(s);
}

static inline int ignored(const gcd_check_opts *o, const char *name) {
    for (int i = 0; i < o->nignore; i++)
        if (!fnmatch(o->ignore[i], name, 0)) return 1;
    return 0;
}

static inline double dtype_tol(gcd_dtype d) { return d == GCD_DT_F64 ? GCD_TOL : d == GCD_DT_F32 ? 1e-5 : 1e-2; }

// ----------------------------------------------------------------------------
// the files of one check

// rank k's dump, with k == world the reference and with k == world + 1 the second one (NULL where not given)
static inline const gcd_st_file *file_of(const gcd_check_set *set, int k) {
    if (k < set->world) return &set->rank[k];
    return k == set->world ? (set->has_ref ? &set->ref : NULL) : (set->has_ref2 ? &set->ref2 : NULL);
}

enum { NREF = 2 };   // the file slots after the ranks': the reference and the second reference
static inline int nfiles(const gcd_check_set *set) { return set->world + NREF; }

// Every file a check reads: the ranks' (reduced) dumps, the references, then the local dumps when both
// stages are given; every_file(set, i) is the i-th of them, NULL for a reference not given
static inline int all_files(const gcd_check_set *set) { return nfiles(set) + (set->local ? set->world : 0); }
static inline const gcd_st_file *every_file(const gcd_check_set *set, int i) {
    return i < nfiles(set) ? file_of(set, i) : &set->local[i - nfiles(set)];
}

// ----------------------------------------------------------------------------
// files.c: the dumps listed, opened and validated one by one

// every dump path (*out, *n), directories expanded (sorted), the references left out; no more than
// the system can map at once
int gcd_dumps_list(const gcd_check_opts *o, char ***out, int *n, char *err, size_t len);
// one dump opened, its names unwrapped, its metadata (world, rank, params) read and its tensors checked
int gcd_dump_open(const gcd_check_opts *o, const char *path, gcd_st_file *f, long *world, long *rank, char ***params, int *np, char *err,
                  size_t len);
// a reference: the same, and one process (world 1, rank 0)
int gcd_ref_open(const gcd_check_opts *o, const char *path, gcd_st_file *ref, char ***params, int *np, char *err, size_t len);
// the first name of a (in a's order) that b lacks, or NULL
const char *gcd_first_missing(char *const *a, int na, char *const *b, int nb);
// the wrappers' prefixes removed in place (FSDP, activation checkpointing, DDP, torch.compile)
void gcd_strip_wrappers(char *name);

// ----------------------------------------------------------------------------
// held.c: gradcheck.held, the gradients a wrapper kept in its own buffer (main_grad)

int gcd_held_load(gcd_check_set *set, char *err, size_t len);
const gcd_held *gcd_held_find(const gcd_check_set *set, const char *name);   // NULL: not recorded
void gcd_held_free(gcd_check_set *set);
// gradcheck.loss of every rank and the reference: set->loss_known, loss_mean, loss_ref (2: one is not a number)
int gcd_losses_load(gcd_check_set *set, char *err, size_t len);
int gcd_ref_multi(const gcd_check_set *set);   // the reference is a rank of a run of several (gradcheck.world > 1)
void gcd_result_start(const gcd_check_opts *o, const gcd_check_set *set, gcd_run_result *res);   // scan.c

// ----------------------------------------------------------------------------
// shards.c: gradcheck.shards, the FSDP maps

// gradcheck.shards: {"name": {"shape": [full dims], "start": flat offset}}: this file's tensor of that
// name holds the contiguous run of the parameter's row-major elements from start (FSDP); or, on a mesh
// (DTensor placements, tp_layout), {"shape", "placements", "offsets", "lengths"}: the box of the parameter
// at offsets with those lengths, row-major (start: its first element's flat index), a partial sum when
// a placement says partial
struct gcd_shard_map {
    int n;
    struct shard {
        char *name;
        uint64_t start, numel;
        int ndim, box, partial;                        // box: the mesh form; partial: bit i set where mesh dimension i is a partial sum
        int shape[GCD_ST_MAX_DIM];
        int off[GCD_ST_MAX_DIM], len[GCD_ST_MAX_DIM];  // box: its corner and lengths
    } *e;   // (n) by name
};
// box x's elements of flat indices [at, at + m) as contiguous segments: calls fn(arg, local index, flat
// index, count) for each, in order; 0, or what fn returns to stop
int gcd_box_segments(const struct shard *x, uint64_t at, uint64_t m, int (*fn)(void *, uint64_t, uint64_t, uint64_t), void *arg);

const struct shard *gcd_shard_of(const gcd_shard_map *m, const char *name);
int gcd_shards_load(const gcd_st_file *f, gcd_shard_map *m, char *err, size_t len);
void gcd_shards_free(gcd_shard_map *m);
// every sharded parameter's pieces tile it (sets set->sharded); 2 with the message otherwise
int gcd_shards_check(const gcd_check_opts *o, gcd_check_set *set, char *err, size_t len);

// ----------------------------------------------------------------------------
// mesh.c: gradcheck.mesh, the ranks' coordinates on a device mesh (DTensor, tp_layout)

// every rank's file records the same mesh shape and names and its own coordinates, inside the mesh and
// claimed by no other rank; 2 with the message otherwise (none anywhere: mesh_nd 0)
int gcd_mesh_load(gcd_check_set *set, char *err, size_t len);

// ----------------------------------------------------------------------------
// scan.c and stages.c

// m values of dtype dt at b, as float64, into out
void gcd_check_convert(gcd_dtype dt, const unsigned char *b, size_t m, double *out);
// Both stages, p's ranks disagreeing after the reduce: each rank's reduced gradient against its own local
// one, their mean, and the gradient accumulated before the last backward (name@earlier in the local dump,
// where it is): p->stage_cause, own_rel, ref_rel, split_rel. 0, or 2 with err set.
int gcd_check_stages(const gcd_check_set *set, gcd_param_result *p, int sharded, char *err, size_t len);

// ----------------------------------------------------------------------------
// digest.c: the files the scan does not hash, hashed by a pool of threads

typedef struct gcd_hash_pool gcd_hash_pool;
// starts hashing every file with inl[k] 0 (and the local dumps); pooled: how many; without threads, hashes them here
gcd_hash_pool *gcd_hash_pool_start(gcd_check_set *set, const unsigned char *inl, int pooled);
// waits for the pool; 0, or 2 with its first error in err
int gcd_hash_pool_join(gcd_hash_pool *pool, char *err, size_t len);

// ----------------------------------------------------------------------------
// sketch.c: sketch dumps (dump_grads(..., sketch=K)), docs/dumps.md. Each parameter with a gradient is one F64
// tensor of GCD_SK_COLS + K values: these columns, then its K-value linear sketch (python/gradcheck_dist/guard.py
// _sketch, at the piece's offset START in the whole parameter, so that pieces add)
enum { GCD_SK_NONFINITE, GCD_SK_FIRST_NONFINITE, GCD_SK_NORM, GCD_SK_START, GCD_SK_NUMEL, GCD_SK_DTYPE, GCD_SK_NDIM, GCD_SK_DIM0,
       GCD_SK_COLS = GCD_SK_DIM0 + GCD_ST_MAX_DIM };
#define GCD_SKETCH_MAX_K 4096

// every file a sketch dump of one K and seed, or none (set->sketch_k 0); each sketch tensor F64 (GCD_SK_COLS + K);
// the reduced stage only. 2 with a message naming the file otherwise
int gcd_sketch_load(gcd_check_set *set, char *err, size_t len);
// gcd_check_scan for sketch dumps: each parameter's rows (read and validated) judged by the guard's rules
// (guard/rows.h) and the classifier
int gcd_check_sketch_scan(const gcd_check_opts *o, gcd_check_set *set, gcd_run_result *res, char *err, size_t len);
