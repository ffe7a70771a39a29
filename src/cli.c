/*
 * cli: gradcheck-dist's entry point. `run` parses and checks every argument first (exit 2 before any
 * rank starts), then either launches itself under mpirun -np N or, inside an MPI job, runs as one rank:
 * every probe under every gather mode, the table and verdicts on rank 0, the JSON report.
 * `report FILE` renders a saved report as text, Markdown or JUnit XML.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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
#include "verdict.h"

extern char **environ;

#ifndef GCD_VERSION
#define GCD_VERSION "0.0.0"
#endif

static const char usage[] =
    "gradcheck-dist " GCD_VERSION ": finds gradients that distributed training silently drops\n"
    "\n"
    "usage:\n"
    "  gradcheck-dist run [options]        run the probes across ranks and compare every gradient\n"
    "  gradcheck-dist check DUMP...|DIR [options]   diagnose your own training's gradients (safetensors dumps)\n"
    "  gradcheck-dist report FILE [--format text|md|junit]   render a saved JSON report\n"
    "  gradcheck-dist --help | --version\n"
    "\n"
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
    "  --summary-only       leave tensor values out of the report, keep the statuses\n"
    "\n"
    "check options:\n"
    "  DUMP...|DIR          one safetensors dump per rank (gradcheck_dist.dump_grads), or a directory of them\n"
    "  --ref FILE           the single-process reference: same starting weights, the whole batch, world 1\n"
    "  --ignore GLOB        leave parameters matching GLOB out (repeatable; fnmatch, e.g. 'head.*')\n"
    "  --tol X              relative tolerance (default from the dtypes: F64 1e-9, F32 1e-5, F16/BF16 1e-2)\n"
    "  --json PATH|- --no-json   as for run\n"

    "  --snippet            print the recipe that writes the dumps (PyTorch, Lightning) and exit\n"
    "\n"
    "gather modes:\n"
    "  off    Lightning all_gather(sync_grads=False): gathered under no_grad\n"
    "  on     Lightning sync_grads=True / torch.distributed.nn.functional.all_gather\n"
    "  local  open_clip gather_with_grad=False / torchmetrics: own slot put back\n"
    "  avg    Horovod allgather: backward averages over ranks\n"
    "\n"
    "statuses: none (no rank got a gradient), partial (some ranks did not), zero, nonfinite, ok,\n"
    "scaled (a multiple of the reference), mismatch (wrong direction), disagree (ranks differ after\n"
    "DDP's all-reduce; check), present (check without --ref: finite, non-zero, the same on every rank)\n"
    "\n"
    "exit status:\n"
    "  0  no unexpected finding     1  gradient findings (or a control that showed none)\n"
    "  2  bad input (flag, dump, report file)   3  runtime failure (MPI, NCCL, I/O)\n";

// ----------------------------------------------------------------------------
// options

typedef struct {
    int world;                       // 0: not given
    const char *probe;               // "all" or a probe's name
    int mode[GCD_GATHER_COUNT], nmode, mode_given;
    gcd_probe_cfg cfg;
    int steps;
    double lr;
    const char *hostfile, *json, *backend;
    int no_json, summary_only;
    double timeout;                  // seconds a collective may take (--timeout, GCD_TIMEOUT, default 300)
} options;

static int bad(const char *flag, const char *fmt, const char *value) {
    fprintf(stderr, "gradcheck-dist: %s: ", flag);
    fprintf(stderr, fmt, value);
    fprintf(stderr, " (see gradcheck-dist --help)\n");
    return 2;
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
// a directory. NULL: the default, reports/ here.
static int report_path_ok(const char *path) {
    if (!path) {
        const char *dir = access("reports", F_OK) == 0 ? "reports" : ".";
        if (access(dir, W_OK | X_OK) == 0) return 0;
        char msg[PATH_MAX + 96];
        snprintf(msg, sizeof msg, "the default report goes into %s/, which cannot be written here: %s (give --json PATH or --no-json)",
                 strcmp(dir, ".") ? dir : "reports", strerror(errno));
        return bad("--json", "%s", msg);
    }
    if (!strcmp(path, "-")) return 0;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return bad("--json", "'%s' is a directory", path);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    if (access(dir, W_OK | X_OK)) {
        char msg[PATH_MAX + 64];
        snprintf(msg, sizeof msg, "cannot write into '%s': %s", dir, strerror(errno));
        return bad("--json", "%s", msg);
    }
    return 0;
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
                                              "--json", "--timeout", NULL };
        int takes = 0;
        for (int k = 0; valued[k]; k++) takes |= !strcmp(flag, valued[k]);
        if (takes) {
            if (eq) v = eq + 1;
            else if (i + 1 < argc) v = argv[++i];
            else return bad(flag, "%s", "missing value");
            if (!*v) return bad(flag, "%s", "empty value");
            if (!eq && !strncmp(v, "--", 2)) return bad(flag, "missing value: '%s' is a flag (write FLAG=VALUE for a value that starts with --)", v);
        } else if (eq) {
            return bad(flag, "%s", "takes no value");
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
        else if (!strcmp(flag, "--no-json")) o->no_json = 1;
        else if (!strcmp(flag, "--summary-only")) o->summary_only = 1;
        else if (!strcmp(flag, "--local-loss")) o->cfg.local_loss = 1;
        else return bad(flag, "%s", "unknown option");
        if (rc) return rc;
    }
    if (o->no_json && o->json) return bad("--no-json", "%s", "conflicts with --json");
    if (!o->no_json && report_path_ok(o->json)) return 2;
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
        return bad("--backend", "%s", "this build has no NCCL backend (configure found no CUDA Toolkit with NCCL); use --backend mpi");
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
// mpirun gets SIGTERM too when the launcher dies by SIGKILL (PR_SET_PDEATHSIG).
static volatile sig_atomic_t mpirun_pid, caught;
static void forward_signal(int sig) {
    caught = sig;
    if (mpirun_pid > 0) kill((pid_t)mpirun_pid, sig);
}

// The launcher's verdict comes from rank 0 (a file in a private directory), never from mpirun's exit
// status: mpirun exiting with 1 because a launch failed is not a gradient finding.
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
    setenv("GCD_RESULT_FILE", result, 1);
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
    char **av = calloc((size_t)argc + 2 * (size_t)nenv + 16, sizeof *av);
    mallocCheck(av);
    int n = 0;
    av[n++] = "mpirun";
    av[n++] = "-np";
    av[n++] = np;
    if (!o->hostfile && world > physical_cores()) av[n++] = "--oversubscribe";
    if (geteuid() == 0) av[n++] = "--allow-run-as-root";
    if (o->hostfile) av[n++] = "--hostfile", av[n++] = (char *)o->hostfile;
    // one node: the ob1 PML straight away. The default (cm) loads the psm/psm2 libraries first, whose
    // constructors sleep ~0.2 s, then settles on ob1 anyway. A PML the user chose, or several hosts
    // (UCX, InfiniBand), keep Open MPI's choice.
    const char *pml = getenv("OMPI_MCA_pml");
    if (!o->hostfile && !(pml && *pml)) av[n++] = "--mca", av[n++] = "pml", av[n++] = "ob1";
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
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) return fprintf(stderr, "gradcheck-dist: fork: %s\n", strerror(errno)), rmdir(dir), 3;
    if (pid == 0) {
        for (int i = 0; i < 3; i++) sigaction(forwarded[i], &old[i], NULL);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(3);   // the launcher died before the line above
        int null = open("/dev/null", O_RDONLY);   // the ranks read no stdin: a caller's stays its own
        if (null >= 0) dup2(null, 0), close(null);
        execvp(av[0], av);
        fprintf(stderr, "gradcheck-dist: cannot start mpirun: %s (install openmpi-bin)\n", strerror(errno));
        _exit(127);
    }
    for (int i = first_x + 1; i < last_x; i += 2) free(av[i]);
    free(av);
    mpirun_pid = pid;
    if (caught) kill(pid, caught);   // a signal between fork and here
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return fprintf(stderr, "gradcheck-dist: waitpid: %s\n", strerror(errno)), 3;
    mpirun_pid = 0;
    int code = -1;
    FILE *f = fopen(result, "r");
    if (f) {
        if (fscanf(f, "%d", &code) != 1 || code < 0 || code > 3) code = -1;
        fclose(f);
        unlink(result);
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
    double t0;
    volatile sig_atomic_t reserved, written;   // the default path was created empty for us; the report is in it
} job;

// rank 0, ended by a signal (mpirun forwards the launcher's): no half report, no empty reserved name
static void rank0_signal(int sig) {
    if (job.reserved && !job.written) unlink(job.path);
    _exit(128 + sig);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// rank 0's fatal hook: leave a report saying what failed
static void write_error_report(const char *message) {
    if (!job.doc || !job.path[0]) return;
    char err[512];
    gcd_report_finish(job.doc, 3, message, 0, now() - job.t0);
    if (gcd_report_write(job.doc, job.path, err, sizeof err)) {
        fprintf(stderr, "gradcheck-dist: %s\n", err);
        if (job.reserved) unlink(job.path);
    } else if (strcmp(job.path, "-")) {
        fprintf(stderr, "gradcheck-dist: error report written to %s\n", job.path);
    }
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

static void environment(gcd_comm *comm, gcd_env *env, int root) {
    static char host[256], device[256];
    memset(env, 0, sizeof *env);
    env->backend = comm->backend;
    env->world = comm->world;
    gethostname(host, sizeof host - 1);
    char *hosts = root ? gcd_malloc((size_t)comm->world * 256) : NULL;
    gcd_mpi_gather_str(host, hosts, 256);
    gcd_mpi_library_version(env->mpi_version, sizeof env->mpi_version);
    int nccl = !strcmp(comm->backend, "nccl");
    if (nccl) gcd_nccl_info(comm, env->nccl_version, env->cuda_version, device, sizeof device);
    char *devs = root && nccl ? gcd_malloc((size_t)comm->world * 256) : NULL;
    if (nccl) gcd_mpi_gather_str(device, devs, 256);
    if (root) {
        env->hostnames = gcd_malloc((size_t)comm->world * sizeof(char *));
        if (nccl) env->devices = gcd_malloc((size_t)comm->world * sizeof(char *));
        for (int k = 0; k < comm->world; k++) {
            env->hostnames[k] = hosts + 256 * k;
            if (nccl) env->devices[k] = devs + 256 * k;
        }
    }
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

static int run_rank(const options *o, int argc, char **argv) {
    char **args = gcd_malloc((size_t)argc * sizeof *args);   // the command as typed, before MPI_Init
    for (int i = 0; i < argc; i++) args[i] = gcd_strdup(argv[i]);
    gcd_mpi_set_timeout(o->timeout);   // MPI_Init too
    gcd_mpi_init(&argc, &argv);
    gcd_comm *comm = gcd_comm_mpi();
    int root = comm->rank == 0;
    if (o->world && o->world != comm->world) {
        if (root) fprintf(stderr, "gradcheck-dist: --world: %d, but this MPI job has %d ranks\n", o->world, comm->world);
        gcd_mpi_finalize();
        return rank_exit(root, 2);
    }
    if (!strcmp(o->backend, "nccl")) {
        char why[512] = "";
        gcd_comm *nccl = gcd_comm_nccl(comm, why, sizeof why);
        if (!nccl) {
            if (root) fprintf(stderr, "gradcheck-dist: --backend nccl: %s; use --backend mpi\n", why);
            gcd_mpi_finalize();
            return rank_exit(root, 2);
        }
        comm = nccl;
    }
    if (!getenv("OPENBLAS_NUM_THREADS")) {   // a plain mpirun, not the launcher: this node's CPUs shared out
        int local_rank, local_size;
        gcd_mpi_local(&local_rank, &local_size);
        gcd_blas_share_cpus(local_size);
    }
    job.t0 = now();
    gcd_env env;
    environment(comm, &env, root);
    if (root) {
        job.doc = gcd_report_new(argc, args, &env);
        if (o->json) snprintf(job.path, sizeof job.path, "%s", o->json);
        else if (!o->no_json) job.reserved = default_report_path(job.path, sizeof job.path);
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
            gcd_run(comm, &ro, &res);
            if (root) {
                int test = o->mode_given || ro.mode == GCD_GATHER_ON;
                gcd_report_add_run(job.doc, &res, test ? "test" : "control", o->summary_only);
                all_met &= expect(job.doc, &res, pr, test);
            }
            gcd_run_result_free(&res);
        }
        gcd_reference_free(&ref);
    }

    int code = all_met ? 0 : 1;
    if (root) {   // the report first, so that the text says the code the process returns
        gcd_report_finish(job.doc, code, NULL, 0, now() - job.t0);
        char err[512];
        if (job.path[0] && gcd_report_write(job.doc, job.path, err, sizeof err)) {
            fprintf(stderr, "gradcheck-dist: %s\n", err);
            code = 3;
            gcd_report_finish(job.doc, code, err, 0, now() - job.t0);
            if (job.reserved) unlink(job.path);   // no empty report left behind
            job.path[0] = 0;
        }
        job.written = 1;
        char *text = gcd_render_text(job.doc);
        FILE *out = o->json && !strcmp(o->json, "-") ? stderr : stdout;
        fputs(text, out);
        free(text);
        if (job.path[0] && strcmp(job.path, "-")) fprintf(out, "report: %s\n", job.path);
        if (fflush(out) || ferror(out)) {
            fprintf(stderr, "gradcheck-dist: writing the table: %s\n", strerror(errno));
            code = 3;
        }
        fflush(NULL);
        cJSON_Delete(job.doc);
        job.doc = NULL;
        free(env.hostnames ? env.hostnames[0] : NULL), free(env.hostnames);
        free(env.devices ? env.devices[0] : NULL), free(env.devices);
    }
    gcd_mpi_bcast_int(&code, 0);
    if (comm->impl) gcd_comm_nccl_free(comm);
    gcd_mpi_finalize();
    for (int i = 0; i < argc; i++) free(args[i]);
    free(args);
    return rank_exit(root, code);
}

// ----------------------------------------------------------------------------
// check DUMP... [--ref REF]: the user's own gradients

static int check_main(int argc, char **argv) {
    const char **dumps = gcd_malloc((size_t)argc * sizeof *dumps), **ignore = gcd_malloc((size_t)argc * sizeof *ignore);
    gcd_check_opts o = { .dumps = dumps, .ignore = ignore };
    const char *json = NULL;
    int no_json = 0, rc = 0;
    for (int i = 2; i < argc && !rc; i++) {
        char flag[64];
        const char *a = argv[i], *eq = strchr(a, '='), *v = NULL;
        if (a[0] != '-' || !a[1]) { dumps[o.ndumps++] = a; continue; }
        snprintf(flag, sizeof flag, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
        int takes = !strcmp(flag, "--ref") || !strcmp(flag, "--ignore") || !strcmp(flag, "--tol") || !strcmp(flag, "--json");
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
        } else rc = bad(flag, "%s", "unknown option");
    }
    if (!rc && !o.ndumps) rc = bad("check", "%s", "missing DUMP... or DIR (one safetensors dump per rank; see check --snippet)");
    if (!rc && no_json && json) rc = bad("--no-json", "%s", "conflicts with --json");
    if (!rc && !no_json) rc = report_path_ok(json);
    o.no_hash = no_json;   // the sha256 of each dump goes into the report; without one, no hashing
    if (rc) { free(dumps), free(ignore); return rc; }

    double t0 = now();
    char err[2048];
    gcd_check_set set;
    gcd_run_result res = { 0 };
    rc = gcd_check_load(&o, &set, err, sizeof err);
    if (!rc) rc = gcd_check_scan(&o, &set, &res, err, sizeof err);
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

    char path[PATH_MAX] = "";
    if (json) snprintf(path, sizeof path, "%s", json);
    int reserved = !json && !no_json && default_report_path(path, sizeof path);
    gcd_report_finish(doc, code, NULL, 0, now() - t0);
    if (path[0] && gcd_report_write(doc, path, err, sizeof err)) {
        fprintf(stderr, "gradcheck-dist: %s\n", err);
        if (reserved) unlink(path);
        code = 3;
        gcd_report_finish(doc, code, err, 0, now() - t0);
        path[0] = 0;
    }
    FILE *out = json && !strcmp(json, "-") ? stderr : stdout;
    char *text = gcd_render_text(doc);
    fputs(text, out);
    free(text);
    if (path[0] && strcmp(path, "-")) fprintf(out, "report: %s\n", path);
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
        } else if (argv[i][0] == '-' && argv[i][1]) return bad(argv[i], "%s", "unknown option");
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
    if (argc < 2) return fputs(usage, stderr), 2;
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) return fputs(usage, stdout), 0;
    if (!strcmp(cmd, "--version")) return puts("gradcheck-dist " GCD_VERSION), 0;
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(usage, stdout), 0;
    if (!strcmp(cmd, "report")) return report_main(argc, argv);
    if (!strcmp(cmd, "check")) return check_main(argc, argv);
    if (strcmp(cmd, "run")) return bad(cmd, "%s", "unknown command: expected run, check or report");
    options o;
    int rc = parse_run(argc, argv, &o);
    if (rc) return rc;
    return gcd_mpi_inside_job() ? run_rank(&o, argc, argv) : launch(&o, argc, argv);
}
