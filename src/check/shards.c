// gradcheck.shards, the FSDP maps: each file's read and checked, then every sharded parameter's pieces
// across the files checked to tile it.
#include <math.h>

#include <cjson/cJSON.h>
#include "check/internal.h"

static int by_shard(const void *a, const void *b) { return strcmp(((const struct shard *)a)->name, ((const struct shard *)b)->name); }

static int whole_int(const cJSON *d) {
    return cJSON_IsNumber(d) && d->valuedouble >= 0 && d->valuedouble <= 2147483647.0 && d->valuedouble == floor(d->valuedouble);
}

// the mesh form: offsets and lengths inside the shape, the tensor holding exactly the box, placements
// each replicate, shard or strided_shard (a dimension in range) or partial sum
static int box_load(const gcd_st_file *f, const cJSON *e, struct shard *x, const gcd_st_tensor *t, char *err, size_t len) {
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "offsets"), *ln = cJSON_GetObjectItemCaseSensitive(e, "lengths");
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(e, "placements"), *q;
    if (!cJSON_IsArray(of) || !cJSON_IsArray(ln) || !cJSON_IsArray(pl) || cJSON_GetArraySize(of) != x->ndim || cJSON_GetArraySize(ln) != x->ndim)
        return fail(err, len, "%s: tensor '%.80s': gradcheck.shards needs \"offsets\" and \"lengths\" with one value per dimension of its shape and \"placements\"", f->path, x->name);
    uint64_t n = 1;
    for (int i = 0; i < x->ndim; i++) {
        const cJSON *a = cJSON_GetArrayItem(of, i), *b = cJSON_GetArrayItem(ln, i);
        if (!whole_int(a) || !whole_int(b) || a->valuedouble + b->valuedouble > x->shape[i])
            return fail(err, len, "%s: tensor '%.80s': dimension %d: the piece at %.0f of length %.0f does not fit in %d (gradcheck.shards)", f->path, x->name, i,
                        cJSON_IsNumber(a) ? a->valuedouble : -1.0, cJSON_IsNumber(b) ? b->valuedouble : -1.0, x->shape[i]);
        x->off[i] = (int)a->valuedouble, x->len[i] = (int)b->valuedouble;
        n *= (uint64_t)x->len[i];   // no overflow: each length at most its dimension, whose product did not overflow
    }
    int i = 0;
    cJSON_ArrayForEach(q, pl) {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(q, "kind"), *dm = cJSON_GetObjectItemCaseSensitive(q, "dim"), *op = cJSON_GetObjectItemCaseSensitive(q, "op");
        const char *kind = cJSON_IsString(k) ? k->valuestring : "";
        int sharded = !strcmp(kind, "shard") || !strcmp(kind, "strided_shard");
        if (sharded && (!whole_int(dm) || dm->valuedouble >= x->ndim))
            return fail(err, len, "%s: tensor '%.80s': placement %s names a dimension out of range of its %d (gradcheck.shards)", f->path, x->name, kind, x->ndim);
        if (!strcmp(kind, "partial") && !(op && cJSON_IsString(op) && !strcmp(op->valuestring, "sum")))
            return fail(err, len, "%s: tensor '%.80s': a partial placement other than a sum cannot be assembled (gradcheck.shards)", f->path, x->name);
        if (!sharded && strcmp(kind, "replicate") && strcmp(kind, "partial"))
            return fail(err, len, "%s: tensor '%.80s': placement kind '%.40s' is not shard, strided_shard, replicate or partial (gradcheck.shards)", f->path, x->name, kind);
        if (!strcmp(kind, "partial")) x->partial |= 1 << (i < 30 ? i : 30);
        i++;
    }
    if (t && t->n != n)
        return fail(err, len, "%s: tensor '%.80s' holds %llu elements, its box %llu (gradcheck.shards)", f->path, x->name, (unsigned long long)t->n, (unsigned long long)n);
    uint64_t st = 0;
    for (int i = 0; i < x->ndim; i++) st = st * (uint64_t)x->shape[i] + (uint64_t)x->off[i];
    x->start = n ? st : 0;
    return 0;
}

// ----------------------------------------------------------------------------
// a box's contiguous segments: the last dimension it does not span whole, times the whole ones after it

int gcd_box_segments(const struct shard *x, uint64_t at, uint64_t m, int (*fn)(void *, uint64_t, uint64_t, uint64_t), void *arg) {
    int c = x->ndim - 1;
    uint64_t inner = 1, nseg = 1;
    while (c > 0 && x->len[c] == x->shape[c]) inner *= (uint64_t)x->shape[c--];
    if (x->ndim == 0) return at == 0 && m ? fn(arg, 0, 0, 1) : 0;
    uint64_t L = (uint64_t)x->len[c] * inner, stride[GCD_ST_MAX_DIM];
    stride[x->ndim - 1] = 1;
    for (int i = x->ndim - 2; i >= 0; i--) stride[i] = stride[i + 1] * (uint64_t)x->shape[i + 1];
    for (int i = 0; i < c; i++) nseg *= (uint64_t)x->len[i];
    if (!L) return 0;
    // segment q's flat start, q in mixed radix over the lengths of the dimensions before c
#define SEG_START(q, out) do { uint64_t r_ = (q), s_ = (uint64_t)x->off[c] * stride[c]; \
        for (int i_ = c - 1; i_ >= 0; i_--) { s_ += ((uint64_t)x->off[i_] + r_ % (uint64_t)x->len[i_]) * stride[i_]; r_ /= (uint64_t)x->len[i_]; } \
        (out) = s_; } while (0)
    uint64_t lo = 0, hi = nseg;   // the first segment ending past at
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2, s0;
        SEG_START(mid, s0);
        if (s0 + L <= at) lo = mid + 1; else hi = mid;
    }
    for (uint64_t q = lo; q < nseg; q++) {
        uint64_t s0;
        SEG_START(q, s0);
        if (s0 >= at + m) break;
        uint64_t a = s0 > at ? s0 : at, b = s0 + L < at + m ? s0 + L : at + m;
        int rc = fn(arg, q * L + (a - s0), a, b - a);
        if (rc) return rc;
    }
#undef SEG_START
    return 0;
}

const struct shard *gcd_shard_of(const gcd_shard_map *m, const char *name) {
    struct shard key = { .name = (char *)name };
    return m && m->n ? bsearch(&key, m->e, (size_t)m->n, sizeof *m->e, by_shard) : NULL;
}

void gcd_shards_free(gcd_shard_map *m) {
    for (int i = 0; m && i < m->n; i++) free(m->e[i].name);
    if (m) free(m->e), m->e = NULL, m->n = 0;
}

int gcd_shards_load(const gcd_st_file *f, gcd_shard_map *m, char *err, size_t len) {
    const char *v = gcd_st_meta(f, "gradcheck.shards");
    memset(m, 0, sizeof *m);
    if (!v) return 0;
    cJSON *doc = cJSON_Parse(v);
    int rc = 0;
    if (!cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        return fail(err, len, "%s: metadata gradcheck.shards is not a JSON object {name: {\"shape\": [...], \"start\": N}}", f->path);
    }
    m->e = gcd_malloc((size_t)(cJSON_GetArraySize(doc) + 1) * sizeof *m->e);
    const cJSON *e;
    cJSON_ArrayForEach(e, doc) {
        struct shard *x = &m->e[m->n++];
        x->name = gcd_strdup(e->string);
        gcd_strip_wrappers(x->name);
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape"), *st = cJSON_GetObjectItemCaseSensitive(e, "start"), *d;
        x->box = !st && cJSON_GetObjectItemCaseSensitive(e, "offsets") != NULL;
        int bad = !cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > GCD_ST_MAX_DIM ||
                  (!x->box && (!cJSON_IsNumber(st) || !(st->valuedouble >= 0) || st->valuedouble > 9007199254740992.0 || st->valuedouble != floor(st->valuedouble)));
        x->numel = 1;
        const cJSON *dims = bad ? NULL : sh;
        cJSON_ArrayForEach(d, dims) {
            if (!whole_int(d) || __builtin_mul_overflow(x->numel, (uint64_t)d->valuedouble, &x->numel)) { bad = 1; break; }
            x->shape[x->ndim++] = (int)d->valuedouble;
        }
        if (bad) { rc = fail(err, len, "%s: gradcheck.shards['%.80s'] is not {\"shape\": [whole dims], \"start\": whole number}", f->path, e->string); break; }
        const gcd_st_tensor *t = gcd_st_find(f, x->name);
        if (x->box) {
            if ((rc = box_load(f, e, x, t, err, len))) break;
            continue;
        }
        x->start = (uint64_t)st->valuedouble;
        if (t && (x->start > x->numel || t->n > x->numel - x->start)) {
            rc = fail(err, len, "%s: tensor '%.80s': its %llu elements from start %llu run past the parameter's %llu (gradcheck.shards)", f->path, x->name,
                      (unsigned long long)t->n, (unsigned long long)x->start, (unsigned long long)x->numel);
            break;
        }
    }
    cJSON_Delete(doc);
    qsort(m->e, (size_t)m->n, sizeof *m->e, by_shard);
    for (int i = 1; !rc && i < m->n; i++)
        if (!strcmp(m->e[i].name, m->e[i - 1].name)) rc = fail(err, len, "%s: gradcheck.shards names '%.80s' twice", f->path, m->e[i].name);
    return rc;
}


// the piece of parameter j that file k holds: [start, start + n) of numel elements; 0 when it has none
static int piece(const gcd_check_set *set, int k, const char *name, uint64_t *start, uint64_t *n, uint64_t *numel, const struct shard **sh) {
    const gcd_st_file *f = file_of(set, k);
    const gcd_st_tensor *t = f ? gcd_st_find(f, name) : NULL;
    *sh = f ? gcd_shard_of(&set->shards[k], name) : NULL;
    if (!t) return 0;
    *start = *sh ? (*sh)->start : 0, *n = t->n, *numel = *sh ? (*sh)->numel : t->n;
    return 1;
}

typedef struct { uint64_t a, b; int k; } run_of;
static int by_run(const void *x, const void *y) {
    const run_of *a = x, *b = y;
    return a->a < b->a ? -1 : a->a > b->a ? 1 : a->k - b->k;
}

static int same_box(const struct shard *a, const struct shard *b) {
    return !memcmp(a->off, b->off, (size_t)a->ndim * sizeof a->off[0]) && !memcmp(a->len, b->len, (size_t)a->ndim * sizeof a->len[0]);
}

static int boxes_meet(const struct shard *a, const struct shard *b) {
    for (int i = 0; i < a->ndim; i++)
        if (a->off[i] >= b->off[i] + b->len[i] || b->off[i] >= a->off[i] + a->len[i] || !a->len[i] || !b->len[i]) return 0;
    return 1;
}

// the mesh form: the ranks' boxes, copies aside, neither overlap nor (when every rank holds one) leave
// elements out; a map claims nothing the files do not hold
static int boxes_tile(const gcd_check_set *set, const char *name, const struct shard *full, char *err, size_t len) {
    int W = set->world, nb = 0, whole = 0;
    const struct shard **b = gcd_malloc((size_t)(W + 1) * sizeof *b);
    int *who = gcd_malloc((size_t)(W + 1) * sizeof *who), rc = 0;
    uint64_t sum = 0, longest = 0;
    for (int k = 0; !rc && k < nfiles(set); k++) {
        const gcd_st_file *f = file_of(set, k);
        const struct shard *sh = f ? gcd_shard_of(&set->shards[k], name) : NULL;
        if (!f || !gcd_st_find(f, name)) continue;
        if (k >= W) { whole = 1; continue; }
        if (!sh || !sh->box) { rc = fail(err, len, "tensor '%.80s': rank %d holds it without a box (gradcheck.shards), other ranks with one", name, k); break; }
        int dup = 0;
        for (int i = 0; i < nb && !dup; i++) dup = same_box(b[i], sh);
        if (dup) continue;
        for (int i = 0; i < nb && !rc; i++)
            if (boxes_meet(b[i], sh)) rc = fail(err, len, "tensor '%.80s': rank %d's piece overlaps rank %d's (gradcheck.shards): an unreadable layout", name, k, who[i]);
        uint64_t v = 1;
        for (int i = 0; i < sh->ndim; i++) v *= (uint64_t)sh->len[i];
        sum += v, longest = v > longest ? v : longest;
        who[nb] = k, b[nb++] = sh;
    }
    int held = 0;
    for (int k = 0; k < W; k++) held += gcd_st_find(&set->rank[k], name) != NULL;
    if (!rc && held == W && sum != full->numel)
        rc = fail(err, len, "tensor '%.80s': the ranks' pieces hold %llu of its %llu elements: some are in no rank's piece (gradcheck.shards): an unreadable layout", name,
                  (unsigned long long)sum, (unsigned long long)full->numel);
    uint64_t bound;
    if (!rc && !whole && (__builtin_mul_overflow(longest, (uint64_t)(W - held), &bound) || __builtin_add_overflow(bound, sum, &bound) || full->numel > bound))
        rc = fail(err, len, "tensor '%.80s': gradcheck.shards claims %llu elements, more than the ranks' pieces could hold: a map may claim nothing the files hold",
                  name, (unsigned long long)full->numel);
    free(b), free(who);
    return rc;
}

// Every sharded parameter: one full shape in every map, the reference whole, and the ranks' runs
// neither overlapping nor (when every rank has its run) leaving a gap. A layout that breaks this is
// not readable: exit 2, named.
int gcd_shards_check(const gcd_check_opts *o, gcd_check_set *set, char *err, size_t len) {
    int W = set->world;
    run_of *runs = gcd_malloc((size_t)(W + 1) * sizeof *runs);
    int rc = 0;
    for (int j = 0; !rc && j < set->nparams; j++) {
        const char *name = set->params[j];
        const struct shard *full = NULL, *sh;
        int fk = -1;
        for (int k = 0; k < nfiles(set); k++) {
            sh = file_of(set, k) ? gcd_shard_of(&set->shards[k], name) : NULL;
            if (sh && !full) full = sh, fk = k;
        }
        if (!full || ignored(o, name)) continue;
        set->sharded[j] = 1;
        if (full->box && !strcmp(set->stage, "reduced")) {
            int same = 1;
            for (int k = 0; k < nfiles(set); k++) {
                sh = file_of(set, k) ? gcd_shard_of(&set->shards[k], name) : NULL;
                if (sh) same &= sh->ndim == full->ndim && !memcmp(sh->shape, full->shape, (size_t)full->ndim * sizeof full->shape[0]);
            }
            rc = same ? boxes_tile(set, name, full, err, len) : fail(err, len, "tensor '%.80s': the files give it different full shapes (gradcheck.shards)", name);
            continue;
        }
        if (!strcmp(set->stage, "local")) { rc = fail(err, len, "tensor '%.80s': sharded (gradcheck.shards) in local dumps: dump the sharded gradients after the reduce-scatter (stage reduced)", name); break; }
        int nr = 0, whole = 0;
        for (int k = 0; !rc && k < nfiles(set); k++) {
            uint64_t st, n, numel;
            if (!piece(set, k, name, &st, &n, &numel, &sh)) continue;
            int same = sh ? sh->ndim == full->ndim && !memcmp(sh->shape, full->shape, (size_t)full->ndim * sizeof full->shape[0]) : numel == full->numel;
            if (!same) {
                rc = fail(err, len, "tensor '%.80s': %s (%s) gives it another full shape than %s does (gradcheck.shards)", name, k >= W ? "the reference" : "a rank",
                          file_of(set, k)->path, file_of(set, fk)->path);
                break;
            }
            if (k >= W) {
                whole = 1;
                if (st != 0 || n != numel) rc = fail(err, len, "tensor '%.80s': the reference %s holds elements [%llu, %llu) of %llu: it must be whole", name,
                                                     file_of(set, k)->path, (unsigned long long)st, (unsigned long long)(st + n), (unsigned long long)numel);
                continue;
            }
            runs[nr++] = (run_of){ st, st + n, k };
        }
        if (rc) break;
        qsort(runs, (size_t)nr, sizeof *runs, by_run);
        uint64_t at = 0;
        for (int i = 0; !rc && i < nr; i++) {
            if (runs[i].a == runs[i].b) continue;   // an empty run (FSDP pads the last ranks')
            if (i && runs[i].a == runs[i - 1].a && runs[i].b == runs[i - 1].b) continue;   // a replica (HSDP): the same run again
            if (runs[i].a < at) {
                int prev = -1;
                for (int q = i - 1; q >= 0 && prev < 0; q--) prev = runs[q].b > runs[i].a ? runs[q].k : -1;
                rc = fail(err, len, "tensor '%.80s': rank %d's shard [%llu, %llu) overlaps rank %d's (gradcheck.shards): an unreadable layout", name, runs[i].k,
                          (unsigned long long)runs[i].a, (unsigned long long)runs[i].b, prev);
            } else if (runs[i].a > at && nr == W)
                rc = fail(err, len, "tensor '%.80s': elements [%llu, %llu) are in no rank's shard (gradcheck.shards): an unreadable layout", name,
                          (unsigned long long)at, (unsigned long long)runs[i].a);
            at = runs[i].b > at ? runs[i].b : at;
        }
        if (!rc && nr == W && at != full->numel)
            rc = fail(err, len, "tensor '%.80s': elements [%llu, %llu) are in no rank's shard (gradcheck.shards): an unreadable layout", name,
                      (unsigned long long)at, (unsigned long long)full->numel);
        // A map claims nothing the files do not hold: without a whole reference, the parameter is at most
        // the runs the ranks hold plus, for each rank without one, the longest of them. The scan's work is
        // bounded by the bytes read.
        uint64_t sum = 0, longest = 0, bound;
        for (int i = 0; i < nr; i++) {
            uint64_t len_i = runs[i].b - runs[i].a;
            if (!(i && runs[i].a == runs[i - 1].a && runs[i].b == runs[i - 1].b)) sum += len_i;
            longest = len_i > longest ? len_i : longest;
        }
        if (!rc && !whole && (__builtin_mul_overflow(longest, (uint64_t)(W - nr), &bound) || __builtin_add_overflow(bound, sum, &bound) ||
                              full->numel > bound))
            rc = fail(err, len, "tensor '%.80s': gradcheck.shards claims %llu elements, but the %d rank%s holding a run hold %llu and the %d "
                                "without one could hold at most %llu more: a map may claim nothing the files hold",
                      name, (unsigned long long)full->numel, nr, nr == 1 ? "" : "s", (unsigned long long)sum, W - nr,
                      (unsigned long long)(W == nr ? 0 : longest > UINT64_MAX / (uint64_t)(W - nr) ? UINT64_MAX : longest * (uint64_t)(W - nr)));
    }
    free(runs);
    return rc;
}

