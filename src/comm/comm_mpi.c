#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <signal.h>
#include <unistd.h>
#include <time.h>
#include <dirent.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <limits.h>

#include "comm/comm.h"
#include "util.h"

// ----------------------------------------------------------------------------
// checks

static MPI_Comm world_comm = MPI_COMM_NULL;   // process-wide as MPI itself is: one job, one world a process

#define mpiCheck(call) mpi_check((call), #call, __FILE__, __LINE__)
static void mpi_check(int err, const char *call, const char *file, int line) {
    if (err == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, msg, &len);
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(call, "("), call);
    gcd_fatal_at(file, line, "%s: %s", name, msg);
}

static void abort_job(int code) { MPI_Abort(MPI_COMM_WORLD, code); exit(code); }

// ----------------------------------------------------------------------------
// deadlines: every collective is started non-blocking and polled, so a stopped, hung or dead peer is
// an error naming the call and what was running, never a hang

// process-wide: every collective of the one MPI job waits under one deadline and names what was running
static double timeout_s = 300;
static char context[160];

void gcd_mpi_set_timeout(double seconds) { timeout_s = seconds; }
static volatile sig_atomic_t stop_signal;   // set from rank 0's signal handler, which takes no context
void gcd_mpi_stop(int sig) { stop_signal = sig; }
void gcd_comm_set_context(const char *what) { snprintf(context, sizeof context, "%s", what ? what : ""); }

// polls before the wait starts sleeping 50 us between them: 1000 (a few ms of spinning) when every rank
// has a CPU; 10 when this node holds more ranks than CPUs, where a spinning rank takes the CPU from the
// peer it waits for (world 32 on 2 cores)
static long spin_polls = 1000;   // process-wide: one rank a process, set once from this node's ranks and CPUs

#define mpiWait(req, name) mpi_wait(&(req), name, __FILE__, __LINE__)
static void mpi_wait(MPI_Request *req, const char *name, const char *file, int line) {
    double t0 = MPI_Wtime();
    for (long spins = 0;; spins++) {
        int done = 0;
        mpi_check(MPI_Test(req, &done, MPI_STATUS_IGNORE), name, file, line);
        if (done) return;
        if (stop_signal)   // gcd_mpi_stop: mpirun is ending the job, as another rank ended first
            gcd_fatal_at(file, line, "%s: ended by signal %d%s%s: mpirun was ending the job", name, (int)stop_signal,
                         *context ? ", in " : "", context);
        if (MPI_Wtime() - t0 > timeout_s)
            gcd_fatal_at(file, line, "%s: not complete after %g s%s%s: a peer is stopped, hung or dead (GCD_TIMEOUT, --timeout)", name, timeout_s,
                         *context ? ", in " : "", context);
        if (spins > spin_polls) nanosleep(&(struct timespec){ 0, 50000 }, NULL);   // past the first spins, poll every 50 us
    }
}

int gcd_mpi_inside_job(void) { return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK"); }

// MPI_Init and MPI_Finalize wait for every rank: a peer stopped before it arrives would hang them, so
// they have the deadline too (alarm: neither has a non-blocking form). The message is made beforehand,
// as the handler may only write it.
static char alarm_msg[256];   // process-wide: the SIGALRM handler may only write it, and takes no context
static void alarm_timeout(int sig) {
    (void)sig;
    if (write(2, alarm_msg, strlen(alarm_msg)) < 0) _exit(3);
    _exit(3);
}

static void alarm_arm(const char *call, struct sigaction *old) {
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");   // set by mpirun; before MPI_Init the only way to know
    if (!rank) rank = getenv("PMIX_RANK");
    snprintf(alarm_msg, sizeof alarm_msg, "gradcheck-dist: %s%s%s%s: not complete after %g s: a peer is stopped, hung or dead (GCD_TIMEOUT, --timeout)\n",
             rank ? "rank " : "", rank ? rank : "", rank ? ": " : "", call, timeout_s);
    struct sigaction sa = { .sa_handler = alarm_timeout };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, old);
    alarm((unsigned)ceil(timeout_s));
}

static void alarm_disarm(const struct sigaction *old) {
    alarm(0);
    sigaction(SIGALRM, old, NULL);
}

// Open MPI's PMIx client talks to its server (mpirun, or the node's orted) over loopback TCP without
// TCP_NODELAY: at MPI_Finalize its second small message waits for the ACK of the first, which the server
// delays (40 ms on Linux), for every job. Small messages go at once from this side.
static void nodelay_loopback(void) {
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e; d && (e = readdir(d));) {
        int fd = atoi(e->d_name), type = 0, one = 1;
        socklen_t len = sizeof type;
        struct sockaddr_storage a;
        socklen_t alen = sizeof a;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) || type != SOCK_STREAM || getpeername(fd, (struct sockaddr *)&a, &alen)) continue;
        const struct in6_addr *v6 = &((const struct sockaddr_in6 *)&a)->sin6_addr;
        int loop = a.ss_family == AF_INET ? ntohl(((const struct sockaddr_in *)&a)->sin_addr.s_addr) >> 24 == 127
                 : a.ss_family == AF_INET6 && (IN6_IS_ADDR_LOOPBACK(v6) || (IN6_IS_ADDR_V4MAPPED(v6) && v6->s6_addr[12] == 127));
        if (loop) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);   // only a speed-up: a failure changes nothing
    }
    if (d) closedir(d);
}

void gcd_mpi_init(int *argc, char ***argv) {
    int rank;
    struct sigaction old;
    alarm_arm("MPI_Init", &old);
    MPI_Init(argc, argv);
    alarm_disarm(&old);
    nodelay_loopback();
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (local && atol(local) > sysconf(_SC_NPROCESSORS_ONLN)) spin_polls = 10;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    gcd_fatal_setup(rank, abort_job, NULL);
    world_comm = MPI_COMM_WORLD;   // errors returned (above): each call names itself and stops the job
}

// Open MPI 4.1 unloads its components (dlclose) inside MPI_Finalize while its progress thread may still
// run code of one of them: under load about 1 run in 300 ended there in SIGSEGV, at an address of an
// unloaded component, after every report was written (mpirun then exits 139). The rank exits right
// after MPI_Finalize, so its components stay mapped until then: this program's dlclose unloads nothing.
int dlclose(void *handle) {
    (void)handle;
    return 0;
}

void gcd_mpi_finalize(void) {
    struct sigaction old;
    alarm_arm("MPI_Finalize", &old);
    MPI_Finalize();
    alarm_disarm(&old);
}

// ----------------------------------------------------------------------------
// collectives

static void all_gather(const void *send, void *recv, int n, MPI_Datatype type) {
    MPI_Request r;
    mpi_check(MPI_Iallgather(send, n, type, recv, n, type, world_comm, &r), "MPI_Allgather", __FILE__, __LINE__);
    mpiWait(r, "MPI_Allgather");
}

// MPI counts are int: a larger buffer is a runtime failure, named, never a count cut short
static int count(size_t n, const char *call) {
    if (n > INT_MAX) GCD_FATAL("%s: %zu doubles, more than MPI's int count holds", call, n);
    return (int)n;
}

static void mpi_all_gather(gcd_comm *c, const double *send, double *recv, size_t n) {
    (void)c;
    all_gather(send, recv, count(n, "MPI_Allgather"), MPI_DOUBLE);
}

static void mpi_reduce_scatter(gcd_comm *c, const double *send, double *recv, size_t n) {
    (void)c;
    MPI_Request r;
    mpi_check(MPI_Ireduce_scatter_block(send, recv, count(n, "MPI_Reduce_scatter_block"), MPI_DOUBLE, MPI_SUM, world_comm, &r), "MPI_Reduce_scatter_block", __FILE__,
              __LINE__);
    mpiWait(r, "MPI_Reduce_scatter_block");
}

static void mpi_all_reduce(gcd_comm *c, double *buf, size_t n) {
    (void)c;
    MPI_Request r;
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf, count(n, "MPI_Allreduce"), MPI_DOUBLE, MPI_SUM, world_comm, &r), "MPI_Allreduce", __FILE__, __LINE__);
    mpiWait(r, "MPI_Allreduce");
}

static void mpi_gather(gcd_comm *c, const double *send, double *recv, size_t n) {
    (void)c;
    MPI_Request r;
    int k = count(n, "MPI_Gather");
    mpi_check(MPI_Igather(send, k, MPI_DOUBLE, recv, k, MPI_DOUBLE, 0, world_comm, &r), "MPI_Gather", __FILE__, __LINE__);
    mpiWait(r, "MPI_Gather");
}

static void mpi_barrier(gcd_comm *c) {
    (void)c;
    MPI_Request r;
    mpi_check(MPI_Ibarrier(world_comm, &r), "MPI_Barrier", __FILE__, __LINE__);
    mpiWait(r, "MPI_Barrier");
}

gcd_comm *gcd_comm_mpi(void) {
    static gcd_comm c;
    c.backend = "mpi";
    mpiCheck(MPI_Comm_rank(world_comm, &c.rank));
    mpiCheck(MPI_Comm_size(world_comm, &c.world));
    c.all_gather = mpi_all_gather;
    c.reduce_scatter = mpi_reduce_scatter;
    c.all_reduce = mpi_all_reduce;
    c.barrier = mpi_barrier;
    c.gather = mpi_gather;
    return &c;
}

// ----------------------------------------------------------------------------
// bootstrap helpers (launch facts, NCCL's unique id)

static void bcast(void *buf, int n, MPI_Datatype type, int root) {
    MPI_Request r;
    mpi_check(MPI_Ibcast(buf, n, type, root, world_comm, &r), "MPI_Bcast", __FILE__, __LINE__);
    mpiWait(r, "MPI_Bcast");
}

void gcd_mpi_bcast_int(int *v, int root) { bcast(v, 1, MPI_INT, root); }

void gcd_mpi_allgather_bytes(const void *mine, void *all, int len) { all_gather(mine, all, len, MPI_BYTE); }

void gcd_mpi_library_version(char *buf, int len) {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    MPI_Get_library_version(v, &n);
    v[strcspn(v, "\n")] = 0;   // first line: "Open MPI v4.1.4, package: ..."
    snprintf(buf, (size_t)len, "%s", v);
}

void gcd_mpi_bcast_bytes(void *buf, int len, int root) { bcast(buf, len, MPI_BYTE, root); }

// The ranks of this node, from every rank's host name: the ones the program's first collective gathered
// (gcd_mpi_set_hosts; MPI_Comm_split_type has no non-blocking form, so a stopped peer could hang it). A
// node is a host name, as Open MPI's shared-memory domain is on every machine this runs on.
// process-wide as the job is: set once from the first collective
static const char *hosts;   // rank k's at hosts + k * host_stride, NUL-terminated
static size_t host_stride;

void gcd_mpi_set_hosts(const char *first, size_t stride) { hosts = first, host_stride = stride; }

static const char *host_of(int k) {
    if (!hosts) GCD_FATAL("the ranks' host names are not known yet (gcd_mpi_set_hosts)");
    return hosts + (size_t)k * host_stride;
}

static const char *my_host(int *rank, int *world) {
    mpiCheck(MPI_Comm_rank(world_comm, rank));
    mpiCheck(MPI_Comm_size(world_comm, world));
    return host_of(*rank);
}

void gcd_mpi_local(int *local_rank, int *local_size) {
    int rank, world;
    const char *me = my_host(&rank, &world);
    *local_rank = *local_size = 0;
    for (int k = 0; k < world; k++)
        if (!strcmp(host_of(k), me)) *local_rank += k < rank, ++*local_size;
}

void gcd_mpi_node_allgather(const void *mine, void *all, int len) {
    int rank, world;
    const char *me = my_host(&rank, &world);
    char *every = gcd_malloc((size_t)world * (size_t)len);
    all_gather(mine, every, len, MPI_BYTE);
    int j = 0;
    for (int k = 0; k < world; k++)
        if (!strcmp(host_of(k), me)) memcpy((char *)all + (size_t)j++ * (size_t)len, every + (size_t)k * (size_t)len, (size_t)len);
    free(every);
}

int gcd_mpi_any(int flag) {
    int any = 0;
    MPI_Request r;
    mpi_check(MPI_Iallreduce(&flag, &any, 1, MPI_INT, MPI_MAX, world_comm, &r), "MPI_Allreduce", __FILE__, __LINE__);
    mpiWait(r, "MPI_Allreduce");
    return any;
}

// ----------------------------------------------------------------------------
// arrival at a collective (the NCCL backend's timeout starts once every rank has entered it)

static MPI_Request arrival = MPI_REQUEST_NULL;   // process-wide: one collective of the one job at a time

void gcd_mpi_arrive(void) {
    if (arrival != MPI_REQUEST_NULL) GCD_FATAL("arrival: the previous collective's MPI_Ibarrier was never completed");
    mpiCheck(MPI_Ibarrier(world_comm, &arrival));
}

int gcd_mpi_arrived(void) {
    int done = 1;
    if (arrival != MPI_REQUEST_NULL) mpiCheck(MPI_Test(&arrival, &done, MPI_STATUS_IGNORE));
    return done;
}

// Called once the collective has completed: every rank then has started its MPI_Ibarrier (before its
// NCCL call, which the collective needed), so this returns as soon as the ranks drive it.
void gcd_mpi_arrive_end(void) {
    if (arrival != MPI_REQUEST_NULL) mpiWait(arrival, "MPI_Ibarrier (arrival)");
}
