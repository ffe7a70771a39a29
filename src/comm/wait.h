/*
 * wait: how the NCCL backend waits for its communicator and its stream without ever blocking the host,
 * written against a table of queries so that a CPU test drives it with fakes (tests/test_wait.c) and the
 * loop that runs on a GPU is the loop that was tested.
 *
 * Each turn asks the communicator (ncclCommGetAsyncError) and, once that is ready, the stream
 * (cudaStreamQuery), as nccl-tests' testStreamSynchronize does (src/common.cu). The stream is never asked
 * while the communicator is still in progress: a non-blocking NCCL call that answered ncclInProgress may
 * not have put its work on the stream yet. An error, or no completion `timeout` seconds after every rank
 * has entered the call, aborts the communicator once and says why. The clock starts at that arrival, not
 * at the call: a peer that is busy elsewhere (rank 0 computing the reference) is not a stuck one.
 */
#pragma once
#include <stddef.h>

typedef enum { GCD_POLL_DONE, GCD_POLL_PENDING, GCD_POLL_FAILED } gcd_poll;

typedef struct {
    gcd_poll (*comm)(void *ctx, char *why, size_t len);     // ncclSuccess, ncclInProgress, or an error in words
    gcd_poll (*stream)(void *ctx, char *why, size_t len);   // cudaSuccess, cudaErrorNotReady, or an error in words
    int (*arrived)(void *ctx);                              // 1 once every rank has entered this call
    void (*abort)(void *ctx);                               // ncclCommAbort
    double (*now)(void *ctx);                               // seconds, monotonic
    void (*pause)(void *ctx);                               // between two turns
} gcd_wait_ops;

typedef enum { GCD_WAIT_OK, GCD_WAIT_FAILED, GCD_WAIT_TIMEOUT } gcd_wait_status;

// Polls until the communicator is ready and, with stream set, the stream has drained. Anything but
// GCD_WAIT_OK has aborted the communicator (once) and left in msg what happened, naming `what`.
gcd_wait_status gcd_wait(const gcd_wait_ops *ops, void *ctx, const char *what, int stream, double timeout, char *msg, size_t len);
// The same, fatal on failure: "rank R: what: ..." and exit 3 (MPI_Abort on a multi-rank job)
void gcd_wait_check(const gcd_wait_ops *ops, void *ctx, const char *what, int stream, double timeout);
