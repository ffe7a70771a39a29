#define _GNU_SOURCE   // sched_getaffinity, CPU_COUNT
#include "check/check.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY   // XXH3_state_t in place
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>   // XXH3_128bits_update: AVX2 or AVX-512 where the CPU has it (chosen at run time)
#endif
#include "diagnose/verdict.h"

#define CHUNK 4096   // elements per rank converted to float64 at a time: three such buffers stay in L2

static int fail(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return 2;
}

// ----------------------------------------------------------------------------
// the files: directories expanded, every dump opened and validated

static int ends_with(const char *s, const char *tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && !strcmp(s + a - b, tail);
}

static int by_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// one of the references (--ref), by device and inode
static int is_ref(const struct stat *ref_st, const int *have_ref, const struct stat *fs) {
    for (int r = 0; r < 2; r++)
        if (have_ref[r] && fs->st_dev == ref_st[r].st_dev && fs->st_ino == ref_st[r].st_ino) return 1;
    return 0;
}

// every dump path, directories expanded (sorted), the references left out
static int expand(const gcd_check_opts *o, char ***out, int *n, char *err, size_t len) {
    struct stat ref_st[2];
    int have_ref[2];
    for (int r = 0; r < 2; r++) have_ref[r] = r < o->nref && stat(o->ref[r], &ref_st[r]) == 0;
    int cap = 16;
    char **paths = gcd_malloc((size_t)cap * sizeof *paths);
    *n = 0;
    for (int i = 0; i < o->ndumps; i++) {
        struct stat st;
        if (stat(o->dumps[i], &st)) return *out = paths, fail(err, len, "%s: %s", o->dumps[i], strerror(errno));
        int first = *n;
        if (S_ISDIR(st.st_mode)) {
            DIR *d = opendir(o->dumps[i]);
            if (!d) return *out = paths, fail(err, len, "%s: %s", o->dumps[i], strerror(errno));
            struct dirent *e;
            while ((e = readdir(d))) {
                if (!ends_with(e->d_name, ".safetensors") || e->d_name[0] == '.') continue;
                char *p = gcd_malloc(strlen(o->dumps[i]) + strlen(e->d_name) + 2);
                sprintf(p, "%s/%s", o->dumps[i], e->d_name);
                struct stat fs;
                if (stat(p, &fs) == 0 && is_ref(ref_st, have_ref, &fs)) { free(p); continue; }
                if (*n == cap) {
                    paths = realloc(paths, (size_t)(cap *= 2) * sizeof *paths);
                    mallocCheck(paths);
                }
                paths[(*n)++] = p;
            }
            closedir(d);
            qsort(paths + first, (size_t)(*n - first), sizeof *paths, by_str);
            if (*n == first) return *out = paths, fail(err, len, "%s: no *.safetensors file in this directory", o->dumps[i]);
        } else {
            if (*n == cap) {
                paths = realloc(paths, (size_t)(cap *= 2) * sizeof *paths);
                mallocCheck(paths);
            }
            paths[(*n)++] = gcd_strdup(o->dumps[i]);
        }
    }
    *out = paths;
    return 0;
}

static int meta_int(const gcd_st_file *f, const char *key, long lo, long hi, long *out, char *err, size_t len) {
    const char *v = gcd_st_meta(f, key);
    if (!v) return fail(err, len, "%s: no %s in its metadata: not a gradcheck dump (write it with gradcheck_dist.dump_grads)", f->path, key);
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) return fail(err, len, "%s: metadata %s is '%.40s', expected a whole number from %ld to %ld", f->path, key, v, lo, hi);
    *out = x;
    return 0;
}

static void free_strs(char **s, int n) {
    for (int i = 0; i < n; i++) free(s[i]);
    free(s);
}

// a sorted copy of list (the strings are shared), for in_sorted
static char **sorted_copy(char *const *list, int n) {
    char **s = gcd_malloc((size_t)(n ? n : 1) * sizeof *s);
    memcpy(s, list, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, by_str);
    return s;
}

static int in_sorted(char *const *sorted, int n, const char *s) { return bsearch(&s, sorted, (size_t)n, sizeof *sorted, by_str) != NULL; }

// the first name of a (in a's order) that b lacks, or NULL
static const char *first_missing(char *const *a, int na, char *const *b, int nb) {
    char **sb = sorted_copy(b, nb);
    const char *miss = NULL;
    for (int i = 0; !miss && i < na; i++)
        if (!in_sorted(sb, nb, a[i])) miss = a[i];
    free(sb);
    return miss;
}

// ----------------------------------------------------------------------------
// original names: the wrappers' prefixes removed (FSDP, activation checkpointing, DDP, torch.compile)

static void strip_wrappers(char *name) {
    static const char *const seg[] = { "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod." };
    if (!strncmp(name, "module.", 7)) memmove(name, name + 7, strlen(name + 7) + 1);   // DDP's, at the start only
    for (char *at = name; *at;) {   // the others at any dotted level
        int cut = 0;
        for (size_t i = 0; i < sizeof seg / sizeof seg[0] && !cut; i++) {
            size_t k = strlen(seg[i]);
            if ((at == name || at[-1] == '.') && !strncmp(at, seg[i], k)) memmove(at, at + k, strlen(at + k) + 1), cut = 1;
        }
        if (!cut) at++;
    }
}

static int rename_file(gcd_st_file *f, char *err, size_t len) {
    const char *dup = gcd_st_rename(f, strip_wrappers);
    if (dup) return fail(err, len, "%s: two tensors are both '%.80s' once wrapper prefixes (_fsdp_wrapped_module., module., ...) are removed", f->path, dup);
    return 0;
}

// gradcheck.shards: {"name": {"shape": [full dims], "start": flat offset}}: this file's tensor of that
// name holds the contiguous run of the parameter's row-major elements from start (FSDP)
struct gcd_shard_map {
    int n;
    struct shard { char *name; uint64_t start, numel; int ndim; int shape[GCD_ST_MAX_DIM]; } *e;   // (n) by name
};

static int by_shard(const void *a, const void *b) { return strcmp(((const struct shard *)a)->name, ((const struct shard *)b)->name); }

static const struct shard *shard_of(const gcd_shard_map *m, const char *name) {
    struct shard key = { .name = (char *)name };
    return m && m->n ? bsearch(&key, m->e, (size_t)m->n, sizeof *m->e, by_shard) : NULL;
}

static void shard_map_free(gcd_shard_map *m) {
    for (int i = 0; m && i < m->n; i++) free(m->e[i].name);
    if (m) free(m->e), m->e = NULL, m->n = 0;
}

static int load_shards(const gcd_st_file *f, gcd_shard_map *m, char *err, size_t len) {
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
        strip_wrappers(x->name);
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

// Every dump stays mapped for the scan: more files than the kernel maps at once (vm.max_map_count, less
// room for the program's own mappings) ended in "out of memory: N bytes", exit 3. The user's input: exit 2.
static int too_many_files(int n, char *err, size_t len) {
    long maps = 65530;   // Linux's default, when /proc says nothing
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f) {
        if (fscanf(f, "%ld", &maps) != 1) maps = 65530;
        fclose(f);
    }
    long room = maps - 8192;
    if (n <= room) return 0;
    return fail(err, len, "%d dump files, more than this system can map at once (vm.max_map_count %ld, less 8192 for the program): "
                          "check at most %ld files at a time", n, maps, room > 0 ? room : 0);
}

// gcd.params as a list of unique strings
static int meta_params(const gcd_st_file *f, char ***out, int *n, char *err, size_t len) {
    *out = NULL, *n = 0;
    const char *v = gcd_st_meta(f, "gradcheck.params");
    if (!v) return fail(err, len, "%s: no gradcheck.params in its metadata: not a gradcheck dump (write it with gradcheck_dist.dump_grads)", f->path);
    cJSON *a = cJSON_Parse(v);
    int rc = 0;
    if (!cJSON_IsArray(a)) rc = fail(err, len, "%s: metadata gradcheck.params is not a JSON array of parameter names", f->path);
    *n = rc ? 0 : cJSON_GetArraySize(a);
    *out = gcd_malloc((size_t)(*n ? *n : 1) * sizeof **out);
    int i = 0;
    const cJSON *s;
    cJSON *list = rc ? NULL : a;
    cJSON_ArrayForEach(s, list) {   // not cJSON_GetArrayItem(a, i): that walks the list from the head each time
        if (!cJSON_IsString(s)) { rc = fail(err, len, "%s: metadata gradcheck.params[%d] is not a string", f->path, i); break; }
        (*out)[i++] = gcd_strdup(s->valuestring);
        strip_wrappers((*out)[i - 1]);
    }
    cJSON_Delete(a);
    if (rc) {
        free_strs(*out, i);
        *out = NULL, *n = 0;
        return rc;
    }
    char **sorted = sorted_copy(*out, *n);
    for (int i = 1; i < *n && !rc; i++)
        if (!strcmp(sorted[i], sorted[i - 1])) rc = fail(err, len, "%s: gradcheck.params names '%.80s' twice", f->path, sorted[i]);
    free(sorted);
    return rc;
}

static int ignored(const gcd_check_opts *o, const char *name) {
    for (int i = 0; i < o->nignore; i++)
        if (!fnmatch(o->ignore[i], name, 0)) return 1;
    return 0;
}

static double dtype_tol(gcd_dtype d) { return d == GCD_DT_F64 ? GCD_TOL : d == GCD_DT_F32 ? 1e-5 : 1e-2; }

// gradcheck.precision: the arithmetic the step computed in (autocast computes in bf16 what it stores
// as F32). The five names, and Lightning's trainer.precision spellings. NULL: not one of them.
static const char *precision_name(const char *v, double *tol) {
    static const struct { const char *name, *canon; double tol; } known[] = {
        { "fp64", "fp64", GCD_TOL }, { "64", "fp64", GCD_TOL },       { "64-true", "fp64", GCD_TOL },
        { "fp32", "fp32", 1e-5 },    { "32", "fp32", 1e-5 },          { "32-true", "fp32", 1e-5 },
        { "tf32", "tf32", 1e-2 },    { "bf16", "bf16", 1e-2 },        { "bf16-mixed", "bf16", 1e-2 },
        { "bf16-true", "bf16", 1e-2 }, { "fp16", "fp16", 1e-2 },      { "16", "fp16", 1e-2 },
        { "16-mixed", "fp16", 1e-2 }, { "16-true", "fp16", 1e-2 },
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(v, known[i].name)) return *tol = known[i].tol, known[i].canon;
    return NULL;
}

static char *shape_str(char *buf, size_t len, const gcd_st_tensor *t) {   // "(4,8)": the reader keeps each dim <= INT_MAX
    int shape[GCD_ST_MAX_DIM];
    for (int i = 0; i < t->ndim; i++) shape[i] = (int)t->shape[i];
    return gcd_shape_str(buf, len, t->ndim, shape);
}

static int same_shape(const gcd_st_tensor *a, const gcd_st_tensor *b) {
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]);
}

// rank k's dump, with k == world the reference and with k == world + 1 the second one (NULL where not given)
static const gcd_st_file *file_of(const gcd_check_set *set, int k) {
    if (k < set->world) return &set->rank[k];
    return k == set->world ? (set->has_ref ? &set->ref : NULL) : (set->has_ref2 ? &set->ref2 : NULL);
}

enum { NREF = 2 };   // the file slots after the ranks': the reference and the second reference
static int nfiles(const gcd_check_set *set) { return set->world + NREF; }

// Every file a check reads: the ranks' (reduced) dumps, the references, then the local dumps when both
// stages are given; every_file(set, i) is the i-th of them, NULL for a reference not given
static int all_files(const gcd_check_set *set) { return nfiles(set) + (set->local ? set->world : 0); }
static const gcd_st_file *every_file(const gcd_check_set *set, int i) {
    return i < nfiles(set) ? file_of(set, i) : &set->local[i - nfiles(set)];
}

// the file's own consistency: metadata, and every tensor a listed, readable parameter
static int check_file(const gcd_check_opts *o, const gcd_st_file *f, char **params, int np, char *err, size_t len) {
    const char *fmt = gcd_st_meta(f, "gradcheck.format");
    if (!fmt) return fail(err, len, "%s: no gradcheck.format in its metadata: not a gradcheck dump (write it with gradcheck_dist.dump_grads)", f->path);
    if (strcmp(fmt, "1")) return fail(err, len, "%s: gradcheck.format '%.20s' is not one this gradcheck-dist reads (1): upgrade it", f->path, fmt);
    const char *stage = gcd_st_meta(f, "gradcheck.stage");
    if (!stage || (strcmp(stage, "local") && strcmp(stage, "reduced")))
        return fail(err, len, "%s: metadata gradcheck.stage is '%.20s', expected local or reduced", f->path, stage ? stage : "(missing)");
    char **sorted = sorted_copy(params, np);
    int rc = 0;
    for (int i = 0; !rc && i < f->ntensor; i++) {
        const gcd_st_tensor *t = &f->tensor[i];
        if (!in_sorted(sorted, np, t->name))
            rc = fail(err, len, "%s: tensor '%.80s' is not in gradcheck.params (every gradient must be a listed parameter)", f->path, t->name);
        else if (t->dtype == GCD_DT_OTHER && !ignored(o, t->name))
            rc = fail(err, len, "%s: unsupported dtype %s for tensor '%.80s' (F64, F32, F16 and BF16 are read; --ignore it to leave it out)",
                      f->path, t->dtype_name, t->name);
    }
    free(sorted);
    return rc;
}

// 2 for a file that cannot be read; 3 when a limit of this process stopped it (too many open files)
static int open_failed(const gcd_st_file *f, char *err, size_t len) {
    if (f->open_errno != EMFILE && f->open_errno != ENFILE) return 2;
    size_t n = strlen(err);
    snprintf(err + n, len - n, " (a limit of this process, not bad input: raise `ulimit -n` or check fewer dumps at once)");
    return 3;
}

// the references first: a wrong --ref is named as such, also when it lies among the dumps
static int load_ref(const gcd_check_opts *o, const char *path, gcd_st_file *ref, char ***params, int *np, char *err, size_t len) {
    long world, r0;
    int rc;
    if (gcd_st_open(ref, path, err, len)) return open_failed(ref, err, len);
    if ((rc = rename_file(ref, err, len))) return rc;
    if ((rc = meta_int(ref, "gradcheck.world", 1, 1 << 16, &world, err, len)) || (rc = meta_int(ref, "gradcheck.rank", 0, 0, &r0, err, len)))
        return rc;
    if (world != 1) return fail(err, len, "%s: the reference must be one process (gradcheck.world 1), not %ld", path, world);
    if ((rc = meta_params(ref, params, np, err, len))) return rc;
    return check_file(o, ref, *params, *np, err, len);
}

// The precision the step computed in, as every file records it (gradcheck.precision): one claim for all,
// or none at all. A file that claims another, or claims where the others do not, would loosen or tighten
// the verdict on every tensor of every file: refused, naming both files. With --tol (given) no claim
// is read: they need not agree, and none is the run's.
static int agreed_precision(gcd_check_set *set, int given, double *tol, char *err, size_t len) {
    const gcd_st_file *first = NULL, *bare = NULL;
    const char *canon = NULL;
    int mixed = 0;
    for (int i = 0; i < all_files(set); i++) {
        const gcd_st_file *f = every_file(set, i);
        if (!f) continue;
        const char *v = gcd_st_meta(f, "gradcheck.precision");
        double t;
        const char *c = v ? precision_name(v, &t) : NULL;
        if (v && !c) return fail(err, len, "%s: metadata gradcheck.precision is '%.20s', expected fp64, fp32, tf32, bf16 or fp16", f->path, v);
        if (!v) { bare = bare ? bare : f; continue; }
        if (!first) { first = f, canon = c, *tol = t; continue; }
        if (strcmp(c, canon) && given) mixed = 1;
        else if (strcmp(c, canon))
            return fail(err, len, "%s records gradcheck.precision=%s, but %s records %s: the files of one check must agree on the precision the "
                                  "step computed in (dump every rank and the references alike, or give --tol)", f->path, c, first->path, canon);
    }
    if (first && bare && given) mixed = 1;
    else if (first && bare)
        return fail(err, len, "%s records gradcheck.precision=%s, but %s records none: the files of one check must agree on the precision the "
                              "step computed in (dump every rank and the references alike, or give --tol)", first->path, canon, bare->path);
    set->precision = mixed ? NULL : canon;
    if (mixed) *tol = 0;
    return 0;
}

// gradcheck.ran, .nondeterministic, .batchnorm: JSON lists of strings, as the Python helpers record them
// (absent: not recorded). Every file's, together: ran as a sorted set of names, the others as words.
static int meta_list(const gcd_st_file *f, const char *key, char ***out, int *n, char *err, size_t len) {
    const char *v = gcd_st_meta(f, key);
    if (!v) return 0;
    cJSON *a = cJSON_Parse(v);
    const cJSON *e;
    int rc = cJSON_IsArray(a) ? 0 : fail(err, len, "%s: metadata %s is not a JSON array of strings", f->path, key);
    cJSON *list = rc ? NULL : a;
    if (list) {   // room for this file's strings at once (cJSON_GetArraySize walks the list once)
        *out = realloc(*out, (size_t)(*n + cJSON_GetArraySize(list) + 1) * sizeof **out);
        mallocCheck(*out);
    }
    cJSON_ArrayForEach(e, list) {
        if (!cJSON_IsString(e)) { rc = fail(err, len, "%s: metadata %s holds something other than a string", f->path, key); break; }
        (*out)[(*n)++] = gcd_strdup(e->valuestring);
    }
    cJSON_Delete(a);
    return rc;
}

// the distinct strings of list, sorted; joined with ", " into *words when words is given
static void distinct(char **list, int *n, char **words) {
    if (!*n) return;   // list may be NULL: no qsort(NULL, 0)
    qsort(list, (size_t)*n, sizeof *list, by_str);
    int k = 0;
    for (int i = 0; i < *n; i++) {
        if (k && !strcmp(list[i], list[k - 1])) { free(list[i]); continue; }
        list[k++] = list[i];
    }
    *n = k;
    if (!words || !k) return;
    gcd_sb sb = { 0 };
    for (int i = 0; i < k; i++) gcd_sb_printf(&sb, "%s%s", i ? ", " : "", list[i]);
    *words = sb.s;
}

static int load_recorded(gcd_check_set *set, char *err, size_t len) {
    char **nd = NULL, **bn = NULL;
    int nnd = 0, nbn = 0, rc = 0;
    for (int i = 0; !rc && i < all_files(set); i++) {
        const gcd_st_file *f = every_file(set, i);
        if (!f) continue;
        int before = set->nran;
        if ((rc = meta_list(f, "gradcheck.ran", &set->ran, &set->nran, err, len)) || (rc = meta_list(f, "gradcheck.nondeterministic", &nd, &nnd, err, len)) ||
            (rc = meta_list(f, "gradcheck.batchnorm", &bn, &nbn, err, len)))
            break;
        for (int j = before; j < set->nran; j++) strip_wrappers(set->ran[j]);
    }
    distinct(set->ran, &set->nran, NULL);
    distinct(nd, &nnd, &set->nondeterministic);
    distinct(bn, &nbn, &set->batchnorm);
    free_strs(nd, nnd), free_strs(bn, nbn);
    return rc;
}

// the piece of parameter j that file k holds: [start, start + n) of numel elements; 0 when it has none
static int piece(const gcd_check_set *set, int k, const char *name, uint64_t *start, uint64_t *n, uint64_t *numel, const struct shard **sh) {
    const gcd_st_file *f = file_of(set, k);
    const gcd_st_tensor *t = f ? gcd_st_find(f, name) : NULL;
    *sh = f ? shard_of(&set->shards[k], name) : NULL;
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
static int check_shards(const gcd_check_opts *o, gcd_check_set *set, char *err, size_t len) {
    int W = set->world;
    run_of *runs = gcd_malloc((size_t)(W + 1) * sizeof *runs);
    int rc = 0;
    for (int j = 0; !rc && j < set->nparams; j++) {
        const char *name = set->params[j];
        const struct shard *full = NULL, *sh;
        int fk = -1;
        for (int k = 0; k < nfiles(set); k++) {
            sh = file_of(set, k) ? shard_of(&set->shards[k], name) : NULL;
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

int gcd_check_load(const gcd_check_opts *o, gcd_check_set *set, char *err, size_t len) {
    memset(set, 0, sizeof *set);
    set->ref.fd = set->ref2.fd = -1;
    char **ref_params = NULL, **ref2_params = NULL;
    int nref = 0, nref2 = 0;
    if (o->nref > 0) {
        set->has_ref = 1;
        int rc = load_ref(o, o->ref[0], &set->ref, &ref_params, &nref, err, len);
        if (!rc && o->nref > 1) set->has_ref2 = 1, rc = load_ref(o, o->ref[1], &set->ref2, &ref2_params, &nref2, err, len);
        const char *x;
        struct stat a, b;
        if (!rc && o->nref > 1 && stat(o->ref[0], &a) == 0 && stat(o->ref[1], &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            rc = fail(err, len, "%s: the second reference is the first one: it must be the same step computed in another order (rows "
                                "permuted), whose difference from the first measures each tensor's noise", o->ref[1]);
        else if (!rc && o->nref > 1 && (x = first_missing(ref_params, nref, ref2_params, nref2)))
            rc = fail(err, len, "%s: the second reference's gradcheck.params lacks '%.80s', which %s lists: not the same model", o->ref[1], x, o->ref[0]);
        else if (!rc && o->nref > 1 && (x = first_missing(ref2_params, nref2, ref_params, nref)))
            rc = fail(err, len, "%s: the second reference's gradcheck.params lists '%.80s', which %s does not: not the same model", o->ref[1], x, o->ref[0]);
        free_strs(ref2_params, nref2);
        if (rc) return free_strs(ref_params, nref), rc;
    }
    char **paths = NULL;
    int n = 0, rc = expand(o, &paths, &n, err, len);
    if (!rc) rc = too_many_files(n, err, len);
    gcd_st_file *files = gcd_malloc((size_t)(n ? n : 1) * sizeof *files);
    long *rank = gcd_malloc((size_t)(n ? n : 1) * sizeof *rank), *worlds = gcd_malloc((size_t)(n ? n : 1) * sizeof *worlds);
    char ***plist = gcd_malloc((size_t)(n ? n : 1) * sizeof *plist);
    int *pn = gcd_malloc((size_t)(n ? n : 1) * sizeof *pn);
    char **params = NULL;
    int np = 0;
    for (int i = 0; i < n; i++) files[i].fd = -1;
    for (int i = 0; !rc && i < n; i++) {   // each file on its own
        if (gcd_st_open(&files[i], paths[i], err, len)) rc = open_failed(&files[i], err, len);
        else if (!(rc = rename_file(&files[i], err, len)) && !(rc = meta_int(&files[i], "gradcheck.world", 1, 1 << 16, &worlds[i], err, len)) &&
                 !(rc = meta_int(&files[i], "gradcheck.rank", 0, worlds[i] - 1, &rank[i], err, len)) &&
                 !(rc = meta_params(&files[i], &plist[i], &pn[i], err, len)))
            rc = check_file(o, &files[i], plist[i], pn[i], err, len);
    }
    // Both stages may be given at once (local/ and reduced/ of one step): the reduced dumps are judged,
    // the local ones say which ranks gave no gradient before the all-reduce. f0: the first judged file.
    int f0 = 0, both = 0;
    for (int i = 0; !rc && i < n; i++)
        if (!strcmp(gcd_st_meta(&files[i], "gradcheck.stage"), "reduced")) { f0 = i; break; }
    if (!rc && n) set->world = (int)worlds[f0], set->stage = gcd_st_meta(&files[f0], "gradcheck.stage"), params = plist[f0], np = pn[f0];
    for (int i = 0; !rc && i < n; i++) {
        const char *stage = gcd_st_meta(&files[i], "gradcheck.stage"), *x;
        both |= strcmp(stage, set->stage) != 0;
        if (worlds[i] != set->world)
            rc = fail(err, len, "%s: gradcheck.world is %ld, but %s says %d", paths[i], worlds[i], paths[f0], set->world);
        else if ((x = first_missing(params, np, plist[i], pn[i])))
            rc = fail(err, len, "%s (rank %ld): gradcheck.params lacks '%.80s', which %s lists: not the same model", paths[i], rank[i], x, paths[f0]);
        else if ((x = first_missing(plist[i], pn[i], params, np)))
            rc = fail(err, len, "%s (rank %ld): gradcheck.params lists '%.80s', which %s does not: not the same model", paths[i], rank[i], x, paths[f0]);
    }
    // one file per rank and stage, every rank
    int W = set->world ? set->world : 1;
    set->rank = gcd_malloc((size_t)W * sizeof *set->rank);
    if (both) set->local = gcd_malloc((size_t)W * sizeof *set->local);
    int *owner = gcd_malloc((size_t)W * 2 * sizeof *owner);
    for (int k = 0; k < W; k++) owner[k] = owner[W + k] = -1, set->rank[k].fd = -1;
    for (int k = 0; both && k < W; k++) set->local[k].fd = -1;
    for (int i = 0; !rc && i < n; i++) {
        int *own = owner + (strcmp(gcd_st_meta(&files[i], "gradcheck.stage"), set->stage) ? W : 0);
        if (own[rank[i]] >= 0) rc = fail(err, len, "%s and %s both claim rank %ld", paths[own[rank[i]]], paths[i], rank[i]);
        else own[rank[i]] = i;
    }
    for (int s2 = both; s2 >= 0; s2--)   // the local stage first: a lone file of the other stage is named
        for (int k = 0; !rc && k < set->world; k++) {
            if (owner[s2 * W + k] >= 0) continue;
            int other = owner[(1 - s2) * W + k];
            if (!both) rc = fail(err, len, "world %d, but no dump for rank %d among the %d file%s given (%s%s)", set->world, k, n, n == 1 ? "" : "s",
                                 paths[0], n > 1 ? ", ..." : "");
            else if (other >= 0)
                rc = fail(err, len, "%s: gradcheck.stage is %s, but rank %d has no %s dump, which other ranks have: give every rank's dump of "
                                    "each stage (local and reduced), or one stage alone", paths[other], gcd_st_meta(&files[other], "gradcheck.stage"), k,
                          s2 ? "local" : "reduced");
            else rc = fail(err, len, "world %d, but no %s dump for rank %d among the %d files given (%s, ...)", set->world, s2 ? "local" : "reduced", k, n, paths[0]);
        }
    if (!rc) {
        for (int k = 0; k < set->world; k++) set->rank[k] = files[owner[k]], files[owner[k]].fd = -1, files[owner[k]].path = NULL;
        for (int k = 0; both && k < set->world; k++) set->local[k] = files[owner[W + k]], files[owner[W + k]].fd = -1, files[owner[W + k]].path = NULL;
        if (both) set->stage = gcd_st_meta(&set->rank[0], "gradcheck.stage");   // the string now lives in set->rank
        plist[f0] = NULL;   // kept as params
    } else if (n && params == plist[f0]) plist[f0] = NULL;   // kept as params only where it became them
    for (int i = 0; i < n; i++) {
        if (files[i].path) gcd_st_close(&files[i]);
        if (plist[i]) free_strs(plist[i], pn[i]);
    }
    free(files), free(rank), free(worlds), free(plist), free(pn), free(owner);
    free_strs(paths, n);
    set->params = params, set->nparams = np;
    if (rc) return free_strs(ref_params, nref), rc;

    // the reference and the dumps: the same parameters
    const char *x = NULL;
    if (set->has_ref && (x = first_missing(params, np, ref_params, nref)))
        rc = fail(err, len, "%s: the reference's gradcheck.params lacks '%.80s', which the dumps list", o->ref[0], x);
    else if (set->has_ref && (x = first_missing(ref_params, nref, params, np)))
        rc = fail(err, len, "%s: the reference's gradcheck.params lists '%.80s', which the dumps do not", o->ref[0], x);
    free_strs(ref_params, nref);
    if (rc) return rc;

    // sharded dumps: each file's map, then per sharded parameter one full shape and pieces that tile it
    set->shards = gcd_malloc((size_t)nfiles(set) * sizeof *set->shards);
    int any_shard = 0;
    for (int k = 0; k < nfiles(set); k++) {
        const gcd_st_file *f = file_of(set, k);
        if (f && (rc = load_shards(f, &set->shards[k], err, len))) return rc;
        any_shard |= set->shards[k].n > 0;
    }
    set->sharded = gcd_malloc((size_t)(np ? np : 1));
    if (any_shard && (rc = check_shards(o, set, err, len))) return rc;

    // the precision every file records, and what the dumps say ran in the forward
    double prec_tol = 0;
    if ((rc = agreed_precision(set, o->tol > 0, &prec_tol, err, len)) || (rc = load_recorded(set, err, len))) return rc;

    // per parameter: one shape everywhere, and its own tolerance: the coarsest of its own dtypes and the
    // precision the step computed in (autocast computes in bf16 what it stores as F32). One tensor's
    // dtype never loosens another's.
    set->ptol = gcd_malloc((size_t)(np ? np : 1) * sizeof *set->ptol);
    set->tol_default = 0;
    for (int j = 0; j < np; j++) {
        if (ignored(o, params[j])) continue;
        const gcd_st_tensor *first = NULL;
        int first_rank = -1;
        double t = fmax(GCD_TOL, prec_tol);
        for (int k = 0; k < nfiles(set); k++) {
            const gcd_st_file *f = file_of(set, k);
            const gcd_st_tensor *tk = f ? gcd_st_find(f, params[j]) : NULL;
            if (!tk) continue;
            t = fmax(t, dtype_tol(tk->dtype));
            if (set->sharded[j]) continue;
            if (!first) { first = tk, first_rank = k; continue; }
            if (!same_shape(tk, first)) {
                char a[96], b[96];
                shape_str(a, sizeof a, tk), shape_str(b, sizeof b, first);
                if (k >= set->world)
                    return fail(err, len, "tensor '%.80s': shape %s in the reference %s differs from %s %s %d", params[j], a, f->path, b,
                                first_rank >= set->world ? "in the reference" : "on rank", first_rank >= set->world ? 1 : first_rank);
                return fail(err, len, "tensor '%.80s': shape %s on rank %d (%s) differs from %s on rank %d", params[j], a, k, f->path, b, first_rank);
            }
        }
        set->ptol[j] = t;
        set->tol_default = fmax(set->tol_default, t);
    }
    if (!(set->tol_default > 0)) set->tol_default = fmax(GCD_TOL, prec_tol);
    if (set->precision) snprintf(set->tol_reason, sizeof set->tol_reason, "gradcheck.precision=%s", set->precision);
    set->tol = o->tol > 0 ? o->tol : set->tol_default;
    set->digest = gcd_malloc((size_t)nfiles(set) * sizeof *set->digest);
    if (set->local) {
        set->local_digest = gcd_malloc((size_t)set->world * sizeof *set->local_digest);
        for (int k = 0; k < set->world; k++) set->local_digest[k][0] = 0;
    }
    return 0;
}

void gcd_check_free(gcd_check_set *set) {
    for (int k = 0; set->rank && k < set->world; k++) gcd_st_close(&set->rank[k]);
    for (int k = 0; set->local && k < set->world; k++) gcd_st_close(&set->local[k]);
    free(set->local);
    for (int k = 0; set->shards && k < nfiles(set); k++) shard_map_free(&set->shards[k]);
    free(set->shards), free(set->sharded), free(set->ptol);
    free_strs(set->ran, set->nran), free(set->nondeterministic), free(set->batchnorm);
    if (set->has_ref) gcd_st_close(&set->ref);
    if (set->has_ref2) gcd_st_close(&set->ref2);
    free(set->rank);
    free(set->digest), free(set->local_digest);
    free_strs(set->params, set->nparams);
    memset(set, 0, sizeof *set);
}

// ----------------------------------------------------------------------------
// The XXH3-128 of every file (what `xxh128sum` prints; a sha256 runs at a seventh of memory's speed).
// It names the dumps a report was made from; it is not a signature. A digest is sequential within a file.
// A mapped file whose tensors the scan reads in the order they lie in it is hashed by the scan itself,
// each chunk as it is read (hash_to: while the chunk is in cache, so the file comes from memory once).
// The other files go to a pool of threads, one file at a time each: as many threads as the CPUs this
// process may run on, at most one per file.

typedef struct {
    gcd_check_set *set;
    const unsigned char *inl;   // (world + 1) 1: hashed by the scan, not by the pool
    atomic_int next;       // the next file to take: 0..world, the reference last
    atomic_int failed;     // set with err: the other threads stop before their next file
    pthread_mutex_t mu;    // err's one writer
    char err[512];
} hash_job;

static void hash_failed(hash_job *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void hash_failed(hash_job *h, const char *fmt, ...) {
    pthread_mutex_lock(&h->mu);
    if (!h->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(h->err, sizeof h->err, fmt, ap);
        va_end(ap);
    }
    atomic_store(&h->failed, 1);
    pthread_mutex_unlock(&h->mu);
}


static int hash_threads(int files) {
    cpu_set_t cpus;
    int n = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    return n < files ? (n > 1 ? n : 1) : files;
}

static void *hash_files(void *arg) {
    hash_job *h = arg;
    gcd_check_set *set = h->set;
    size_t cap = 1 << 20;
    unsigned char *buf = gcd_malloc(cap);
    const gcd_st_file *volatile f = NULL;
    sigjmp_buf jb;
    gcd_st_guard_install();
    gcd_st_jmp = &jb;   // this thread's own guard: a mapped file that shrinks while it is hashed
    if (sigsetjmp(jb, 1)) {
        hash_failed(h, "%s: changed while being read (truncated: SIGBUS while hashing it); dump it again", f->path);
        goto out;
    }
    for (int k; !atomic_load(&h->failed) && (k = atomic_fetch_add(&h->next, 1)) < all_files(set);) {
        char *digest = k < nfiles(set) ? set->digest[k] : set->local_digest[k - nfiles(set)];
        f = every_file(set, k);
        if (!f) { digest[0] = 0; continue; }
        if (k < nfiles(set) && h->inl[k]) continue;
        XXH3_state_t s;
        XXH3_128bits_reset(&s);
        // from the mapping, no copy, and out of the resident set again piece by piece (16 MiB: page-aligned;
        // every hashing thread holds at most one piece)
        for (uint64_t at = 0, piece = 16u << 20; f->map && at < f->size; at += piece) {
            size_t n = f->size - at < piece ? (size_t)(f->size - at) : (size_t)piece;
            XXH3_128bits_update(&s, f->map + at, n);
            madvise((void *)(f->map + at), n, MADV_DONTNEED);
        }
        for (uint64_t at = 0; !f->map && at < f->size;) {
            ssize_t got = pread(f->fd, buf, cap, (off_t)at);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) {
                hash_failed(h, "%s: %s while hashing it", f->path, got < 0 ? strerror(errno) : "the file shrank");
                goto out;
            }
            XXH3_128bits_update(&s, buf, (size_t)got);
            at += (uint64_t)got;
        }
        XXH128_hash_t d = XXH3_128bits_digest(&s);
        gcd_xxh128_hex(d.high64, d.low64, digest);
    }
out:
    gcd_st_jmp = NULL;
    free(buf);
    return NULL;
}

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

typedef struct {
    const gcd_check_set *set;
    const gcd_st_tensor **t;   // (world + 2) rank k's tensor or NULL; the references' last
    int local;                 // stage local: g is the DDP mean; reduced: g is the first rank's
    int sharded;               // this parameter: g is the ranks' runs side by side (FSDP), each from start[k]
    uint64_t *start;           // (world)
    int *twin;                 // (world) sharded: the first rank holding the same run (an HSDP replica), or -1
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

static const char *volatile reading;   // the file being read, for the SIGBUS message


static const unsigned char *bytes(scan *s, int k, uint64_t at, size_t m) {
    const gcd_st_file *f = file_of(s->set, k);
    reading = f->path;
    const unsigned char *b = gcd_st_bytes(f, s->t[k], at, m, s->err, s->len);
    if (b) hash_to(s, k, f->data_start + s->t[k]->begin + (at + m) * gcd_dtype_size(s->t[k]->dtype));
    return b;
}

// g (and r) for elements [at, at+m); with p, also each rank's own figures (without p, a reduced
// stage reads the first rank only: g is its gradient)
// g for elements [at, at+m) of a sharded parameter: each rank's run where it overlaps (the rest, of
// ranks without a gradient, zeros); with p each rank's figures over its run
static int chunk_sharded(scan *s, gcd_param_result *p, uint64_t at, size_t m) {
    memset(s->g, 0, m * sizeof *s->g);
    for (int k = 0; k < s->set->world; k++) {
        if (!s->t[k]) continue;
        uint64_t lo = at > s->start[k] ? at : s->start[k], end = s->start[k] + s->t[k]->n, hi = at + m < end ? at + m : end;
        if (lo >= hi) continue;
        const gcd_st_file *f = file_of(s->set, k);
        reading = f->path;
        const unsigned char *b = gcd_st_bytes(f, s->t[k], lo - s->start[k], (size_t)(hi - lo), s->err, s->len);
        if (!b) return 2;
        hash_to(s, k, f->data_start + s->t[k]->begin + (hi - s->start[k]) * gcd_dtype_size(s->t[k]->dtype));
        rank_acc a = { 0 };
        int twin = s->twin[k] >= 0;   // a replica of an earlier rank's run: compared with it, not placed again
        take(twin ? TAKE_DIFF : TAKE_FIRST, s->t[k]->dtype, b, (size_t)(hi - lo), s->g + (lo - at), &a, s->tmp);
        if (!p) continue;
        s->sq[k] += a.sq;
        if (twin) {
            s->dsq[k] += a.d2;
            p->max_diff = p->max_diff > a.mx || a.mx != a.mx ? (a.mx != a.mx ? a.mx : p->max_diff) : a.mx;
            if (a.d2 > 0 || a.d2 != a.d2) p->differs[k] = 1;
        }
        if (a.bad) {
            p->rank_nonfinite[k] += a.bad;
            if (p->rank_first_nonfinite[k] < 0) p->rank_first_nonfinite[k] = (long)(lo + (uint64_t)a.first);
        }
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
        uint64_t a = s->start[k], b = a + s->t[k]->n;
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

static int scan_param(scan *s, gcd_param_result *p) {
    int W = s->set->world, rc;
    s->param = p->name;
    gcd_sums sums;
    const double *r = s->set->has_ref ? s->r : NULL;   // a None reference counts as zeros for the sums
    gcd_sums_init(&sums, s->set->has_ref);
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
    gcd_classify_sums(p, &sums, W, p->tol);
    return 0;
}

int gcd_check_scan(const gcd_check_opts *o, gcd_check_set *set, gcd_run_result *res, char *err, size_t len) {
    int W = set->world;
    memset(res, 0, sizeof *res);
    res->probe = "check";
    res->world = W;
    res->tol = set->tol;
    res->classified = 1;
    res->no_ref = !set->has_ref;
    res->nref = set->has_ref + set->has_ref2;
    res->tol_given = o->tol > 0;
    res->nondeterministic = set->nondeterministic, res->batchnorm = set->batchnorm;
    res->param = gcd_malloc((size_t)(set->nparams ? set->nparams : 1) * sizeof *res->param);
    scan s = { .set = set, .local = !strcmp(set->stage, "local"), .err = err, .len = len };
    int NF = nfiles(set);
    s.t = gcd_malloc((size_t)NF * sizeof *s.t);
    s.g = gcd_malloc(CHUNK * sizeof(double)), s.r = gcd_malloc(CHUNK * sizeof(double)), s.r2 = gcd_malloc(CHUNK * sizeof(double));
    s.tmp = gcd_malloc(CHUNK * sizeof(double));
    s.sq = gcd_malloc((size_t)W * sizeof(double)), s.dsq = gcd_malloc((size_t)W * sizeof(double));
    s.start = gcd_malloc((size_t)W * sizeof *s.start), s.twin = gcd_malloc((size_t)W * sizeof *s.twin), s.held = gcd_malloc((size_t)W * sizeof *s.held);
    s.deadline = o->timeout > 0 ? mono() + o->timeout : 0;

    unsigned char *inl = gcd_malloc((size_t)NF);
    int pooled = 0;
    for (int k = 0; k < NF && !o->no_hash; k++)
        if (file_of(set, k)) pooled += !(inl[k] = (unsigned char)scan_order_is_file_order(o, set, k));
    if (!o->no_hash && set->local) pooled += W;   // the local dumps: read by the scan only for what it needs, hashed whole by the pool
    s.xxh = aligned_alloc(64, (size_t)NF * sizeof *s.xxh), s.hashed = gcd_malloc((size_t)NF * sizeof *s.hashed);   // XXH3's state: 64-byte aligned
    if (!s.xxh) GCD_FATAL("out of memory for %d digests", NF);
    for (int k = 0; k < NF; k++)
        if (inl[k]) XXH3_128bits_reset(&s.xxh[k]);
    s.inl = inl;
    hash_job h = { .set = set, .inl = inl, .mu = PTHREAD_MUTEX_INITIALIZER };
    int nthreads = o->no_hash || !pooled ? 0 : hash_threads(pooled), threaded = 0;
    pthread_t *threads = gcd_malloc((size_t)(nthreads ? nthreads : 1) * sizeof *threads);
    while (threaded < nthreads && pthread_create(&threads[threaded], NULL, hash_files, &h) == 0) threaded++;
    if (!threaded && pooled) hash_files(&h);

    int rc = 0;
    sigjmp_buf jb;
    gcd_st_guard_install();
    gcd_st_jmp = &jb;
    if (sigsetjmp(jb, 1)) {
        rc = fail(err, len, "%s: changed while being read (truncated: SIGBUS on its mapped data); dump it again", (const char *)reading);
        goto done;
    }
    int tty = isatty(2);
    uint64_t total = 0, seen = 0;
    for (int j = 0; j < set->nparams; j++)
        for (int k = 0; k < NF; k++) {
            const gcd_st_file *f = file_of(set, k);
            const gcd_st_tensor *t = f && !ignored(o, set->params[j]) ? gcd_st_find(f, set->params[j]) : NULL;
            total += t ? t->end - t->begin : 0;
        }
    for (int j = 0; j < set->nparams; j++) {
        if (ignored(o, set->params[j])) continue;
        gcd_param_result *p = &res->param[res->nparam++];
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
        for (int k = 0; k < NF; k++) {
            const gcd_st_file *f = file_of(set, k);
            s.t[k] = f ? gcd_st_find(f, p->name) : NULL;
            if (!s.t[k]) continue;
            seen += s.t[k]->end - s.t[k]->begin;
            if (!any || (k < W && dtype_tol(s.t[k]->dtype) > dtype_tol(any->dtype))) any = s.t[k];
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
        p->ref_none = set->has_ref && !s.t[W];
        p->ndim = -1;   // unknown: None on every rank and in the reference
        if (any) {
            p->ndim = any->ndim;
            for (int d = 0; d < any->ndim; d++) p->shape[d] = (int)any->shape[d];
            p->n = any->n;
        }
        p->dtype = any ? gcd_dtype_str(any->dtype) : "-";
        s.sharded = set->sharded[j];
        if (s.sharded) {   // the parameter's own shape, and where each rank's run starts
            const struct shard *full = NULL;
            for (int k = 0; k < NF; k++) {
                const struct shard *sh = file_of(set, k) ? shard_of(&set->shards[k], p->name) : NULL;
                if (k < W) s.start[k] = sh ? sh->start : 0;
                if (sh && !full) full = sh;
            }
            p->ndim = full->ndim, p->n = full->numel;
            for (int d = 0; d < full->ndim; d++) p->shape[d] = full->shape[d];
            // HSDP: replicas of one run are compared with its first holder; the ranks sorted by run, not a
            // pass over the earlier ranks per rank (W^2: seconds per parameter at a few thousand ranks)
            int nheld = 0;
            for (int k = 0; k < W; k++) {
                s.twin[k] = -1;
                if (s.t[k] && s.t[k]->n) s.held[nheld++] = k;
            }
            qsort_r(s.held, (size_t)nheld, sizeof *s.held, by_held, &s);
            for (int i = 1; i < nheld; i++) {
                int q = s.held[i - 1], k = s.held[i];
                if (s.start[q] == s.start[k] && s.t[q]->n == s.t[k]->n) s.twin[k] = s.twin[q] >= 0 ? s.twin[q] : q;
            }
        }
        p->diff_base = p->first;
        if ((rc = scan_param(&s, p))) goto done;
        if (tty && total > (1u << 30)) fprintf(stderr, "\rcheck: %3.0f%% of %.1f GB", 100.0 * (double)seen / (double)total, (double)total / 1e9);
    }
    if (tty && total > (1u << 30)) fprintf(stderr, "\r%40s\r", "");
    set->bytes = total;
    for (int k = 0; k < NF; k++)   // the rest of each file the scan hashed: its last bytes past the last tensor read
        if (inl[k]) {
            hash_to(&s, k, file_of(set, k)->size);
            XXH128_hash_t d = XXH3_128bits_digest(&s.xxh[k]);
            gcd_xxh128_hex(d.high64, d.low64, set->digest[k]);
        }
done:
    gcd_st_jmp = NULL;
    for (int i = 0; i < threaded; i++) pthread_join(threads[i], NULL);
    free(threads);
    if (!rc && h.err[0]) rc = fail(err, len, "%s", h.err);
    for (int k = 0; !rc && k < W; k++)
        if (gcd_st_unchanged(&set->rank[k], err, len)) rc = 2;
    if (!rc && set->has_ref && gcd_st_unchanged(&set->ref, err, len)) rc = 2;
    if (!rc && set->has_ref2 && gcd_st_unchanged(&set->ref2, err, len)) rc = 2;
    for (int k = 0; !rc && set->local && k < W; k++)
        if (gcd_st_unchanged(&set->local[k], err, len)) rc = 2;
    free(s.t), free(s.g), free(s.r), free(s.r2), free(s.tmp), free(s.sq), free(s.dsq), free(s.start), free(s.twin), free(s.held), free(s.xxh), free(s.hashed), free(inl);
    if (!rc) gcd_verdict(res);
    return rc;
}

// ----------------------------------------------------------------------------

#include "gcd_snippet.h"   // gcd_check_snippet, generated by CMake from python/gradcheck_dist/snippet.txt
