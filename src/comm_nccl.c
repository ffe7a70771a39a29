/*
 * comm_nccl: the collectives over NCCL on CUDA buffers, one GPU per rank, bootstrapped over MPI.
 * Built when CMake finds the CUDA Toolkit and NCCL (GCD_WITH_NCCL); otherwise only the answers that
 * say why --backend nccl cannot run.
 */
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "util.h"

#ifndef GCD_WITH_NCCL

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

void gcd_nccl_info(gcd_comm *c, char *nccl_version, char *cuda_version, char *device, size_t len) {
    (void)c;
    snprintf(nccl_version, len, "%s", "");
    snprintf(cuda_version, len, "%s", "");
    snprintf(device, len, "%s", "");
}

#endif
