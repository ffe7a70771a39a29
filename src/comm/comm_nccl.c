/*
 * comm_nccl: the collectives over NCCL on CUDA buffers, one GPU per rank, bootstrapped over MPI.
 * Built when CMake finds the CUDA Toolkit and NCCL >= 2.14, as a module of its own
 * (gradcheck-dist-nccl.so, linked to CUDA and NCCL) that nccl_module.c loads for --backend nccl only:
 * a CPU run never loads CUDA or NCCL. The module's one visible symbol is gcd_nccl_module (comm.h); what
 * it calls of the program (util.c, comm_mpi.c) the program exports.
 *
 * No wait blocks the host: a non-blocking communicator, pinned staging buffers, and every wait a poll
 * (wait.c) bounded by GCD_NCCL_TIMEOUT, then ncclCommAbort and exit 3. Why: docs/nccl.md.
 */
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "util.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "comm/wait.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the NCCL backend needs NCCL >= 2.14 (ncclCommInitRankConfig with non-blocking communicators)"
#endif

// ----------------------------------------------------------------------------
// checks: file:line, the rank (from the fatal setup), the call and the library's own words

#define cudaCheck(call) cuda_check((call), #call, __FILE__, __LINE__)
static void cuda_check(cudaError_t err, const char *call, const char *file, int line) {
    if (err != cudaSuccess) gcd_fatal_at(file, line, "%s: %s", call, cudaGetErrorString(err));
}

// for the calls that take no communicator; those that do go through launched() below
#define ncclCheck(call) nccl_check((call), #call, __FILE__, __LINE__)
static void nccl_check(ncclResult_t r, const char *call, const char *file, int line) {
    if (r != ncclSuccess) gcd_fatal_at(file, line, "%s: %s (%s)", call, ncclGetErrorString(r), ncclGetLastError(NULL));
}

typedef struct {
    double *dev, *host;   // (cap) on the device, and its pinned twin on the host (cudaMallocHost)
    size_t cap;
} staging;

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    staging send, recv;
    int device;
    double timeout;   // seconds a call may go without completing once every rank has entered it
} nccl_impl;

// ----------------------------------------------------------------------------
// the queries wait.c polls

static gcd_poll comm_state(void *ctx, char *why, size_t len) {
    nccl_impl *m = ctx;
    ncclResult_t async = ncclSuccess, r = ncclCommGetAsyncError(m->comm, &async);
    if (r != ncclSuccess) async = r;
    if (async == ncclSuccess) return GCD_POLL_DONE;
    if (async == ncclInProgress) return GCD_POLL_PENDING;
    snprintf(why, len, "NCCL reports %s (%s)", ncclGetErrorString(async), ncclGetLastError(NULL));
    return GCD_POLL_FAILED;
}

static gcd_poll stream_state(void *ctx, char *why, size_t len) {
    cudaError_t e = cudaStreamQuery(((nccl_impl *)ctx)->stream);
    if (e == cudaSuccess) return GCD_POLL_DONE;
    if (e == cudaErrorNotReady) return GCD_POLL_PENDING;
    snprintf(why, len, "cudaStreamQuery: %s", cudaGetErrorString(e));
    return GCD_POLL_FAILED;
}

static int all_arrived(void *ctx) { (void)ctx; return gcd_mpi_arrived(); }
static void abort_comm(void *ctx) { ncclCommAbort(((nccl_impl *)ctx)->comm); }   // the job ends next

static double seconds(void *ctx) {
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void pause_50us(void *ctx) { (void)ctx; nanosleep(&(struct timespec){ 0, 50000 }, NULL); }

static const gcd_wait_ops ops = { comm_state, stream_state, all_arrived, abort_comm, seconds, pause_50us };

// An NCCL call on the communicator was made: an error ends the job; ncclInProgress means the call may
// not be done (nor its work on the stream): wait until the communicator says ncclSuccess.
static void launched(nccl_impl *m, const char *what, ncclResult_t r) {
    if (r == ncclInProgress) gcd_wait_check(&ops, m, what, 0, m->timeout);
    else if (r != ncclSuccess) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s: %s (%s)", what, ncclGetErrorString(r), ncclGetLastError(NULL));   // before the abort
        ncclCommAbort(m->comm);
        GCD_FATAL("%s", msg);
    }
}

// ----------------------------------------------------------------------------
// collectives: host -> pinned -> device, the NCCL call, device -> pinned, poll, pinned -> host

static void reserve(staging *s, size_t n) {
    if (n <= s->cap) return;   // grown only between collectives, when the stream has drained
    if (s->dev) cudaCheck(cudaFree(s->dev));
    if (s->host) cudaCheck(cudaFreeHost(s->host));
    cudaCheck(cudaMalloc((void **)&s->dev, n * sizeof(double)));
    cudaCheck(cudaMallocHost((void **)&s->host, n * sizeof(double)));
    s->cap = n;
}

// stage n doubles in, then say this rank has entered the collective
static void enter(nccl_impl *m, staging *s, const double *src, size_t n) {
    reserve(s, n);
    memcpy(s->host, src, n * sizeof(double));
    cudaCheck(cudaMemcpyAsync(s->dev, s->host, n * sizeof(double), cudaMemcpyHostToDevice, m->stream));
    gcd_mpi_arrive();
}

// the collective was called (r): once it is on the stream, queue the copy back, poll until the stream
// has drained, and only then read the host copy
static void leave(nccl_impl *m, const char *what, ncclResult_t r, staging *s, double *dst, size_t n) {
    launched(m, what, r);
    cudaCheck(cudaMemcpyAsync(s->host, s->dev, n * sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    gcd_wait_check(&ops, m, what, 1, m->timeout);
    gcd_mpi_arrive_end();
    memcpy(dst, s->host, n * sizeof(double));
}

static void nccl_all_gather(gcd_comm *c, const double *send, double *recv, size_t n) {
    nccl_impl *m = c->impl;
    reserve(&m->recv, n * c->world);
    enter(m, &m->send, send, n);
    ncclResult_t r = ncclAllGather(m->send.dev, m->recv.dev, n, ncclDouble, m->comm, m->stream);
    leave(m, "ncclAllGather", r, &m->recv, recv, n * c->world);
}

static void nccl_reduce_scatter(gcd_comm *c, const double *send, double *recv, size_t n) {
    nccl_impl *m = c->impl;
    reserve(&m->recv, n);
    enter(m, &m->send, send, n * c->world);
    ncclResult_t r = ncclReduceScatter(m->send.dev, m->recv.dev, n, ncclDouble, ncclSum, m->comm, m->stream);
    leave(m, "ncclReduceScatter", r, &m->recv, recv, n);
}

static void nccl_all_reduce(gcd_comm *c, double *buf, size_t n) {
    nccl_impl *m = c->impl;
    enter(m, &m->send, buf, n);
    ncclResult_t r = ncclAllReduce(m->send.dev, m->send.dev, n, ncclDouble, ncclSum, m->comm, m->stream);
    leave(m, "ncclAllReduce", r, &m->send, buf, n);
}

static void nccl_barrier(gcd_comm *c) {
    double one = 1;
    nccl_all_reduce(c, &one, 1);
}

// ----------------------------------------------------------------------------
// setup

static int device_count(char *why, size_t len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    // what is missing first, the driver's words after
    if (e != cudaSuccess) return snprintf(why, len, "no CUDA device visible (cudaGetDeviceCount: %s)", cudaGetErrorString(e)), -1;
    if (n == 0) return snprintf(why, len, "no CUDA device visible (cudaGetDeviceCount: 0 devices)"), -1;
    return n;
}

static void uuid_str(const cudaUUID_t *u, char *out, size_t len) {   // as nvidia-smi -L writes it
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4],
             b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

// Device local_rank % count: each rank's own under per-rank isolation (CUDA_VISIBLE_DEVICES per rank,
// Slurm --gpus-per-task: every rank sees one device, its own). Two ranks of a node on one physical GPU
// (same UUID) are refused: NCCL does not support one device as two ranks of a communicator.
static int pick_device(int *device, char *why, size_t len) {
    int local_rank, local_size, ndev = device_count(why, len);
    gcd_mpi_local(&local_rank, &local_size);
    cudaUUID_t mine = { 0 };
    struct cudaDeviceProp p;
    int bad = ndev < 0;
    if (!bad) {
        *device = local_rank % ndev;
        cudaError_t e = cudaGetDeviceProperties(&p, *device);
        if (e != cudaSuccess) bad = 1, snprintf(why, len, "cudaGetDeviceProperties(%d): %s", *device, cudaGetErrorString(e));
        else mine = p.uuid;
    }
    cudaUUID_t *all = gcd_malloc((size_t)local_size * sizeof *all);
    gcd_mpi_node_allgather(&mine, all, (int)sizeof mine);
    for (int i = 0; i < local_size && !bad; i++)
        for (int j = i + 1; j < local_size && !bad; j++)
            if (!memcmp(&all[i], &all[j], sizeof mine) && memcmp(&all[i], &(cudaUUID_t){ 0 }, sizeof mine)) {
                char u[64];
                uuid_str(&all[i], u, sizeof u);
                snprintf(why, len, "one GPU per rank needed: local ranks %d and %d of this node share GPU %s (%d ranks, %d visible CUDA device%s here; NCCL refuses two ranks on one GPU)",
                         i, j, u, local_size, ndev, ndev == 1 ? "" : "s");
                bad = 1;
            }
    free(all);
    return bad;
}

static gcd_comm *comm_nccl(gcd_comm *mpi, char *why, size_t len) {
    int device = 0, bad = pick_device(&device, why, len);
    if (gcd_mpi_any(bad)) {
        if (!bad) snprintf(why, len, "another rank cannot use a CUDA device of its own");
        return NULL;
    }
    nccl_impl *m = gcd_malloc(sizeof *m);
    m->device = device;
    const char *t = getenv("GCD_NCCL_TIMEOUT");
    m->timeout = t && atof(t) > 0 ? atof(t) : 120;
    cudaCheck(cudaSetDevice(m->device));
    cudaCheck(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
    ncclUniqueId id;
    if (mpi->rank == 0) ncclCheck(ncclGetUniqueId(&id));
    gcd_mpi_bcast_bytes(&id, sizeof id, 0);   // every rank is here: the init's clock may start at once
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    launched(m, "ncclCommInitRankConfig", ncclCommInitRankConfig(&m->comm, mpi->world, id, mpi->rank, &config));
    static gcd_comm c;
    c = (gcd_comm){ .rank = mpi->rank, .world = mpi->world, .backend = "nccl", .all_gather = nccl_all_gather,
                    .reduce_scatter = nccl_reduce_scatter, .all_reduce = nccl_all_reduce, .barrier = nccl_barrier, .impl = m };
    return &c;
}

static void comm_free(gcd_comm *c) {
    nccl_impl *m = c->impl;
    if (!m) return;
    launched(m, "ncclCommFinalize", ncclCommFinalize(m->comm));
    ncclResult_t r = ncclCommDestroy(m->comm);   // runs to completion, see the top of this file
    if (r != ncclSuccess && r != ncclInProgress) GCD_FATAL("ncclCommDestroy: %s", ncclGetErrorString(r));
    for (staging *s = &m->send; s <= &m->recv; s++) {
        if (s->dev) cudaFree(s->dev);
        if (s->host) cudaFreeHost(s->host);
    }
    cudaStreamDestroy(m->stream);
    free(m);
    c->impl = NULL;
}

static void info(gcd_comm *c, char *nccl_version, char *cuda_version, char *device, size_t len) {
    nccl_impl *m = c->impl;
    int v = 0, rt = 0, drv = 0;
    ncclGetVersion(&v);
    snprintf(nccl_version, GCD_VERSION_LEN, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    snprintf(cuda_version, GCD_VERSION_LEN, "runtime %d.%d, driver %d.%d", rt / 1000, rt % 1000 / 10, drv / 1000, drv % 1000 / 10);
    struct cudaDeviceProp p;
    char host[64] = "", u[64];
    gethostname(host, sizeof host - 1);
    if (cudaGetDeviceProperties(&p, m->device) == cudaSuccess) {
        uuid_str(&p.uuid, u, sizeof u);
        snprintf(device, len, "%s: GPU %d %s (%04x:%02x:%02x, %s)", host, m->device, p.name, p.pciDomainID, p.pciBusID, p.pciDeviceID, u);
    } else snprintf(device, len, "%s: GPU %d", host, m->device);
}

__attribute__((visibility("default"))) const gcd_nccl_api gcd_nccl_module = { comm_nccl, info, comm_free, device_count };
