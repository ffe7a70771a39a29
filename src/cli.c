/*
 * cli: gradcheck-dist's entry point. `run` parses and checks every argument first (exit 2 before any
 * rank starts), then either launches itself under mpirun -np N or, inside an MPI job, runs as one rank:
 * every probe under every gather mode, the table and verdicts on rank 0, the JSON report.
 * `report FILE` renders a saved report as text, Markdown or JUnit XML.
 */
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

#include "check.h"
#include "comm.h"
#include "expect.h"
#include "ops.h"
#include "report.h"
#include "run.h"
#include "sha256.h"
#include "verdict.h"

extern char **environ;

#ifndef GCD_VERSION
#define GCD_VERSION "0.0.0"
#endif

static const char usage_top[] =
    "gradcheck-dist " GCD_VERSION ": finds gradients that distributed training silently drops\n"
    "\n"
    "usage:\n"
    "  gradcheck-dist run [options]        run the probes across ranks and compare every gradient\n"
    "  gradcheck-dist check DUMP...|DIR [options]   diagnose your own training's gradients (safetensors dumps)\n"
    "  gradcheck-dist report FILE|- [--format text|md|junit]   render a saved JSON report\n"
    "  gradcheck-dist --help | -V | --version | version\n"
    "  gradcheck-dist COMMAND --help       that command's usage alone\n";
static const char usage_run[] =
    "run options:\n"
    "  --world N            ranks to launch (default 2); inside mpirun it must equal the job's size\n"
    "  --probe NAME|all     simplenet, contrastive or all (default all)\n"
    "  --mode LIST|all      gather modes under test, comma-separated: off,on,local,avg. Without it every\n"
    "                       mode runs: on is under test, the others are controls that must show a finding\n"
    "  --inputs seed|random simplenet: the seed's inputs on every rank, or rank-distinct ones (default seed)\n"
    "  --seed S             seed for weights and inputs (default 42)\n"
    "  --local-loss         contrastive: open_clip local_loss=True\n"
    "  --batch B --dim-img D --dim-txt D --dim-emb E   contrastive sizes (default 4, 8, 6, 4)\n"
    "  --steps N --lr X     then take N SGD steps per mode (default 0, at most 100000; lr 0.1)\n"
    "  --backend mpi|nccl   collectives over Open MPI on the CPU, or NCCL on CUDA devices (default mpi)\n"
    "  --hostfile FILE      passed to mpirun\n"
    "  --timeout S          a collective not complete after S seconds stops the run, exit 3 (default 300,\n"
    "                       or GCD_TIMEOUT): a stopped, hung or dead rank never hangs the job\n"
    "  --json PATH|-        where the JSON report goes (default reports/gradcheck-<UTC time>.json;\n"
    "                       -: stdout, and the table goes to stderr)\n"
    "  --no-json            write no report\n"
    "  --junit PATH|-       also write the result as JUnit XML for CI (also with --no-json)\n"
    "  --summary-only       leave tensor values out of the report, keep the statuses\n"
    "  --full               every tensor's values (default: one over 4096 elements as its norm and first 16)\n"
    "progress goes to stderr: a live line on a terminal, else one line per probe and mode\n"
    "\n"
    "gather modes:\n"
    "  off    Lightning all_gather(sync_grads=False): gathered under no_grad\n"
    "  on     Lightning sync_grads=True / torch.distributed.nn.functional.all_gather\n"
    "  local  open_clip gather_with_grad=False / torchmetrics: own slot put back\n"
    "  avg    Horovod allgather: backward averages over ranks\n";
static const char usage_check[] =
    "check options:\n"
    "  DUMP...|DIR          one safetensors dump per rank (gradcheck_dist.dump_grads), or a directory of them\n"
    "  --ref FILE           the single-process reference: same starting weights, the whole batch, world 1\n"
    "  --ignore GLOB        leave parameters matching GLOB out (repeatable; fnmatch, e.g. 'head.*')\n"
    "  --tol X              relative tolerance (default from the dtypes: F64 1e-9, F32 1e-5, F16/BF16 1e-2)\n"
    "  --json PATH|- --no-json --junit PATH|-   as for run\n"
    "  --snippet            print the recipe that writes the dumps (PyTorch, Lightning) and exit\n";
static const char usage_report[] =
    "report options:\n"
    "  FILE|-               a JSON report gradcheck-dist wrote (-: read it from stdin)\n"
    "  --format text|md|junit   the table (as wide as COLUMNS, else the terminal, else 100 columns),\n"
    "                       a Markdown ticket, or JUnit XML (default text)\n";
static const char usage_tail[] =
    "statuses: none (no rank got a gradient), partial (some ranks did not), zero, nonfinite, ok,\n"
    "scaled (a multiple of the reference), mismatch (wrong direction), disagree (ranks differ after\n"
    "DDP's all-reduce; check), present (check without --ref: finite, non-zero, the same on every rank)\n"
    "\n"
    "exit status:\n"
    "  0  no unexpected finding     1  gradient findings (or a control that showed none)\n"
    "  2  bad input (flag, dump, report file)   3  runtime failure (MPI, NCCL, I/O)\n";

// NULL: every command's; "run", "check", "report": that command's alone
static int help(FILE *f, const char *cmd) {
    if (!cmd) fprintf(f, "%s\n%s\n%s\n%s\n%s", usage_top, usage_run, usage_check, usage_report, usage_tail);
    else if (!strcmp(cmd, "run")) fprintf(f, "usage: gradcheck-dist run [options]\n\n%s\n%s", usage_run, usage_tail);
    else if (!strcmp(cmd, "check")) fprintf(f, "usage: gradcheck-dist check DUMP...|DIR [options]\n\n%s\n%s", usage_check, usage_tail);
    else if (!strcmp(cmd, "report")) fprintf(f, "usage: gradcheck-dist report FILE|- [--format text|md|junit]\n\n%s", usage_report);
    else return help(f, NULL);
    return fflush(f) || ferror(f) ? 3 : 0;
}

// ----------------------------------------------------------------------------
// options

typedef struct {
    int world;                       // 0: not given
    const char *probe;               // "all" or a probe's name
    int mode[GCD_GATHER_COUNT], nmode, mode_given;
    gcd_probe_cfg cfg;
    int steps;
    double lr;
    const char *hostfile, *json, *backend, *junit;
    int no_json, summary_only, full;
    double timeout;                  // seconds a collective may take (--timeout, GCD_TIMEOUT, default 300)
} options;

static const char *command = "";   // "run ", "check ", "report ": where the usage is

static int bad(const char *flag, const char *fmt, const char *value) {
    fprintf(stderr, "gradcheck-dist: %s: ", flag);
    fprintf(stderr, fmt, value);
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
static int unknown(const char *what, const char *word, const char *const *known) {
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

static int parse_int(const char *flag, const char *v, long lo, long hi, long *out) {
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
static int report_path_ok(const char *flag, const char *path) {
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

// --junit PATH: as --json's, and not the same file (or both stdout)
// a path's directory, resolved, and its last name: two spellings of one new file compare equal
static int same_place(const char *a, const char *b) {
    char d[2][PATH_MAX], *r[2];
    const char *p[2] = { a, b }, *base[2];
    for (int i = 0; i < 2; i++) {
        const char *slash = strrchr(p[i], '/');
        snprintf(d[i], sizeof d[i], "%.*s", slash ? (int)(slash - p[i]) + 1 : 1, slash ? p[i] : ".");
        base[i] = slash ? slash + 1 : p[i];
        r[i] = realpath(d[i], NULL);
    }
    int same = r[0] && r[1] && !strcmp(r[0], r[1]) && !strcmp(base[0], base[1]);
    free(r[0]), free(r[1]);
    return same;
}

static int junit_path_ok(const char *junit, const char *json) {
    struct stat a, b;
    int same = json && (!strcmp(junit, json) || (stat(junit, &a) == 0 && stat(json, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) ||
                        (strcmp(junit, "-") && strcmp(json, "-") && same_place(junit, json)));
    if (same) return bad("--junit", "'%s' is also the --json path: give each its own", junit);
    return report_path_ok("--junit", junit);
}

static int parse_run(int argc, char **argv, options *o) {
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
                                              "--json", "--timeout", "--junit", "--no-json", "--summary-only", "--full", "--local-loss", "--help", NULL };
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

// ----------------------------------------------------------------------------
// launching: not inside an MPI job yet, so start mpirun -np N on this same program

static int nccl_precheck(const options *o, int world) {
    char why[256];
    if (!gcd_nccl_built())
        return bad("--backend", "%s", "nccl: not built: configure found no CUDA Toolkit with NCCL; use --backend mpi");
    int n = gcd_cuda_device_count(why, sizeof why);
    if (n < 0) return bad("--backend", "nccl: %s; use --backend mpi", why);
    if (!o->hostfile && world > n) {
        char msg[160];
        snprintf(msg, sizeof msg, "nccl needs one GPU per rank: --world %d on a machine with %d; use --world %d or --backend mpi", world, n, n);
        return bad("--backend", "%s", msg);
    }
    return 0;
}

// Physical cores: Open MPI counts its default slots by cores, not hardware threads.
static long physical_cores(void) {
    long n = 0, cpus = sysconf(_SC_NPROCESSORS_ONLN);
    char seen[4096] = { 0 };
    for (long c = 0; c < cpus && c < 4096; c++) {
        char path[128];
        int core = -1, pkg = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/core_id", c);
        FILE *f = fopen(path, "r");
        if (!f || fscanf(f, "%d", &core) != 1) core = -1;
        if (f) fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/physical_package_id", c);
        if ((f = fopen(path, "r"))) {
            if (fscanf(f, "%d", &pkg) != 1) pkg = 0;
            fclose(f);
        }
        if (core < 0) return cpus;   // no topology: count what runs
        int id = (pkg * 1024 + core) % 4096;
        n += !seen[id];
        seen[id] = 1;
    }
    return n > 0 ? n : cpus;
}

// bytes a run needs at most, roughly: every rank's pass on this machine (its features, the gathered
// copies, the N x N logits and their gradients, N = world x batch) and rank 0's single-process reference
static double run_bytes(const options *o, int world) {
    double per_process = 64e6;   // MPI, the program, its arenas' first chunks
    if (!strcmp(o->probe, "simplenet")) return world * per_process;
    double N = (double)o->cfg.batch * world, E = o->cfg.dim_emb, D = (double)o->cfg.dim_img + o->cfg.dim_txt;
    double pass = 8 * (12 * N * N + 10 * N * (D + E) + 4 * E * D);
    return world * (pass + per_process) + 1.5 * pass;
}

static double mem_available(void) {   // bytes, from /proc/meminfo; 0 when unknown
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

// Work that cannot be done is refused before any rank starts: more ranks than this machine can start
// (32 a physical core, without a hostfile), more memory than it has available.
static int feasible(const options *o, int world) {
    long cap = 32 * physical_cores();
    char msg[256];
    if (!o->hostfile && world > cap) {
        snprintf(msg, sizeof msg, "%d ranks are more than this machine can start (%ld: 32 a core); give --hostfile for more hosts", world, cap);
        return bad("--world", "%s", msg);
    }
    double need = run_bytes(o, world), have = mem_available();
    if (have > 0 && need > have) {
        snprintf(msg, sizeof msg, "this run needs about %.3g GB (%d ranks, batch %d) and the machine has %.3g GB available: lower --batch, the dims or --world",
                 need / 1e9, world, o->cfg.batch, have / 1e9);
        return bad("--batch", "%s", msg);
    }
    return 0;
}

// The launcher passes SIGINT, SIGTERM and SIGHUP on to mpirun (which ends the ranks) and waits for it;
// mpirun gets SIGTERM too when the launcher dies by SIGKILL (PR_SET_PDEATHSIG). It first leaves a file
// "interrupted" in its private directory: rank 0, ended by mpirun, then leaves no report; without it
// (another rank died) rank 0 writes its error report.
static volatile sig_atomic_t mpirun_pid, caught;
static char interrupted[PATH_MAX + 32];
static void forward_signal(int sig) {
    caught = sig;
    int fd = open(interrupted, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
    if (mpirun_pid > 0) kill((pid_t)mpirun_pid, sig);
}

// a file of the private directory rank 0 shares with the launcher ("" when not under the launcher)
static void shared_file(char *buf, size_t len, const char *name) {
    const char *result = getenv("GCD_RESULT_FILE"), *slash = result ? strrchr(result, '/') : NULL;
    if (slash) snprintf(buf, len, "%.*s/%s", (int)(slash - result), result, name);
    else if (len) buf[0] = 0;
}

static char *read_small(const char *path, char *buf, size_t len) {   // NULL when absent or empty
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    return n ? buf : NULL;
}

// mpirun's stderr passes through the launcher, byte for byte, so that a rank's death can be named:
// "mpirun noticed that process rank 2 with PID 0 on node vm exited on signal 9 (Killed)." (Open MPI
// 4.1 says PID 0: the pid comes from the list rank 0 left, "rank pid host" a line)
typedef struct {
    char line[1024];
    size_t n;
    int rank, sig;
    char host[256];
} mpirun_log;

static void scan_line(mpirun_log *m) {
    int rank, pid, sig;
    char host[256];
    const char *at = strstr(m->line, "mpirun noticed that process rank ");
    if (m->sig || !at) return;
    if (sscanf(at, "mpirun noticed that process rank %d with PID %d on node %255s exited on signal %d", &rank, &pid, host, &sig) == 4)
        m->rank = rank, m->sig = sig, snprintf(m->host, sizeof m->host, "%s", host);
}

// Until EOF, or mpirun reaped and the pipe quiet for 0.2 s (a stray holder of the pipe must not hang
// the launcher). Sets *status and returns 1 when it reaped mpirun.
static int forward_stderr(int fd, mpirun_log *m, pid_t pid, int *status) {
    char buf[4096];
    int reaped = 0;
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int r = poll(&p, 1, 200);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) {
            if (reaped) return 1;
            reaped = waitpid(pid, status, WNOHANG) == pid;
            if (reaped) mpirun_pid = 0;   // its pid may be reused: forward no signal to it
            continue;
        }
        ssize_t k = read(fd, buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return reaped;
        for (ssize_t off = 0; off < k;) {
            ssize_t w = write(2, buf + off, (size_t)(k - off));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break;   // our stderr is gone: keep reading, so that mpirun never blocks on the pipe
            off += w;
        }
        for (ssize_t i = 0; i < k; i++) {
            if (buf[i] == '\n' || m->n + 1 >= sizeof m->line) {
                m->line[m->n] = 0;
                scan_line(m);
                m->n = 0;
            } else m->line[m->n++] = buf[i];
        }
    }
}

// Rank 0 reserved a default report name and was killed before it wrote there: the empty file goes
// (whole or absent). Only a default name: an empty file at a --json path was the user's.
static void drop_empty_default(const char *dir) {
    char path[PATH_MAX + 32], report[PATH_MAX] = "";
    struct stat st;
    snprintf(path, sizeof path, "%s/report", dir);
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (fgets(report, sizeof report, f) && lstat(report, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0) unlink(report);
    fclose(f);
}

// After a rank's death: name it, and put its name into the error report rank 0 left ("ended by signal")
static void name_the_dead(const mpirun_log *m, const char *dir, const char *junit) {
    char path[PATH_MAX + 32], list[65536], report[PATH_MAX], msg[1024];
    long pid = 0;
    snprintf(path, sizeof path, "%s/ranks", dir);
    if (read_small(path, list, sizeof list))
        for (char *save = NULL, *l = strtok_r(list, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
            int r;
            long p;
            char host[256];
            if (sscanf(l, "%d %ld %255s", &r, &p, host) == 3 && r == m->rank) pid = p;
        }
    char who[64] = "pid unknown";
    if (pid > 0) snprintf(who, sizeof who, "pid %ld", pid);
    snprintf(msg, sizeof msg, "rank %d (%s on %s) was killed by signal %d (%s)", m->rank, who, m->host, m->sig, strsignal(m->sig));
    fprintf(stderr, "gradcheck-dist: %s\n", msg);
    snprintf(path, sizeof path, "%s/report", dir);
    if (!read_small(path, report, sizeof report)) return;
    char err[512];
    cJSON *doc = gcd_report_load(report, err, sizeof err);
    const cJSON *e = doc ? cJSON_GetObjectItem(doc, "error") : NULL, *em = cJSON_GetObjectItem(e, "message");
    if (cJSON_IsString(em) && strstr(em->valuestring, "ended by signal")) {
        char full[2048];
        snprintf(full, sizeof full, "%s; rank 0 then: %s", msg, em->valuestring);
        const cJSON *env = cJSON_GetObjectItem(doc, "environment");
        gcd_report_finish(doc, 3, full, m->rank, gcd_json_num(cJSON_GetObjectItem(env, "wall_seconds")));
        if (gcd_report_write(doc, report, err, sizeof err)) fprintf(stderr, "gradcheck-dist: %s\n", err);
        else fprintf(stderr, "gradcheck-dist: the error report, %s, names rank %d\n", report, m->rank);
        char *xml = junit ? gcd_render_junit(doc) : NULL;   // and the JUnit file rank 0 wrote from it
        if (xml && gcd_text_write(xml, "--junit", junit, err, sizeof err)) fprintf(stderr, "gradcheck-dist: %s\n", err);
        free(xml);
    }
    cJSON_Delete(doc);
}

// The launcher's verdict comes from rank 0 (a file in a private directory), never from mpirun's exit
// status: mpirun exiting with 1 because a launch failed is not a gradient finding.
// Without --hostfile mpirun stays on this node, unless a resource manager's allocation gives it others
// (Open MPI reads Slurm's, SGE's, PBS's and LSF's, and a default hostfile)
static int one_node(const options *o) {
    static const char *const others[] = { "PE_HOSTFILE", "PBS_NODEFILE", "LSB_HOSTS", "LSB_MCPU_HOSTS", "OMPI_MCA_orte_default_hostfile", NULL };
    const char *slurm = getenv("SLURM_JOB_NUM_NODES");
    if (o->hostfile || (getenv("SLURM_JOB_ID") && !(slurm && !strcmp(slurm, "1")))) return 0;
    for (int i = 0; others[i]; i++)
        if (getenv(others[i]) && *getenv(others[i])) return 0;
    return 1;
}

static int launch(const options *o, int argc, char **argv) {
    int world = o->world ? o->world : 2;
    int rc = feasible(o, world);
    if (rc) return rc;
    if (!strcmp(o->backend, "nccl") && (rc = nccl_precheck(o, world))) return rc;
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) return fprintf(stderr, "gradcheck-dist: cannot find my own executable: %s\n", strerror(errno)), 3;
    exe[k] = 0;
    const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char dir[PATH_MAX], result[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/gradcheck-dist.XXXXXX", tmpdir);
    if (!mkdtemp(dir)) return fprintf(stderr, "gradcheck-dist: mkdtemp %s: %s\n", dir, strerror(errno)), 3;
    snprintf(result, sizeof result, "%s/result", dir);
    snprintf(interrupted, sizeof interrupted, "%s/interrupted", dir);
    setenv("GCD_RESULT_FILE", result, 1);
    char me[24];
    snprintf(me, sizeof me, "%ld", (long)getpid());
    setenv("GCD_LAUNCHER_PID", me, 1);
    // the ranks' stdout and stderr are pipes: rank 0 learns the table's width and whether stderr is a terminal here
    char columns[16];
    snprintf(columns, sizeof columns, "%d", gcd_text_width((o->json && !strcmp(o->json, "-")) || (o->junit && !strcmp(o->junit, "-")) ? 2 : 1));
    setenv("GCD_COLUMNS", columns, 1);
    setenv("GCD_PROGRESS", isatty(2) ? "tty" : "lines", 0);
    int err_pipe[2];
    if (pipe(err_pipe) || fcntl(err_pipe[0], F_SETFD, FD_CLOEXEC) || fcntl(err_pipe[1], F_SETFD, FD_CLOEXEC)) return fprintf(stderr, "gradcheck-dist: pipe: %s\n", strerror(errno)), rmdir(dir), 3;
    // BLAS threads, set before OpenBLAS starts in the ranks (unless the user chose): this machine's cores
    // shared out, one a rank when the ranks fill them, more when they do not; each rank is then bound to
    // that many cores (Open MPI binds a rank to one core by default, where its threads would share it)
    long threads = physical_cores() / world;
    if (getenv("OPENBLAS_NUM_THREADS")) threads = atol(getenv("OPENBLAS_NUM_THREADS"));
    else {
        char nt[24];
        snprintf(nt, sizeof nt, "%ld", threads > 1 ? threads : 1);
        setenv("OPENBLAS_NUM_THREADS", nt, 1);
    }
    char pe[32];
    snprintf(pe, sizeof pe, "slot:PE=%ld", threads);
    char np[16];
    snprintf(np, sizeof np, "%d", world);
    int nenv = 0;
    for (char **e = environ; *e; e++) nenv++;
    char **av = calloc((size_t)argc + 2 * (size_t)nenv + 32, sizeof *av);   // 20 fixed at most
    mallocCheck(av);
    int n = 0;
    av[n++] = "mpirun";
    av[n++] = "-np";
    av[n++] = np;
    if (!o->hostfile && world > physical_cores()) av[n++] = "--oversubscribe";
    if (geteuid() == 0) av[n++] = "--allow-run-as-root";
    // when a rank dies, mpirun ends the others with SIGTERM, then SIGKILL after this many seconds (1 by
    // default; mpirun waits it out whole, twice): time for rank 0 to write its error report (an fsync)
    av[n++] = "--mca", av[n++] = "odls_base_sigkill_timeout", av[n++] = "3";
    if (o->hostfile) av[n++] = "--hostfile", av[n++] = (char *)o->hostfile;
    // One node: start what a one-node job uses, and nothing else (measured in tests/bench/bench.sh).
    // - the ob1 PML straight away: the default (cm) loads the psm/psm2 libraries first, whose
    //   constructors sleep ~0.2 s, then settles on ob1 anyway;
    // - the shared-memory and self BTLs: the TCP BTL opens listening sockets on every interface;
    // - libnbc's recursive-doubling all-gather (log2(world) rounds; its default sends world-1 messages
    //   from every rank; Open MPI keeps the linear one where world is not a power of two);
    // - hwloc without I/O discovery (PCI config space read through /sys, its libxml2, OpenCL and X11
    //   plugins loaded): Open MPI binds ranks to cores, which this topology still has.
    // Whatever the user set, or several hosts (UCX, InfiniBand), keeps Open MPI's choice.
    if (one_node(o)) {
        static const char *const mca[][2] = { { "pml", "ob1" }, { "btl", "self,vader" }, { "coll_libnbc_iallgather_algorithm", "2" } };
        for (size_t i = 0; i < sizeof mca / sizeof *mca; i++) {
            char var[64];
            snprintf(var, sizeof var, "OMPI_MCA_%s", mca[i][0]);
            if (!(getenv(var) && *getenv(var))) av[n++] = "--mca", av[n++] = (char *)mca[i][0], av[n++] = (char *)mca[i][1];
        }
        setenv("HWLOC_COMPONENTS", "-linuxio", 0);
        setenv("HWLOC_PLUGINS_BLACKLIST", "hwloc_pci,hwloc_opencl,hwloc_gl,hwloc_xml_libxml", 0);
    }
    if (!o->hostfile && threads > 1 && threads * world <= physical_cores()) av[n++] = "--map-by", av[n++] = pe;
    // Open MPI starts ranks on other nodes without this environment: forward every GCD_, NCCL_ and
    // OPENBLAS_ variable (GCD_RESULT_FILE, GCD_NCCL_TIMEOUT, NCCL_DEBUG, ...) by name with -x
    int first_x = n;
    for (char **e = environ; *e; e++)
        if (!strncmp(*e, "GCD_", 4) || !strncmp(*e, "NCCL_", 5) || !strncmp(*e, "OPENBLAS_", 9)) {
            av[n++] = "-x";
            mallocCheck(av[n++] = strndup(*e, strcspn(*e, "=")));
        }
    int last_x = n;
    av[n++] = exe;
    for (int i = 1; i < argc; i++) av[n++] = argv[i];
    fflush(NULL);
    struct sigaction sa = { .sa_handler = forward_signal }, old[3];
    sigemptyset(&sa.sa_mask);
    static const int forwarded[3] = { SIGINT, SIGTERM, SIGHUP };
    for (int i = 0; i < 3; i++) sigaction(forwarded[i], &sa, &old[i]);
    signal(SIGPIPE, SIG_IGN);   // a closed stderr is EPIPE to forward_stderr, not the launcher's death
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) return fprintf(stderr, "gradcheck-dist: fork: %s\n", strerror(errno)), close(err_pipe[0]), close(err_pipe[1]), rmdir(dir), 3;
    if (pid == 0) {
        for (int i = 0; i < 3; i++) sigaction(forwarded[i], &old[i], NULL);
        signal(SIGPIPE, SIG_DFL);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(3);   // the launcher died before the line above
        int null = open("/dev/null", O_RDONLY);   // the ranks read no stdin: a caller's stays its own
        if (null >= 0) dup2(null, 0), close(null);
        dup2(err_pipe[1], 2);
        execvp(av[0], av);
        fprintf(stderr, "gradcheck-dist: cannot start mpirun: %s (install openmpi-bin)\n", strerror(errno));
        _exit(127);
    }
    for (int i = first_x + 1; i < last_x; i += 2) free(av[i]);
    free(av);
    mpirun_pid = pid;
    if (caught) kill(pid, caught);   // a signal between fork and here
    close(err_pipe[1]);
    int status;
    mpirun_log log = { .n = 0 };
    int reaped = forward_stderr(err_pipe[0], &log, pid, &status);
    close(err_pipe[0]);
    while (!reaped && waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return fprintf(stderr, "gradcheck-dist: waitpid: %s\n", strerror(errno)), 3;
    mpirun_pid = 0;
    if (log.n) log.line[log.n] = 0, scan_line(&log);   // a last line without its newline
    int code = -1;
    FILE *f = fopen(result, "r");
    if (f) {
        if (fscanf(f, "%d", &code) != 1 || code < 0 || code > 3) code = -1;
        fclose(f);
        unlink(result);
    }
    if (!caught && code < 0 && log.sig) name_the_dead(&log, dir, o->junit && strcmp(o->junit, "-") ? o->junit : NULL);
    if (code < 0 && !o->json && !o->no_json) drop_empty_default(dir);
    static const char *const left[] = { "ranks", "report", "interrupted" };
    for (int i = 0; i < 3; i++) {
        char f[PATH_MAX + 32];
        snprintf(f, sizeof f, "%s/%s", dir, left[i]);
        unlink(f);
    }
    rmdir(dir);
    if (caught) {
        fprintf(stderr, "gradcheck-dist: interrupted by signal %d: mpirun and the ranks were ended, no verdict and no report\n", (int)caught);
        return 3;
    }
    char how[64];
    if (WIFEXITED(status)) snprintf(how, sizeof how, "mpirun exited with %d", WEXITSTATUS(status));
    else snprintf(how, sizeof how, "mpirun was killed by signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && code < 0) return 3;   // mpirun itself could not start: said above
    if (code >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) return code;
    if (code >= 0) {
        fprintf(stderr, "gradcheck-dist: rank 0 gave exit %d, but the MPI job then failed (%s)\n", code, how);
        return 3;
    }
    fprintf(stderr, "gradcheck-dist: the MPI job ended before rank 0 gave its verdict (%s)%s\n", how,
            o->hostfile ? "; with --hostfile, rank 0 must run on this host (list it first) and the hosts must give --world slots"
                        : "; mpirun's message above says why");
    return 3;
}

// ----------------------------------------------------------------------------
// one rank

static struct {
    cJSON *doc;
    char path[PATH_MAX];
    char junit[PATH_MAX];                        // --junit, or ""
    double t0;
    volatile sig_atomic_t reserved, written;   // the default path was created empty for us; the report is in it
} job;

static char interrupted_file[PATH_MAX + 32], launcher_stat[64];   // under the launcher; "" otherwise

static int launcher_alive(void) {   // async-signal-safe: /proc/PID/stat exists and its state is not Z (zombie)
    char buf[512];
    int fd = open(launcher_stat, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    const char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

// rank 0, ended by a signal. Under the launcher, unless the launcher itself was interrupted or is gone,
// it is mpirun ending the job because another rank died: the collective in progress stops and the fatal
// hook writes the error report. Otherwise (the launcher's signal, forwarded): no half report, no empty
// reserved name.
static void rank0_signal(int sig) {
    if (interrupted_file[0] && access(interrupted_file, F_OK) && launcher_alive() && (job.path[0] || job.junit[0]) && !job.written) {
        gcd_mpi_stop(sig);
        return;
    }
    if (job.reserved && !job.written) unlink(job.path);
    _exit(128 + sig);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ----------------------------------------------------------------------------
// progress on stderr, rank 0 only: on a terminal one line rewritten in place (probe, mode, step k/N,
// elapsed); otherwise one line as each probe and mode ends

static struct {
    int tty, run, nrun;
    const char *probe, *mode;
    double t0, t_run, shown;
} progress;

static void progress_step(int k, int n) {
    double t = now();
    if (!progress.tty || (k < n && t - progress.shown < 0.1)) return;   // ten updates a second at most
    progress.shown = t;
    fprintf(stderr, "\r\033[K%d/%d %s, mode %s: step %d/%d, %.1f s", progress.run, progress.nrun, progress.probe, progress.mode, k, n,
            t - progress.t0);
    fflush(stderr);
}

static void progress_done(int steps) {
    if (progress.tty) return;
    double t = now();
    char what[48] = "gradients";
    if (steps) snprintf(what, sizeof what, "%d SGD step%s", steps, steps == 1 ? "" : "s");
    fprintf(stderr, "gradcheck-dist: %d/%d %s, mode %s: %s in %.2f s, %.2f s elapsed\n", progress.run, progress.nrun, progress.probe,
            progress.mode, what, t - progress.t_run, t - progress.t0);
}

// The files a run or check leaves, each whole or absent: the JSON report at json, then the JUnit XML
// rendered from the same document at junit ("" for none). A failed write is a runtime failure: the code
// becomes 3, the document says why, and the JSON, when already written, is written again to say so.
// A path that could not be written is emptied (a reserved default name removed). Returns the code.
static int write_reports(cJSON *doc, char *json, int reserved, char *junit, int code, double seconds) {
    char *path[2] = { json, junit };
    int junit_first = !strcmp(json, "-");   // stdout takes one document: the JSON last, never written twice
    for (int k = 0; k < 2; k++) {
        int i = k ^ junit_first;
        char err[PATH_MAX + 128], *xml = NULL;
        if (!path[i][0]) continue;
        int rc = i ? gcd_text_write(xml = gcd_render_junit(doc), "--junit", path[i], err, sizeof err) : gcd_report_write(doc, path[i], err, sizeof err);
        free(xml);
        if (!rc) continue;
        fprintf(stderr, "gradcheck-dist: %s\n", err);
        if (!i && reserved) unlink(json);
        path[i][0] = 0;
        if (code == 3) continue;   // the document already says what failed first
        code = 3;
        gcd_report_finish(doc, 3, err, 0, seconds);
        if (i && !junit_first && json[0] && gcd_report_write(doc, json, err, sizeof err)) fprintf(stderr, "gradcheck-dist: %s\n", err);
    }
    return code;
}

// rank 0's fatal hook: leave a report (and the JUnit file) saying what failed
static void write_error_report(const char *message) {
    if (!job.doc || (!job.path[0] && !job.junit[0])) return;
    gcd_report_finish(job.doc, 3, message, 0, now() - job.t0);
    write_reports(job.doc, job.path, job.reserved, job.junit, 3, now() - job.t0);
    if (job.path[0] && strcmp(job.path, "-")) fprintf(stderr, "gradcheck-dist: error report written to %s\n", job.path);
    if (job.junit[0] && strcmp(job.junit, "-")) fprintf(stderr, "gradcheck-dist: JUnit written to %s\n", job.junit);
    job.written = 1;
}

// reports/gradcheck-<UTC time>[-N].json, created empty and exclusively (O_EXCL): runs started in the
// same second never share a name. Returns 1 when a name was reserved.
static int default_report_path(char *path, size_t len) {
    char stamp[32];
    time_t t = time(NULL);
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", gmtime(&t));
    mkdir("reports", 0777);
    for (int i = 1; i < 10000; i++) {
        if (i == 1) snprintf(path, len, "reports/gradcheck-%s.json", stamp);
        else snprintf(path, len, "reports/gradcheck-%s-%d.json", stamp, i);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) return close(fd), 1;
        if (errno != EEXIST) break;
    }
    return 0;   // the write will say why
}

// Every rank's host and pid (to name a rank that dies) and a digest of its command, in one collective
// before any other: every rank must run the same command, as the collectives that follow, and their
// counts, come from it. Returns the facts (world); *differs is the first rank given another command, or -1.
typedef struct {
    char host[256], pid[24], command[65];
} rank_facts;

static rank_facts *gather_rank_facts(int argc, char **args, int world, int *differs) {
    rank_facts mine = { 0 }, *all = gcd_malloc((size_t)world * sizeof *all);
    gethostname(mine.host, sizeof mine.host - 1);
    snprintf(mine.pid, sizeof mine.pid, "%ld", (long)getpid());
    gcd_sha256 h;
    unsigned char d[32];
    gcd_sha256_init(&h);
    for (int i = 1; i < argc; i++) gcd_sha256_update(&h, args[i], strlen(args[i]) + 1);   // argv[0]: installed anywhere
    gcd_sha256_final(&h, d);
    gcd_sha256_hex(d, mine.command);
    gcd_mpi_allgather_bytes(&mine, all, sizeof mine);
    *differs = -1;
    for (int k = 0; k < world; k++) {
        all[k].host[sizeof all[k].host - 1] = all[k].pid[sizeof all[k].pid - 1] = 0;
        if (*differs < 0 && memcmp(all[k].command, all[0].command, sizeof all[0].command)) *differs = k;
    }
    return all;
}

// On rank 0, env's hostnames point into facts and its devices into one block (env->devices[0]).
static void environment(gcd_comm *comm, gcd_env *env, const rank_facts *facts) {
    int W = comm->world, nccl = !strcmp(comm->backend, "nccl");
    memset(env, 0, sizeof *env);
    env->backend = comm->backend;
    env->world = W;
    gcd_mpi_library_version(env->mpi_version, sizeof env->mpi_version);
    char device[256] = "", *devs = NULL;
    if (nccl) {
        gcd_nccl_info(comm, env->nccl_version, env->cuda_version, device, sizeof device);
        devs = gcd_malloc((size_t)W * sizeof device);
        gcd_mpi_allgather_bytes(device, devs, sizeof device);
    }
    if (comm->rank == 0) {
        env->hostnames = gcd_malloc((size_t)W * sizeof(char *));
        if (nccl) env->devices = gcd_malloc((size_t)W * sizeof(char *));
        for (int k = 0; k < W; k++) {
            env->hostnames[k] = (char *)facts[k].host;
            if (nccl) env->devices[k] = devs + sizeof device * k, devs[sizeof device * (k + 1) - 1] = 0;
        }
    } else free(devs);
    time_t t = time(NULL);
    strftime(env->start_time, sizeof env->start_time, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
}

// Is this run what its role expects? Under test: no finding. A control: exactly its signature (expect.c),
// never merely "some finding". Writes the expectation into the report; returns 1 when met.
static int expect(cJSON *doc, const gcd_run_result *res, const gcd_probe *pr, int test) {
    gcd_sb msg = { 0 }, why = { 0 };
    const char *first = "";
    for (int i = 0; i < res->nfinding && test; i++)
        if (res->finding[i].counts) { first = res->finding[i].message; break; }
    gcd_sb_printf(&msg, "%s%s mode %s (%s): ", res->probe, res->cfg.local_loss ? " (local_loss)" : "", gcd_gather_mode_name(res->mode),
                  test ? "under test" : "control");
    int met;
    if (test) {
        met = !gcd_run_has_finding(res);
        gcd_sb_printf(&msg, "%s", met ? "no finding" : first);
    } else {
        met = gcd_signature_met(res, pr->before_gather, &why);
        gcd_signature sig = gcd_expected_signature(res->mode, res->cfg.local_loss, res->world);
        if (!met) gcd_sb_printf(&msg, "not this convention's signature at world %d: %s", res->world, why.s);
        else if (gcd_run_has_finding(res))
            gcd_sb_printf(&msg, "shows exactly its signature: %s%s before the gather, %s after", gcd_status_str(sig.before),
                          sig.before == GCD_ST_SCALED ? " x1/world" : "", gcd_status_str(sig.after));
        else gcd_sb_printf(&msg, "clean at world %d, as it must be (1/world = 1)", res->world);
    }
    gcd_report_add_expectation(doc, res->probe, gcd_gather_mode_name(res->mode), test ? "test" : "control", met, msg.s);
    gcd_sb_free(&msg), gcd_sb_free(&why);
    return met;
}

// Under the launcher rank 0 writes the final code where the launcher reads it, and every rank exits 0,
// so mpirun's status says only whether the job itself ran.
static int rank_exit(int root, int code) {
    const char *result = getenv("GCD_RESULT_FILE");
    if (!result) return code;
    if (root) {
        FILE *f = fopen(result, "w");
        if (!f || fprintf(f, "%d\n", code) < 0 || fclose(f)) {
            fprintf(stderr, "gradcheck-dist: cannot hand the result to the launcher (%s): %s\n", result, strerror(errno));
            return 3;
        }
    }
    return 0;
}

// The tensor values a run's document holds. The table and every rendering read only statuses and
// figures; the values are for the JSON file alone, so without one the document holds none (at
// contrastive B=512 they were most of the peak memory). A consumer that needs values (none yet:
// --junit reads statuses) joins the first test here.
static gcd_values report_values(const options *o) {
    if (o->no_json || o->summary_only) return GCD_VALUES_NONE;
    return o->full ? GCD_VALUES_FULL : GCD_VALUES_LIMITED;
}

static int run_rank(const options *o, int argc, char **argv) {
    int nargs = argc;
    char **args = gcd_malloc((size_t)argc * sizeof *args);   // the command as typed, before MPI_Init
    for (int i = 0; i < argc; i++) args[i] = gcd_strdup(argv[i]);
    gcd_mpi_set_timeout(o->timeout);   // MPI_Init too
    gcd_mpi_init(&argc, &argv);
    gcd_comm *comm = gcd_comm_mpi();
    int root = comm->rank == 0, differs;
    rank_facts *facts = gather_rank_facts(nargs, args, comm->world, &differs);
    char why[640] = "";   // every rank decides alike: the same facts, the same job, NCCL's own agreement
    if (differs >= 0)
        snprintf(why, sizeof why, "rank %d was started with other options than rank 0: every rank must run the same command", differs);
    else if (o->world && o->world != comm->world)
        snprintf(why, sizeof why, "--world: %d, but this MPI job has %d ranks", o->world, comm->world);
    else if (!strcmp(o->backend, "nccl")) {
        char reason[512] = "";
        gcd_comm *nccl = gcd_comm_nccl(comm, reason, sizeof reason);
        if (nccl) comm = nccl;
        else snprintf(why, sizeof why, "--backend nccl: %s; use --backend mpi", reason);
    }
    if (why[0]) {
        if (root) fprintf(stderr, "gradcheck-dist: %s\n", why);
        free(facts);
        gcd_mpi_finalize();
        return rank_exit(root, 2);
    }
    if (!getenv("OPENBLAS_NUM_THREADS")) {   // a plain mpirun, not the launcher: this node's CPUs shared out
        int local_rank, local_size;
        gcd_mpi_local(&local_rank, &local_size);
        gcd_blas_share_cpus(local_size);
    }
    job.t0 = now();
    gcd_env env;
    environment(comm, &env, facts);
    shared_file(interrupted_file, sizeof interrupted_file, "interrupted");
    const char *launcher = getenv("GCD_LAUNCHER_PID");   // a launcher killed by SIGKILL leaves no file: it is gone
    snprintf(launcher_stat, sizeof launcher_stat, "/proc/%ld/stat", launcher ? atol(launcher) : 0L);
    if (interrupted_file[0] && root) {   // under the launcher: every rank's pid and host, to name a rank that dies
        char path[PATH_MAX + 32];
        shared_file(path, sizeof path, "ranks");
        FILE *f = fopen(path, "w");
        for (int k = 0; f && k < comm->world; k++) fprintf(f, "%d %s %s\n", k, facts[k].pid, facts[k].host);
        if (f) fclose(f);
    }
    if (root) {
        job.doc = gcd_report_new(nargs, args, &env);
        if (o->json) snprintf(job.path, sizeof job.path, "%s", o->json);
        else if (!o->no_json) job.reserved = default_report_path(job.path, sizeof job.path);
        if (o->junit) snprintf(job.junit, sizeof job.junit, "%s", o->junit);
        char path[PATH_MAX + 32];
        shared_file(path, sizeof path, "report");   // the launcher names a dead rank in it
        FILE *f = path[0] && job.path[0] && strcmp(job.path, "-") ? fopen(path, "w") : NULL;
        if (f) fputs(job.path, f), fclose(f);
        const char *pr = getenv("GCD_PROGRESS");
        progress.tty = pr ? !strcmp(pr, "tty") : isatty(2);
        progress.t0 = job.t0;
        for (int pi = 0; gcd_probes[pi]; pi++) progress.nrun += !strcmp(o->probe, "all") || !strcmp(o->probe, gcd_probes[pi]->name);
        progress.nrun *= o->nmode;
        gcd_fatal_hook(write_error_report);   // then MPI_Abort, as on every rank
        struct sigaction sa = { .sa_handler = rank0_signal };
        sigemptyset(&sa.sa_mask);
        for (int sig = 0; sig < 3; sig++) sigaction((int[]){ SIGTERM, SIGINT, SIGHUP }[sig], &sa, NULL);
    }

    int all_met = 1;
    for (int pi = 0; gcd_probes[pi]; pi++) {
        const gcd_probe *pr = gcd_probes[pi];
        if (strcmp(o->probe, "all") && strcmp(o->probe, pr->name)) continue;
        gcd_reference ref = { 0 };   // one reference for every mode of this probe (rank 0's)
        for (int mi = 0; mi < o->nmode; mi++) {
            gcd_run_opts ro = { .probe = pr, .cfg = o->cfg, .mode = o->mode[mi], .steps = o->steps, .lr = o->lr, .ref = &ref };
            if (strcmp(pr->name, "contrastive")) ro.cfg.local_loss = 0;
            gcd_run_result res;
            char what[96];
            snprintf(what, sizeof what, "probe %s, mode %s", pr->name, gcd_gather_mode_name(ro.mode));
            gcd_comm_set_context(what);
            double t = now();
            progress.run++, progress.probe = pr->name, progress.mode = gcd_gather_mode_name(ro.mode), progress.t_run = now();
            if (root) ro.progress = progress_step;
            gcd_run(comm, &ro, &res);
            res.seconds = now() - t;
            if (root) {
                progress_done(ro.steps);
                int test = o->mode_given || ro.mode == GCD_GATHER_ON;
                gcd_report_add_run(job.doc, &res, test ? "test" : "control", report_values(o));
                all_met &= expect(job.doc, &res, pr, test);
            }
            gcd_run_result_free(&res);
        }
        gcd_reference_free(&ref);
    }

    int code = all_met ? 0 : 1;
    if (root) {   // the report first, so that the text says the code the process returns
        gcd_report_finish(job.doc, code, NULL, 0, now() - job.t0);
        code = write_reports(job.doc, job.path, job.reserved, job.junit, code, now() - job.t0);
        job.written = 1;
        if (progress.tty) fprintf(stderr, "\r\033[K"), fflush(stderr);   // the live line gives way to the table
        FILE *out = (o->json && !strcmp(o->json, "-")) || (o->junit && !strcmp(o->junit, "-")) ? stderr : stdout;
        const char *columns = getenv("GCD_COLUMNS");   // the launcher's terminal (our stdout is mpirun's pipe)
        char *text = gcd_render_text_width(job.doc, columns ? atoi(columns) : gcd_text_width(fileno(out)));
        fputs(text, out);
        free(text);
        if (job.path[0] && strcmp(job.path, "-")) fprintf(out, "report: %s\n", job.path);
        if (job.junit[0] && strcmp(job.junit, "-")) fprintf(out, "junit: %s\n", job.junit);
        if (fflush(out) || ferror(out)) {
            fprintf(stderr, "gradcheck-dist: writing the table: %s\n", strerror(errno));
            code = 3;
        }
        fflush(NULL);
        cJSON_Delete(job.doc);
        job.doc = NULL;
        free(env.hostnames), free(env.devices ? env.devices[0] : NULL), free(env.devices);
    }
    gcd_mpi_bcast_int(&code, 0);
    if (comm->impl) gcd_comm_nccl_free(comm);
    gcd_mpi_finalize();
    free(facts);
    for (int i = 0; i < nargs; i++) free(args[i]);
    free(args);
    return rank_exit(root, code);
}

// ----------------------------------------------------------------------------
// check DUMP... [--ref REF]: the user's own gradients

static int check_main(int argc, char **argv) {
    const char **dumps = gcd_malloc((size_t)argc * sizeof *dumps), **ignore = gcd_malloc((size_t)argc * sizeof *ignore);
    gcd_check_opts o = { .dumps = dumps, .ignore = ignore };
    const char *json = NULL, *junit = NULL;
    int no_json = 0, rc = 0;
    for (int i = 2; i < argc && !rc; i++) {
        char flag[64];
        const char *a = argv[i], *eq = strchr(a, '='), *v = NULL;
        if (a[0] != '-' || !a[1]) { dumps[o.ndumps++] = a; continue; }
        snprintf(flag, sizeof flag, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
        int takes = !strcmp(flag, "--ref") || !strcmp(flag, "--ignore") || !strcmp(flag, "--tol") || !strcmp(flag, "--json") || !strcmp(flag, "--junit");
        if (takes) {
            if (eq) v = eq + 1;
            else if (i + 1 < argc) v = argv[++i];
            else { rc = bad(flag, "%s", "missing value"); break; }
            if (!*v) { rc = bad(flag, "%s", "empty value"); break; }
            if (!eq && !strncmp(v, "--", 2)) { rc = bad(flag, "missing value: '%s' is a flag (write FLAG=VALUE for a value that starts with --)", v); break; }
        } else if (eq) { rc = bad(flag, "%s", "takes no value"); break; }
        if (!strcmp(flag, "--ref")) o.ref = v;
        else if (!strcmp(flag, "--ignore")) ignore[o.nignore++] = v;
        else if (!strcmp(flag, "--json")) json = v;
        else if (!strcmp(flag, "--junit")) junit = v;
        else if (!strcmp(flag, "--no-json")) no_json = 1;
        else if (!strcmp(flag, "--snippet")) {
            int ok = fputs(gcd_check_snippet, stdout) >= 0 && fflush(stdout) == 0 && !ferror(stdout);
            free(dumps), free(ignore);
            if (!ok) fprintf(stderr, "gradcheck-dist: check --snippet: writing to stdout: %s\n", strerror(errno ? errno : EIO));
            return ok ? 0 : 3;
        }
        else if (!strcmp(flag, "--tol")) {
            char *end;
            o.tol = strtod(v, &end);
            if (end == v || *end || !isfinite(o.tol) || o.tol <= 0 || o.tol >= 1) rc = bad(flag, "expected a number between 0 and 1, got '%s'", v);
        } else {
            static const char *const known[] = { "--ref", "--ignore", "--tol", "--json", "--no-json", "--junit", "--snippet", "--help", NULL };
            rc = unknown("unknown option", flag, known);
        }
    }
    if (!rc && !o.ndumps) rc = bad("check", "%s", "missing DUMP... or DIR (one safetensors dump per rank; see check --snippet)");
    if (!rc && no_json && json) rc = bad("--no-json", "%s", "conflicts with --json");
    if (!rc && !no_json) rc = report_path_ok("--json", json);
    if (!rc && junit) rc = junit_path_ok(junit, json);
    o.no_hash = no_json;   // the sha256 of each dump goes into the report; without one, no hashing
    if (rc) { free(dumps), free(ignore); return rc; }

    double t0 = now();
    char err[2048];
    gcd_check_set set;
    gcd_run_result res = { 0 };
    rc = gcd_check_load(&o, &set, err, sizeof err);
    if (!rc) rc = gcd_check_scan(&o, &set, &res, err, sizeof err);
    res.seconds = now() - t0;
    if (rc) {
        fprintf(stderr, "gradcheck-dist: check: %s\n", err);
        gcd_run_result_free(&res);
        gcd_check_free(&set);
        free(dumps), free(ignore);
        return rc;
    }
    gcd_env env = { .backend = "dumps", .world = set.world };
    time_t t = time(NULL);
    strftime(env.start_time, sizeof env.start_time, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    cJSON *doc = gcd_report_new(argc, argv, &env);
    gcd_report_add_check(doc, &set, &res);
    int code = gcd_run_has_finding(&res);
    const char *first = "";
    for (int i = 0; i < res.nfinding; i++)
        if (res.finding[i].counts) { first = res.finding[i].message; break; }
    gcd_sb msg = { 0 };
    gcd_sb_printf(&msg, "check stage %s (under test): %s", set.stage, code ? first : "no finding");
    gcd_report_add_expectation(doc, "check", set.stage, "test", !code, msg.s);
    gcd_sb_free(&msg);

    char path[PATH_MAX] = "", xml[PATH_MAX] = "";
    if (json) snprintf(path, sizeof path, "%s", json);
    if (junit) snprintf(xml, sizeof xml, "%s", junit);
    int reserved = !json && !no_json && default_report_path(path, sizeof path);
    gcd_report_finish(doc, code, NULL, 0, now() - t0);
    code = write_reports(doc, path, reserved, xml, code, now() - t0);
    FILE *out = (json && !strcmp(json, "-")) || (junit && !strcmp(junit, "-")) ? stderr : stdout;
    char *text = gcd_render_text_width(doc, gcd_text_width(fileno(out)));
    fputs(text, out);
    free(text);
    if (path[0] && strcmp(path, "-")) fprintf(out, "report: %s\n", path);
    if (xml[0] && strcmp(xml, "-")) fprintf(out, "junit: %s\n", xml);
    if (fflush(out) || ferror(out)) code = 3;
    cJSON_Delete(doc);
    gcd_run_result_free(&res);
    gcd_check_free(&set);
    free(dumps), free(ignore);
    return code;
}

// ----------------------------------------------------------------------------
// report FILE

static int report_main(int argc, char **argv) {
    const char *file = NULL, *format = "text";
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--format") || !strncmp(argv[i], "--format=", 9)) {
            format = argv[i][8] == '=' ? argv[i] + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!format) return bad("--format", "%s", "missing value");
            if (strcmp(format, "text") && strcmp(format, "md") && strcmp(format, "junit"))
                return bad("--format", "expected text, md or junit, got '%s'", format);
        } else if (argv[i][0] == '-' && argv[i][1]) {
            static const char *const known[] = { "--format", "--help", NULL };
            return unknown("unknown option", argv[i], known);
        }
        else if (file) return bad("report", "one FILE only, got a second: '%s'", argv[i]);
        else file = argv[i];
    }
    if (!file) return bad("report", "%s", "missing FILE (a gradcheck-dist JSON report)");
    char err[1024];
    cJSON *doc = gcd_report_load(file, err, sizeof err);
    if (!doc) return fprintf(stderr, "gradcheck-dist: report: %s\n", err), 2;
    char *text = !strcmp(format, "md") ? gcd_render_md(doc) : !strcmp(format, "junit") ? gcd_render_junit(doc) : gcd_render_text(doc);
    int ok = fputs(text, stdout) >= 0 && fflush(stdout) == 0 && !ferror(stdout);
    free(text);
    cJSON_Delete(doc);
    if (!ok) fprintf(stderr, "gradcheck-dist: report: writing to stdout: %s\n", strerror(errno ? errno : EIO));
    return ok ? 0 : 3;
}

int main(int argc, char **argv) {
    if (argc < 2) return help(stderr, NULL), 2;
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) return help(stdout, argc > 2 ? argv[2] : NULL);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
        int ok = printf("gradcheck-dist " GCD_VERSION "\nBLAS: %s, linked in\n", gcd_blas_config()) >= 0 && fflush(stdout) == 0;
        return ok ? 0 : 3;
    }
    static const char *const commands[] = { "run", "check", "report", "version", "help", NULL };
    int c = 0;
    while (commands[c] && strcmp(cmd, commands[c])) c++;
    if (c > 2) return unknown("unknown command: expected run, check or report", cmd, commands);
    command = c == 0 ? "run " : c == 1 ? "check " : "report ";
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return help(stdout, cmd);
    if (!strcmp(cmd, "report")) return report_main(argc, argv);
    if (!strcmp(cmd, "check")) return check_main(argc, argv);
    options o;
    int rc = parse_run(argc, argv, &o);
    if (rc) return rc;
    return gcd_mpi_inside_job() ? run_rank(&o, argc, argv) : launch(&o, argc, argv);
}
