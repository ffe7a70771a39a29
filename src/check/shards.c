// gradcheck.shards, the FSDP maps: each file's read and checked, then every sharded parameter's pieces
// across the files checked to tile it.
#include <math.h>

#include <cjson/cJSON.h>
#include "check/internal.h"

static int by_shard(const void *a, const void *b) { return strcmp(((const struct shard *)a)->name, ((const struct shard *)b)->name); }

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
        int bad = !cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > GCD_ST_MAX_DIM || !cJSON_IsNumber(st) || !(st->valuedouble >= 0) ||
                  st->valuedouble > 9007199254740992.0 || st->valuedouble != floor(st->valuedouble);
        x->numel = 1;
        const cJSON *dims = bad ? NULL : sh;
        cJSON_ArrayForEach(d, dims) {
            if (!cJSON_IsNumber(d) || !(d->valuedouble >= 0) || d->valuedouble > 2147483647.0 || d->valuedouble != floor(d->valuedouble) ||
                __builtin_mul_overflow(x->numel, (uint64_t)d->valuedouble, &x->numel)) { bad = 1; break; }
            x->shape[x->ndim++] = (int)d->valuedouble;
        }
        if (bad) { rc = fail(err, len, "%s: gradcheck.shards['%.80s'] is not {\"shape\": [whole dims], \"start\": whole number}", f->path, e->string); break; }
        x->start = (uint64_t)st->valuedouble;
        const gcd_st_tensor *t = gcd_st_find(f, x->name);
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

