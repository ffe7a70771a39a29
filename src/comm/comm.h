/*
 * comm: the collectives of one backend, on float64 host buffers. comm_mpi.c is always built (it also
 * launches the job and carries the bootstrap); comm_nccl.c runs the same collectives through NCCL on
 * CUDA buffers. Every failing call names the rank and the call, and stops the whole job (exit 3).
 */
#pragma once
#include <stddef.h>

typedef struct gcd_comm {
    int rank, world;
    const char *backend;   // "mpi" or "nccl"
    void (*all_gather)(struct gcd_comm *c, const double *send, double *recv, size_t n);       // send (n) -> recv (world*n)
    void (*reduce_scatter)(struct gcd_comm *c, const double *send, double *recv, size_t n);   // SUM: send (world*n) -> recv (n)
    void (*all_reduce)(struct gcd_comm *c, double *buf, size_t n);                            // SUM, in place
    void (*barrier)(struct gcd_comm *c);
    void (*gather)(struct gcd_comm *c, const double *send, double *recv, size_t n);           // send (n) -> recv (world*n) on rank 0; NULL: none (nccl)
    void *impl;
} gcd_comm;

// ----------------------------------------------------------------------------
// MPI (comm_mpi.c)

int gcd_mpi_inside_job(void);                  // launched by mpirun (environment set by Open MPI)
void gcd_mpi_init(int *argc, char ***argv);    // MPI_Init + MPI_ERRORS_RETURN + fatal handler
void gcd_mpi_finalize(void);
gcd_comm *gcd_comm_mpi(void);
void gcd_mpi_bcast_int(int *v, int root);
// every rank's len bytes into all (world*len) on every rank, within the deadline
void gcd_mpi_allgather_bytes(const void *mine, void *all, int len);
void gcd_mpi_library_version(char *buf, int len);
void gcd_mpi_bcast_bytes(void *buf, int len, int root);
void gcd_mpi_set_hosts(const char *first, size_t stride);   // every rank's host name, rank k's at first + k * stride (kept, not copied)
void gcd_mpi_local(int *local_rank, int *local_size);   // ranks sharing this node
// every rank of this node's len bytes, in local rank order, into all (local_size*len)
void gcd_mpi_node_allgather(const void *mine, void *all, int len);
int gcd_mpi_any(int flag);                              // 1 when flag is set on any rank
// Every MPI collective completes within this many seconds (default 300) or stops the job (exit 3),
// naming the call and the context (the probe and mode running).
void gcd_mpi_set_timeout(double seconds);
// async-signal-safe: the collective in progress, or the next, stops with a fatal error naming the signal
void gcd_mpi_stop(int sig);
void gcd_comm_set_context(const char *what);
// Arrival at a collective: each rank starts an MPI_Ibarrier as it enters one; arrived() tests it
// without blocking (1 when every rank has entered, or when none was started); arrive_end() completes it.
void gcd_mpi_arrive(void);
int gcd_mpi_arrived(void);
void gcd_mpi_arrive_end(void);

// ----------------------------------------------------------------------------
// NCCL (comm_nccl.c, a module built when CUDA and NCCL are found; nccl_module.c loads it on first use)

// Returns NULL and fills why (a one-line reason) when this build or this machine cannot run NCCL.
gcd_comm *gcd_comm_nccl(gcd_comm *mpi, char *why, size_t len);
// NCCL's and CUDA's versions (GCD_VERSION_LEN bytes each) and this rank's device (len bytes), for the
// report; "" where not built
#define GCD_VERSION_LEN 64
void gcd_nccl_info(gcd_comm *c, char *nccl_version, char *cuda_version, char *device, size_t len);
void gcd_comm_nccl_free(gcd_comm *c);
int gcd_nccl_built(void);
int gcd_cuda_device_count(char *why, size_t len);   // -1 and why when no device can be used

// what the module gives (its symbol gcd_nccl_module): the four calls above
typedef struct {
    gcd_comm *(*comm)(gcd_comm *mpi, char *why, size_t len);
    void (*info)(gcd_comm *c, char *nccl_version, char *cuda_version, char *device, size_t len);
    void (*free)(gcd_comm *c);
    int (*device_count)(char *why, size_t len);
} gcd_nccl_api;
