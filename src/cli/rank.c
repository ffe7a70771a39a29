// One rank of `run`: every probe under every gather mode, the table and verdicts on rank 0, the reports.
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
#define XXH_STATIC_LINKING_ONLY   // XXH3_state_t on the stack
#include <xxhash.h>

// process-wide: rank 0's signal handler (rank0_signal) and fatal hook (write_error_report) read it, and
// neither takes a context
static struct {
    cJSON *doc;
    char path[PATH_MAX];
    char junit[PATH_MAX];                        // --junit, or ""
    double t0;
    volatile sig_atomic_t reserved, written;   // the default path was created empty for us; the report is in it
} job;

static char interrupted_file[PATH_MAX + 32], launcher_stat[64];   // under the launcher; "" otherwise (the signal handler's too)

// a file of the private directory rank 0 shares with the launcher ("" when not under the launcher)
static void shared_file(char *buf, size_t len, const char *name) {
    const char *result = getenv("GCD_RESULT_FILE"), *slash = result ? strrchr(result, '/') : NULL;
    if (slash) snprintf(buf, len, "%.*s/%s", (int)(slash - result), result, name);
    else if (len) buf[0] = 0;
}

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
// reserved name. A signal sent to the whole job at once (scancel, kill of a process group) may reach
// rank 0 before the launcher has left its file: rank 0 gives it half a second.
static int interrupted_soon(void) {   // async-signal-safe
    for (int i = 0; i < 50; i++) {
        if (access(interrupted_file, F_OK) == 0) return 1;
        nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
    }
    return 0;
}

static void rank0_signal(int sig) {
    if (interrupted_file[0] && launcher_alive() && (job.path[0] || job.junit[0]) && !job.written && !interrupted_soon()) {
        gcd_mpi_stop(sig);
        return;
    }
    if (job.reserved && !job.written) unlink(job.path);
    _exit(128 + sig);
}

// ----------------------------------------------------------------------------
// progress on stderr, rank 0 only: on a terminal one line rewritten in place (probe, mode, step k/N,
// elapsed); otherwise one line as each probe and mode ends

// process-wide: gcd_run's progress callback (progress_step) takes no context
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

// rank 0's fatal hook: leave a report (and the JUnit file) saying what failed
static void write_error_report(const char *message) {
    if (!job.doc || (!job.path[0] && !job.junit[0])) return;
    gcd_report_finish(job.doc, 3, message, 0, now() - job.t0);
    write_reports(job.doc, job.path, job.reserved, job.junit, 3, now() - job.t0);
    if (job.path[0] && strcmp(job.path, "-")) put_path(stderr, "gradcheck-dist: error report written to ", job.path);
    if (job.junit[0] && strcmp(job.junit, "-")) put_path(stderr, "gradcheck-dist: JUnit written to ", job.junit);
    job.written = 1;
}

// Every rank's host and pid (to name a rank that dies) and a digest of its command, in one collective
// before any other: every rank must run the same command, as the collectives that follow, and their
// counts, come from it. Returns the facts (world); *differs is the first rank given another command, or -1.
typedef struct {
    char host[256], pid[24], command[33];
} rank_facts;

static rank_facts *gather_rank_facts(int argc, char **args, int world, int *differs) {
    rank_facts mine = { 0 }, *all = gcd_malloc((size_t)world * sizeof *all);
    if (gethostname(mine.host, sizeof mine.host - 1) || !mine.host[0]) strcpy(mine.host, "?");   // as the report says of any unknown
    snprintf(mine.pid, sizeof mine.pid, "%ld", (long)getpid());
    XXH3_state_t h;
    XXH3_128bits_reset(&h);
    for (int i = 1; i < argc; i++) XXH3_128bits_update(&h, args[i], strlen(args[i]) + 1);   // argv[0]: installed anywhere
    XXH128_hash_t d = XXH3_128bits_digest(&h);
    gcd_xxh128_hex(d.high64, d.low64, mine.command);
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
        _Static_assert(sizeof env->nccl_version == GCD_VERSION_LEN && sizeof env->cuda_version == GCD_VERSION_LEN, "gcd_nccl_info's lengths");
        gcd_nccl_info(comm, env->nccl_version, env->cuda_version, device, sizeof device);   // len: device's alone
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
        gcd_signature sig = gcd_expected_signature(res->mode, res->cfg.local_loss, res->world, res->finalize);
        if (!met) gcd_sb_printf(&msg, "did not show its known defect at world %d: %s", res->world, why.s);
        else if (gcd_run_has_finding(res))
            gcd_sb_printf(&msg, res->finalize ? "shows exactly its known defect: %s%s on the replicated parameters, %s on the rest" : "shows exactly its known defect: %s%s before the gather, %s after", gcd_status_str(sig.before),
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

// why this job cannot run, decided alike on every rank ("" when it can): the same command everywhere,
// --world as the job's, NCCL's own agreement (*comm becomes the NCCL communicator)
static void job_refusal(const options *o, gcd_comm **comm, int differs, char *why, size_t len) {
    if (differs >= 0)
        snprintf(why, len, "rank %d was started with other options than rank 0: every rank must run the same command", differs);
    else if (o->world && o->world != (*comm)->world)
        snprintf(why, len, "--world: %d, but this MPI job has %d ranks", o->world, (*comm)->world);
    else if (!strcmp(o->backend, "nccl")) {
        char reason[512] = "";
        gcd_comm *nccl = gcd_comm_nccl(*comm, reason, sizeof reason);
        if (nccl) *comm = nccl;
        else snprintf(why, len, "--backend nccl: %s; use --backend mpi", reason);
    }
}

// under the launcher: the files rank 0 shares with it, and every rank's pid and host, to name a rank that dies
static void launcher_files(const gcd_comm *comm, const rank_facts *facts) {
    shared_file(interrupted_file, sizeof interrupted_file, "interrupted");
    const char *launcher = getenv("GCD_LAUNCHER_PID");   // a launcher killed by SIGKILL leaves no file: it is gone
    snprintf(launcher_stat, sizeof launcher_stat, "/proc/%ld/stat", launcher ? atol(launcher) : 0L);
    if (interrupted_file[0] && comm->rank == 0) {
        char path[PATH_MAX + 32];
        shared_file(path, sizeof path, "ranks");
        FILE *f = fopen(path, "w");
        for (int k = 0; f && k < comm->world; k++) fprintf(f, "%d %s %s\n", k, facts[k].pid, facts[k].host);
        if (f) fclose(f);
    }
}

// rank 0's job: the report's document and where it goes, the progress line, the fatal hook and the
// signals that leave an error report
static void rank0_job(const options *o, int nargs, char **args, const gcd_env *env) {
    job.doc = gcd_report_new(nargs, args, env);
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

// every chosen probe under every chosen mode; on rank 0 each run goes into the report with its
// expectation. Returns 1 when every expectation was met (rank 0's answer; 1 elsewhere)
static int run_probes(const options *o, gcd_comm *comm) {
    int root = comm->rank == 0, all_met = 1;
    gcd_arena passes = { 0 };   // every run's passes, in the same memory: touched once, not once a run
    for (int pi = 0; gcd_probes[pi]; pi++) {
        const gcd_probe *pr = gcd_probes[pi];
        if (strcmp(o->probe, "all") && strcmp(o->probe, pr->name)) continue;
        gcd_reference ref = { 0 };   // one reference for every mode of this probe (rank 0's)
        for (int mi = 0; mi < o->nmode; mi++) {
            gcd_run_opts ro = { .probe = pr, .cfg = o->cfg, .mode = o->mode[mi], .steps = o->steps, .lr = o->lr, .ref = &ref, .arena = &passes };
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
    gcd_arena_free(&passes);
    return all_met;
}

// rank 0's ending: the report written first, so that the text says the code the process returns, then
// the table; returns the code (3 when a report or the table could not be written)
static int rank0_finish(const options *o, gcd_env *env, int code) {
    gcd_report_finish(job.doc, code, NULL, 0, now() - job.t0);
    code = write_reports(job.doc, job.path, job.reserved, job.junit, code, now() - job.t0);
    job.written = 1;
    if (progress.tty) fprintf(stderr, "\r\033[K"), fflush(stderr);   // the live line gives way to the table
    FILE *out = (o->json && !strcmp(o->json, "-")) || (o->junit && !strcmp(o->junit, "-")) ? stderr : stdout;
    const char *columns = getenv("GCD_COLUMNS");   // the launcher's terminal (our stdout is mpirun's pipe)
    char *text = gcd_render_text_width(job.doc, columns ? atoi(columns) : gcd_text_width(fileno(out)));
    fputs(text, out);
    free(text);
    if (job.path[0] && strcmp(job.path, "-")) put_path(out, "report: ", job.path);
    if (job.junit[0] && strcmp(job.junit, "-")) put_path(out, "junit: ", job.junit);
    if (fflush(out) || ferror(out)) {
        fprintf(stderr, "gradcheck-dist: writing the table: %s\n", strerror(errno));
        code = 3;
    }
    fflush(NULL);
    cJSON_Delete(job.doc);
    job.doc = NULL;
    free(env->hostnames), free(env->devices ? env->devices[0] : NULL), free(env->devices);
    return code;
}

int run_rank(const options *o, int argc, char **argv) {
    int nargs = argc;
    char **args = gcd_malloc((size_t)argc * sizeof *args);   // the command as typed, before MPI_Init
    for (int i = 0; i < argc; i++) args[i] = gcd_strdup(argv[i]);
    gcd_mpi_set_timeout(o->timeout);   // MPI_Init too
    gcd_mpi_init(&argc, &argv);
    gcd_comm *comm = gcd_comm_mpi();
    int root = comm->rank == 0, differs;
    rank_facts *facts = gather_rank_facts(nargs, args, comm->world, &differs);
    gcd_mpi_set_hosts(facts[0].host, sizeof *facts);   // the node's ranks (gcd_mpi_local), from the same collective
    char why[640] = "";   // every rank decides alike: the same facts, the same job, NCCL's own agreement
    job_refusal(o, &comm, differs, why, sizeof why);
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
    launcher_files(comm, facts);
    if (root) rank0_job(o, nargs, args, &env);
    int code = run_probes(o, comm) ? 0 : 1;
    if (root && interrupted_file[0] && !launcher_alive()) {   // the launcher was killed (SIGKILL): nobody takes a verdict
        if (job.reserved) unlink(job.path);
        fprintf(stderr, "gradcheck-dist: the launcher is gone: no report\n");
        _exit(3);
    }
    if (root) code = rank0_finish(o, &env, code);
    // the verdict to the launcher first: a peer stopped from here on fails only what follows (exit 3)
    int exit_code = root ? rank_exit(root, code) : 0;
    gcd_comm_set_context("the final broadcast of the exit code");
    gcd_mpi_bcast_int(&code, 0);
    if (!root) exit_code = rank_exit(root, code);
    if (comm->impl) gcd_comm_nccl_free(comm);
    gcd_mpi_finalize();
    free(facts);
    for (int i = 0; i < nargs; i++) free(args[i]);
    free(args);
    return exit_code;
}
