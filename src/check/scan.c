#define _GNU_SOURCE   // qsort_r
// The scan: per parameter, every rank's values a chunk at a time into the sums the classifier reads;
// the files the scan reads in their own order are hashed as they are read.
#include <math.h>
#include <setjmp.h>
#include <time.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY   // XXH3_state_t in place
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>   // XXH3_128bits_update: AVX2 or AVX-512 where the CPU has it (chosen at run time)
#endif
#include "check/internal.h"
#include "diagnose/findings.h"
#include "diagnose/verdict.h"

#define CHUNK 4096   // elements per rank converted to float64 at a time: three such buffers stay in L2

// ----------------------------------------------------------------------------
// the scan: per parameter, every rank's values a chunk at a time. One pass over each rank's bytes
// converts them and takes that rank's figures at once (take); the loops vectorise (omp simd).

typedef struct {
    double sq, d2, mx;   // ||v||^2, ||v - g||^2, max |v - g|
    long bad, first;     // NaN and infinities, and the first one's index in the chunk
} rank_acc;

enum { TAKE_FIRST, TAKE_ADD, TAKE_DIFF, TAKE_CONV };   // g = v; g += v; compare v with g; g = v, no figures

static inline double ld_f64(const unsigned char *s, size_t i) { double v; memcpy(&v, s + 8 * i, 8); return v; }
static inline double ld_f32(const unsigned char *s, size_t i) { float v; memcpy(&v, s + 4 * i, 4); return v; }
static inline double ld_f16(const unsigned char *s, size_t i) { uint16_t h; memcpy(&h, s + 2 * i, 2); return gcd_f16_table[h]; }
static inline double ld_bf16(const unsigned char *s, size_t i) {
    uint16_t h;
    memcpy(&h, s + 2 * i, 2);
    uint32_t u = (uint32_t)h << 16;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

#define TAKE_LOOPS(LD)                                                                                                          \
    switch (how) {                                                                                                              \
    case TAKE_FIRST:                                                                                                            \
        _Pragma("omp simd reduction(+ : sq)") for (size_t i = 0; i < m; i++) {                                                \
            double v = LD(s, i);                                                                                                \
            g[i] = v, sq += v * v;                                                                                              \
        }                                                                                                                       \
        break;                                                                                                                  \
    case TAKE_ADD:                                                                                                              \
        _Pragma("omp simd reduction(+ : sq)") for (size_t i = 0; i < m; i++) {                                                \
            double v = LD(s, i);                                                                                                \
            g[i] += v, sq += v * v;                                                                                             \
        }                                                                                                                       \
        break;                                                                                                                  \
    case TAKE_DIFF: /* the largest |v - g| only where they differ: rare, and a max would not vectorise well */                 \
        _Pragma("omp simd reduction(+ : sq, d2)") for (size_t i = 0; i < m; i++) {                                            \
            double v = LD(s, i), d = v - g[i];                                                                                  \
            sq += v * v, d2 += d * d;                                                                                           \
        }                                                                                                                       \
        for (size_t i = 0; d2 != 0 && i < m; i++) {                                                                             \
            double ad = fabs(LD(s, i) - g[i]);                                                                                  \
            mx = mx > ad || mx != mx ? mx : ad;                                                                                 \
        }                                                                                                                       \
        break;                                                                                                                  \
    default:                                                                                                                    \
        _Pragma("omp simd") for (size_t i = 0; i < m; i++) g[i] = LD(s, i);                                                    \
    }

// A NaN or infinity makes ||v||^2 non-finite (so can a finite F64 beyond 1e154 squared): only then
// are the values looked at one by one.
GCD_CLONES static void take(int how, gcd_dtype dt, const unsigned char *s, size_t m, double *g, rank_acc *a, double *tmp) {
    double sq = 0, d2 = 0, mx = 0;
    switch (dt) {
    case GCD_DT_F64: TAKE_LOOPS(ld_f64) break;
    case GCD_DT_F32: TAKE_LOOPS(ld_f32) break;
    case GCD_DT_F16: TAKE_LOOPS(ld_f16) break;
    case GCD_DT_BF16: TAKE_LOOPS(ld_bf16) break;
    default: GCD_FATAL("take: dtype %d is not readable", (int)dt);
    }
    if (how != TAKE_CONV && !isfinite(sq)) {
        double *v = how == TAKE_FIRST ? g : tmp;
        if (how != TAKE_FIRST) take(TAKE_CONV, dt, s, m, tmp, a, NULL);
        a->first = -1;
        for (size_t i = 0; i < m; i++)
            if (!isfinite(v[i])) a->bad++, a->first = a->first < 0 ? (long)i : a->first;
    }
    a->sq += sq, a->d2 += d2;
    a->mx = a->mx > mx || mx != mx ? (mx != mx ? mx : a->mx) : mx;
}

void gcd_check_convert(gcd_dtype dt, const unsigned char *b, size_t m, double *out) {
    rank_acc a = { 0 };
    take(TAKE_CONV, dt, b, m, out, &a, NULL);
}

typedef struct {
    const gcd_check_set *set;
    const gcd_st_tensor **t;   // (world + 2) rank k's tensor or NULL; the references' last
    int local;                 // stage local: g is the DDP mean; reduced: g is the first rank's
    int sharded;               // this parameter: g is the ranks' runs side by side (FSDP), each from start[k]
    uint64_t *start;           // (world)
    int *twin;                 // (world) sharded: the first rank holding the same run (an HSDP replica), or -1
    unsigned char *dup;        // (world) a partial piece that copies an earlier rank's (the same partial coordinates): not added again
    int *held;                 // (world) sharded: the ranks holding a non-empty run, sorted by run (by_held)
    double *g, *r, *r2, *tmp;  // (CHUNK) r2: the second reference
    double *sq, *dsq;          // (world) ||g_k||^2, ||g_k - g_first||^2 (sharded: - its twin's)
    XXH3_state_t *xxh;         // (world + 2) the digests the scan makes (hash_to), where inl[k]
    const unsigned char *inl;
    uint64_t *hashed;          // (world + 2) how far into file k they are
    int read_b;                // this pass reads the second reference into r2 (scan_param decides)
    double deadline;           // mono() past which the scan stops (--timeout); 0: none
    uint64_t nlate;            // chunks late() has been asked about (the clock is read every 64th)
    const char *param;         // the parameter being scanned, for the message
    const char *volatile reading;   // the file being read, for the SIGBUS message
    char *err;
    size_t len;
} scan;

// file k's digest up to byte `end`, in order: the chunk the scan just read is hashed while in cache;
// bytes it never reads (the header, padding, ignored tensors) are taken on the way
static void hash_to(scan *s, int k, uint64_t end) {
    if (!s->inl || !s->inl[k] || end <= s->hashed[k]) return;
    XXH3_128bits_update(&s->xxh[k], file_of(s->set, k)->map + s->hashed[k], (size_t)(end - s->hashed[k]));
    s->hashed[k] = end;
}

// the scan reads a file's tensors in the order of the parameters; it can hash it when that is the
// order they lie in the file (and the file is mapped)
static int scan_order_is_file_order(const gcd_check_opts *o, const gcd_check_set *set, int k) {
    const gcd_st_file *f = file_of(set, k);
    uint64_t end = 0;
    for (int j = 0; f && f->map && j < set->nparams; j++) {
        const gcd_st_tensor *t = ignored(o, set->params[j]) ? NULL : gcd_st_find(f, set->params[j]);
        if (!t) continue;
        if (t->begin < end) return 0;
        end = t->end;
    }
    return f && f->map;
}

static const unsigned char *bytes(scan *s, int k, uint64_t at, size_t m) {
    const gcd_st_file *f = file_of(s->set, k);
    s->reading = f->path;
    const unsigned char *b = gcd_st_bytes(f, s->t[k], at, m, s->err, s->len);
    if (b) hash_to(s, k, f->data_start + s->t[k]->begin + (at + m) * gcd_dtype_size(s->t[k]->dtype));
    return b;
}

// g (and r) for elements [at, at+m); with p, also each rank's own figures (without p, a reduced
// stage reads the first rank only: g is its gradient)
// g for elements [at, at+m) of a sharded parameter: each rank's run where it overlaps (the rest, of
// ranks without a gradient, zeros); with p each rank's figures over its run
typedef struct { scan *s; gcd_param_result *p; int k, how; uint64_t at; } seg_arg;

// one contiguous piece of rank k's tensor: elements [local, local + n) of it, [flat, flat + n) of the whole
static int take_seg(void *arg, uint64_t local, uint64_t flat, uint64_t n) {
    seg_arg *c = arg;
    scan *s = c->s;
    int k = c->k;
    const gcd_st_file *f = file_of(s->set, k);
    s->reading = f->path;
    const unsigned char *b = gcd_st_bytes(f, s->t[k], local, (size_t)n, s->err, s->len);
    if (!b) return 2;
    hash_to(s, k, f->data_start + s->t[k]->begin + (local + n) * gcd_dtype_size(s->t[k]->dtype));
    rank_acc a = { 0 };
    take(c->how, s->t[k]->dtype, b, (size_t)n, s->g + (flat - c->at), &a, s->tmp);
    gcd_param_result *p = c->p;
    if (!p) return 0;
    s->sq[k] += a.sq;
    if (c->how == TAKE_DIFF) {
        s->dsq[k] += a.d2;
        p->max_diff = p->max_diff > a.mx || a.mx != a.mx ? (a.mx != a.mx ? a.mx : p->max_diff) : a.mx;
        if (a.d2 > 0 || a.d2 != a.d2) p->differs[k] = 1;
    }
    if (a.bad) {
        p->rank_nonfinite[k] += a.bad;
        if (p->rank_first_nonfinite[k] < 0) p->rank_first_nonfinite[k] = (long)(flat + (uint64_t)a.first);
    }
    return 0;
}

// g for elements [at, at+m) of a sharded parameter: each rank's run (or box) where it overlaps (the
// rest, of ranks without a gradient, zeros); a copy of an earlier rank's piece is compared with it, a
// piece of a partial sum added to it; with p each rank's figures over its piece
static int chunk_sharded(scan *s, gcd_param_result *p, uint64_t at, size_t m) {
    memset(s->g, 0, m * sizeof *s->g);
    for (int k = 0; k < s->set->world; k++) {
        if (!s->t[k]) continue;
        const struct shard *sh = gcd_shard_of(&s->set->shards[k], p ? p->name : s->param);
        int twin = s->twin[k] >= 0;
        if (s->dup[k]) continue;
        seg_arg c = { s, p, k, !twin ? TAKE_FIRST : sh && sh->partial ? TAKE_ADD : TAKE_DIFF, at };
        if (sh && sh->box) {
            if (gcd_box_segments(sh, at, m, take_seg, &c)) return 2;
            continue;
        }
        uint64_t lo = at > s->start[k] ? at : s->start[k], end = s->start[k] + s->t[k]->n, hi = at + m < end ? at + m : end;
        if (lo < hi && take_seg(&c, lo - s->start[k], lo, hi - lo)) return 2;
    }
    return 0;
}

static int chunk(scan *s, gcd_param_result *p, uint64_t at, size_t m) {
    int W = s->set->world, got = 0;
    if (s->sharded && chunk_sharded(s, p, at, m)) return 2;
    const unsigned char *b0 = NULL;   // the first rank's bytes, where they stay valid (mapped)
    rank_acc a0 = { 0 };
    for (int k = 0; k < W && !s->sharded; k++) {
        if (!s->t[k] || (!p && !s->local && got)) continue;
        const unsigned char *b = bytes(s, k, at, m);
        if (!b) return 2;
        int how = got == 0 ? TAKE_FIRST : s->local ? TAKE_ADD : TAKE_DIFF;
        rank_acc a = { 0 };
        if (how == TAKE_DIFF && b0 && s->t[k]->dtype == s->t[p->first]->dtype && !memcmp(b, b0, m * gcd_dtype_size(s->t[k]->dtype)))
            a = a0, a.d2 = a.mx = 0;   // the same bytes as the first rank (after an all-reduce, the rule): the same figures
        else take(how, s->t[k]->dtype, b, m, s->g, &a, s->tmp);
        if (how == TAKE_FIRST && file_of(s->set, k)->map) b0 = b, a0 = a;
        got++;
        if (!p) continue;
        s->sq[k] += a.sq;
        if (a.bad) {
            p->rank_nonfinite[k] += a.bad;
            if (p->rank_first_nonfinite[k] < 0) p->rank_first_nonfinite[k] = (long)at + a.first;
        }
        if (how == TAKE_DIFF) {
            s->dsq[k] += a.d2;
            p->max_diff = p->max_diff > a.mx || a.mx != a.mx ? (a.mx != a.mx ? a.mx : p->max_diff) : a.mx;
            if (a.d2 > 0 || a.d2 != a.d2) p->differs[k] = 1;
        }
    }
    if (s->local)
        for (size_t i = 0; i < m; i++) s->g[i] /= W;
    for (int k = W; k < W + NREF; k++) {
        if (!s->t[k] || (k > W && !s->read_b)) continue;
        const unsigned char *b = bytes(s, k, at, m);
        if (!b) return 2;
        rank_acc a = { 0 };
        take(TAKE_CONV, s->t[k]->dtype, b, m, k == W ? s->r : s->r2, &a, NULL);
    }
    return 0;
}

// ranks by their run (start, length), then by rank: each run's first holder leads its replicas
static int by_held(const void *x, const void *y, void *arg) {
    const scan *s = arg;
    int a = *(const int *)x, b = *(const int *)y;
    uint64_t sa = s->start[a], sb = s->start[b], na = s->t[a]->n, nb = s->t[b]->n;
    return sa != sb ? (sa < sb ? -1 : 1) : na != nb ? (na < nb ? -1 : 1) : a - b;
}

// sharded, with no reference to read: the first element at or past `at` that some rank's run holds
// (the gaps of ranks without a gradient are zeros, which add nothing to the sums)
static uint64_t next_held(const scan *s, uint64_t at, uint64_t n) {
    uint64_t next = n;
    for (int k = 0; k < s->set->world; k++) {
        if (!s->t[k] || !s->t[k]->n) continue;
        const struct shard *sh = gcd_shard_of(&s->set->shards[k], s->param);
        uint64_t a = s->start[k], b = sh && sh->box ? n : a + s->t[k]->n;   // a box: from its corner on
        if (at >= a && at < b) return at;
        if (a > at && a < next) next = a;
    }
    return next - next % CHUNK > at ? next - next % CHUNK : at;
}

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// 3 once the scan is past --timeout (looked at every 64 chunks read: a clock read per 256 Ki elements;
// counted, not taken from the element index, which skipped gaps can keep off every 64th chunk)
static int late(scan *s) {
    if (!s->deadline || s->nlate++ % 64 || mono() <= s->deadline) return 0;
    snprintf(s->err, s->len, "stopped: the scan took longer than --timeout allows (at '%.80s')", (const char *)s->param);
    return 3;
}

// on a mesh with a dimension named tp: a rank whose copy differs sits at another tp coordinate than the
// rank it is compared with (copies that must agree across the tensor-parallel group do not)
static int copies_across_tp(const gcd_check_set *set, const gcd_param_result *p) {
    int tp = -1;
    for (int i = 0; i < set->mesh_nd; i++)
        if (!strcmp(set->mesh_names[i], "tp")) tp = i;
    int b = p->diff_base >= 0 ? p->diff_base : p->first;
    for (int k = 0; tp >= 0 && b >= 0 && k < set->world; k++)
        if (p->differs[k] && set->mesh_coords[k * 4 + tp] != set->mesh_coords[b * 4 + tp]) return 1;
    return 0;
}

static int scan_param(scan *s, gcd_param_result *p) {
    int W = s->set->world, rc;
    s->param = p->name;
    gcd_sums sums;
    const double *r = s->set->has_ref ? s->r : NULL;   // a None reference counts as zeros for the sums
    gcd_sums_init(&sums, s->set->has_ref);
    sums.masks = s->set->nondeterministic != NULL;
    s->read_b = 0;   // the second reference: read in the second pass, only where the claimed tolerance does not pass g
    memset(s->sq, 0, (size_t)W * sizeof *s->sq);
    memset(s->dsq, 0, (size_t)W * sizeof *s->dsq);
    if (r && !s->t[W]) memset(s->r, 0, CHUNK * sizeof *s->r);
    int skip = s->sharded && !s->t[W];   // nothing but the ranks' runs to read: their gaps are skipped
    for (uint64_t at = 0; p->nhave && at < p->n; at += CHUNK) {
        if (skip && (at = next_held(s, at, p->n)) >= p->n) break;
        size_t m = p->n - at < CHUNK ? (size_t)(p->n - at) : CHUNK;
        if ((rc = late(s)) || (rc = chunk(s, p, at, m))) return rc ? rc : 2;
        gcd_sums_add(&sums, s->g, r, m, at);
    }
    if (!p->nhave && s->t[W])   // None everywhere: only the reference's norm
        for (uint64_t at = 0; at < p->n; at += CHUNK) {
            size_t m = p->n - at < CHUNK ? (size_t)(p->n - at) : CHUNK;
            const unsigned char *bt = bytes(s, W, at, m);
            if ((rc = late(s)) || !bt) return rc ? rc : 2;
            rank_acc a = { 0 };
            take(TAKE_FIRST, s->t[W]->dtype, bt, m, s->r, &a, NULL);
            sums.rr += a.sq;
        }
    // a reduced stage takes g from the first rank: a NaN elsewhere is still a NaN in the gradients
    for (int k = 0; k < W && !sums.nonfinite; k++)
        if (p->rank_nonfinite[k]) sums.nonfinite = p->rank_nonfinite[k], sums.first_nonfinite = p->rank_first_nonfinite[k];
    int resid = gcd_sums_need_resid(&sums, p->tol);
    s->read_b = p->nhave && s->t[W] && s->t[W + 1] && gcd_sums_need_noise(&sums, p->tol);
    if (resid || s->read_b)
        for (uint64_t at = 0; at < p->n; at += CHUNK) {
            if (skip && (at = next_held(s, at, p->n)) >= p->n) break;
            size_t m = p->n - at < CHUNK ? (size_t)(p->n - at) : CHUNK;
            if ((rc = late(s)) || (rc = chunk(s, NULL, at, m))) return rc ? rc : 2;
            if (resid) gcd_sums_resid(&sums, s->g, r, m);
            if (s->read_b) gcd_sums_noise(&sums, s->g, r, s->r2, m);
        }
    double g0 = p->first >= 0 ? sqrt(s->sq[p->first]) : 0;
    for (int k = 0; k < W; k++) {
        p->rank_norm[k] = s->t[k] ? sqrt(s->sq[k]) : NAN;
        if (s->local || !s->t[k] || k == p->first || !p->differs[k]) continue;
        double base = s->sharded ? sqrt(s->sq[s->twin[k]]) : g0;   // a replica against the run it copies
        double rel = base > 0 ? sqrt(s->dsq[k]) / base : INFINITY;
        if (rel <= p->tol) p->differs[k] = 0;   // within the tolerance: not a disagreement
        else {
            if (s->sharded && !(p->diff_rel > 0)) p->diff_base = s->twin[k];
            p->diff_rel = rel != rel || p->diff_rel != p->diff_rel ? NAN : fmax(p->diff_rel, rel);
        }
    }
    for (int k = 0; k < W + NREF; k++)
        if (s->t[k]) gcd_st_release(file_of(s->set, k), s->t[k]);
    p->tp_split = copies_across_tp(s->set, p) ? 2 : p->tp_split;
    gcd_classify_sums(p, &sums, W, p->tol);
    return 0;
}

// the result's header and the scan's buffers
// the result's header, the full scan's and the sketch scan's (sketch.c)
void gcd_result_start(const gcd_check_opts *o, const gcd_check_set *set, gcd_run_result *res) {
    memset(res, 0, sizeof *res);
    res->probe = "check";
    res->world = set->world;
    res->tol = set->tol;
    res->classified = 1;
    res->no_ref = !set->has_ref, res->ref_multi = gcd_ref_multi(set);
    res->nref = set->has_ref + set->has_ref2;
    res->tol_given = o->tol > 0;
    res->nondeterministic = set->nondeterministic, res->batchnorm = set->batchnorm, res->wrapper = set->wrapper;
    res->reduced_by = gcd_reducer_words(set->wrapper);
    res->param = gcd_malloc((size_t)(set->nparams ? set->nparams : 1) * sizeof *res->param);
}

static void scan_start(const gcd_check_opts *o, gcd_check_set *set, gcd_run_result *res, scan *s, char *err, size_t len) {
    int W = set->world, NF = nfiles(set);
    gcd_result_start(o, set, res);
    res->loss_known = set->loss_known, res->loss_mean = set->loss_mean, res->loss_ref = set->loss_ref;
    res->rank_loss = set->rank_loss, res->shard_loss = set->shard_loss, res->accumulate = set->accumulate;
    res->ref_objective = set->ref_objective;
    res->mesh_nd = set->mesh_nd;
    if (set->mesh_nd) res->mesh_coords = gcd_malloc((size_t)W * (size_t)set->mesh_nd * sizeof(int));
    for (int i = 0; i < set->mesh_nd; i++) {
        memcpy(res->mesh_names[i], set->mesh_names[i], sizeof res->mesh_names[i]);
        for (int k = 0; k < W; k++) res->mesh_coords[k * set->mesh_nd + i] = set->mesh_coords[k * 4 + i];
    }
    *s = (scan){ .set = set, .local = !strcmp(set->stage, "local"), .err = err, .len = len };
    s->t = gcd_malloc((size_t)NF * sizeof *s->t);
    s->g = gcd_malloc(CHUNK * sizeof(double)), s->r = gcd_malloc(CHUNK * sizeof(double)), s->r2 = gcd_malloc(CHUNK * sizeof(double));
    s->tmp = gcd_malloc(CHUNK * sizeof(double));
    s->sq = gcd_malloc((size_t)W * sizeof(double)), s->dsq = gcd_malloc((size_t)W * sizeof(double));
    s->start = gcd_malloc((size_t)W * sizeof *s->start), s->twin = gcd_malloc((size_t)W * sizeof *s->twin), s->held = gcd_malloc((size_t)W * sizeof *s->held);
    s->dup = gcd_malloc((size_t)W);
    s->deadline = o->timeout > 0 ? mono() + o->timeout : 0;
}

// which files the scan hashes itself (inl), the others to the pool, started here
static gcd_hash_pool *digests_start(const gcd_check_opts *o, gcd_check_set *set, scan *s) {
    int NF = nfiles(set);
    unsigned char *inl = gcd_malloc((size_t)NF);
    int pooled = 0;
    for (int k = 0; k < NF && !o->no_hash; k++)
        if (file_of(set, k)) pooled += !(inl[k] = (unsigned char)scan_order_is_file_order(o, set, k));
    if (!o->no_hash && set->local) pooled += set->world;   // the local dumps: read by the scan only for what it needs, hashed whole by the pool
    s->xxh = aligned_alloc(64, (size_t)NF * sizeof *s->xxh), s->hashed = gcd_malloc((size_t)NF * sizeof *s->hashed);   // XXH3's state: 64-byte aligned
    if (!s->xxh) GCD_FATAL("out of memory for %d digests", NF);
    for (int k = 0; k < NF; k++)
        if (inl[k]) XXH3_128bits_reset(&s->xxh[k]);
    s->inl = inl;
    return gcd_hash_pool_start(set, inl, o->no_hash ? 0 : pooled);
}

// the data bytes of every parameter not ignored, for the progress line
static uint64_t data_bytes(const gcd_check_opts *o, const gcd_check_set *set) {
    uint64_t total = 0;
    for (int j = 0; j < set->nparams; j++)
        for (int k = 0; k < nfiles(set); k++) {
            const gcd_st_file *f = file_of(set, k);
            const gcd_st_tensor *t = f && !ignored(o, set->params[j]) ? gcd_st_find(f, set->params[j]) : NULL;
            total += t ? t->end - t->begin : 0;
        }
    return total;
}

// a sharded parameter: its own shape, where each rank's run starts, and each replica's first holder
static void place_shards(scan *s, gcd_param_result *p) {
    const gcd_check_set *set = s->set;
    int W = set->world;
    const struct shard *full = NULL;
    for (int k = 0; k < nfiles(set); k++) {
        const struct shard *sh = file_of(set, k) ? gcd_shard_of(&set->shards[k], p->name) : NULL;
        if (k < W) s->start[k] = sh ? sh->start : 0;
        if (sh && !full) full = sh;
    }
    p->ndim = full->ndim, p->n = full->numel;
    for (int d = 0; d < full->ndim; d++) p->shape[d] = full->shape[d];
    // HSDP: replicas of one run are compared with its first holder; the ranks sorted by run, not a
    // pass over the earlier ranks per rank (W^2: seconds per parameter at a few thousand ranks)
    int nheld = 0;
    memset(s->dup, 0, (size_t)W);
    for (int k = 0; k < W; k++) {
        s->twin[k] = -1;
        if (s->t[k] && s->t[k]->n) s->held[nheld++] = k;
    }
    qsort_r(s->held, (size_t)nheld, sizeof *s->held, by_held, s);
    for (int i = 1; i < nheld; i++) {
        int q = s->held[i - 1], k = s->held[i];
        if (s->start[q] == s->start[k] && s->t[q]->n == s->t[k]->n) s->twin[k] = s->twin[q] >= 0 ? s->twin[q] : q;
    }
    // a partial piece held again at the same partial coordinates (a copy along a replicate dimension) is
    // not added twice
    for (int i = 0; i < nheld; i++) {
        int k = s->held[i];
        const struct shard *sh = gcd_shard_of(&set->shards[k], p->name);
        s->dup[k] = 0;
        for (int h = i - 1; sh && sh->partial && set->mesh_coords && h >= 0 && s->twin[k] >= 0 && !s->dup[k]; h--) {
            int q = s->held[h], same = s->twin[q] == s->twin[k] || q == s->twin[k];
            for (int d = 0; same && d < set->mesh_nd; d++)
                if (sh->partial >> d & 1) same = set->mesh_coords[q * 4 + d] == set->mesh_coords[k * 4 + d];
            s->dup[k] = (unsigned char)same;
        }
    }
}

// parameter j's result before its values are read: who has it, its tolerance, dtype and shape; the
// data bytes its files hold (for the progress line)
static uint64_t param_start(const gcd_check_opts *o, scan *s, int j, gcd_param_result *p) {
    const gcd_check_set *set = s->set;
    int W = set->world;
    uint64_t bytes_of = 0;
    p->name = set->params[j];
    p->first = -1;
    p->has = gcd_malloc((size_t)W);
    p->rank_norm = gcd_malloc((size_t)W * sizeof(double));
    p->rank_nonfinite = gcd_malloc((size_t)W * sizeof(long));
    p->rank_first_nonfinite = gcd_malloc((size_t)W * sizeof(long));
    p->differs = gcd_malloc((size_t)W);
    const gcd_st_tensor *any = NULL;   // the loosest dtype among the ranks' (else the reference's) names the column
    p->tol = o->tol > 0 ? o->tol : set->ptol[j];
    p->tol_source = o->tol > 0 ? GCD_TOL_GIVEN : GCD_TOL_CLAIMED;
    p->ran = set->nran && in_sorted(set->ran, set->nran, p->name);
    const gcd_held *h = gcd_held_find(set, p->name);
    if (h) p->held_attr = h->attr, p->held_norm = h->norm, p->held_filled = h->filled;
    for (int k = 0; k < nfiles(set); k++) {
        const gcd_st_file *f = file_of(set, k);
        s->t[k] = f ? gcd_st_find(f, p->name) : NULL;
        if (!s->t[k]) continue;
        bytes_of += s->t[k]->end - s->t[k]->begin;
        if (!any || (k < W && dtype_tol(s->t[k]->dtype) > dtype_tol(any->dtype))) any = s->t[k];
        if (k < W) {
            p->has[k] = 1, p->nhave++;
            if (p->first < 0) p->first = k;
        }
    }
    for (int k = 0; k < W; k++) p->rank_first_nonfinite[k] = -1;
    if (set->local) {   // both stages: which ranks had a gradient before the all-reduce (the headers say)
        p->local_has = gcd_malloc((size_t)W);
        for (int k = 0; k < W; k++) p->local_nhave += p->local_has[k] = gcd_st_find(&set->local[k], p->name) != NULL;
    }
    p->ref_none = set->has_ref && !s->t[W];
    p->ndim = -1;   // unknown: None on every rank and in the reference
    if (any) {
        p->ndim = any->ndim;
        for (int d = 0; d < any->ndim; d++) p->shape[d] = (int)any->shape[d];
        p->n = any->n;
    }
    p->dtype = any ? gcd_dtype_str(any->dtype) : "-";
    s->sharded = set->sharded[j];
    if (s->sharded) place_shards(s, p);
    p->diff_base = p->first;
    p->split_rel = NAN;
    return bytes_of;
}

// every file still what was read (size and time unchanged), the ranks', the references', the local dumps'
static int files_unchanged(gcd_check_set *set, char *err, size_t len) {
    for (int k = 0; k < set->world; k++)
        if (gcd_st_unchanged(&set->rank[k], err, len)) return 2;
    if (set->has_ref && gcd_st_unchanged(&set->ref, err, len)) return 2;
    if (set->has_ref2 && gcd_st_unchanged(&set->ref2, err, len)) return 2;
    for (int k = 0; set->local && k < set->world; k++)
        if (gcd_st_unchanged(&set->local[k], err, len)) return 2;
    return 0;
}

static void scan_free(scan *s) {
    free(s->t), free(s->g), free(s->r), free(s->r2), free(s->tmp), free(s->sq), free(s->dsq), free(s->start), free(s->twin), free(s->held), free(s->dup);
    free(s->xxh), free(s->hashed), free((void *)s->inl);
}

int gcd_check_scan(const gcd_check_opts *o, gcd_check_set *set, gcd_run_result *res, char *err, size_t len) {
    if (set->sketch_k) return gcd_check_sketch_scan(o, set, res, err, len);
    scan s;
    scan_start(o, set, res, &s, err, len);
    gcd_hash_pool *pool = digests_start(o, set, &s);
    int rc = 0, NF = nfiles(set);
    sigjmp_buf jb;
    gcd_st_guard_install();
    gcd_st_jmp = &jb;
    if (sigsetjmp(jb, 1)) {
        rc = fail(err, len, "%s: changed while being read (truncated: SIGBUS on its mapped data); dump it again", (const char *)s.reading);
        goto done;
    }
    int tty = isatty(2);
    uint64_t total = data_bytes(o, set), seen = 0;
    for (int j = 0; j < set->nparams; j++) {
        if (ignored(o, set->params[j])) continue;
        gcd_param_result *p = &res->param[res->nparam++];
        seen += param_start(o, &s, j, p);
        if ((rc = scan_param(&s, p))) goto done;
        if (set->local && p->status == GCD_ST_DISAGREE) {   // both stages: why they disagree (check/stages.c)
            p->own_rel = gcd_malloc((size_t)set->world * sizeof(double)), p->ref_rel = gcd_malloc((size_t)set->world * sizeof(double));
            for (int k = 0; k < set->world; k++) p->own_rel[k] = p->ref_rel[k] = NAN;
            if ((rc = gcd_check_stages(set, p, s.sharded, err, len))) goto done;
        }
        if (tty && total > (1u << 30)) fprintf(stderr, "\rcheck: %3.0f%% of %.1f GB", 100.0 * (double)seen / (double)total, (double)total / 1e9);
    }
    if (tty && total > (1u << 30)) fprintf(stderr, "\r%40s\r", "");
    set->bytes = total;
    for (int k = 0; k < NF; k++)   // the rest of each file the scan hashed: its last bytes past the last tensor read
        if (s.inl[k]) {
            hash_to(&s, k, file_of(set, k)->size);
            XXH128_hash_t d = XXH3_128bits_digest(&s.xxh[k]);
            gcd_xxh128_hex(d.high64, d.low64, set->digest[k]);
        }
done:
    gcd_st_jmp = NULL;
    if (gcd_hash_pool_join(pool, rc ? NULL : err, len) && !rc) rc = 2;
    if (!rc) rc = files_unchanged(set, err, len);
    scan_free(&s);
    if (!rc) gcd_verdict(res);
    return rc;
}
