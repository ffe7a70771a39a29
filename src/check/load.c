// gcd_check_load: the references and the dumps opened, their stages, ranks and parameter lists agreed,
// the shards assembled, and the plan of the scan (each tensor's tolerance, the recorded lists).
#include <math.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include "check/internal.h"

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
        for (int j = before; j < set->nran; j++) gcd_strip_wrappers(set->ran[j]);
    }
    distinct(set->ran, &set->nran, NULL);
    distinct(nd, &nnd, &set->nondeterministic);
    distinct(bn, &nbn, &set->batchnorm);
    free_strs(nd, nnd), free_strs(bn, nbn);
    return rc;
}

// gradcheck.loss of every rank's judged dump and the reference's gradcheck.shard_losses (check_ddp records both):
// each rank's loss, and what each rank's batch gives alone; either absent anywhere: none (NULL)
static int load_losses(gcd_check_set *set, char *err, size_t len) {
    int W = set->world;
    const char *acc = gcd_st_meta(&set->rank[0], "gradcheck.accumulate");   // check_ddp(accumulate=K), K > 1
    set->accumulate = 1;
    if (acc) {
        char *end = NULL;
        long k = strtol(acc, &end, 10);
        if (end == acc || *end || k < 1 || k > 1 << 20)
            return fail(err, len, "%s: metadata gradcheck.accumulate is '%.40s', not a count of micro-batches (1 to 1048576)", set->rank[0].path, acc);
        set->accumulate = (int)k;
    }
    const char *obj = set->has_ref ? gcd_st_meta(&set->ref, "gradcheck.objective") : NULL;   // check_ddp(reference=fn)
    if (obj && strcmp(obj, "step") && strcmp(obj, "reference"))
        return fail(err, len, "%s: metadata gradcheck.objective is '%.40s', not 'step' or 'reference'", set->ref.path, obj);
    set->ref_objective = obj && !strcmp(obj, "reference");
    const char *sl = set->has_ref ? gcd_st_meta(&set->ref, "gradcheck.shard_losses") : NULL;
    set->rank_loss = gcd_malloc((size_t)W * sizeof(double));
    for (int k = 0; k < W; k++) {
        const char *v = gcd_st_meta(&set->rank[k], "gradcheck.loss");
        char *end = NULL;
        if (!v) { free(set->rank_loss), set->rank_loss = NULL; break; }
        set->rank_loss[k] = strtod(v, &end);
        if (end == v || *end) return fail(err, len, "%s: metadata gradcheck.loss is '%.40s', not a number", set->rank[k].path, v);
        if (!isfinite(set->rank_loss[k])) { free(set->rank_loss), set->rank_loss = NULL; break; }   // a loss that diverged says nothing here
    }
    if (!sl) return 0;
    cJSON *a = cJSON_Parse(sl), *e;
    int rc = cJSON_IsArray(a) && cJSON_GetArraySize(a) == W ? 0 : fail(err, len, "%s: metadata gradcheck.shard_losses is not a list of %d numbers", set->ref.path, W);
    set->shard_loss = rc ? NULL : gcd_malloc((size_t)W * sizeof(double));
    int k = 0;
    cJSON *list = rc ? NULL : a;
    cJSON_ArrayForEach(e, list) {
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble)) { rc = fail(err, len, "%s: metadata gradcheck.shard_losses[%d] is not a finite number", set->ref.path, k); break; }
        set->shard_loss[k++] = e->valuedouble;
    }
    if (rc) free(set->shard_loss), set->shard_loss = NULL;
    cJSON_Delete(a);
    return rc;
}

// ----------------------------------------------------------------------------
// gcd_check_load, step by step

// the dumps given, each opened on its own
typedef struct {
    int n;
    char **paths;         // (n)
    gcd_st_file *files;   // (n) moved into the set once every rank has its file
    long *rank, *world;   // (n) each file's gradcheck.rank and gradcheck.world
    char ***params;       // (n) each file's gradcheck.params, and their counts
    int *nparams;
    int judged;           // the first file of the stage judged (reduced, when both stages are given)
    int two_stages;       // local and reduced dumps of one step given together
    int *owner;           // (2 world) the file of rank k: [k] of the judged stage, [world + k] of the other, or -1
} dump_list;

// the references first: a wrong --ref is named as such, also when it lies among the dumps. The first
// reference's parameters in *ref_params (freed here on an error)
static int open_refs(const gcd_check_opts *o, gcd_check_set *set, char ***ref_params, int *nref, char *err, size_t len) {
    char **ref2_params = NULL;
    int nref2 = 0;
    if (o->nref <= 0) return 0;
    set->has_ref = 1;
    int rc = gcd_ref_open(o, o->ref[0], &set->ref, ref_params, nref, err, len);
    if (!rc && o->nref > 1) set->has_ref2 = 1, rc = gcd_ref_open(o, o->ref[1], &set->ref2, &ref2_params, &nref2, err, len);
    const char *x;
    struct stat a, b;
    if (!rc && o->nref > 1 && stat(o->ref[0], &a) == 0 && stat(o->ref[1], &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        rc = fail(err, len, "%s: the second reference is the first one: it must be the same step computed in another order (rows "
                            "permuted), whose difference from the first measures each tensor's noise", o->ref[1]);
    else if (!rc && o->nref > 1 && (x = gcd_first_missing(*ref_params, *nref, ref2_params, nref2)))
        rc = fail(err, len, "%s: the second reference's gradcheck.params lacks '%.80s', which %s lists: not the same model", o->ref[1], x, o->ref[0]);
    else if (!rc && o->nref > 1 && (x = gcd_first_missing(ref2_params, nref2, *ref_params, *nref)))
        rc = fail(err, len, "%s: the second reference's gradcheck.params lists '%.80s', which %s does not: not the same model", o->ref[1], x, o->ref[0]);
    free_strs(ref2_params, nref2);
    if (rc) free_strs(*ref_params, *nref), *ref_params = NULL, *nref = 0;
    return rc;
}

static int open_dumps(const gcd_check_opts *o, dump_list *d, char *err, size_t len) {
    int rc = gcd_dumps_list(o, &d->paths, &d->n, err, len), n = d->n ? d->n : 1;
    d->files = gcd_malloc((size_t)n * sizeof *d->files);
    d->rank = gcd_malloc((size_t)n * sizeof *d->rank), d->world = gcd_malloc((size_t)n * sizeof *d->world);
    d->params = gcd_malloc((size_t)n * sizeof *d->params);
    d->nparams = gcd_malloc((size_t)n * sizeof *d->nparams);
    for (int i = 0; i < d->n; i++) d->files[i].fd = -1;
    for (int i = 0; !rc && i < d->n; i++)   // each file on its own
        rc = gcd_dump_open(o, d->paths[i], &d->files[i], &d->world[i], &d->rank[i], &d->params[i], &d->nparams[i], err, len);
    return rc;
}

// Both stages may be given at once (local/ and reduced/ of one step): the reduced dumps are judged,
// the local ones say which ranks gave no gradient before the all-reduce. Every file: the same world
// and parameters as the first judged one.
static int agree_dumps(gcd_check_set *set, dump_list *d, char *err, size_t len) {
    for (int i = 0; i < d->n; i++)
        if (!strcmp(gcd_st_meta(&d->files[i], "gradcheck.stage"), "reduced")) { d->judged = i; break; }
    int j = d->judged, rc = 0;
    if (d->n) set->world = (int)d->world[j], set->stage = gcd_st_meta(&d->files[j], "gradcheck.stage"), set->params = d->params[j], set->nparams = d->nparams[j];
    for (int i = 0; !rc && i < d->n; i++) {
        const char *stage = gcd_st_meta(&d->files[i], "gradcheck.stage"), *x;
        d->two_stages |= strcmp(stage, set->stage) != 0;
        if (d->world[i] != set->world)
            rc = fail(err, len, "%s: gradcheck.world is %ld, but %s says %d", d->paths[i], d->world[i], d->paths[j], set->world);
        else if ((x = gcd_first_missing(set->params, set->nparams, d->params[i], d->nparams[i])))
            rc = fail(err, len, "%s (rank %ld): gradcheck.params lacks '%.80s', which %s lists: not the same model", d->paths[i], d->rank[i], x, d->paths[j]);
        else if ((x = gcd_first_missing(d->params[i], d->nparams[i], set->params, set->nparams)))
            rc = fail(err, len, "%s (rank %ld): gradcheck.params lists '%.80s', which %s does not: not the same model", d->paths[i], d->rank[i], x, d->paths[j]);
    }
    return rc;
}

// one file per rank and stage, every rank
static int assign_ranks(gcd_check_set *set, dump_list *d, int rc, char *err, size_t len) {
    int W = set->world ? set->world : 1, n = d->n;
    set->rank = gcd_malloc((size_t)W * sizeof *set->rank);
    if (d->two_stages) set->local = gcd_malloc((size_t)W * sizeof *set->local);
    d->owner = gcd_malloc((size_t)W * 2 * sizeof *d->owner);
    for (int k = 0; k < W; k++) d->owner[k] = d->owner[W + k] = -1, set->rank[k].fd = -1;
    for (int k = 0; d->two_stages && k < W; k++) set->local[k].fd = -1;
    for (int i = 0; !rc && i < n; i++) {
        int *own = d->owner + (strcmp(gcd_st_meta(&d->files[i], "gradcheck.stage"), set->stage) ? W : 0);
        if (own[d->rank[i]] >= 0) rc = fail(err, len, "%s and %s both claim rank %ld", d->paths[own[d->rank[i]]], d->paths[i], d->rank[i]);
        else own[d->rank[i]] = i;
    }
    for (int other_stage = d->two_stages; other_stage >= 0; other_stage--)   // the local stage first: a lone file of the other stage is named
        for (int k = 0; !rc && k < set->world; k++) {
            if (d->owner[other_stage * W + k] >= 0) continue;
            int other = d->owner[(1 - other_stage) * W + k];
            if (!d->two_stages)
                rc = fail(err, len, "world %d, but no dump for rank %d among the %d file%s given (%s%s)", set->world, k, n, n == 1 ? "" : "s",
                          d->paths[0], n > 1 ? ", ..." : "");
            else if (other >= 0)
                rc = fail(err, len, "%s: gradcheck.stage is %s, but rank %d has no %s dump, which other ranks have: give every rank's dump of "
                                    "each stage (local and reduced), or one stage alone", d->paths[other], gcd_st_meta(&d->files[other], "gradcheck.stage"), k,
                          other_stage ? "local" : "reduced");
            else rc = fail(err, len, "world %d, but no %s dump for rank %d among the %d files given (%s, ...)", set->world, other_stage ? "local" : "reduced", k, n, d->paths[0]);
        }
    return rc;
}

// every rank's file moved into the set (when all went well), the rest closed and freed; the judged
// file's parameter list stays, as set->params
static void take_files(gcd_check_set *set, dump_list *d, int rc) {
    int W = set->world ? set->world : 1;
    for (int k = 0; !rc && k < set->world; k++) set->rank[k] = d->files[d->owner[k]], d->files[d->owner[k]].fd = -1, d->files[d->owner[k]].path = NULL;
    for (int k = 0; !rc && d->two_stages && k < set->world; k++)
        set->local[k] = d->files[d->owner[W + k]], d->files[d->owner[W + k]].fd = -1, d->files[d->owner[W + k]].path = NULL;
    if (!rc && d->two_stages) set->stage = gcd_st_meta(&set->rank[0], "gradcheck.stage");   // the string now lives in set->rank
    if (!rc && set->world) {   // what reduced the gradients, as rank 0 records it (docs/dumps.md)
        set->wrapper = gcd_st_meta(&set->rank[0], "gradcheck.wrapper");
        if (!set->wrapper && gcd_st_meta(&set->rank[0], "gradcheck.shards") && !gcd_st_meta(&set->rank[0], "gradcheck.mesh")) set->wrapper = "sharded";
    }
    if (set->params) d->params[d->judged] = NULL;   // kept as set->params
    for (int i = 0; i < d->n; i++) {
        if (d->files[i].path) gcd_st_close(&d->files[i]);
        if (d->params[i]) free_strs(d->params[i], d->nparams[i]);
    }
    free(d->files), free(d->rank), free(d->world), free(d->params), free(d->nparams), free(d->owner);
    free_strs(d->paths, d->n);
}

// sharded dumps: each file's map, then per sharded parameter one full shape and pieces that tile it
static int load_shard_maps(const gcd_check_opts *o, gcd_check_set *set, char *err, size_t len) {
    int rc, any_shard = 0;
    set->shards = gcd_malloc((size_t)nfiles(set) * sizeof *set->shards);
    for (int k = 0; k < nfiles(set); k++) {
        const gcd_st_file *f = file_of(set, k);
        if (f && (rc = gcd_shards_load(f, &set->shards[k], err, len))) return rc;
        any_shard |= set->shards[k].n > 0;
    }
    set->sharded = gcd_malloc((size_t)(set->nparams ? set->nparams : 1));
    if ((rc = gcd_mesh_load(set, err, len))) return rc;
    return any_shard ? gcd_shards_check(o, set, err, len) : 0;
}

// Per parameter: one shape everywhere, and its own tolerance: the coarsest of its own dtypes and the
// precision the step computed in (prec_tol: autocast computes in bf16 what it stores as F32). One
// tensor's dtype never loosens another's.
static int plan_tolerances(const gcd_check_opts *o, gcd_check_set *set, double prec_tol, char *err, size_t len) {
    char **params = set->params;
    set->ptol = gcd_malloc((size_t)(set->nparams ? set->nparams : 1) * sizeof *set->ptol);
    set->tol_default = 0;
    for (int j = 0; j < set->nparams; j++) {
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
    return 0;
}

int gcd_check_load(const gcd_check_opts *o, gcd_check_set *set, char *err, size_t len) {
    memset(set, 0, sizeof *set);
    set->ref.fd = set->ref2.fd = -1;
    char **ref_params = NULL;
    int nref = 0, rc;
    if ((rc = open_refs(o, set, &ref_params, &nref, err, len))) return rc;
    dump_list dumps = { 0 };
    rc = open_dumps(o, &dumps, err, len);
    if (!rc) rc = agree_dumps(set, &dumps, err, len);
    rc = assign_ranks(set, &dumps, rc, err, len);
    take_files(set, &dumps, rc);
    if (rc) return free_strs(ref_params, nref), rc;

    // the reference and the dumps: the same parameters
    const char *x = NULL;
    if (set->has_ref && (x = gcd_first_missing(set->params, set->nparams, ref_params, nref)))
        rc = fail(err, len, "%s: the reference's gradcheck.params lacks '%.80s', which the dumps list", o->ref[0], x);
    else if (set->has_ref && (x = gcd_first_missing(ref_params, nref, set->params, set->nparams)))
        rc = fail(err, len, "%s: the reference's gradcheck.params lists '%.80s', which the dumps do not", o->ref[0], x);
    free_strs(ref_params, nref);
    if (rc || (rc = gcd_sketch_load(set, err, len)) || (rc = load_shard_maps(o, set, err, len))) return rc;

    // the precision every file records, and what the dumps say ran in the forward
    double prec_tol = 0;
    if ((rc = agreed_precision(set, o->tol > 0, &prec_tol, err, len)) || (rc = load_recorded(set, err, len)) || (rc = gcd_held_load(set, err, len)) ||
        (rc = gcd_losses_load(set, err, len)) || (rc = plan_tolerances(o, set, prec_tol, err, len)) || (rc = load_losses(set, err, len)))
        return rc;
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
    for (int k = 0; set->shards && k < nfiles(set); k++) gcd_shards_free(&set->shards[k]);
    free(set->shards), free(set->sharded), free(set->ptol), free(set->mesh_coords);
    free_strs(set->ran, set->nran), free(set->nondeterministic), free(set->batchnorm);
    gcd_held_free(set);
    if (set->has_ref) gcd_st_close(&set->ref);
    if (set->has_ref2) gcd_st_close(&set->ref2);
    free(set->rank), free(set->rank_loss), free(set->shard_loss);
    free(set->digest), free(set->local_digest);
    free_strs(set->params, set->nparams);
    memset(set, 0, sizeof *set);
}
