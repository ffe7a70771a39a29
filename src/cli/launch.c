// The launcher: not inside an MPI job yet, so start mpirun -np N on this same program, supervise it, and
// take the verdict rank 0 leaves.
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
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

extern char **environ;

// ----------------------------------------------------------------------------
// supervision. mpirun runs in its own process group, so a terminal's Ctrl-C reaches the launcher alone
// (mpirun given SIGINT twice, by the terminal and by the launcher, exits at once without ending the
// ranks). The launcher passes the first SIGINT, SIGTERM or SIGHUP on to mpirun, which ends the ranks;
// mpirun not gone GCD_END_GRACE seconds later, or a second signal, is SIGKILL to mpirun's group and to
// each rank on this host. mpirun gets SIGTERM when the launcher dies by SIGKILL (PR_SET_PDEATHSIG).
// The launcher first leaves a file "interrupted" in its private directory: rank 0 then leaves no report;
// without it (mpirun ending the job because another rank died) rank 0 writes its error report.
enum { GCD_END_GRACE = 10 };
static const size_t stderr_cap = 1 << 20;   // bytes of mpirun's stderr passed on (a flood is a broken launch)
// process-wide: the signal handler (forward_signal) reads and writes these, and a handler takes no context
static volatile sig_atomic_t mpirun_pid, caught, signals;
static char interrupted[PATH_MAX + 32];
static void forward_signal(int sig) {
    if (!caught) caught = sig;
    signals++;
    int fd = open(interrupted, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
    if (mpirun_pid > 0) kill(-(pid_t)mpirun_pid, signals > 1 ? SIGKILL : sig);
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

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Each rank on this host, from the list rank 0 left ("rank pid host" a line), that is still this program:
// SIGKILL (mpirun itself killed leaves its ranks running)
static void kill_ranks(const char *dir, const char *exe) {
    char path[PATH_MAX + 32], list[65536], host[256] = "";
    gethostname(host, sizeof host - 1);
    snprintf(path, sizeof path, "%s/ranks", dir);
    if (!read_small(path, list, sizeof list)) return;
    for (char *save = NULL, *l = strtok_r(list, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        int r;
        long p;
        char h[256], link[64], target[PATH_MAX];
        if (sscanf(l, "%d %ld %255s", &r, &p, h) != 3 || p <= 1 || strcmp(h, host)) continue;
        snprintf(link, sizeof link, "/proc/%ld/exe", p);
        ssize_t k = readlink(link, target, sizeof target - 1);
        if (k > 0 && (target[k] = 0, !strcmp(target, exe))) kill((pid_t)p, SIGKILL);
    }
}

// What the launcher watches besides mpirun's stderr: the ranks started (rank 0 left its list), the
// verdict given (the result file), and the deadlines on both; why it ended the job, if it did.
typedef struct {
    const char *dir, *exe, *result;
    double t0, start_limit, exit_limit;   // seconds: start from t0, exit from the verdict
    double verdict_at, ending_at, caught_at;
    int started, killed;
    size_t forwarded, dropped;
    char why[256];
} watch;

// mpirun's exit seen without reaping it (waitid WNOWAIT), then, with the forwarded signals blocked,
// mpirun_pid cleared and mpirun reaped: no handler can signal its group id once that id may be reused.
// 1 when reaped (*status set); 0 when still running (WNOHANG) or on an error (errno set).
static int reap(pid_t pid, int *status, int flags) {
    siginfo_t si = { 0 };
    if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT | flags) < 0 || si.si_pid != pid) return 0;
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT), sigaddset(&block, SIGTERM), sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &old);
    mpirun_pid = 0;
    int r = waitpid(pid, status, 0) == pid;
    sigprocmask(SIG_SETMASK, &old, NULL);
    return r;
}

static void end_job(watch *w, pid_t pid, const char *why) {
    if (mpirun_pid <= 0) return;   // reaped: its group id is no longer ours
    if (w->ending_at > 0 || w->killed) return;
    snprintf(w->why, sizeof w->why, "%s", why);
    w->ending_at = mono();
    kill(-pid, SIGTERM);
}

static void kill_job(watch *w, pid_t pid) {
    if (w->killed) return;
    w->killed = 1;
    if (mpirun_pid > 0) kill(-pid, SIGKILL);   // never a group id after mpirun was reaped (it may be another's)
    kill_ranks(w->dir, w->exe);
}

// Every turn: a deadline passed ends the job (SIGTERM, then SIGKILL after the grace).
static void supervise(watch *w, pid_t pid) {
    double t = mono();
    char path[PATH_MAX + 32], msg[256];
    if (!w->started) {
        snprintf(path, sizeof path, "%s/ranks", w->dir);
        w->started = access(path, F_OK) == 0;
    }
    if (w->verdict_at == 0 && access(w->result, F_OK) == 0) w->verdict_at = t;
    if (caught && w->caught_at == 0) w->caught_at = t;
    if (!w->started && w->verdict_at == 0 && t - w->t0 > w->start_limit) {
        snprintf(msg, sizeof msg, "mpirun did not start the ranks within %g s (--timeout + %d s): it was ended", w->start_limit - GCD_END_GRACE * 3, GCD_END_GRACE * 3);
        end_job(w, pid, msg);
    }
    if (w->verdict_at > 0 && t - w->verdict_at > w->exit_limit) {
        snprintf(msg, sizeof msg, "mpirun had not exited %g s after rank 0 gave its verdict: it was ended", w->exit_limit);
        end_job(w, pid, msg);
    }
    if ((w->ending_at > 0 && t - w->ending_at > GCD_END_GRACE) || (w->caught_at > 0 && t - w->caught_at > GCD_END_GRACE) || signals > 1) kill_job(w, pid);
}

// Until EOF, or mpirun reaped and the pipe quiet for 0.2 s (a stray holder of the pipe must not hang
// the launcher). Sets *status and returns 1 when it reaped mpirun. At most stderr_cap bytes are passed
// on; past that, a job whose ranks have not started is ended (an endless error flood), and a running
// one runs on with the rest counted, not shown.
static int forward_stderr(int fd, mpirun_log *m, pid_t pid, int *status, watch *wt) {
    char buf[4096];
    int reaped = 0;
    for (;;) {
        supervise(wt, pid);
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int r = poll(&p, 1, 200);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) {
            if (reaped) return 1;
            reaped = reap(pid, status, WNOHANG);   // its pid may be reused: forward no signal to it
            continue;
        }
        ssize_t k = read(fd, buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return reaped;
        if (wt->forwarded + (size_t)k > stderr_cap) {
            size_t keep = stderr_cap - wt->forwarded;
            wt->dropped += (size_t)k - keep;
            if (keep == 0) {
                if (!wt->started) end_job(wt, pid, "mpirun wrote more than 1 MiB to stderr before any rank started (the first 1 MiB is above): it was ended");
                goto scan;
            }
            k = (ssize_t)keep;
        }
        wt->forwarded += (size_t)k;
        for (ssize_t off = 0; off < k;) {
            ssize_t w = write(2, buf + off, (size_t)(k - off));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break;   // our stderr is gone: keep reading, so that mpirun never blocks on the pipe
            off += w;
        }
        if (wt->forwarded == stderr_cap) fprintf(stderr, "\ngradcheck-dist: mpirun's stderr passed 1 MiB: the rest is not shown\n");
    scan:
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
        if (gcd_report_write(doc, report, err, sizeof err)) say("", err);
        else {
            char *r = gcd_term_str(report);
            fprintf(stderr, "gradcheck-dist: the error report, %s, names rank %d\n", r, m->rank);
            free(r);
        }
        char *xml = junit ? gcd_render_junit(doc) : NULL;   // and the JUnit file rank 0 wrote from it
        if (xml && gcd_text_write(xml, "--junit", junit, err, sizeof err)) say("", err);
        free(xml);
    }
    cJSON_Delete(doc);
}

// After the launcher's own signal the words and the files agree, said once. A verdict rank 0 gave before
// the signal stands (its report is whole). Otherwise a report this run left (rank 0's error report, when
// its signal came before the launcher's) is rewritten to say the job was cancelled, and by which signal,
// and the JUnit file with it; the words say whether a report was left.
static int cancelled(const options *o, const char *report, time_t started, int code) {
    int sig = (int)caught;
    if (code >= 0) {
        fprintf(stderr, "gradcheck-dist: signal %d (%s) came after rank 0's verdict (exit %d): the report stands\n", sig, strsignal(sig), code);
        return code;
    }
    char msg[160], err[512];
    snprintf(msg, sizeof msg, "cancelled by signal %d (%s): mpirun and the ranks were ended before the verdict", sig, strsignal(sig));
    const char *junit = o->junit && strcmp(o->junit, "-") ? o->junit : NULL;
    struct stat st;
    int ours = report[0] && stat(report, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && st.st_mtime >= started;
    cJSON *doc = ours ? gcd_report_load(report, err, sizeof err) : NULL;
    if (doc) {
        const cJSON *env = cJSON_GetObjectItem(doc, "environment");
        gcd_report_finish(doc, 3, msg, 0, gcd_json_num(cJSON_GetObjectItem(env, "wall_seconds")));
        char *xml = junit ? gcd_render_junit(doc) : NULL;
        int bad_write = gcd_report_write(doc, report, err, sizeof err) || (xml && gcd_text_write(xml, "--junit", junit, err, sizeof err));
        free(xml);
        cJSON_Delete(doc);
        if (!bad_write) {
            char *r = gcd_term_str(report);
            fprintf(stderr, "gradcheck-dist: %s; the report, %s, says so\n", msg, r);
            free(r);
            return 3;
        }
        say("", err);
    } else if (junit && stat(junit, &st) == 0 && S_ISREG(st.st_mode) && st.st_mtime >= started)
        unlink(junit);   // rank 0's JUnit error without its report: it would say another thing than these words
    fprintf(stderr, "gradcheck-dist: %s; no report\n", msg);
    return 3;
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

// BLAS threads a rank: the user's OPENBLAS_NUM_THREADS (checked), else this machine's cores shared out
static int blas_threads(int world, long *threads) {
    const char *blas = getenv("OPENBLAS_NUM_THREADS");
    *threads = physical_cores() / world;
    if (!blas) return 0;
    char *end;
    errno = 0;
    *threads = strtol(blas, &end, 10);
    if (end == blas || *end || errno || *threads < 1 || *threads > 1024)
        return bad("OPENBLAS_NUM_THREADS", "expected a number of threads from 1 to 1024, got '%s'", blas);
    return 0;
}

// the launcher's private directory (dir: mkdtemp's, result: rank 0's verdict file in it), and what the
// ranks learn from the environment; 0, or the exit code
static int make_run_dir(const options *o, int world, char dir[PATH_MAX], char result[PATH_MAX + 16]) {
    const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    int rc = tmpdir_room(tmpdir, world);
    if (rc) return rc;
    snprintf(dir, PATH_MAX, "%s/gradcheck-dist.XXXXXX", tmpdir);
    if (!mkdtemp(dir)) return fprintf(stderr, "gradcheck-dist: mkdtemp %s: %s\n", dir, strerror(errno)), 3;
    snprintf(result, PATH_MAX + 16, "%s/result", dir);
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
    return 0;
}

// mpirun's command line: av (calloc'd; the -x names in [first_x, last_x) strdup'd), np and pe its texts
typedef struct {
    char **av;
    int first_x, last_x;
    char np[16], pe[32];
} mpirun_cmd;

// mpirun's options: ranks, slots, the grace to end them, hosts, one node's transports, binding
static int mpirun_options(const options *o, int world, long threads, mpirun_cmd *c) {
    char **av = c->av;
    int n = 0;
    snprintf(c->pe, sizeof c->pe, "slot:PE=%ld", threads);
    snprintf(c->np, sizeof c->np, "%d", world);
    av[n++] = "mpirun";
    av[n++] = "-np";
    av[n++] = c->np;
    // more ranks than slots: asked for (--oversubscribe), or more than this machine's cores outside an
    // allocation (inside one, slurm_refusal above refused it unless asked for)
    if (o->oversubscribe || (!o->hostfile && !getenv("SLURM_JOB_ID") && world > physical_cores())) av[n++] = "--oversubscribe";
    if (geteuid() == 0) av[n++] = "--allow-run-as-root";
    // when a rank dies, mpirun ends the others with SIGTERM, then SIGKILL after this many seconds (1 by
    // default; mpirun waits it out whole, twice): time for rank 0 to write its error report (an fsync)
    av[n++] = "--mca", av[n++] = "odls_base_sigkill_timeout", av[n++] = "3";
    if (o->hostfile) av[n++] = "--hostfile", av[n++] = (char *)o->hostfile;
    // One node: only what a one-node job uses (ob1, self+vader, libnbc's recursive doubling, hwloc without
    // I/O discovery); what the user set, or several hosts, keeps Open MPI's choice. Why each: docs/launcher.md.
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
    if (!o->hostfile && threads > 1 && threads * world <= physical_cores()) av[n++] = "--map-by", av[n++] = c->pe;
    return n;
}

// the whole command: mpirun's options, the environment forwarded by name, then this program and its arguments
static void mpirun_command(const options *o, int world, long threads, const char *exe, int argc, char **argv, mpirun_cmd *c) {
    int nenv = 0;
    for (char **e = environ; *e; e++) nenv++;
    c->av = calloc((size_t)argc + 2 * (size_t)nenv + 32, sizeof *c->av);   // 20 fixed at most
    mallocCheck(c->av);
    int n = mpirun_options(o, world, threads, c);
    // Open MPI starts ranks on other nodes without this environment: forward every GCD_, NCCL_ and
    // OPENBLAS_ variable (GCD_RESULT_FILE, GCD_NCCL_TIMEOUT, NCCL_DEBUG, ...) by name with -x
    c->first_x = n;
    for (char **e = environ; *e; e++)
        if (!strncmp(*e, "GCD_", 4) || !strncmp(*e, "NCCL_", 5) || !strncmp(*e, "OPENBLAS_", 9)) {
            c->av[n++] = "-x";
            mallocCheck(c->av[n++] = strndup(*e, strcspn(*e, "=")));
        }
    c->last_x = n;
    c->av[n++] = (char *)exe;
    for (int i = 1; i < argc; i++) c->av[n++] = argv[i];
}

static void mpirun_command_free(mpirun_cmd *c) {
    for (int i = c->first_x + 1; i < c->last_x; i += 2) free(c->av[i]);
    free(c->av);
}

// the forwarded signals' handlers installed (old: what they were), and mpirun forked into its own process
// group with its stderr into err_pipe; mpirun's pid, or -1 (errno says why)
static const int forwarded[3] = { SIGINT, SIGTERM, SIGHUP };
static pid_t start_mpirun(char **av, const int err_pipe[2]) {
    fflush(NULL);
    struct sigaction sa = { .sa_handler = forward_signal }, old[3];
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++) sigaddset(&sa.sa_mask, forwarded[i]);   // one handler at a time: signals++ never loses a count
    for (int i = 0; i < 3; i++) sigaction(forwarded[i], &sa, &old[i]);
    signal(SIGPIPE, SIG_IGN);   // a closed stderr is EPIPE to forward_stderr, not the launcher's death
    pid_t parent = getpid(), pid = fork();
    if (pid != 0) return pid;
    for (int i = 0; i < 3; i++) sigaction(forwarded[i], &old[i], NULL);
    signal(SIGPIPE, SIG_DFL);
    setpgid(0, 0);   // its own process group: the terminal's signals reach the launcher alone
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(3);   // the launcher died before the line above
    int null = open("/dev/null", O_RDONLY);   // the ranks read no stdin: a caller's stays its own
    if (null >= 0) dup2(null, 0), close(null);
    dup2(err_pipe[1], 2);
    execvp(av[0], av);
    fprintf(stderr, "gradcheck-dist: cannot start mpirun: %s (install openmpi-bin)\n", strerror(errno));
    _exit(127);
}

// rank 0's verdict (0..3) from the result file, which goes; -1 when it left none
static int rank0_code(const char *result) {
    int code = -1;
    FILE *f = fopen(result, "r");
    if (f) {
        if (fscanf(f, "%d", &code) != 1 || code < 0 || code > 3) code = -1;
        fclose(f);
        unlink(result);
    }
    return code;
}

// the JSON report this run wrote, if any ("" when none): --json's path, or the default name rank 0 left in dir
static void run_report(const options *o, const char *dir, char report[PATH_MAX]) {
    report[0] = 0;
    if (o->json && strcmp(o->json, "-")) snprintf(report, PATH_MAX, "%s", o->json);
    else if (!o->json && !o->no_json) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/report", dir);
        if (!read_small(path, report, PATH_MAX)) report[0] = 0;
    }
}

static void remove_run_dir(const char *dir) {
    static const char *const left[] = { "ranks", "report", "interrupted" };
    for (int i = 0; i < 3; i++) {
        char f[PATH_MAX + 32];
        snprintf(f, sizeof f, "%s/%s", dir, left[i]);
        unlink(f);
    }
    rmdir(dir);
}

// the exit code once mpirun is gone and no signal came: rank 0's, when mpirun ended well too
static int job_code(const options *o, int status, int code) {
    char how[64];
    if (WIFEXITED(status)) snprintf(how, sizeof how, "mpirun exited with %d", WEXITSTATUS(status));
    else snprintf(how, sizeof how, "mpirun was killed by signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && code < 0) return 3;   // mpirun itself could not start: said above
    if (code >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) return launcher_streams_code(code);   // (sec: broken streams)
    if (code >= 0) {
        fprintf(stderr, "gradcheck-dist: rank 0 gave exit %d, but the MPI job then failed (%s)\n", code, how);
        return 3;
    }
    fprintf(stderr, "gradcheck-dist: the MPI job ended before rank 0 gave its verdict (%s)%s\n", how,
            o->hostfile ? "; with --hostfile, rank 0 must run on this host (list it first) and the hosts must give --world slots"
                        : "; mpirun's message above says why");
    return 3;
}

int launch(const options *o, int argc, char **argv) {
    int world = o->world ? o->world : 2;
    long threads;
    int rc = slurm_refusal(o, world);
    if (rc) return rc;
    if ((rc = feasible(o, world))) return rc;
    if ((rc = blas_threads(world, &threads))) return rc;
    if (!strcmp(o->backend, "nccl") && (rc = nccl_precheck(o, world))) return rc;
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) return fprintf(stderr, "gradcheck-dist: cannot find my own executable: %s\n", strerror(errno)), 3;
    exe[k] = 0;
    char dir[PATH_MAX], result[PATH_MAX + 16];
    if ((rc = make_run_dir(o, world, dir, result))) return rc;
    int err_pipe[2];
    if (pipe(err_pipe) || fcntl(err_pipe[0], F_SETFD, FD_CLOEXEC) || fcntl(err_pipe[1], F_SETFD, FD_CLOEXEC)) return fprintf(stderr, "gradcheck-dist: pipe: %s\n", strerror(errno)), rmdir(dir), 3;
    // BLAS threads, set before OpenBLAS starts in the ranks (unless the user chose): this machine's cores
    // shared out, one a rank when the ranks fill them, more when they do not; each rank is then bound to
    // that many cores (Open MPI binds a rank to one core by default, where its threads would share it)
    if (!getenv("OPENBLAS_NUM_THREADS")) {
        char nt[24];
        snprintf(nt, sizeof nt, "%ld", threads > 1 ? threads : 1);
        setenv("OPENBLAS_NUM_THREADS", nt, 1);
    }
    mpirun_cmd cmd;
    mpirun_command(o, world, threads, exe, argc, argv, &cmd);
    pid_t pid = start_mpirun(cmd.av, err_pipe);
    if (pid < 0) return fprintf(stderr, "gradcheck-dist: fork: %s\n", strerror(errno)), close(err_pipe[0]), close(err_pipe[1]), rmdir(dir), 3;
    mpirun_command_free(&cmd);
    setpgid(pid, pid);   // as the child does: whichever runs first
    mpirun_pid = pid;
    if (caught) kill(-pid, caught);   // a signal between fork and here
    close(err_pipe[1]);
    int status;
    mpirun_log log = { .n = 0 };
    // the ranks start within MPI_Init's deadline (--timeout) and end within MPI_Finalize's: mpirun gets that
    // and GCD_END_GRACE x 3 (its own SIGTERM-then-SIGKILL of the ranks, twice) on either side
    watch wt = { .dir = dir, .exe = exe, .result = result, .t0 = mono() };
    wt.start_limit = o->timeout + GCD_END_GRACE * 3;
    wt.exit_limit = o->timeout + GCD_END_GRACE * 3;
    time_t started = time(NULL);
    int reaped = forward_stderr(err_pipe[0], &log, pid, &status, &wt);
    close(err_pipe[0]);
    while (!reaped && !(reaped = reap(pid, &status, 0)))
        if (errno != EINTR) return fprintf(stderr, "gradcheck-dist: waitpid: %s\n", strerror(errno)), 3;
    if (log.n) log.line[log.n] = 0, scan_line(&log);   // a last line without its newline
    int code = rank0_code(result);
    if (wt.dropped) fprintf(stderr, "gradcheck-dist: %zu bytes of mpirun's stderr past the first 1 MiB were not shown\n", wt.dropped);
    if (!caught && code < 0 && log.sig && !wt.why[0]) name_the_dead(&log, dir, o->junit && strcmp(o->junit, "-") ? o->junit : NULL);
    if (code < 0 && !o->json && !o->no_json) drop_empty_default(dir);
    char report[PATH_MAX];
    run_report(o, dir, report);
    if (wt.killed && !caught) kill_ranks(dir, exe);
    remove_run_dir(dir);
    if (caught) return cancelled(o, report, started, code);
    if (wt.why[0]) {
        fprintf(stderr, "gradcheck-dist: %s\n", wt.why);
        return 3;
    }
    return job_code(o, status, code);
}
