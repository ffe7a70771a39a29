/*
 * report_load: reading a report back. Bounded (its size, the memory its tree would take), every key the
 * renderings read validated, with the JSON path of a bad one; and the renderings' accessors (numbers
 * written as strings, a run's setup, strings made safe for a terminal). No probe, no check, no MPI: the
 * fuzz target links this file, report_print.c and the renderings alone.
 */
#include <sys/resource.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "report/report.h"

double gcd_json_num(const cJSON *v) {
    if (cJSON_IsNumber(v)) return v->valuedouble;
    if (cJSON_IsString(v)) {
        if (!strcmp(v->valuestring, "inf")) return INFINITY;
        if (!strcmp(v->valuestring, "-inf")) return -INFINITY;
    }
    return NAN;
}

const cJSON *gcd_report_run_setup(const cJSON *doc, const cJSON *run) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(run, "setup"), *probe = cJSON_GetObjectItemCaseSensitive(run, "probe");
    if (s || !cJSON_IsString(probe)) return s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(doc, "setups")) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "probe");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, probe->valuestring)) return s;
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// the renderings' view of a report: every string value as a terminal may show it (gcd_sb_term), so that
// no name or message can start a line, move a cursor or break a document; keys are only looked up

static int any_unsafe(const cJSON *v) {
    for (; v; v = v->next) {
        if (cJSON_IsString(v) && v->valuestring && gcd_term_needs(v->valuestring)) return 1;
        if (v->child && any_unsafe(v->child)) return 1;
    }
    return 0;
}

static void make_safe(cJSON *v) {
    for (; v; v = v->next) {
        if (cJSON_IsString(v) && v->valuestring && gcd_term_needs(v->valuestring)) {
            char *t = gcd_term_str(v->valuestring);
            cJSON_free(v->valuestring);
            v->valuestring = cJSON_malloc(strlen(t) + 1);
            mallocCheck(v->valuestring);
            memcpy(v->valuestring, t, strlen(t) + 1);
            free(t);
        }
        if (v->child) make_safe(v->child);
    }
}

const cJSON *gcd_report_safe(const cJSON *doc, cJSON **copy) {
    *copy = NULL;
    if (!doc || !any_unsafe(doc->child)) return doc;   // the usual case: nothing copied
    *copy = cJSON_Duplicate(doc, 1);
    mallocCheck(*copy);
    make_safe((*copy)->child);
    return *copy;
}

// ----------------------------------------------------------------------------
// reading: a gradcheck-dist report of exactly the schema this build writes, every key the renderings
// read checked, and every number they turn into a count or an index within range. A bad key is named
// by its JSON path: runs[0].params[3].shape.

typedef struct {
    char *err;
    size_t len;
} why;

static int invalid(why *w, const char *path, const char *key, const char *what) {
    snprintf(w->err, w->len, "%s%s%s: %s", path, *path && key ? "." : "", key ? key : "", what);
    return 0;
}

static const cJSON *key(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static int need(why *w, const cJSON *o, const char *path, const char *k, cJSON_bool (*is)(const cJSON *)) {
    return is(key(o, k)) ? 1 : invalid(w, path, k, "missing or of the wrong type");
}

// an integer in [lo, hi], or absent/null when optional
static int whole(why *w, const cJSON *o, const char *path, const char *k, double lo, double hi, int optional) {
    const cJSON *v = key(o, k);
    if (optional && (!v || cJSON_IsNull(v))) return 1;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
        char what[96];
        snprintf(what, sizeof what, "expected a whole number from %.0f to %.0f", lo, hi);
        return invalid(w, path, k, what);
    }
    return 1;
}

// shape: whole numbers whose product is at most 2^40 (null where a check's tensor has none); *n: the product
static int shape_ok(why *w, const cJSON *p, const char *path, double *n) {
    const cJSON *s = key(p, "shape"), *d;
    *n = 1;
    if (cJSON_IsNull(s)) return *n = -1, 1;
    if (!cJSON_IsArray(s) || cJSON_GetArraySize(s) > 8) return invalid(w, path, "shape", "not an array of at most 8 whole numbers");
    cJSON_ArrayForEach(d, s) {
        if (!cJSON_IsNumber(d) || d->valuedouble != floor(d->valuedouble) || d->valuedouble < 0 || d->valuedouble > INT_MAX)
            return invalid(w, path, "shape", "not an array of whole numbers from 0 to 2^31-1");
        *n *= d->valuedouble;
    }
    return *n <= 1099511627776.0 ? 1 : invalid(w, path, "shape", "its element count is over 2^40");
}

static int number_ok(const cJSON *x) { return cJSON_IsNumber(x) || cJSON_IsString(x); }

// values: null, an array of n numbers (or "nan", "inf", "-inf"), or over the limit an elided tensor
// {"elided": true, "numel": n, "norm", "first": [at most GCD_VALUES_FIRST numbers]}
static int values_ok(why *w, const cJSON *v, const char *path, const char *k, double n) {
    if (!v || cJSON_IsNull(v)) return 1;
    if (cJSON_IsObject(v)) {
        const cJSON *numel = key(v, "numel"), *first = key(v, "first"), *x;
        if (!cJSON_IsTrue(key(v, "elided")) || !cJSON_IsNumber(numel) || numel->valuedouble != n || !number_ok(key(v, "norm")) ||
            !cJSON_IsArray(first) || cJSON_GetArraySize(first) > GCD_VALUES_FIRST || cJSON_GetArraySize(first) > n)
            return invalid(w, path, k, "not an elided tensor {elided: true, numel: as many values as the shape holds, norm, first: at most 16 values}");
        cJSON_ArrayForEach(x, first) if (!number_ok(x)) return invalid(w, path, k, "holds a value that is not a number");
        return 1;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != n) return invalid(w, path, k, "not an array of as many values as the shape holds");
    const cJSON *x;
    cJSON_ArrayForEach(x, v) if (!number_ok(x)) return invalid(w, path, k, "holds a value that is not a number");
    return 1;
}

// a probe's setup: {params: [{name, shape, init}], inputs: [{rank, tensors: [{name, shape, data}]}]}
static int setup_ok(why *w, const cJSON *s, const char *path) {
    if (!cJSON_IsObject(s)) return invalid(w, path, NULL, "not an object");
    if (!need(w, s, path, "params", cJSON_IsArray) || !need(w, s, path, "inputs", cJSON_IsArray)) return 0;
    char at[192];
    const cJSON *p, *r, *t;
    int i = 0;
    cJSON_ArrayForEach(p, key(s, "params")) {
        double n;
        snprintf(at, sizeof at, "%s.params[%d]", path, i++);
        if (!cJSON_IsObject(p) || !need(w, p, at, "name", cJSON_IsString) || !shape_ok(w, p, at, &n) || !values_ok(w, key(p, "init"), at, "init", n)) return 0;
    }
    i = 0;
    cJSON_ArrayForEach(r, key(s, "inputs")) {
        snprintf(at, sizeof at, "%s.inputs[%d]", path, i++);
        if (!cJSON_IsObject(r) || !need(w, r, at, "tensors", cJSON_IsArray)) return invalid(w, at, "tensors", "missing or of the wrong type");
        int j = 0;
        cJSON_ArrayForEach(t, key(r, "tensors")) {
            double n;
            char tat[224];
            snprintf(tat, sizeof tat, "%s.tensors[%d]", at, j++);
            if (!cJSON_IsObject(t) || !need(w, t, tat, "name", cJSON_IsString) || !shape_ok(w, t, tat, &n) || !values_ok(w, key(t, "data"), tat, "data", n)) return 0;
        }
    }
    return 1;
}

static int run_ok(why *w, const cJSON *run, const char *path, int world) {
    if (!cJSON_IsObject(run)) return invalid(w, path, NULL, "not an object");
    int check = cJSON_IsString(key(run, "probe")) && !strcmp(key(run, "probe")->valuestring, "check");
    if (!(need(w, run, path, "probe", cJSON_IsString) && need(w, run, path, "mode", cJSON_IsString) && need(w, run, path, "params", cJSON_IsArray) &&
          need(w, run, path, "findings", cJSON_IsArray) && whole(w, run, path, "world", 1, 65536, 0) &&
          (check ? need(w, run, path, "dumps", cJSON_IsArray) : need(w, run, path, "loss", cJSON_IsObject) && whole(w, run, path, "steps", 0, 1e6, 0))))
        return 0;
    int W = (int)key(run, "world")->valuedouble;
    if (W != world) return invalid(w, path, "world", "differs from environment.world");
    char at[160];
    snprintf(at, sizeof at, "%s.setup", path);
    if (key(run, "setup") && !setup_ok(w, key(run, "setup"), at)) return 0;   // schema /1
    if (!check) {
        const cJSON *loss = key(run, "loss"), *row;
        snprintf(at, sizeof at, "%s.loss", path);
        if (!need(w, loss, at, "per_rank", cJSON_IsArray) || !need(w, loss, at, "per_step", cJSON_IsArray)) return 0;
        if (!values_ok(w, key(loss, "per_rank"), at, "per_rank", W)) return 0;
        int s = 0;
        cJSON_ArrayForEach(row, key(loss, "per_step")) {
            snprintf(at, sizeof at, "%s.loss.per_step[%d]", path, s++);
            if (!values_ok(w, row, at, "", W)) return 0;
        }
    }
    const cJSON *p, *f;
    int i = 0;
    cJSON_ArrayForEach(p, key(run, "params")) {
        snprintf(at, sizeof at, "%s.params[%d]", path, i++);
        double n;
        if (!cJSON_IsObject(p)) return invalid(w, at, NULL, "not an object");
        if (!(need(w, p, at, "name", cJSON_IsString) && need(w, p, at, "status", cJSON_IsString) && shape_ok(w, p, at, &n) &&
              whole(w, p, at, "ranks_with_grad", 0, W, 0) && whole(w, p, at, "nonfinite", 0, 9e15, 0)))
            return 0;
        if (!values_ok(w, key(p, "reduced"), at, "reduced", n) || !values_ok(w, key(p, "reference"), at, "reference", n)) return 0;
        const cJSON *local = key(p, "local"), *r;
        if (local && !cJSON_IsNull(local)) {
            if (!cJSON_IsArray(local) || cJSON_GetArraySize(local) != W) return invalid(w, at, "local", "not an array of one entry per rank");
            cJSON_ArrayForEach(r, local) if (!values_ok(w, r, at, "local[]", n)) return 0;
        }
    }
    i = 0;
    cJSON_ArrayForEach(f, key(run, "findings")) {
        snprintf(at, sizeof at, "%s.findings[%d]", path, i++);
        if (!cJSON_IsObject(f) || !need(w, f, at, "kind", cJSON_IsString) || !need(w, f, at, "message", cJSON_IsString)) return 0;
    }
    return 1;
}

static int doc_ok(why *w, const cJSON *doc) {
    const cJSON *schema = key(doc, "schema");
    const char *prefix = "gradcheck-dist.report/";
    if (!cJSON_IsObject(doc)) return invalid(w, "", NULL, "not a gradcheck-dist report (not a JSON object)");
    if (!cJSON_IsString(schema) || strncmp(schema->valuestring, prefix, strlen(prefix))) {
        snprintf(w->err, w->len, "not a gradcheck-dist report (no \"schema\": \"%s\")", GCD_REPORT_SCHEMA);
        return 0;
    }
    const char *v = schema->valuestring + strlen(prefix);   // /1 to this build's: read; a later one: newer; "/-1", "/x": nothing known
    int number = *v >= '1' && *v <= '9' && v[strspn(v, "0123456789")] == 0 && strlen(v) < 6, version = number ? atoi(v) : 0;
    if (version < GCD_REPORT_VERSION_OLDEST || version > GCD_REPORT_VERSION) {
        snprintf(w->err, w->len, number ? "schema %.40s is newer than this gradcheck-dist (%s) reads: upgrade it" : "schema %.40s is not one this gradcheck-dist (%s) knows",
                 schema->valuestring, GCD_VERSION);
        return 0;
    }
    if (!(need(w, doc, "", "environment", cJSON_IsObject) && need(w, doc, "", "runs", cJSON_IsArray) && need(w, doc, "", "result", cJSON_IsString) &&
          whole(w, doc, "", "exit_code", 0, 3, 0) && need(w, doc, "", "expectations", cJSON_IsArray) && need(w, doc, "", "command", cJSON_IsArray) &&
          whole(w, key(doc, "environment"), "environment", "world", 1, 65536, 0)))
        return 0;
    int world = (int)key(key(doc, "environment"), "world")->valuedouble, i = 0;
    static const char *const lists[] = { "hostnames", "devices" };   // one per rank at most: the renderings count them
    for (int k = 0; k < 2; k++) {
        const cJSON *l = key(key(doc, "environment"), lists[k]), *x;
        if (!l || cJSON_IsNull(l)) continue;
        if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) > world) return invalid(w, "environment", lists[k], "not an array of at most one string per rank (environment.world)");
        cJSON_ArrayForEach(x, l) if (!cJSON_IsString(x)) return invalid(w, "environment", lists[k], "holds something that is not a string");
    }
    const cJSON *run, *e, *setups = key(doc, "setups");
    if (setups && !cJSON_IsArray(setups)) return invalid(w, "", "setups", "not an array");
    cJSON_ArrayForEach(e, setups) {
        char at[32];
        snprintf(at, sizeof at, "setups[%d]", i++);
        if (!setup_ok(w, e, at) || !need(w, e, at, "probe", cJSON_IsString)) return 0;
    }
    i = 0;
    cJSON_ArrayForEach(run, key(doc, "runs")) {
        char at[32];
        snprintf(at, sizeof at, "runs[%d]", i++);
        if (!run_ok(w, run, at, world)) return 0;
    }
    i = 0;
    cJSON_ArrayForEach(e, key(doc, "expectations")) {
        char at[40];
        snprintf(at, sizeof at, "expectations[%d]", i++);
        if (!cJSON_IsObject(e) || !need(w, e, at, "message", cJSON_IsString)) return 0;
    }
    const cJSON *err = key(doc, "error");
    if (cJSON_IsObject(err) && !(need(w, err, "error", "message", cJSON_IsString) && whole(w, err, "error", "rank", 0, 65535, 0))) return 0;
    return 1;
}

// cJSON's allocations, watched: "out of memory" is not "not valid JSON". Process-wide because cJSON's
// hooks are (cJSON_InitHooks takes plain function pointers, no context)
static int oom;
static void *watched_malloc(size_t n) {
    void *p = malloc(n);
    oom |= !p;
    return p;
}

// What the tree of buf costs: one cJSON node (64 bytes, 80 with malloc's header) per value, and the
// text of every string and key once more. A report of "0," x N costs 40 times its size.
static double tree_bytes(const char *buf, size_t n, double *values) {
    double v = 1;
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        char c = buf[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = 0;
        } else if (c == '"') in_string = 1;
        else if (c == ',' || c == '[' || c == '{') v++;
    }
    *values = v;
    return v * 80.0 + (double)n;
}

// the memory this process may still take: the cgroup's limit less its use, the address-space limit,
// the machine's available memory; the least of them (bytes, or INFINITY when none is known)
static double memory_left(void) {
    double left = INFINITY;
    char line[256];
    unsigned long long a, b;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (f && fscanf(f, "%llu", &a) == 1) {
        FILE *g = fopen("/sys/fs/cgroup/memory.current", "r");
        if (g && fscanf(g, "%llu", &b) == 1) left = a > b ? (double)(a - b) : 0;
        if (g) fclose(g);
    }
    if (f) fclose(f);
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < left) left = (double)rl.rlim_cur;
    if ((f = fopen("/proc/meminfo", "r"))) {
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &a) == 1 && a * 1024.0 < left) left = a * 1024.0;
        fclose(f);
    }
    return left;
}

cJSON *gcd_report_parse(const char *buf, size_t n, const char *name, char *err, size_t len) {
    if (!n || memchr(buf, 0, n)) return snprintf(err, len, "%s: not a gradcheck-dist report (empty or binary)", name), NULL;
    double values, cost = tree_bytes(buf, n, &values), left = memory_left();
    if (cost > GCD_REPORT_MAX_TREE || cost > left) {   // refused before a byte of the tree is built
        snprintf(err, len, "%s: %.0f JSON values: reading it would take about %.1f GB of memory, over the %.1f GB %s", name, values, cost / 1e9,
                 (cost > GCD_REPORT_MAX_TREE ? GCD_REPORT_MAX_TREE : left) / 1e9,
                 cost > GCD_REPORT_MAX_TREE ? "a report may take (write a large one with --summary-only, or without --full)" : "this process may still use here");
        errno = cost > GCD_REPORT_MAX_TREE ? EFBIG : ENOMEM;
        return NULL;
    }
    cJSON_Hooks hooks = { watched_malloc, free };
    cJSON_InitHooks(&hooks);
    oom = 0;
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(buf, n, &end, 0);
    if (!doc) {
        size_t at = end ? (size_t)(end - buf) : 0;
        if (oom) snprintf(err, len, "%s: out of memory reading it (%zu bytes)", name, n), errno = ENOMEM;
        else snprintf(err, len, "%s: not valid JSON (%s at byte %zu of %zu)", name, at >= n ? "ends early: truncated?" : "syntax error", at, n);
        return NULL;
    }
    for (const char *s = end; s < buf + n; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r') {
            snprintf(err, len, "%s: not valid JSON (bytes after the report at byte %zu)", name, (size_t)(s - buf));
            cJSON_Delete(doc);
            return NULL;
        }
    char why_buf[512] = "";
    why w = { why_buf, sizeof why_buf };
    if (!doc_ok(&w, doc)) {
        snprintf(err, len, "%s: %s", name, why_buf);
        cJSON_Delete(doc);
        return NULL;
    }
    return doc;
}

cJSON *gcd_report_load(const char *path, char *err, size_t len) {
    int std = !strcmp(path, "-");
    int fd = std ? 0 : open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);   // a FIFO must not block the open
    if (fd < 0) return snprintf(err, len, "%s: %s", path, strerror(errno)), NULL;
    struct stat st;
    if (!std && (fstat(fd, &st) || !S_ISREG(st.st_mode))) {
        close(fd);
        return snprintf(err, len, "%s: not a regular file (give a report file, or - for stdin)", path), NULL;
    }
    if (!std && (uint64_t)st.st_size > GCD_REPORT_MAX_BYTES) {
        close(fd);
        return snprintf(err, len, "%s: %lld bytes, over the %llu a report may have", path, (long long)st.st_size, (unsigned long long)GCD_REPORT_MAX_BYTES), NULL;
    }
    gcd_sb b = { 0 };
    char chunk[65536];
    ssize_t k;
    int rc = 0;
    while ((k = read(fd, chunk, sizeof chunk)) != 0) {
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k < 0) { rc = errno; break; }
        if (b.len + (size_t)k > GCD_REPORT_MAX_BYTES) { rc = EFBIG; break; }
        gcd_sb_append(&b, chunk, (size_t)k);
    }
    if (!std) close(fd);
    cJSON *doc = NULL;
    if (rc == EFBIG) snprintf(err, len, "%s: over the %llu bytes a report may have", path, (unsigned long long)GCD_REPORT_MAX_BYTES);
    else if (rc) snprintf(err, len, "%s: read error: %s", path, strerror(rc));
    else doc = gcd_report_parse(b.s ? b.s : "", b.len, path, err, len);
    int saved = errno;   // ENOMEM: the machine's limit, not the file's fault
    gcd_sb_free(&b);
    errno = saved;
    return doc;
}
