/*
 * ddp: what DistributedDataParallel does to a parameter's gradient after backward: the mean over
 * ranks. A gradient that is None on every rank stays None; None on some ranks counts as zeros from
 * those ranks (as with find_unused_parameters=True) and the caller flags it "partial".
 */
#pragma once
#include <stddef.h>

#include "comm/comm.h"

// local (n) is this rank's gradient or NULL (None). On return every rank holds the same
// mean (n) (summed in rank order, so the ranks stay bit-identical) and returns how many ranks had a
// gradient. all (world*n) and has (world) receive every rank's local gradient when not NULL.
int gcd_ddp_mean(gcd_comm *comm, const double *local, size_t n, double *mean, double *all, unsigned char *has);
// The same for k tensors in one collective (DDP's gradient bucket): local[i] (n[i]) or NULL, mean[i]
// (n[i]); all and has, or any all[i] and has[i], may be NULL; a NULL mean[i] skips that mean (a tensor
// carried only for its every-rank copy); nhave[i] receives tensor i's count. root_only: only rank 0's
// outputs are wanted (no update follows): the buckets go to rank 0 alone, where backend has a gather,
// with the same bits there; another rank's nhave are 0 and its other outputs untouched.
void gcd_ddp_mean_bucket(gcd_comm *comm, int k, const double *const *local, const size_t *n, double **mean,
                         double **all, unsigned char **has, int *nhave, int root_only);
