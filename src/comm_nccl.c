/*
 * comm_nccl: the collectives over NCCL on CUDA buffers, one GPU per rank, bootstrapped over MPI.
 * Built when CMake finds the CUDA Toolkit and NCCL (GCD_WITH_NCCL); otherwise only the answers that
 * say why --backend nccl cannot run.
 */
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "util.h"

#ifdef GCD_WITH_NCCL

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// checks: file:line, the rank (from the fatal setup), the call and the library's own words

#define cudaCheck(call) cuda_check((call), #call, __FILE__, __LINE__)
static void cuda_check(cudaError_t err, const char *call, const char *file, int line) {
    if (err != cudaSuccess) gcd_fatal_at(file, line, "%s: %s", call, cudaGetErrorString(err));
}

// non-blocking communicators may answer ncclInProgress: the watchdog below waits for those
#define ncclCheck(call) nccl_check((call), #call, __FILE__, __LINE__)
static void nccl_check(ncclResult_t r, const char *call, const char *file, int line) {
    if (r != ncclSuccess && r != ncclInProgress) gcd_fatal_at(file, line, "%s: %s", call, ncclGetErrorString(r));
}

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    double *send, *recv;       // device buffers
    size_t cap_send, cap_recv; // in doubles
    int device;
    double timeout;            // seconds a collective may take before the peers are declared stuck
} nccl_impl;

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Waits for the communicator (init) or the stream (a collective); a peer that died or hangs ends
// the job with a message instead of a hang: ncclCommAbort, then the fatal path (exit 3).
static void watchdog(nccl_impl *n, int stream, const char *what) {
    double t0 = seconds();
    for (;;) {
        ncclResult_t async = ncclSuccess;
        ncclCheck(ncclCommGetAsyncError(n->comm, &async));
        if (async != ncclSuccess && async != ncclInProgress) {
            ncclCommAbort(n->comm);
            GCD_FATAL("%s: NCCL reports %s", what, ncclGetErrorString(async));
        }
        if (stream) {
            cudaError_t e = cudaStreamQuery(n->stream);
            if (e == cudaSuccess) return;
            if (e != cudaErrorNotReady) cudaCheck(e);
        } else if (async == ncclSuccess) {
            return;
        }
        if (seconds() - t0 > n->timeout) {
            ncclCommAbort(n->comm);
            GCD_FATAL("%s: no progress after %.0f s: a peer rank is dead or stuck (GCD_NCCL_TIMEOUT sets the limit)", what, n->timeout);
        }
        nanosleep(&(struct timespec){ 0, 20000 }, NULL);
    }
}

static void reserve(double **buf, size_t *cap, size_t n) {
    if (n <= *cap) return;
    if (*buf) cudaCheck(cudaFree(*buf));
    cudaCheck(cudaMalloc((void **)buf, n * sizeof(double)));
    *cap = n;
}

// ----------------------------------------------------------------------------
// collectives: host -> device, the NCCL call, device -> host, on one stream

static void nccl_all_gather(gcd_comm *c, const double *send, double *recv, size_t n) {
    nccl_impl *m = c->impl;
    reserve(&m->send, &m->cap_send, n);
    reserve(&m->recv, &m->cap_recv, n * c->world);
    cudaCheck(cudaMemcpyAsync(m->send, send, n * sizeof(double), cudaMemcpyHostToDevice, m->stream));
    ncclCheck(ncclAllGather(m->send, m->recv, n, ncclDouble, m->comm, m->stream));
    cudaCheck(cudaMemcpyAsync(recv, m->recv, n * c->world * sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    watchdog(m, 1, "ncclAllGather");
}

static void nccl_reduce_scatter(gcd_comm *c, const double *send, double *recv, size_t n) {
    nccl_impl *m = c->impl;
    reserve(&m->send, &m->cap_send, n * c->world);
    reserve(&m->recv, &m->cap_recv, n);
    cudaCheck(cudaMemcpyAsync(m->send, send, n * c->world * sizeof(double), cudaMemcpyHostToDevice, m->stream));
    ncclCheck(ncclReduceScatter(m->send, m->recv, n, ncclDouble, ncclSum, m->comm, m->stream));
    cudaCheck(cudaMemcpyAsync(recv, m->recv, n * sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    watchdog(m, 1, "ncclReduceScatter");
}

static void nccl_all_reduce(gcd_comm *c, double *buf, size_t n) {
    nccl_impl *m = c->impl;
    reserve(&m->send, &m->cap_send, n);
    cudaCheck(cudaMemcpyAsync(m->send, buf, n * sizeof(double), cudaMemcpyHostToDevice, m->stream));
    ncclCheck(ncclAllReduce(m->send, m->send, n, ncclDouble, ncclSum, m->comm, m->stream));
    cudaCheck(cudaMemcpyAsync(buf, m->send, n * sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    watchdog(m, 1, "ncclAllReduce");
}

static void nccl_barrier(gcd_comm *c) {
    double one = 1;
    nccl_all_reduce(c, &one, 1);
}

// ----------------------------------------------------------------------------
// setup

int gcd_nccl_built(void) { return 1; }

int gcd_cuda_device_count(char *why, size_t len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return snprintf(why, len, "no usable CUDA device or driver (cudaGetDeviceCount: %s)", cudaGetErrorString(e)), -1;
    if (n == 0) return snprintf(why, len, "no CUDA device is visible"), -1;
    return n;
}

gcd_comm *gcd_comm_nccl(gcd_comm *mpi, char *why, size_t len) {
    // one GPU per rank: every rank of this node needs a device of its own
    int local_rank, local_size, ndev = gcd_cuda_device_count(why, len);
    gcd_mpi_local(&local_rank, &local_size);
    int bad = ndev < 0;
    if (!bad && local_size > ndev) {
        snprintf(why, len, "one GPU per rank needed: %d ranks share this node's %d CUDA device%s (NCCL refuses two ranks on one GPU)",
                 local_size, ndev, ndev == 1 ? "" : "s");
        bad = 1;
    }
    if (gcd_mpi_any(bad)) {
        if (!bad) snprintf(why, len, "another rank cannot use a CUDA device");
        return NULL;
    }
    nccl_impl *m = gcd_malloc(sizeof *m);
    m->device = local_rank;
    const char *t = getenv("GCD_NCCL_TIMEOUT");
    m->timeout = t && atof(t) > 0 ? atof(t) : 120;
    cudaCheck(cudaSetDevice(m->device));
    cudaCheck(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
    ncclUniqueId id;
    if (mpi->rank == 0) ncclCheck(ncclGetUniqueId(&id));
    gcd_mpi_bcast_bytes(&id, sizeof id, 0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;   // so the watchdog can give up on a peer that never arrives
    ncclCheck(ncclCommInitRankConfig(&m->comm, mpi->world, id, mpi->rank, &config));
    watchdog(m, 0, "ncclCommInitRankConfig");
    static gcd_comm c;
    c = (gcd_comm){ .rank = mpi->rank, .world = mpi->world, .backend = "nccl", .all_gather = nccl_all_gather,
                    .reduce_scatter = nccl_reduce_scatter, .all_reduce = nccl_all_reduce, .barrier = nccl_barrier, .impl = m };
    return &c;
}

void gcd_comm_nccl_free(gcd_comm *c) {
    nccl_impl *m = c->impl;
    if (!m) return;
    ncclCheck(ncclCommFinalize(m->comm));
    watchdog(m, 0, "ncclCommFinalize");
    ncclCommDestroy(m->comm);
    if (m->send) cudaFree(m->send);
    if (m->recv) cudaFree(m->recv);
    cudaStreamDestroy(m->stream);
    free(m);
    c->impl = NULL;
}

void gcd_nccl_info(gcd_comm *c, char *nccl_version, char *cuda_version, char *device, size_t len) {
    nccl_impl *m = c->impl;
    int v = 0, rt = 0, drv = 0;
    ncclGetVersion(&v);
    snprintf(nccl_version, len, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    snprintf(cuda_version, len, "runtime %d.%d, driver %d.%d", rt / 1000, rt % 1000 / 10, drv / 1000, drv % 1000 / 10);
    struct cudaDeviceProp p;
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    if (cudaGetDeviceProperties(&p, m->device) == cudaSuccess)
        snprintf(device, len, "%s: GPU %d %s (%04x:%02x:%02x)", host, m->device, p.name, p.pciDomainID, p.pciBusID, p.pciDeviceID);
    else snprintf(device, len, "%s: GPU %d", host, m->device);
}

#else

int gcd_nccl_built(void) { return 0; }

int gcd_cuda_device_count(char *why, size_t len) {
    snprintf(why, len, "this build has no CUDA");
    return -1;
}

gcd_comm *gcd_comm_nccl(gcd_comm *mpi, char *why, size_t len) {
    (void)mpi;
    snprintf(why, len, "this build has no NCCL backend (configure found no CUDA Toolkit with NCCL)");
    return NULL;
}

void gcd_comm_nccl_free(gcd_comm *c) { (void)c; }

void gcd_nccl_info(gcd_comm *c, char *nccl_version, char *cuda_version, char *device, size_t len) {
    (void)c;
    snprintf(nccl_version, len, "%s", "");
    snprintf(cuda_version, len, "%s", "");
    snprintf(device, len, "%s", "");
}

#endif
