// Sketch dumps (dump_grads(..., sketch=K), docs/dumps.md): each parameter's present/None, non-finite count,
// float64 norm and K-value linear sketch instead of its values. Loaded (one K and seed for every file, named
// when not), then judged per parameter as the guard judges its rows (guard/rows.c) against the reference's
// sketch, by the one classifier (diagnose/verdict.c). docs/check-verdicts.md: what the sketch can miss.
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <time.h>

#include "check/internal.h"
#include "diagnose/findings.h"
#include "diagnose/verdict.h"
#include "guard/rows.h"

// a strict decimal integer in [lo, hi] (no sign games, no trailing bytes, no float, no NaN)
static int parse_int(const char *v, long lo, long hi, long *out) {
    if (!v || !*v || ((*v < '0' || *v > '9') && *v != '-')) return -1;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi) return -1;
    return *out = x, 0;
}

// this file's K and seed (k 0: not a sketch dump)
static int sketch_meta(const gcd_st_file *f, long *k, long *seed, char *err, size_t len) {
    const char *v = gcd_st_meta(f, "gradcheck.sketch"), *s = gcd_st_meta(f, "gradcheck.seed");
    *k = 0, *seed = 0;
    if (!v) return 0;
    if (parse_int(v, 1, GCD_SKETCH_MAX_K, k))
        return fail(err, len, "%s: metadata gradcheck.sketch is '%.20s': expected the sketch's size K, an integer from 1 to %d", f->path, v,
                    GCD_SKETCH_MAX_K);
    if (parse_int(s, 0, 0x7FFFFFFF, seed))
        return fail(err, len, "%s: metadata gradcheck.seed is '%.20s': a sketch dump records its seed, an integer from 0 to 2147483647", f->path,
                    s ? s : "(missing)");
    return 0;
}

// every tensor of a sketch dump: F64, one dimension of GCD_SK_COLS + K
static int sketch_tensors(const gcd_st_file *f, int k, char *err, size_t len) {
    for (int i = 0; i < f->ntensor; i++) {
        const gcd_st_tensor *t = &f->tensor[i];
        if (t->dtype != GCD_DT_F64 || t->ndim != 1 || t->shape[0] != GCD_SK_COLS + k)
            return fail(err, len, "%s: tensor '%.80s' is %s with %d dimension%s (first %lld): a sketch dump of K=%d holds one F64 vector of %d values per "
                                  "parameter", f->path, t->name, t->dtype_name, t->ndim, t->ndim == 1 ? "" : "s", t->ndim ? (long long)t->shape[0] : 0LL, k,
                        GCD_SK_COLS + k);
    }
    return 0;
}

int gcd_sketch_load(gcd_check_set *set, char *err, size_t len) {
    const gcd_st_file *first = NULL, *full = NULL;
    long k0 = 0, seed0 = 0;
    const char *proj0 = NULL;
    int rc;
    for (int i = 0; i < all_files(set); i++) {
        const gcd_st_file *f = every_file(set, i);
        long k, seed;
        if (!f) continue;
        if ((rc = sketch_meta(f, &k, &seed, err, len))) return rc;
        if (!k) { full = full ? full : f; continue; }
        const char *proj = gcd_st_meta(f, "gradcheck.projections");
        if (!first) { first = f, k0 = k, seed0 = seed, proj0 = proj; continue; }
        if (k != k0 || seed != seed0)
            return fail(err, len, "%s: a sketch of K=%ld with seed %ld, but %s is one of K=%ld with seed %ld: the sketches of one check must share K and "
                                  "seed (dump every run with the same sketch=K and seed)", f->path, k, seed, first->path, k0, seed0);
        if ((proj != NULL) != (proj0 != NULL) || (proj && strcmp(proj, proj0)))   // other projections: their sketches do not compare
            return fail(err, len, "%s: sketched with projections '%.40s', but %s with '%.40s' (gradcheck.projections): sketches of other projections do "
                                  "not compare; dump both runs with the same gradcheck_dist", f->path, proj ? proj : "(none)", first->path,
                        proj0 ? proj0 : "(none)");
    }
    if (!first) return 0;
    if (full)
        return fail(err, len, "%s is a full dump, but %s is a sketch dump (gradcheck.sketch=%ld): one check reads one kind; dump every rank and the "
                              "reference alike (both full, or both dump_grads(..., sketch=K))", full->path, first->path, k0);
    if (set->has_ref2)
        return fail(err, len, "%s: a second --ref measures noise from full dumps; with sketch dumps give one --ref", set->ref2.path);
    if (set->local || strcmp(set->stage, "reduced"))
        return fail(err, len, "%s: a sketch dump of stage %s: sketch dumps are read for the reduced stage only (each rank's gradient after the reduce)",
                    set->local ? set->local[0].path : set->rank[0].path, set->local ? "local" : set->stage);
    if (set->has_ref && strcmp(gcd_st_meta(&set->ref, "gradcheck.stage"), "reduced") && strcmp(gcd_st_meta(&set->ref, "gradcheck.world"), "1"))
        return fail(err, len, "%s: a sketch reference of stage local from a run of several ranks: give one rank's reduced sketch dump", set->ref.path);
    for (int i = 0; i < all_files(set); i++)
        if (every_file(set, i) && (rc = sketch_tensors(every_file(set, i), (int)k0, err, len))) return rc;
    set->sketch_k = (int)k0, set->sketch_seed = seed0;
    return 0;
}

// ----------------------------------------------------------------------------
// one parameter's rows

static int whole(double x) { return isfinite(x) && x == floor(x); }

static const char *const dtype_names[] = { "F64", "F32", "F16", "BF16" };
static const double dtype_tols[] = { GCD_TOL, 1e-5, 1e-2, 1e-2 };

// x: file f's row of parameter name, validated: its columns whole numbers where they count, the piece inside
// the parameter, the norm finite, the sketch finite unless the gradient has non-finite values. *total: the
// parameter's elements (its shape in p when p is given)
static int check_row(const gcd_st_file *f, const char *name, const double *x, int k, double *total, char *err, size_t len) {
    const char *bad = NULL;
    double n = 1;
    if (!whole(x[GCD_SK_NDIM]) || x[GCD_SK_NDIM] < 0 || x[GCD_SK_NDIM] > GCD_ST_MAX_DIM) bad = "its number of dimensions";
    for (int d = 0; !bad && d < (int)x[GCD_SK_NDIM]; d++) {
        if (!whole(x[GCD_SK_DIM0 + d]) || x[GCD_SK_DIM0 + d] < 0 || x[GCD_SK_DIM0 + d] > 0x7FFFFFFF) bad = "a dimension of its shape";
        n *= x[GCD_SK_DIM0 + d];
    }
    if (!bad && n > 0x1p62) bad = "its shape (more than 2^62 elements)";
    else if (!bad && (!whole(x[GCD_SK_START]) || !whole(x[GCD_SK_NUMEL]) || x[GCD_SK_START] < 0 || x[GCD_SK_NUMEL] < 0 ||
                      x[GCD_SK_START] + x[GCD_SK_NUMEL] > n))
        bad = "its piece (start, count) inside the parameter";
    else if (!bad && (!whole(x[GCD_SK_NONFINITE]) || x[GCD_SK_NONFINITE] < 0 || x[GCD_SK_NONFINITE] > x[GCD_SK_NUMEL])) bad = "its non-finite count";
    else if (!bad && x[GCD_SK_NONFINITE] > 0 && (!whole(x[GCD_SK_FIRST_NONFINITE]) || x[GCD_SK_FIRST_NONFINITE] < 0 || x[GCD_SK_FIRST_NONFINITE] >= n))
        bad = "the index of its first non-finite value";
    else if (!bad && (!isfinite(x[GCD_SK_NORM]) || x[GCD_SK_NORM] < 0)) bad = "its norm (of the finite values)";
    else if (!bad && (!whole(x[GCD_SK_DTYPE]) || x[GCD_SK_DTYPE] < 0 || x[GCD_SK_DTYPE] > 3)) bad = "its dtype code (0 F64, 1 F32, 2 F16, 3 BF16)";
    for (int j = 0; !bad && x[GCD_SK_NONFINITE] == 0 && j < k; j++)
        if (!isfinite(x[GCD_SK_COLS + j])) bad = "its sketch (a value not finite, yet no non-finite gradient value)";
    if (bad) return fail(err, len, "%s: tensor '%.80s' of this sketch dump: %s is not possible", f->path, name, bad);
    *total = n;
    return 0;
}

static int same_full_shape(const double *a, const double *b) {
    if (a[GCD_SK_NDIM] != b[GCD_SK_NDIM]) return 0;
    for (int d = 0; d < (int)a[GCD_SK_NDIM]; d++)
        if (a[GCD_SK_DIM0 + d] != b[GCD_SK_DIM0 + d]) return 0;
    return 1;
}

typedef struct {
    const gcd_check_set *set;
    int k, w;              // K; the row width GCD_SK_COLS + K
    double *raw;           // (world + 1, w) each file's row of the parameter (the reference's last), copied out of the file
    unsigned char *got;    // (world + 1)
    double *grow;          // (world, GCD_GUARD_COLS + K) the ranks' rows in the guard's form
    const double **rows;   // (world) into grow, NULL for a rank without the gradient
    double *sg;            // (K) the gradient's sketch: the first rank's, or its pieces' sum
    const char *volatile reading;
    char *err;
    size_t len;
} sk_scan;

// every file's row of parameter name, copied and validated; the shapes agree
static int read_rows(sk_scan *s, const char *name, double *total) {
    const gcd_check_set *set = s->set;
    int first = -1;
    for (int r = 0; r <= set->world; r++) {
        const gcd_st_file *f = r < set->world ? &set->rank[r] : (set->has_ref ? &set->ref : NULL);
        const gcd_st_tensor *t = f ? gcd_st_find(f, name) : NULL;
        s->got[r] = t != NULL;
        if (!t) continue;
        s->reading = f->path;
        const unsigned char *b = gcd_st_bytes(f, t, 0, (size_t)s->w, s->err, s->len);
        if (!b) return 2;
        double *x = s->raw + (size_t)r * (size_t)s->w, n;
        memcpy(x, b, (size_t)s->w * sizeof *x);
        if (check_row(f, name, x, s->k, &n, s->err, s->len)) return 2;
        if (first < 0) { first = r, *total = n; continue; }
        if (!same_full_shape(x, s->raw + (size_t)first * (size_t)s->w))
            return fail(s->err, s->len, "tensor '%.80s': its shape in %s differs from its shape in %s", name, f->path,
                        first < set->world ? set->rank[first].path : set->ref.path);
    }
    return 0;
}

// the ranks' pieces of a sharded parameter: side by side, no overlap (every rank with one: they tile it);
// their sketches summed into sg
static int add_pieces(sk_scan *s, const char *name, double total) {
    int W = s->set->world, all = 1;
    double held = 0;
    memset(s->sg, 0, (size_t)s->k * sizeof *s->sg);
    for (int r = 0; r < W; r++) {
        if (!s->got[r]) { all = 0; continue; }
        const double *x = s->raw + (size_t)r * (size_t)s->w;
        for (int q = 0; q < r; q++) {
            const double *y = s->raw + (size_t)q * (size_t)s->w;
            if (s->got[q] && x[GCD_SK_NUMEL] > 0 && y[GCD_SK_NUMEL] > 0 && x[GCD_SK_START] < y[GCD_SK_START] + y[GCD_SK_NUMEL] &&
                y[GCD_SK_START] < x[GCD_SK_START] + x[GCD_SK_NUMEL])
                return fail(s->err, s->len, "tensor '%.80s': the pieces of rank %d (%s) and rank %d overlap: sketch dumps of a sharded parameter are read "
                                            "when each rank holds its own piece (FSDP; not HSDP replicas)", name, r, s->set->rank[r].path, q);
        }
        held += x[GCD_SK_NUMEL];
        for (int j = 0; j < s->k; j++) s->sg[j] += x[GCD_SK_COLS + j];
    }
    if (all && held != total)
        return fail(s->err, s->len, "tensor '%.80s': the ranks' pieces hold %.0f of its %.0f elements: sketch dumps of every rank must cover it",
                    name, held, total);
    return 0;
}

// the rank rows in the guard's form (guard/guard.h): present, non-finite, first, norm, ran, sharded, sketch
static void guard_rows(sk_scan *s, int ran, int sharded) {
    int gw = GCD_GUARD_COLS + s->k;
    for (int r = 0; r < s->set->world; r++) {
        double *g = s->grow + (size_t)r * (size_t)gw;
        const double *x = s->raw + (size_t)r * (size_t)s->w;
        s->rows[r] = s->got[r] ? g : NULL;
        if (!s->got[r]) continue;
        g[GCD_GUARD_NAME] = 0, g[GCD_GUARD_PRESENT] = 1, g[GCD_GUARD_NONFINITE] = x[GCD_SK_NONFINITE];
        g[GCD_GUARD_FIRST_NONFINITE] = x[GCD_SK_NONFINITE] > 0 ? x[GCD_SK_FIRST_NONFINITE] : -1;
        g[GCD_GUARD_NORM] = x[GCD_SK_NORM], g[GCD_GUARD_RAN] = ran, g[GCD_GUARD_SHARDED] = sharded;
        memcpy(g + GCD_GUARD_COLS, x + GCD_SK_COLS, (size_t)s->k * sizeof *g);
    }
}

// parameter j: its rows read, the ranks' figures by the guard's rules, the reference's sums from the sketches,
// then the classifier's decision
static int judge_param(const gcd_check_opts *o, sk_scan *s, int j, gcd_param_result *p) {
    const gcd_check_set *set = s->set;
    int W = set->world, k = s->k, rc, any = -1, sharded = 0;
    double total = 0, t = set->ptol[j];
    p->name = set->params[j];
    p->ran = set->nran && in_sorted(set->ran, set->nran, p->name);
    p->ndim = -1, p->dtype = "-";
    if ((rc = read_rows(s, p->name, &total))) return rc;
    for (int r = 0; r <= W; r++) {
        const double *x = s->raw + (size_t)r * (size_t)s->w;
        if (!s->got[r]) continue;
        t = fmax(t, dtype_tols[(int)x[GCD_SK_DTYPE]]);
        if (any < 0 || (r < W && dtype_tols[(int)x[GCD_SK_DTYPE]] > dtype_tols[(int)s->raw[(size_t)any * (size_t)s->w + GCD_SK_DTYPE]])) any = r;
        if (r < W) sharded |= x[GCD_SK_NUMEL] < total;
        else if (x[GCD_SK_NUMEL] < total)
            return fail(s->err, s->len, "%s: the reference holds a piece of '%.80s' (a sharded run's dump): the reference must hold each whole gradient "
                                        "(a single process, or a rank of a run that does not shard)", set->ref.path, p->name);
    }
    p->tol = o->tol > 0 ? o->tol : t;
    p->tol_source = o->tol > 0 ? GCD_TOL_GIVEN : GCD_TOL_CLAIMED;
    if (any >= 0) {
        const double *x = s->raw + (size_t)any * (size_t)s->w;
        p->ndim = (int)x[GCD_SK_NDIM], p->n = (size_t)total, p->dtype = dtype_names[(int)x[GCD_SK_DTYPE]];
        for (int d = 0; d < p->ndim; d++) p->shape[d] = (int)x[GCD_SK_DIM0 + d];
    }
    gcd_sums sums;
    gcd_sums_init(&sums, set->has_ref);
    guard_rows(s, p->ran, sharded);
    gcd_guard_fill(p, &sums, s->rows, W, k, sharded);
    p->ref_none = set->has_ref && !s->got[W];
    if (sharded && (rc = add_pieces(s, p->name, total))) return rc;
    if (!sharded && p->first >= 0) memcpy(s->sg, s->raw + (size_t)p->first * (size_t)s->w + GCD_SK_COLS, (size_t)k * sizeof *s->sg);
    if (set->has_ref) {
        const double *xr = s->got[W] ? s->raw + (size_t)W * (size_t)s->w : NULL;
        double nr = !xr ? 0 : xr[GCD_SK_NONFINITE] > 0 ? NAN : xr[GCD_SK_NORM];
        if (p->nhave && !sums.nonfinite) gcd_sketch_ref_sums(&sums, s->sg, sqrt(sums.gg), xr ? xr + GCD_SK_COLS : NULL, nr, k);
        else sums.rr = nr * nr;
    }
    gcd_classify_sums(p, &sums, W, p->tol);
    if (set->has_ref && s->got[W] && isfinite(p->cosine)) {   // the cosine the sketches show (gr = a ||r||^2 with exact norms can pass 1)
        const double *sr = s->raw + (size_t)W * (size_t)s->w + GCD_SK_COLS;
        double gg = 0, rr = 0, gr = 0;
        for (int i = 0; i < k; i++) gg += s->sg[i] * s->sg[i], rr += sr[i] * sr[i], gr += s->sg[i] * sr[i];
        p->cosine = gg > 0 && rr > 0 ? gr / sqrt(gg * rr) : p->cosine;
    }
    return 0;
}

static int unchanged(const gcd_check_set *set, char *err, size_t len) {
    for (int k = 0; k < set->world; k++)
        if (gcd_st_unchanged(&set->rank[k], err, len)) return 2;
    return set->has_ref && gcd_st_unchanged(&set->ref, err, len) ? 2 : 0;
}

int gcd_check_sketch_scan(const gcd_check_opts *o, gcd_check_set *set, gcd_run_result *res, char *err, size_t len) {
    int W = set->world, NF = nfiles(set), rc = 0, pooled = 0;
    gcd_result_start(o, set, res);
    sk_scan s = { .set = set, .k = set->sketch_k, .w = GCD_SK_COLS + set->sketch_k, .err = err, .len = len };
    s.raw = gcd_malloc((size_t)(W + 1) * (size_t)s.w * sizeof *s.raw), s.got = gcd_malloc((size_t)W + 1);
    s.grow = gcd_malloc((size_t)W * (size_t)(GCD_GUARD_COLS + s.k) * sizeof *s.grow);
    s.rows = gcd_malloc((size_t)W * sizeof *s.rows), s.sg = gcd_malloc((size_t)s.k * sizeof *s.sg);
    unsigned char *inl = gcd_malloc((size_t)NF);   // all 0: the pool hashes every file whole (they are KB)
    for (int k = 0; k < NF; k++) pooled += file_of(set, k) != NULL;
    gcd_hash_pool *pool = gcd_hash_pool_start(set, inl, o->no_hash ? 0 : pooled);
    sigjmp_buf jb;
    gcd_st_guard_install();
    gcd_st_jmp = &jb;
    if (sigsetjmp(jb, 1)) {
        rc = fail(err, len, "%s: changed while being read (truncated: SIGBUS on its mapped data); dump it again", (const char *)s.reading);
        goto done;
    }
    for (int j = 0; j < set->nparams; j++) {
        if (ignored(o, set->params[j])) continue;
        if ((rc = judge_param(o, &s, j, &res->param[res->nparam++]))) goto done;
    }
    for (int k = 0; k < NF; k++)
        for (int i = 0; file_of(set, k) && i < file_of(set, k)->ntensor; i++) set->bytes += file_of(set, k)->tensor[i].end - file_of(set, k)->tensor[i].begin;
done:
    gcd_st_jmp = NULL;
    if (gcd_hash_pool_join(pool, rc ? NULL : err, len) && !rc) rc = 2;
    if (!rc) rc = unchanged(set, err, len);
    free(inl), free(s.raw), free(s.got), free(s.grow), free(s.rows), free(s.sg);
    if (!rc) gcd_verdict(res);
    return rc;
}
