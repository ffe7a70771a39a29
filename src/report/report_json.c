#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/gather.h"
#include "report/report.h"
#include "diagnose/verdict.h"

#ifndef GCD_VERSION
#define GCD_VERSION "0.0.0"
#endif

// ----------------------------------------------------------------------------
// checked cJSON building: a NULL from cJSON is out of memory

static cJSON *chk(cJSON *v) {
    if (!v) GCD_FATAL("report: cJSON out of memory");
    return v;
}
static cJSON *put(cJSON *obj, const char *key, cJSON *v) {
    if (!cJSON_AddItemToObject(obj, key, chk(v))) GCD_FATAL("report: cannot add key %s", key);
    return v;
}
static cJSON *push(cJSON *arr, cJSON *v) {
    if (!cJSON_AddItemToArray(arr, chk(v))) GCD_FATAL("report: cannot append to an array");
    return v;
}

// the ranks' mesh (gradcheck.mesh): its dimensions' names and each rank's coordinates
static cJSON *mesh_json(const gcd_run_result *res) {
    cJSON *m = chk(cJSON_CreateObject()), *names = put(m, "names", cJSON_CreateArray()), *coords = put(m, "coords", cJSON_CreateArray());
    for (int i = 0; i < res->mesh_nd; i++) push(names, cJSON_CreateString(res->mesh_names[i]));
    for (int k = 0; k < res->world; k++) push(coords, cJSON_CreateIntArray(res->mesh_coords + (size_t)k * res->mesh_nd, res->mesh_nd));
    return m;
}

// cJSON prints NaN and infinities as null; here null means None, so they are strings
static cJSON *num(double v) {
    if (isnan(v)) return cJSON_CreateString("nan");
    if (isinf(v)) return cJSON_CreateString(v > 0 ? "inf" : "-inf");
    return cJSON_CreateNumber(v);
}

static cJSON *nums(const double *v, size_t n) {
    cJSON *a = chk(cJSON_CreateArray());
    for (size_t i = 0; v && i < n; i++) push(a, num(v[i]));
    return a;
}

// a tensor's values: all of them, none (--summary-only), or over the limit without --full a summary:
// {"elided": true, "numel": n, "norm": ||v||, "first": [v[0], ..., v[15]]}
static cJSON *tensor(const double *v, size_t n, gcd_values values) {
    if (values == GCD_VALUES_NONE) return cJSON_CreateNull();
    if (values == GCD_VALUES_FULL || n <= GCD_VALUES_LIMIT) return nums(v, n);
    double big = 0, ss = 0;   // scaled by the largest |v|: a finite tensor has a finite norm
    for (size_t i = 0; i < n && !isnan(big); i++) big = isnan(v[i]) ? v[i] : fmax(big, fabs(v[i]));   // NaN stays NaN
    for (size_t i = 0; big > 0 && isfinite(big) && i < n; i++) ss += (v[i] / big) * (v[i] / big);
    cJSON *o = chk(cJSON_CreateObject());
    put(o, "elided", cJSON_CreateTrue());
    put(o, "numel", cJSON_CreateNumber((double)n));
    put(o, "norm", num(isfinite(big) ? big * sqrt(ss) : big));
    put(o, "first", nums(v, GCD_VALUES_FIRST));
    return o;
}

static cJSON *shape(int ndim, const int *s) {
    cJSON *a = chk(cJSON_CreateArray());
    for (int i = 0; i < ndim; i++) push(a, cJSON_CreateNumber(s[i]));
    return a;
}

static cJSON *strs(char **v, int n) {
    if (!v) return cJSON_CreateNull();
    cJSON *a = chk(cJSON_CreateArray());
    for (int i = 0; i < n; i++) push(a, cJSON_CreateString(v[i]));
    return a;
}

static cJSON *str_or_null(const char *s) { return s && *s ? cJSON_CreateString(s) : cJSON_CreateNull(); }

// ----------------------------------------------------------------------------
// building

cJSON *gcd_report_new(int argc, char **argv, const gcd_env *env) {
    cJSON *doc = chk(cJSON_CreateObject());
    put(doc, "schema", cJSON_CreateString(GCD_REPORT_SCHEMA));
    cJSON *tool = put(doc, "tool", cJSON_CreateObject());
    put(tool, "name", cJSON_CreateString("gradcheck-dist"));
    put(tool, "version", cJSON_CreateString(GCD_VERSION));
    put(doc, "command", strs(argv, argc));
    cJSON *e = put(doc, "environment", cJSON_CreateObject());
    put(e, "backend", cJSON_CreateString(env->backend));
    put(e, "world", cJSON_CreateNumber(env->world));
    put(e, "hostnames", strs(env->hostnames, env->world));
    put(e, "devices", strs(env->devices, env->world));
    put(e, "mpi_version", str_or_null(env->mpi_version));
    put(e, "nccl_version", str_or_null(env->nccl_version));
    put(e, "cuda_version", str_or_null(env->cuda_version));
    put(e, "precision", cJSON_CreateString("float64"));
    put(e, "start_time", cJSON_CreateString(env->start_time));
    put(e, "wall_seconds", cJSON_CreateNull());
    put(doc, "result", cJSON_CreateString("error"));   // until finished
    put(doc, "exit_code", cJSON_CreateNumber(3));
    put(doc, "error", cJSON_CreateNull());
    put(doc, "tolerance", cJSON_CreateNumber(GCD_TOL));
    put(doc, "expectations", cJSON_CreateArray());
    put(doc, "runs", cJSON_CreateArray());
    return doc;
}

// what another framework needs to replay a probe: its initial weights and every rank's inputs. The same
// for every mode of the probe (one configuration per invocation), so written once, keyed by the probe.
static cJSON *setup(const gcd_run_result *res, gcd_values values) {
    cJSON *s = chk(cJSON_CreateObject());
    put(s, "probe", cJSON_CreateString(res->probe));
    cJSON *ps = put(s, "params", cJSON_CreateArray());
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        cJSON *o = push(ps, cJSON_CreateObject());
        put(o, "name", cJSON_CreateString(p->name));
        put(o, "shape", shape(p->ndim, p->shape));
        put(o, "init", tensor(p->init, p->n, values));
    }
    cJSON *ins = put(s, "inputs", cJSON_CreateArray());
    for (int k = 0; k < res->world; k++) {
        cJSON *r = push(ins, cJSON_CreateObject());
        put(r, "rank", cJSON_CreateNumber(k));
        cJSON *ts = put(r, "tensors", cJSON_CreateArray());
        for (int j = 0; j < res->ninput; j++) {
            cJSON *t = push(ts, cJSON_CreateObject());
            put(t, "name", cJSON_CreateString(res->input_name[j]));
            put(t, "shape", shape(res->input_ndim[j], res->input_shape[j]));
            put(t, "data", tensor(res->inputs[j] + (size_t)k * res->input_n[j], res->input_n[j], values));
        }
    }
    return s;
}

// the forward path from the parameter to the loss: [{op, name, detached, reason}], reason only where it breaks
static cJSON *path(const gcd_run_result *res, const gcd_param_result *p) {
    const char *names[GCD_MAX_PARAMS];
    for (int i = 0; i < res->nparam && i < GCD_MAX_PARAMS; i++) names[i] = res->param[i].name;
    cJSON *a = chk(cJSON_CreateArray());
    for (int j = 0; j < p->path.n; j++) {
        const gcd_path_node *nd = &p->path.node[j];
        char name[128];
        cJSON *o = push(a, cJSON_CreateObject());
        put(o, "op", cJSON_CreateString(gcd_path_op(nd)));
        put(o, "name", str_or_null(gcd_path_name(nd, names, name, sizeof name)));
        put(o, "detached", cJSON_CreateBool(nd->cut != GCD_CUT_NONE));
        put(o, "reason", str_or_null(j == p->breaks_at ? p->reason : NULL));
    }
    return a;
}

static cJSON *param(const gcd_run_result *res, const gcd_param_result *p, gcd_values values) {
    cJSON *o = chk(cJSON_CreateObject());
    int none = p->status == GCD_ST_NONE;
    put(o, "name", cJSON_CreateString(p->name));
    put(o, "shape", shape(p->ndim, p->shape));
    put(o, "status", cJSON_CreateString(gcd_status_str(p->status)));
    put(o, "ranks_with_grad", cJSON_CreateNumber(p->nhave));
    put(o, "norm", none ? cJSON_CreateNull() : num(p->norm));
    put(o, "reference_norm", num(p->ref_norm));
    put(o, "rel_err", none ? cJSON_CreateNull() : num(p->rel_err));
    put(o, "scale", none ? cJSON_CreateNull() : num(p->scale));
    put(o, "cosine", none ? cJSON_CreateNull() : num(p->cosine));
    put(o, "nonfinite", cJSON_CreateNumber((double)p->nonfinite));
    put(o, "moved", num(p->moved));
    put(o, "moved_any", cJSON_CreateBool(p->moved_any));
    put(o, "path", path(res, p));
    put(o, "breaks_at", p->breaks_at >= 0 && p->breaks_at < p->path.n ? cJSON_CreateNumber(p->breaks_at) : cJSON_CreateNull());
    if (p->tp_split) put(o, "tensor_parallel", cJSON_CreateString(p->tp_split == 1 ? "sharded" : "replicated"));
    if (p->differs) {   // a tensor-parallel probe's replicated parameter: its copies against the first rank's
        put(o, "max_rank_diff", num(p->max_diff));
        put(o, "rank_diff_rel", num(p->diff_rel));
    }
    if (values == GCD_VALUES_NONE) return o;
    cJSON *local = put(o, "local", cJSON_CreateArray());
    for (int k = 0; k < res->world; k++)
        push(local, p->has[k] ? tensor(p->local + (size_t)k * p->n, p->n, values) : cJSON_CreateNull());
    put(o, "reduced", p->reduced ? tensor(p->reduced, p->n, values) : cJSON_CreateNull());
    put(o, "reference", tensor(p->reference, p->n, values));
    return o;
}

// "a,b,c" as ["a", "b", "c"]
static cJSON *param_names(const char *list) {
    cJSON *names = chk(cJSON_CreateArray());
    for (const char *s = list; *s;) {
        size_t k = strcspn(s, ",");
        char *name = gcd_malloc(k + 1);
        memcpy(name, s, k);
        push(names, cJSON_CreateString(name));
        free(name);
        s += k + (s[k] == ',');
    }
    return names;
}

static void add_findings(cJSON *run, const gcd_run_result *res) {
    cJSON *fs = put(run, "findings", cJSON_CreateArray());
    for (int i = 0; i < res->nfinding; i++) {
        const gcd_finding *f = &res->finding[i];
        cJSON *o = push(fs, cJSON_CreateObject());
        put(o, "kind", cJSON_CreateString(f->kind));
        put(o, "counts", cJSON_CreateBool(f->counts));
        put(o, "params", param_names(f->params));
        put(o, "message", cJSON_CreateString(f->message));
    }
}

// what the document says of its values, once: how many a tensor may have before it is elided
static void values_note(cJSON *doc, gcd_values values) {
    if (cJSON_GetObjectItem(doc, "values")) return;
    cJSON *v = put(doc, "values", cJSON_CreateObject());
    put(v, "limit", values == GCD_VALUES_LIMITED ? cJSON_CreateNumber(GCD_VALUES_LIMIT) : cJSON_CreateNull());
    put(v, "full", cJSON_CreateBool(values == GCD_VALUES_FULL));
    put(v, "summary_only", cJSON_CreateBool(values == GCD_VALUES_NONE));
    char note[160];
    if (values == GCD_VALUES_NONE) snprintf(note, sizeof note, "--summary-only: no tensor values, only their statuses and norms");
    else if (values == GCD_VALUES_FULL) snprintf(note, sizeof note, "--full: every tensor's values");
    else snprintf(note, sizeof note, "a tensor of more than %d elements is written as {elided, numel, norm, first: its first %d values}; "
                  "run with --full for every value", GCD_VALUES_LIMIT, GCD_VALUES_FIRST);
    put(v, "note", cJSON_CreateString(note));
}

void gcd_report_add_run(cJSON *doc, const gcd_run_result *res, const char *role, gcd_values values) {
    values_note(doc, values);
    cJSON *setups = cJSON_GetObjectItem(doc, "setups");
    if (!setups) setups = put(doc, "setups", cJSON_CreateArray());
    cJSON *r = push(cJSON_GetObjectItem(doc, "runs"), cJSON_CreateObject());
    put(r, "probe", cJSON_CreateString(res->probe));
    put(r, "mode", cJSON_CreateString(gcd_gather_mode_name(res->mode)));
    put(r, "library", cJSON_CreateString(res->finalize ? gcd_finalize_mode_library(res->mode) : gcd_gather_mode_library(res->mode, res->cfg.local_loss)));
    put(r, "role", cJSON_CreateString(role));
    put(r, "world", cJSON_CreateNumber(res->world));
    put(r, "local_loss", cJSON_CreateBool(res->cfg.local_loss));
    put(r, "inputs", cJSON_CreateString(res->cfg.inputs_random ? "random" : "seed"));
    put(r, "steps", cJSON_CreateNumber(res->steps));
    put(r, "lr", num(res->lr));
    put(r, "seed", cJSON_CreateNumber((double)res->cfg.seed));
    put(r, "seconds", num(res->seconds));
    cJSON *dims = put(r, "dims", cJSON_CreateObject());
    put(dims, "batch", cJSON_CreateNumber(res->cfg.batch));
    put(dims, "dim_img", cJSON_CreateNumber(res->cfg.dim_img));
    put(dims, "dim_txt", cJSON_CreateNumber(res->cfg.dim_txt));
    put(dims, "dim_emb", cJSON_CreateNumber(res->cfg.dim_emb));
    if (!gcd_report_run_setup(doc, r)) push(setups, setup(res, values));
    cJSON *loss = put(r, "loss", cJSON_CreateObject());
    put(loss, "per_rank", nums(res->loss, (size_t)res->world));
    cJSON *steps = put(loss, "per_step", cJSON_CreateArray());
    for (int s = 0; s < res->nloss && res->steps > 0; s++) push(steps, nums(res->loss + (size_t)s * res->world, (size_t)res->world));
    put(loss, "reference", num(res->ref_loss));
    cJSON *ps = put(r, "params", cJSON_CreateArray());
    for (int i = 0; i < res->nparam; i++) push(ps, param(res, &res->param[i], values));
    add_findings(r, res);
}

void gcd_report_add_expectation(cJSON *doc, const char *probe, const char *mode, const char *role, int met, const char *message) {
    cJSON *o = push(cJSON_GetObjectItem(doc, "expectations"), cJSON_CreateObject());
    put(o, "probe", cJSON_CreateString(probe));
    put(o, "mode", cJSON_CreateString(mode));
    put(o, "role", cJSON_CreateString(role));
    put(o, "met", cJSON_CreateBool(met));
    put(o, "message", cJSON_CreateString(message));
}

void gcd_report_finish(cJSON *doc, int exit_code, const char *error, int error_rank, double wall_seconds) {
    const char *result = exit_code == 0 ? "pass" : exit_code == 1 ? "fail" : "error";
    cJSON_ReplaceItemInObject(doc, "result", chk(cJSON_CreateString(result)));
    cJSON_ReplaceItemInObject(doc, "exit_code", chk(cJSON_CreateNumber(exit_code)));
    cJSON *e = error ? chk(cJSON_CreateObject()) : cJSON_CreateNull();   // one or the other: the null leaked when error was set
    if (error) {
        put(e, "message", cJSON_CreateString(error));
        put(e, "rank", cJSON_CreateNumber(error_rank));
    }
    cJSON_ReplaceItemInObject(doc, "error", chk(e));
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(doc, "environment"), "wall_seconds", chk(num(wall_seconds)));
}

// ----------------------------------------------------------------------------
// check: the dumps and per-parameter figures (no tensor values: the dumps hold them)

static cJSON *dump_entry(const gcd_st_file *f, int rank, const char *digest) {
    cJSON *o = chk(cJSON_CreateObject());
    put(o, "path", cJSON_CreateString(f->path));
    put(o, "rank", cJSON_CreateNumber(rank));
    put(o, "bytes", cJSON_CreateNumber((double)f->size));
    put(o, "xxh128", str_or_null(digest));
    cJSON *m = put(o, "metadata", cJSON_CreateObject());
    for (int i = 0; i < f->nmeta; i++) put(m, f->meta_key[i], cJSON_CreateString(f->meta_val[i]));
    return o;
}

static cJSON *per_rank(const gcd_param_result *p, int world) {
    cJSON *a = chk(cJSON_CreateArray());
    for (int k = 0; k < world; k++) {
        cJSON *o = push(a, cJSON_CreateObject());
        put(o, "rank", cJSON_CreateNumber(k));
        put(o, "present", cJSON_CreateBool(p->has[k]));
        put(o, "norm", p->has[k] ? num(p->rank_norm[k]) : cJSON_CreateNull());
        put(o, "nonfinite", cJSON_CreateNumber((double)p->rank_nonfinite[k]));
        put(o, "first_nonfinite", p->rank_first_nonfinite[k] >= 0 ? cJSON_CreateNumber((double)p->rank_first_nonfinite[k]) : cJSON_CreateNull());
        put(o, "differs", cJSON_CreateBool(p->differs[k]));
        if (p->own_rel) {   // check, both stages, ranks that disagree: against its own local gradient and the reference
            put(o, "own_local_rel", isfinite(p->own_rel[k]) ? num(p->own_rel[k]) : cJSON_CreateNull());
            put(o, "ref_rel", isfinite(p->ref_rel[k]) ? num(p->ref_rel[k]) : cJSON_CreateNull());
        }
    }
    return a;
}

void gcd_report_add_check(cJSON *doc, const gcd_check_set *set, const gcd_run_result *res) {
    cJSON_ReplaceItemInObject(doc, "tolerance", chk(num(set->tol)));
    cJSON *env = cJSON_GetObjectItem(doc, "environment");
    static const char *const versions[][2] = { { "python_version", "gradcheck.python" }, { "torch_version", "gradcheck.torch" },
                                               { "lightning_version", "gradcheck.lightning" } };
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++)
        put(env, versions[i][0], str_or_null(gcd_st_meta(&set->rank[0], versions[i][1])));
    cJSON *r = push(cJSON_GetObjectItem(doc, "runs"), cJSON_CreateObject());
    put(r, "probe", cJSON_CreateString("check"));
    put(r, "mode", cJSON_CreateString(set->stage));
    put(r, "stage", cJSON_CreateString(set->stage));
    put(r, "wrapper", str_or_null(set->wrapper));
    put(r, "reduced_by", str_or_null(res->reduced_by));
    put(r, "role", cJSON_CreateString("test"));
    put(r, "world", cJSON_CreateNumber(set->world));
    put(r, "tolerance", num(set->tol));
    put(r, "tolerance_from_dtypes", num(set->tol_default));
    if (set->tol_reason[0]) put(r, "tolerance_reason", cJSON_CreateString(set->tol_reason));
    put(r, "bytes_scanned", cJSON_CreateNumber((double)set->bytes));
    if (res->mesh_nd) put(r, "mesh", mesh_json(res));
    put(r, "seconds", num(res->seconds));
    cJSON *dumps = put(r, "dumps", cJSON_CreateArray());
    for (int k = 0; k < set->world; k++) push(dumps, dump_entry(&set->rank[k], k, set->digest[k]));
    put(r, "reference", set->has_ref ? dump_entry(&set->ref, 0, set->digest[set->world]) : cJSON_CreateNull());
    put(r, "reference2", set->has_ref2 ? dump_entry(&set->ref2, 0, set->digest[set->world + 1]) : cJSON_CreateNull());
    put(r, "precision", str_or_null(set->precision));
    put(r, "noise_k", num(GCD_NOISE_K));
    put(r, "sensitivity", isfinite(res->sensitivity) ? num(res->sensitivity) : cJSON_CreateNull());
    if (set->local) {   // every input read is named and digested: the local (pre-reduce) dumps too
        cJSON *local = put(r, "local_dumps", cJSON_CreateArray());
        for (int k = 0; k < set->world; k++) push(local, dump_entry(&set->local[k], k, set->local_digest[k]));
    }
    cJSON *ps = put(r, "params", cJSON_CreateArray());
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        cJSON *o = push(ps, cJSON_CreateObject());
        int none = p->status == GCD_ST_NONE;
        put(o, "name", cJSON_CreateString(p->name));
        put(o, "shape", p->ndim < 0 ? cJSON_CreateNull() : shape(p->ndim, p->shape));   // null: no file has it
        put(o, "dtype", p->ndim < 0 ? cJSON_CreateNull() : cJSON_CreateString(p->dtype));
        put(o, "status", cJSON_CreateString(gcd_status_str(p->status)));
        put(o, "ranks_with_grad", cJSON_CreateNumber(p->nhave));
        put(o, "norm", none ? cJSON_CreateNull() : num(p->norm));
        put(o, "reference_norm", set->has_ref && !p->ref_none ? num(p->ref_norm) : cJSON_CreateNull());
        put(o, "rel_err", none || !set->has_ref ? cJSON_CreateNull() : num(p->rel_err));
        put(o, "scale", none || !set->has_ref ? cJSON_CreateNull() : num(p->scale));
        put(o, "cosine", none || !set->has_ref ? cJSON_CreateNull() : num(p->cosine));
        put(o, "nonfinite", cJSON_CreateNumber((double)p->nonfinite));
        static const char *const sources[] = { [GCD_TOL_CLAIMED] = "claimed", [GCD_TOL_MEASURED] = "measured", [GCD_TOL_GIVEN] = "--tol" };
        put(o, "tol", num(p->tol));
        put(o, "tol_source", cJSON_CreateString(sources[p->tol_source]));
        put(o, "allowed", isfinite(p->allowed) ? num(p->allowed) : cJSON_CreateNull());
        put(o, "noise", isfinite(p->noise) ? num(p->noise) : cJSON_CreateNull());
        put(o, "max_rank_diff", num(p->max_diff));
        put(o, "rank_diff_rel", num(p->diff_rel));
        put(o, "per_rank", per_rank(p, set->world));
        if (p->stage_cause) {
            static const char *const causes[] = { [GCD_SC_UNREDUCED] = "unreduced", [GCD_SC_LAST_UNSYNCED] = "last_unsynced", [GCD_SC_PART] = "part_own",
                                                  [GCD_SC_OTHER] = "other" };
            put(o, "stage_cause", cJSON_CreateString(causes[p->stage_cause]));
            put(o, "split_rel", isfinite(p->split_rel) ? num(p->split_rel) : cJSON_CreateNull());
        }
    }
    add_findings(r, res);
}

// guard (src/guard): a check of the reduced stage from the ranks' summaries, inside training: no dumps, no
// reference. The run's figures are check's; the caller adds its "guard" object (step, ranks) to the run returned.
cJSON *gcd_report_add_guard(cJSON *doc, const gcd_run_result *res) {
    cJSON_ReplaceItemInObject(doc, "tolerance", chk(num(res->tol)));
    cJSON *r = push(cJSON_GetObjectItem(doc, "runs"), cJSON_CreateObject());
    put(r, "probe", cJSON_CreateString("check"));
    put(r, "mode", cJSON_CreateString("reduced"));
    put(r, "stage", cJSON_CreateString("reduced"));
    put(r, "role", cJSON_CreateString("test"));
    put(r, "world", cJSON_CreateNumber(res->world));
    put(r, "tolerance", num(res->tol));
    put(r, "seconds", num(res->seconds));
    put(r, "dumps", cJSON_CreateArray());
    put(r, "reference", cJSON_CreateNull());
    put(r, "reference2", cJSON_CreateNull());
    cJSON *ps = put(r, "params", cJSON_CreateArray());
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        cJSON *o = push(ps, cJSON_CreateObject());
        put(o, "name", cJSON_CreateString(p->name));
        put(o, "shape", shape(p->ndim, p->shape));
        put(o, "status", cJSON_CreateString(gcd_status_str(p->status)));
        put(o, "ranks_with_grad", cJSON_CreateNumber(p->nhave));
        put(o, "norm", p->status == GCD_ST_NONE ? cJSON_CreateNull() : num(p->norm));
        put(o, "nonfinite", cJSON_CreateNumber((double)p->nonfinite));
        put(o, "max_rank_diff", num(p->max_diff));
        put(o, "rank_diff_rel", num(p->diff_rel));
        put(o, "per_rank", per_rank(p, res->world));
    }
    add_findings(r, res);
    return r;
}
