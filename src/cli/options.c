// `run`'s options: parsing and checking every argument before any rank starts (exit 2), with the
// nearest known word for a near miss.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/prctl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

// options


const char *command = "";

int bad(const char *flag, const char *fmt, const char *value) {
    char *v = gcd_term_str(value ? value : "");   // a hostile path or name never reaches the terminal raw
    fprintf(stderr, "gradcheck-dist: %s: ", flag);
    fprintf(stderr, fmt, v);
    free(v);
    fprintf(stderr, " (see gradcheck-dist %s--help)\n", command);
    return 2;
}

// edit distance (insertions, deletions, substitutions; a swap of neighbours counts one)
static int distance(const char *a, const char *b) {
    int n = (int)strlen(b), d[3][64];
    if (strlen(a) >= 63 || n >= 63) return 99;
    for (int j = 0; j <= n; j++) d[0][j] = j;
    for (int i = 1; a[i - 1]; i++) {
        int *cur = d[i % 3], *prev = d[(i + 2) % 3], *prev2 = d[(i + 1) % 3];
        cur[0] = i;
        for (int j = 1; j <= n; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]), del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && prev2[j - 2] + 1 < cur[j]) cur[j] = prev2[j - 2] + 1;
        }
    }
    return d[strlen(a) % 3][n];
}

// "unknown option", with the nearest known word when it is a near miss (at most 2 edits, under half the word)
int unknown(const char *what, const char *word, const char *const *known) {
    const char *best = NULL;
    int bd = 3;
    for (int k = 0; known[k]; k++) {
        int d = distance(word, known[k]);
        if (d < bd && 2 * d < (int)strlen(known[k])) bd = d, best = known[k];
    }
    char msg[128];
    if (best) snprintf(msg, sizeof msg, "%s; did you mean %s?", what, best);
    else snprintf(msg, sizeof msg, "%s", what);
    return bad(word, "%s", msg);
}

int parse_int(const char *flag, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        char what[96];
        snprintf(what, sizeof what, "expected an integer from %ld to %ld, got '%%s'", lo, hi);
        return bad(flag, what, v);
    }
    *out = x;
    return 0;
}

static int parse_modes(const char *v, options *o) {
    o->nmode = 0;
    o->mode_given = 1;
    if (!strcmp(v, "all")) {
        for (int m = 0; m < GCD_GATHER_COUNT; m++) o->mode[o->nmode++] = m;
        return 0;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int m = gcd_gather_mode_parse(t);
        if (m < 0) return bad("--mode", "unknown mode '%s': expected off, on, local, avg or all", t);
        for (int i = 0; i < o->nmode; i++)
            if (o->mode[i] == m) return bad("--mode", "mode '%s' is listed twice", t);
        o->mode[o->nmode++] = m;
    }
    return o->nmode ? 0 : bad("--mode", "no mode in '%s'", v);
}

// Checked before any work: the report's directory must exist and take files, and the path must not be
// a directory; the message names flag. NULL: the default JSON report, reports/ here.
int report_path_ok(const char *flag, const char *path) {
    if (!path) {
        const char *dir = access("reports", F_OK) == 0 ? "reports" : ".";
        if (access(dir, W_OK | X_OK) == 0) return 0;
        char msg[PATH_MAX + 96];
        snprintf(msg, sizeof msg, "the default report goes into %s/, which cannot be written here: %s (give --json PATH or --no-json)",
                 strcmp(dir, ".") ? dir : "reports", strerror(errno));
        return bad(flag, "%s", msg);
    }
    if (!strcmp(path, "-")) return 0;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return bad(flag, "'%s' is a directory", path);
    char err[PATH_MAX + 256];
    if (gcd_output_check(flag, path, err, sizeof err) == -2) {   // a link another user planted, a FIFO nobody reads
        char *e = gcd_term_str(err);
        fprintf(stderr, "gradcheck-dist: %s\n", e);
        free(e);
        return 2;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    if (access(dir, W_OK | X_OK)) {
        char msg[PATH_MAX + 64];
        snprintf(msg, sizeof msg, "cannot write into '%s': %s", dir, strerror(errno));
        return bad(flag, "%s", msg);
    }
    return 0;
}

// --junit PATH: as --json's, and not the same file or stream however spelled (-, /dev/stdout,
// /proc/self/fd/1, a link, a dangling link to the --json path, a hard link)
int junit_path_ok(const char *junit, const char *json) {
    if (json && gcd_output_same(junit, json)) return bad("--junit", "'%s' is also the --json path (one file or one stream, however spelled): give each its own", junit);
    return report_path_ok("--junit", junit);
}

int parse_run(int argc, char **argv, options *o) {
    *o = (options){ .probe = "all", .lr = 0.1, .backend = "mpi", .timeout = 300 };
    const char *env_timeout = getenv("GCD_TIMEOUT");
    if (env_timeout && *env_timeout) {
        char *end;
        o->timeout = strtod(env_timeout, &end);
        if (end == env_timeout || *end || !(o->timeout > 0 && o->timeout <= 1e6)) return bad("GCD_TIMEOUT", "expected seconds from 0 to 1e6, got '%s'", env_timeout);
    }
    o->cfg = (gcd_probe_cfg){ .seed = 42, .batch = 4, .dim_img = 8, .dim_txt = 6, .dim_emb = 4 };
    for (int m = 0; m < GCD_GATHER_COUNT; m++) o->mode[o->nmode++] = m;
    for (int i = 2; i < argc; i++) {
        char flag[64];
        const char *a = argv[i], *eq = strchr(a, '='), *v = NULL;
        snprintf(flag, sizeof flag, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
        static const char *const valued[] = { "--world", "--probe", "--mode", "--inputs", "--seed", "--steps", "--lr",
                                              "--batch", "--dim-img", "--dim-txt", "--dim-emb", "--hostfile", "--backend",
                                              "--json", "--timeout", "--junit", NULL },
                                 *const known[] = { "--world", "--probe", "--mode", "--inputs", "--seed", "--steps", "--lr",
                                              "--batch", "--dim-img", "--dim-txt", "--dim-emb", "--hostfile", "--backend",
                                              "--json", "--timeout", "--junit", "--no-json", "--summary-only", "--full", "--local-loss", "--oversubscribe", "--help", NULL };
        int takes = 0;
        for (int k = 0; valued[k]; k++) takes |= !strcmp(flag, valued[k]);
        if (takes) {
            if (eq) v = eq + 1;
            else if (i + 1 < argc) v = argv[++i];
            else return bad(flag, "%s", "missing value");
            if (!*v) return bad(flag, "%s", "empty value");
            if (!eq && !strncmp(v, "--", 2)) return bad(flag, "missing value: '%s' is a flag (write FLAG=VALUE for a value that starts with --)", v);
        } else if (eq) {
            int known_flag = 0;
            for (int k = 0; known[k]; k++) known_flag |= !strcmp(flag, known[k]);
            return known_flag ? bad(flag, "%s", "takes no value") : unknown("unknown option", flag, known);
        }
        long x;
        int rc = 0;
        if (!strcmp(flag, "--world")) rc = parse_int(flag, v, 1, 4096, &x), o->world = (int)x;
        else if (!strcmp(flag, "--probe")) {
            o->probe = v;
            if (strcmp(v, "all") && !gcd_probe_find(v)) rc = bad(flag, "unknown probe '%s': expected simplenet, contrastive or all", v);
        } else if (!strcmp(flag, "--mode")) rc = parse_modes(v, o);
        else if (!strcmp(flag, "--inputs")) {
            if (!strcmp(v, "seed") || !strcmp(v, "random")) o->cfg.inputs_random = !strcmp(v, "random");
            else rc = bad(flag, "expected seed or random, got '%s'", v);
        } else if (!strcmp(flag, "--seed")) rc = parse_int(flag, v, 0, (1L << 53) - 1, &x), o->cfg.seed = (uint64_t)x;   // a report's number is exact below 2^53
        else if (!strcmp(flag, "--steps")) rc = parse_int(flag, v, 0, 100000, &x), o->steps = (int)x;
        else if (!strcmp(flag, "--batch")) rc = parse_int(flag, v, 1, 1 << 20, &x), o->cfg.batch = (int)x;
        else if (!strcmp(flag, "--dim-img")) rc = parse_int(flag, v, 1, 1 << 20, &x), o->cfg.dim_img = (int)x;
        else if (!strcmp(flag, "--dim-txt")) rc = parse_int(flag, v, 1, 1 << 20, &x), o->cfg.dim_txt = (int)x;
        else if (!strcmp(flag, "--dim-emb")) rc = parse_int(flag, v, 1, 1 << 20, &x), o->cfg.dim_emb = (int)x;
        else if (!strcmp(flag, "--lr")) {
            char *end;
            o->lr = strtod(v, &end);
            if (end == v || *end || !isfinite(o->lr) || o->lr <= 0) rc = bad(flag, "expected a positive number, got '%s'", v);
        } else if (!strcmp(flag, "--timeout")) {
            char *end;
            o->timeout = strtod(v, &end);
            if (end == v || *end || !(o->timeout > 0 && o->timeout <= 1e6)) rc = bad(flag, "expected seconds from 0 to 1e6, got '%s'", v);
        } else if (!strcmp(flag, "--hostfile")) {
            o->hostfile = v;
            if (access(v, R_OK)) rc = bad(flag, "cannot read '%s'", v);
        } else if (!strcmp(flag, "--backend")) {
            o->backend = v;
            if (strcmp(v, "mpi") && strcmp(v, "nccl")) rc = bad(flag, "expected mpi or nccl, got '%s'", v);
        } else if (!strcmp(flag, "--json")) o->json = v;
        else if (!strcmp(flag, "--junit")) o->junit = v;
        else if (!strcmp(flag, "--no-json")) o->no_json = 1;
        else if (!strcmp(flag, "--summary-only")) o->summary_only = 1;
        else if (!strcmp(flag, "--full")) o->full = 1;
        else if (!strcmp(flag, "--oversubscribe")) o->oversubscribe = 1;
        else if (!strcmp(flag, "--local-loss")) o->cfg.local_loss = 1;
        else return unknown("unknown option", flag, known);
        if (rc) return rc;
    }
    if (o->no_json && o->json) return bad("--no-json", "%s", "conflicts with --json");
    if (o->no_json && o->summary_only) return bad("--summary-only", "%s", "conflicts with --no-json: there is no report to leave values out of");
    if (o->full && o->summary_only) return bad("--full", "%s", "conflicts with --summary-only");
    if (!o->no_json && report_path_ok("--json", o->json)) return 2;
    if (o->junit && junit_path_ok(o->junit, o->json)) return 2;
    if (o->cfg.local_loss && !strcmp(o->probe, "simplenet")) return bad("--local-loss", "%s", "applies to the contrastive probe only");
    if (o->cfg.inputs_random && !strcmp(o->probe, "contrastive"))
        return bad("--inputs", "%s", "applies to the simplenet probe only (the contrastive probe's inputs always differ per rank)");
    return 0;
}
