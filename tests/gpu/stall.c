// Test-only (LD_PRELOAD, tests/gpu/run.sh): a rank that sleeps inside a collective, so that the NCCL
// backend's watchdog has something to catch; the program itself has no such path.
// On rank GCD_TEST_STALL_RANK (default 0), NCCL collective number GCD_TEST_STALL_CALL (default 1)
// finds a host function queued on its stream before the real call, sleeping GCD_TEST_STALL_SECONDS
// (default 60): this rank's part of the collective does not start, its stream does not drain, and its
// peers' parts wait for it, as with a hung rank.
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdlib.h>
#include <unistd.h>

static int calls;

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

static void CUDART_CB sleeper(void *arg) {
    (void)arg;
    sleep((unsigned)env_int("GCD_TEST_STALL_SECONDS", 60));
}

static void maybe_stall(cudaStream_t stream) {
    if (env_int("OMPI_COMM_WORLD_RANK", 0) != env_int("GCD_TEST_STALL_RANK", 0)) return;
    if (++calls == env_int("GCD_TEST_STALL_CALL", 1)) cudaLaunchHostFunc(stream, sleeper, NULL);
}

#define REAL(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

ncclResult_t ncclAllGather(const void *send, void *recv, size_t n, ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
    maybe_stall(stream);
    return REAL(ncclAllGather)(send, recv, n, type, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t n, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
    maybe_stall(stream);
    return REAL(ncclReduceScatter)(send, recv, n, type, op, comm, stream);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t n, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    maybe_stall(stream);
    return REAL(ncclAllReduce)(send, recv, n, type, op, comm, stream);
}
