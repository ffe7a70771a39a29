// Every command's options in one table, which the parser, "did you mean" and --help all read; `run`'s
// arguments are checked before any rank starts (exit 2).
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

#include "cli/cli.h"

// ----------------------------------------------------------------------------
// the table

const gcd_option gcd_options[] = {
    { OPT_WORLD, "--world", CMD_RUN, "N", NULL, "ranks to launch (default 2); inside mpirun it must equal the job's size" },
    { OPT_PROBE, "--probe", CMD_RUN, "NAME|all", "simplenet,contrastive,tp,all", "simplenet, contrastive, tp or all (default all)" },
    { OPT_MODE, "--mode", CMD_RUN, "LIST|all", "off,on,local,avg,all",
      "gather modes under test, comma-separated: off,on,local,avg. Without it every\n"
      "mode runs: on is under test, the others are controls, each of which must show\n"
      "its known defect" },
    { OPT_INPUTS, "--inputs", CMD_RUN, "seed|random", "seed,random", "simplenet: the seed's inputs on every rank, or rank-distinct ones (default seed)" },
    { OPT_SEED, "--seed", CMD_RUN, "S", NULL, "seed for weights and inputs (default 42)" },
    { OPT_LOCAL_LOSS, "--local-loss", CMD_RUN, NULL, NULL, "contrastive: open_clip local_loss=True" },
    { OPT_BATCH, "--batch", CMD_RUN, "B", NULL, "contrastive: rows per rank (default 4)" },
    { OPT_DIM_IMG, "--dim-img", CMD_RUN, "D", NULL, "contrastive: image features (default 8)" },
    { OPT_DIM_TXT, "--dim-txt", CMD_RUN, "D", NULL, "contrastive: text features (default 6)" },
    { OPT_DIM_EMB, "--dim-emb", CMD_RUN, "E", NULL, "contrastive: embedding size (default 4)" },
    { OPT_STEPS, "--steps", CMD_RUN, "N", NULL, "then take N SGD steps per mode (default 0, at most 100000)" },
    { OPT_LR, "--lr", CMD_RUN, "X", NULL, "the steps' learning rate (default 0.1)" },
    { OPT_BACKEND, "--backend", CMD_RUN, "mpi|nccl", "mpi,nccl", "collectives over Open MPI on the CPU, or NCCL on CUDA devices (default mpi)" },
    { OPT_HOSTFILE, "--hostfile", CMD_RUN, "FILE", NULL, "passed to mpirun" },
    { OPT_OVERSUBSCRIBE, "--oversubscribe", CMD_RUN, NULL, NULL, "more ranks than the Slurm allocation's tasks (else refused, exit 2)" },
    { OPT_TIMEOUT, "--timeout", CMD_RUN | CMD_CHECK, "S", NULL,
      "run: a collective not complete after S seconds stops the run, exit 3 (default\n"
      "300, or GCD_TIMEOUT): a stopped, hung or dead rank never hangs the job;\n"
      "check: a scan longer than S seconds stops, exit 3 (default: no limit)" },
    { OPT_REF, "--ref", CMD_CHECK, "FILE", NULL,
      "the single-process reference: same starting weights, the whole batch, world 1\n"
      "(sketch dumps: also one rank of another run, such as world W/2: docs/guard.md);\n"
      "a second --ref, the same step with the rows in another order, measures each\n"
      "tensor's rounding noise (docs/check-verdicts.md)" },
    { OPT_IGNORE, "--ignore", CMD_CHECK, "GLOB", NULL, "leave parameters matching GLOB out (repeatable; fnmatch, e.g. 'head.*')" },
    { OPT_TOL, "--tol", CMD_CHECK, "X", NULL,
      "every tensor's relative tolerance (default per tensor: its dtypes and the recorded\n"
      "precision, F64 1e-9, F32 1e-5, F16/BF16 1e-2; or its noise, with two --ref)" },
    { OPT_JSON, "--json", CMD_RUN | CMD_CHECK, "PATH|-", NULL,
      "where the JSON report goes (run: default reports/gradcheck-<UTC time>.json;\n"
      "check: none without --json; -: stdout, and the table goes to stderr)" },
    { OPT_NO_JSON, "--no-json", CMD_RUN | CMD_CHECK, NULL, NULL, "write no report (check's default)" },
    { OPT_JUNIT, "--junit", CMD_RUN | CMD_CHECK, "PATH|-", NULL, "also write the result as JUnit XML for CI (also with --no-json)" },
    { OPT_SUMMARY_ONLY, "--summary-only", CMD_RUN, NULL, NULL, "leave tensor values out of the report, keep the statuses" },
    { OPT_FULL, "--full", CMD_RUN, NULL, NULL, "every tensor's values (default: one over 4096 elements as its norm and first 16)" },
    { OPT_SNIPPET, "--snippet", CMD_CHECK, NULL, NULL, "print the recipe that writes the dumps (PyTorch, Lightning) and exit" },
    { OPT_FORMAT, "--format", CMD_REPORT, "text|md|junit", "text,md,junit",
      "the table (as wide as COLUMNS, else the terminal, else 100 columns),\n"
      "a Markdown ticket, or JUnit XML (default text)" },
    { OPT_HELP, "--help", CMD_RUN | CMD_CHECK | CMD_REPORT, NULL, NULL, "this command's usage" },
    { 0 },
};

// --help: the options of the commands in cmds, one a line, the help in a column (continued under it)
void gcd_options_help(FILE *f, unsigned cmds) {
    for (const gcd_option *o = gcd_options; o->name; o++) {
        if (!(o->cmds & cmds)) continue;
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        if (strlen(left) > 20) fprintf(f, "  %s\n  %-20s ", left, "");
        else fprintf(f, "  %-20s ", left);
        for (const char *h = o->help; *h; h++) {
            fputc(*h, f);
            if (*h == '\n') fprintf(f, "  %-20s ", "");
        }
        fputc('\n', f);
    }
}

// ----------------------------------------------------------------------------
// parsing

const char *command = "";

int bad(const char *flag, const char *fmt, const char *value) {
    char *v = gcd_term_str(value ? value : ""), *f = gcd_term_str(flag);   // a hostile path or name never reaches the terminal raw
    fprintf(stderr, "gradcheck-dist: %s: ", f);   // the flag too: an unknown option or command is the user's word
    fprintf(stderr, fmt, v);
    free(v), free(f);
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

// "WHERE: WHAT", with the nearest known word when word is a near miss (at most 2 edits, under half the word)
static int unknown_in(const char *where, const char *what, const char *word, const char *const *known) {
    const char *best = NULL;
    int bd = 3;
    for (int k = 0; known[k]; k++) {
        int d = distance(word, known[k]);
        if (d < bd && 2 * d < (int)strlen(known[k])) bd = d, best = known[k];
    }
    char msg[512];
    if (best) snprintf(msg, sizeof msg, "%s; did you mean %s?", what, best);
    else snprintf(msg, sizeof msg, "%s", what);
    return bad(where, "%s", msg);
}
int unknown(const char *what, const char *word, const char *const *known) { return unknown_in(word, what, word, known); }

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

// "unknown option", with the nearest of cmd's options
int gcd_unknown_option(unsigned cmd, const char *word) {
    const char *known[sizeof gcd_options / sizeof *gcd_options];
    int n = 0;
    for (const gcd_option *o = gcd_options; o->name; o++)
        if (o->cmds & cmd) known[n++] = o->name;
    known[n] = NULL;
    return unknown("unknown option", word, known);
}

// v one of the comma-separated set? If not: exit 2 naming the set, and the nearest value for a near miss
static int one_of(const char *flag, const char *v, const char *set) {
    char buf[128], list[160] = "";
    const char *word[16];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", set);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n < 15; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(v, t)) return 0;
        word[n++] = t;
    }
    word[n] = NULL;
    for (int k = 0; k < n; k++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k == 0 ? "" : k == n - 1 ? " or " : ", ", word[k]);
    char what[256];
    snprintf(what, sizeof what, "unknown value '%s': expected %s", v, list);
    return unknown_in(flag, what, v, word);
}

// The next argument of command cmd: *opt is its entry in the table and *v its value (or NULL), or
// *opt is NULL and *v a word that is no option (a dump, a file). 0, or 2 after saying what is wrong.
int gcd_next_option(int argc, char **argv, int *i, unsigned cmd, const gcd_option **opt, const char **v) {
    const char *a = argv[*i], *eq = strchr(a, '=');
    *opt = NULL, *v = NULL;
    if (a[0] != '-' || !a[1]) return *v = a, 0;
    char flag[64];
    snprintf(flag, sizeof flag, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
    for (const gcd_option *o = gcd_options; o->name && !*opt; o++)
        if ((o->cmds & cmd) && !strcmp(flag, o->name)) *opt = o;
    if (!*opt) return gcd_unknown_option(cmd, flag);
    if (!(*opt)->arg) return eq ? bad(flag, "%s", "takes no value") : 0;
    if (eq) *v = eq + 1;
    else if (*i + 1 < argc) *v = argv[++*i];
    else return bad(flag, "%s", "missing value");
    if (!**v) return bad(flag, "%s", "empty value");
    if (!eq && !strncmp(*v, "--", 2)) return bad(flag, "missing value: '%s' is a flag (write FLAG=VALUE for a value that starts with --)", *v);
    if ((*opt)->values && (*opt)->id != OPT_MODE) return one_of(flag, *v, (*opt)->values);   // --mode: a list, each checked
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
        if (m < 0) return !strcmp(t, "all") ? bad("--mode", "all stands alone, not in a list: '%s'", v) : one_of("--mode", t, "off,on,local,avg,all");
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
    if (strlen(path) >= PATH_MAX) {   // it would be cut to fit the buffers it passes through: the user's input, exit 2
        char msg[96];
        snprintf(msg, sizeof msg, "a path of %zu bytes, longer than this system's PATH_MAX (%d)", strlen(path), PATH_MAX);
        return bad(flag, "%s", msg);
    }
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
        const gcd_option *opt;
        const char *v;
        int rc = gcd_next_option(argc, argv, &i, CMD_RUN, &opt, &v);
        if (!rc && !opt) rc = gcd_unknown_option(CMD_RUN, v);   // run takes no word
        if (rc) return rc;
        const char *flag = opt->name;
        long x;
        switch ((opt_id)opt->id) {
        case OPT_WORLD: rc = parse_int(flag, v, 1, 4096, &x), o->world = (int)x; break;
        case OPT_PROBE:   // one of the table's values, which name every probe
            o->probe = v;
            if (strcmp(v, "all") && !gcd_probe_find(v)) GCD_FATAL("--probe %s: in the options table but not a probe", v);
            break;
        case OPT_MODE: rc = parse_modes(v, o); break;
        case OPT_INPUTS: o->cfg.inputs_random = !strcmp(v, "random"); break;
        case OPT_SEED: rc = parse_int(flag, v, 0, (1L << 53) - 1, &x), o->cfg.seed = (uint64_t)x; break;   // a report's number is exact below 2^53
        case OPT_STEPS: rc = parse_int(flag, v, 0, 100000, &x), o->steps = (int)x; break;
        case OPT_BATCH: rc = parse_int(flag, v, 1, 1 << 20, &x), o->cfg.batch = (int)x; break;
        case OPT_DIM_IMG: rc = parse_int(flag, v, 1, 1 << 20, &x), o->cfg.dim_img = (int)x; break;
        case OPT_DIM_TXT: rc = parse_int(flag, v, 1, 1 << 20, &x), o->cfg.dim_txt = (int)x; break;
        case OPT_DIM_EMB: rc = parse_int(flag, v, 1, 1 << 20, &x), o->cfg.dim_emb = (int)x; break;
        case OPT_LR: {
            char *end;
            o->lr = strtod(v, &end);
            if (end == v || *end || !isfinite(o->lr) || o->lr <= 0) rc = bad(flag, "expected a positive number, got '%s'", v);
            break;
        }
        case OPT_TIMEOUT: {
            char *end;
            o->timeout = strtod(v, &end);
            if (end == v || *end || !(o->timeout > 0 && o->timeout <= 1e6)) rc = bad(flag, "expected seconds from 0 to 1e6, got '%s'", v);
            break;
        }
        case OPT_HOSTFILE:
            o->hostfile = v;
            if (access(v, R_OK)) rc = bad(flag, "cannot read '%s'", v);
            break;
        case OPT_BACKEND: o->backend = v; break;   // one of the table's values
        case OPT_JSON: o->json = v; break;
        case OPT_JUNIT: o->junit = v; break;
        case OPT_NO_JSON: o->no_json = 1; break;
        case OPT_SUMMARY_ONLY: o->summary_only = 1; break;
        case OPT_FULL: o->full = 1; break;
        case OPT_OVERSUBSCRIBE: o->oversubscribe = 1; break;
        case OPT_LOCAL_LOSS: o->cfg.local_loss = 1; break;
        default: GCD_FATAL("run: option %s in the table but not parsed", flag);   // --help: main.c answered it
        }
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
