/*
 * report_io: a report's JSON text in and out. Printing (each double in its shortest exact form),
 * writing (whole or not at all; devices and FIFOs straight through, never replaced), and loading
 * (bounded, every key the renderings read validated, with the JSON path of a bad one). No probe, no
 * check, no MPI: the fuzz target links this file and the renderings alone.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "report.h"

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
// printing: every double in its shortest form that reads back bit-exact (cJSON_Print stops at 15
// digits when that is "close enough"); arrays of plain values on one line. Into a file the text is
// streamed, 64 KiB at a time: a --full report is never held twice, as a tree and as text.

typedef struct {
    gcd_sb b;
    FILE *f;   // NULL: the whole text stays in b
    int ok;    // every fwrite wrote all it was given
} printer;

static void spill(printer *p, size_t at_least) {
    if (!p->f || p->b.len < at_least || !p->b.len) return;
    p->ok &= fwrite(p->b.s, 1, p->b.len, p->f) == p->b.len;
    p->b.len = 0;
}

int gcd_num_shortest(char buf[32], double v) {
    int k = 0;
    for (int digits = 15; digits <= 17; digits++)   // 17 digits always read back
        if ((k = snprintf(buf, 32, "%.*g", digits, v)), digits == 17 || strtod(buf, NULL) == v) break;
    return k;
}

static void print_num(gcd_sb *b, double v) {
    char buf[32];
    if (!isfinite(v)) return gcd_sb_append(b, "null", 4);   // the builders never store these as numbers
    gcd_sb_append(b, buf, (size_t)gcd_num_shortest(buf, v));
}

static void print_str(gcd_sb *b, const char *s) {
    gcd_sb_append(b, "\"", 1);
    for (const char *p = s; *p; p++) {
        size_t k = strcspn(p, "\"\\\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f");
        gcd_sb_append(b, p, k);
        p += k;
        if (!*p) break;
        if (*p == '"' || *p == '\\') gcd_sb_printf(b, "\\%c", *p);
        else if (*p == '\n') gcd_sb_printf(b, "\\n");
        else if (*p == '\t') gcd_sb_printf(b, "\\t");
        else gcd_sb_printf(b, "\\u%04x", (unsigned char)*p);
    }
    gcd_sb_append(b, "\"", 1);
}

static void print_value(printer *p, const cJSON *v, int depth) {
    gcd_sb *b = &p->b;
    if (cJSON_IsNull(v) || cJSON_IsInvalid(v)) gcd_sb_printf(b, "null");
    else if (cJSON_IsTrue(v)) gcd_sb_printf(b, "true");
    else if (cJSON_IsFalse(v)) gcd_sb_printf(b, "false");
    else if (cJSON_IsNumber(v)) print_num(b, v->valuedouble);
    else if (cJSON_IsString(v)) print_str(b, v->valuestring);
    else if (cJSON_IsRaw(v)) gcd_sb_printf(b, "%s", v->valuestring);
    else {
        int object = cJSON_IsObject(v), flat = !object;
        const cJSON *c;
        cJSON_ArrayForEach(c, v) flat &= !cJSON_IsArray(c) && !cJSON_IsObject(c);
        gcd_sb_printf(b, "%c", object ? '{' : '[');
        int i = 0;
        cJSON_ArrayForEach(c, v) {
            if (!flat) gcd_sb_printf(b, "%s\n%*s", i ? "," : "", 2 * (depth + 1), "");
            else if (i) gcd_sb_append(b, ", ", 2);
            i++;
            if (object) print_str(b, c->string), gcd_sb_printf(b, ": ");
            print_value(p, c, depth + 1);
            spill(p, 1 << 16);
        }
        if (!flat && i) gcd_sb_printf(b, "\n%*s", 2 * depth, "");
        gcd_sb_printf(b, "%c", object ? '}' : ']');
    }
}

char *gcd_json_print(const cJSON *doc) {
    printer p = { .ok = 1 };
    print_value(&p, doc, 0);
    return p.b.s;
}

// the text and a newline into f; 0 when a write failed (errno says why)
static int print_to(const cJSON *doc, FILE *f) {
    printer p = { .f = f, .ok = 1 };
    print_value(&p, doc, 0);
    gcd_sb_append(&p.b, "\n", 1);
    spill(&p, 0);
    gcd_sb_free(&p.b);
    return p.ok;
}

// ----------------------------------------------------------------------------
// writing: whole or not at all

// Straight into what is at path: a device, a FIFO, stdout. ENOSPC and short writes are errors.
static int emit(const cJSON *doc, const char *text, FILE *f) { return doc ? print_to(doc, f) : fputs(text, f) >= 0; }

static int write_direct(const cJSON *doc, const char *text, const char *what, const char *path, char *err, size_t len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;
    int ok = f && emit(doc, text, f) && fflush(f) == 0;
    int saved = errno;
    if (f && f != stdout) ok &= fclose(f) == 0;
    if (!ok) snprintf(err, len, "%s: cannot write %s: %s", what, strcmp(path, "-") ? path : "to stdout", strerror(saved ? saved : EIO));
    return ok ? 0 : -1;
}

// A writer killed mid-write leaves PATH.tmp.XXXXXX: the next write of PATH removes those over an hour
// old (exactly that name pattern, never anything else, never a fresh one: it may be another writer's).
static void remove_stale_temporaries(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
    const char *base = slash ? slash + 1 : path;
    size_t nb = strlen(base);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *n = e->d_name;
        if (strncmp(n, base, nb) || strncmp(n + nb, ".tmp.", 5) || strlen(n + nb + 5) != 6) continue;
        char full[PATH_MAX * 2];
        struct stat st;
        snprintf(full, sizeof full, "%s/%s", dir, n);
        if (lstat(full, &st) == 0 && S_ISREG(st.st_mode) && time(NULL) - st.st_mtime > 3600) unlink(full);
    }
    if (d) closedir(d);
}

static int write_file(const cJSON *doc, const char *text, const char *what, const char *path, char *err, size_t len);

int gcd_report_write(const cJSON *doc, const char *path, char *err, size_t len) {
    return write_file(doc, NULL, "report", path, err, len);
}

int gcd_text_write(const char *text, const char *what, const char *path, char *err, size_t len) {
    return write_file(NULL, text, what, path, err, len);
}

// doc printed, or text as it is, into path: whole or not at all
static int write_file(const cJSON *doc, const char *text, const char *what, const char *path, char *err, size_t len) {
    struct stat st;
    char *real = NULL;
    if (strcmp(path, "-") && lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {   // a link: its target is what is replaced
        real = realpath(path, NULL);
        if (!real && errno == ENOENT) {   // dangling: the target is created, in its own directory
            char target[PATH_MAX];
            ssize_t k = readlink(path, target, sizeof target - 1);
            if (k > 0) {
                target[k] = 0;
                if (target[0] == '/' || !strchr(path, '/')) real = gcd_strdup(target);
                else {
                    real = gcd_malloc(strlen(path) + (size_t)k + 2);
                    sprintf(real, "%.*s/%s", (int)(strrchr(path, '/') - path), path, target);
                }
            }
        }
        if (real) path = real;
    }
    if (!strcmp(path, "-") || (stat(path, &st) == 0 && !S_ISREG(st.st_mode))) {   // never renamed over, never removed
        int rc = S_ISDIR(st.st_mode) && strcmp(path, "-") ? (snprintf(err, len, "%s: %s is a directory", what, path), -1) : write_direct(doc, text, what, path, err, len);
        free(real);
        return rc;
    }
    remove_stale_temporaries(path);
    char *tmp = malloc(strlen(path) + 16);
    mallocCheck(tmp);
    sprintf(tmp, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
    int ok = f && emit(doc, text, f) && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    if (f) ok &= fclose(f) == 0;
    else if (fd >= 0) close(fd);
    mode_t mask = umask(0);
    umask(mask);
    if (ok) chmod(tmp, 0666 & ~mask);   // mkstemp makes 0600; a report is as any new file here
    if (ok && rename(tmp, path) != 0) ok = 0, saved = errno;
    if (!ok) {
        snprintf(err, len, "%s: cannot write %s: %s", what, path, strerror(saved ? saved : EIO));
        if (fd >= 0) unlink(tmp);
    }
    free(tmp), free(real);
    return ok ? 0 : -1;
}

// ----------------------------------------------------------------------------
// reading: a gradcheck-dist report of exactly the schema this build writes, every key the renderings
// read checked, and every number they turn into a count or an index within range. A bad key is named
// by its JSON path: runs[0].params[3].shape.

typedef struct {
    char *err;
    size_t len;
} why;

static int bad(why *w, const char *path, const char *key, const char *what) {
    snprintf(w->err, w->len, "%s%s%s: %s", path, *path && key ? "." : "", key ? key : "", what);
    return 0;
}

static const cJSON *key(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static int need(why *w, const cJSON *o, const char *path, const char *k, cJSON_bool (*is)(const cJSON *)) {
    return is(key(o, k)) ? 1 : bad(w, path, k, "missing or of the wrong type");
}

// an integer in [lo, hi], or absent/null when optional
static int whole(why *w, const cJSON *o, const char *path, const char *k, double lo, double hi, int optional) {
    const cJSON *v = key(o, k);
    if (optional && (!v || cJSON_IsNull(v))) return 1;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
        char what[96];
        snprintf(what, sizeof what, "expected a whole number from %.0f to %.0f", lo, hi);
        return bad(w, path, k, what);
    }
    return 1;
}

// shape: whole numbers whose product is at most 2^40 (null where a check's tensor has none); *n: the product
static int shape_ok(why *w, const cJSON *p, const char *path, double *n) {
    const cJSON *s = key(p, "shape"), *d;
    *n = 1;
    if (cJSON_IsNull(s)) return *n = -1, 1;
    if (!cJSON_IsArray(s) || cJSON_GetArraySize(s) > 8) return bad(w, path, "shape", "not an array of at most 8 whole numbers");
    cJSON_ArrayForEach(d, s) {
        if (!cJSON_IsNumber(d) || d->valuedouble != floor(d->valuedouble) || d->valuedouble < 0 || d->valuedouble > INT_MAX)
            return bad(w, path, "shape", "not an array of whole numbers from 0 to 2^31-1");
        *n *= d->valuedouble;
    }
    return *n <= 1099511627776.0 ? 1 : bad(w, path, "shape", "its element count is over 2^40");
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
            return bad(w, path, k, "not an elided tensor {elided: true, numel: as many values as the shape holds, norm, first: at most 16 values}");
        cJSON_ArrayForEach(x, first) if (!number_ok(x)) return bad(w, path, k, "holds a value that is not a number");
        return 1;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != n) return bad(w, path, k, "not an array of as many values as the shape holds");
    const cJSON *x;
    cJSON_ArrayForEach(x, v) if (!number_ok(x)) return bad(w, path, k, "holds a value that is not a number");
    return 1;
}

// a probe's setup: {params: [{name, shape, init}], inputs: [{rank, tensors: [{name, shape, data}]}]}
static int setup_ok(why *w, const cJSON *s, const char *path) {
    if (!cJSON_IsObject(s)) return bad(w, path, NULL, "not an object");
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
        if (!cJSON_IsObject(r) || !need(w, r, at, "tensors", cJSON_IsArray)) return bad(w, at, "tensors", "missing or of the wrong type");
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
    if (!cJSON_IsObject(run)) return bad(w, path, NULL, "not an object");
    int check = cJSON_IsString(key(run, "probe")) && !strcmp(key(run, "probe")->valuestring, "check");
    if (!(need(w, run, path, "probe", cJSON_IsString) && need(w, run, path, "mode", cJSON_IsString) && need(w, run, path, "params", cJSON_IsArray) &&
          need(w, run, path, "findings", cJSON_IsArray) && whole(w, run, path, "world", 1, 65536, 0) &&
          (check ? need(w, run, path, "dumps", cJSON_IsArray) : need(w, run, path, "loss", cJSON_IsObject) && whole(w, run, path, "steps", 0, 1e6, 0))))
        return 0;
    int W = (int)key(run, "world")->valuedouble;
    if (W != world) return bad(w, path, "world", "differs from environment.world");
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
        if (!cJSON_IsObject(p)) return bad(w, at, NULL, "not an object");
        if (!(need(w, p, at, "name", cJSON_IsString) && need(w, p, at, "status", cJSON_IsString) && shape_ok(w, p, at, &n) &&
              whole(w, p, at, "ranks_with_grad", 0, W, 0) && whole(w, p, at, "nonfinite", 0, 9e15, 0)))
            return 0;
        if (!values_ok(w, key(p, "reduced"), at, "reduced", n) || !values_ok(w, key(p, "reference"), at, "reference", n)) return 0;
        const cJSON *local = key(p, "local"), *r;
        if (local && !cJSON_IsNull(local)) {
            if (!cJSON_IsArray(local) || cJSON_GetArraySize(local) != W) return bad(w, at, "local", "not an array of one entry per rank");
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
    if (!cJSON_IsObject(doc)) return bad(w, "", NULL, "not a gradcheck-dist report (not a JSON object)");
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
    const cJSON *run, *e, *setups = key(doc, "setups");
    if (setups && !cJSON_IsArray(setups)) return bad(w, "", "setups", "not an array");
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

static int oom;   // cJSON's allocations, watched: "out of memory" is not "not valid JSON"
static void *watched_malloc(size_t n) {
    void *p = malloc(n);
    oom |= !p;
    return p;
}

cJSON *gcd_report_parse(const char *buf, size_t n, const char *name, char *err, size_t len) {
    if (!n || memchr(buf, 0, n)) return snprintf(err, len, "%s: not a gradcheck-dist report (empty or binary)", name), NULL;
    cJSON_Hooks hooks = { watched_malloc, free };
    cJSON_InitHooks(&hooks);
    oom = 0;
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(buf, n, &end, 0);
    if (!doc) {
        size_t at = end ? (size_t)(end - buf) : 0;
        if (oom) snprintf(err, len, "%s: out of memory reading it (%zu bytes)", name, n);
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
    gcd_sb_free(&b);
    return doc;
}
