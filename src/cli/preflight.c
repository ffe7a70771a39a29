// Before the launch: what this machine, its allocation and its environment allow, refused before any
// rank starts (exit 2 for an argument or variable, 3 for the machine), each naming what to change.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cli/cli.h"

int nccl_precheck(const options *o, int world) {
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
long physical_cores(void) {
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
int feasible(const options *o, int world) {
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
int tmpdir_room(const char *tmpdir, int world) {
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

int slurm_refusal(const options *o, int world) {
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
