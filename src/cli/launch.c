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

// Open MPI keeps its session files (and the shared-memory segments' backing files) in TMPDIR: a nearly
// full one made mpirun wait out the start deadline (--timeout + 40 s) and leave its ompi.HOST.UID there.
// Refused before anything starts, naming TMPDIR and what is free (exit 3: the machine, not an argument).
enum { GCD_TMPDIR_MIN_MB = 64 };
static int tmpdir_room(const char *tmpdir, int world) {
    struct statvfs fs;
    if (statvfs(tmpdir, &fs) != 0) return 0;   // mkdtemp below says why it cannot
    double have = (double)fs.f_bavail * (double)fs.f_frsize, need = (double)GCD_TMPDIR_MIN_MB * 1048576.0;
    if (have >= need) return 0;
    char *t = gcd_term_str(tmpdir);
    fprintf(stderr, "gradcheck-dist: TMPDIR %s has %.0f KiB free; Open MPI keeps its session files there (%d ranks): "
                    "free %d MiB there or point TMPDIR at another directory\n", t, have / 1024, world, GCD_TMPDIR_MIN_MB);
    free(t);
    return 3;
}

// ----------------------------------------------------------------------------
// Slurm: srun without an MPI plugin starts N copies of this program, each of which would launch its own
// job (N reports, one --json path written by all); srun --mpi=pmi2 gives an environment this Open MPI
// (PMIx only) cannot use. Both are refused before MPI_Init, saying how to start one job.

static long env_long(const char *name) {   // 0 when unset or not a number
    const char *v = getenv(name);
    char *end;
    long x = v && *v ? strtol(v, &end, 10) : 0;
    return v && *v && !*end && x > 0 ? x : 0;
}

// the tasks of this allocation, from SLURM_TASKS_PER_NODE ("2(x3),1" = 7), as Open MPI counts its slots;
// -1 when it is not that form or a count is past 2^24 (a product of two would overflow a long long before)
static long slurm_slots(void) {
    const char *v = getenv("SLURM_TASKS_PER_NODE");
    long total = 0;
    while (v && *v) {
        char *end;
        errno = 0;
        long n = strtol(v, &end, 10), times = 1;
        if (end == v || n < 0 || n > 1L << 24 || errno) return -1;
        if (*end == '(' && end[1] == 'x') {
            const char *t = end + 2;
            times = strtol(t, &end, 10);
            if (end == t || *end != ')' || times < 1 || times > 1L << 24 || errno) return -1;
            end++;
        }
        if (*end && *end != ',') return -1;
        total += n * times;   // at most 2^48 a term
        if (total > 1L << 30) return -1;
        v = *end == ',' ? end + 1 : end;
    }
    return total > 0 ? total : env_long("SLURM_NTASKS");
}

// Open MPI's own variables, when set, must be what mpirun writes: OMPI_COMM_WORLD_SIZE=garbage would
// otherwise make this process a rank of a job of one (MPI_Init's singleton), silently
int mpi_env_refusal(void) {
    static const char *const vars[] = { "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", NULL };
    long size = 0;
    for (int i = 0; vars[i]; i++) {
        const char *v = getenv(vars[i]);
        if (!v) continue;
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10), lo = i == 1 ? 0 : 1, hi = i == 1 && size ? size - 1 : 1L << 24;
        if (end == v || *end || errno || x < lo || x > hi) {
            char what[128];
            snprintf(what, sizeof what, "expected an integer from %ld to %ld (Open MPI sets it for each rank), got '%%s'", lo, hi);
            return bad(vars[i], what, v);
        }
        if (i == 0) size = x;
    }
    return 0;
}

int pmi_unusable(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || !(getenv("PMI_FD") || getenv("PMI_RANK"))) return 0;
    const char *rank = getenv("PMI_RANK");
    if (!rank || !strcmp(rank, "0")) {
        char *type = gcd_term_str(getenv("SLURM_MPI_TYPE") ? getenv("SLURM_MPI_TYPE") : "pmi2");   // the environment's bytes, escaped
        fprintf(stderr, "gradcheck-dist: srun started this task with Slurm's PMI-2 (--mpi=%s), which this Open MPI cannot use (it speaks PMIx): "
                        "start it with srun --mpi=pmix, or salloc -n N gradcheck-dist run --world N\n", type);
        free(type);
    }
    return 3;
}

static int slurm_refusal(const options *o, int world) {
    long tasks = env_long("SLURM_STEP_NUM_TASKS") ? env_long("SLURM_STEP_NUM_TASKS") : env_long("SLURM_NTASKS");
    if (getenv("SLURM_STEP_ID") && tasks > 1) {
        const char *id = getenv("SLURM_PROCID");
        if (!id || !strcmp(id, "0"))
            fprintf(stderr, "gradcheck-dist: srun started %ld tasks that are not one MPI job (no PMIx in their environment: srun's MPI plugin is none), "
                            "and each would launch its own: start one job with srun --mpi=pmix -n %ld gradcheck-dist run, "
                            "or salloc -n %ld gradcheck-dist run --world %ld\n", tasks, tasks, tasks, tasks);
        return 2;
    }
    long slots = getenv("SLURM_JOB_ID") && !o->hostfile ? slurm_slots() : 0;
    if (slots < 0) return bad("SLURM_TASKS_PER_NODE", "expected tasks per node as Slurm writes them (\"2(x3),1\", each count at most 2^24), got '%s'",
                              getenv("SLURM_TASKS_PER_NODE"));
    if (slots > 0 && world > slots && !o->oversubscribe) {
        char msg[320];
        snprintf(msg, sizeof msg, "%d ranks, but this Slurm allocation holds %ld tasks (SLURM_TASKS_PER_NODE=%s): ask Slurm for %d (-n %d), "
                                  "or pass --oversubscribe to run more ranks than tasks", world, slots, getenv("SLURM_TASKS_PER_NODE") ? getenv("SLURM_TASKS_PER_NODE") : "?",
                 world, world);
        return bad("--world", "%s", msg);
    }
    return 0;
}

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

int launch(const options *o, int argc, char **argv) {
    int world = o->world ? o->world : 2;
    int rc = slurm_refusal(o, world);
    if (rc) return rc;
    if ((rc = feasible(o, world))) return rc;
    const char *blas = getenv("OPENBLAS_NUM_THREADS");
    long threads = physical_cores() / world;
    if (blas) {
        char *end;
        errno = 0;
        threads = strtol(blas, &end, 10);
        if (end == blas || *end || errno || threads < 1 || threads > 1024)
            return bad("OPENBLAS_NUM_THREADS", "expected a number of threads from 1 to 1024, got '%s'", blas);
    }
    if (!strcmp(o->backend, "nccl") && (rc = nccl_precheck(o, world))) return rc;
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) return fprintf(stderr, "gradcheck-dist: cannot find my own executable: %s\n", strerror(errno)), 3;
    exe[k] = 0;
    const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    if ((rc = tmpdir_room(tmpdir, world))) return rc;
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
    if (!blas) {
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
    for (int i = 0; i < 3; i++) sigaddset(&sa.sa_mask, forwarded[i]);   // one handler at a time: signals++ never loses a count
    for (int i = 0; i < 3; i++) sigaction(forwarded[i], &sa, &old[i]);
    signal(SIGPIPE, SIG_IGN);   // a closed stderr is EPIPE to forward_stderr, not the launcher's death
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) return fprintf(stderr, "gradcheck-dist: fork: %s\n", strerror(errno)), close(err_pipe[0]), close(err_pipe[1]), rmdir(dir), 3;
    if (pid == 0) {
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
    for (int i = first_x + 1; i < last_x; i += 2) free(av[i]);
    free(av);
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
    int code = -1;
    FILE *f = fopen(result, "r");
    if (f) {
        if (fscanf(f, "%d", &code) != 1 || code < 0 || code > 3) code = -1;
        fclose(f);
        unlink(result);
    }
    if (wt.dropped) fprintf(stderr, "gradcheck-dist: %zu bytes of mpirun's stderr past the first 1 MiB were not shown\n", wt.dropped);
    if (!caught && code < 0 && log.sig && !wt.why[0]) name_the_dead(&log, dir, o->junit && strcmp(o->junit, "-") ? o->junit : NULL);
    if (code < 0 && !o->json && !o->no_json) drop_empty_default(dir);
    char report[PATH_MAX] = "";   // the JSON report this run wrote, if any
    if (o->json && strcmp(o->json, "-")) snprintf(report, sizeof report, "%s", o->json);
    else if (!o->json && !o->no_json) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/report", dir);
        if (!read_small(path, report, sizeof report)) report[0] = 0;
    }
    if (wt.killed && !caught) kill_ranks(dir, exe);
    static const char *const left[] = { "ranks", "report", "interrupted" };
    for (int i = 0; i < 3; i++) {
        char f[PATH_MAX + 32];
        snprintf(f, sizeof f, "%s/%s", dir, left[i]);
        unlink(f);
    }
    rmdir(dir);
    if (caught) return cancelled(o, report, started, code);
    if (wt.why[0]) {
        fprintf(stderr, "gradcheck-dist: %s\n", wt.why);
        return 3;
    }
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
