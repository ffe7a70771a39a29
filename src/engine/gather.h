/*
 * gather: all_gather as an autograd op, one small backward per library convention. The forward is the
 * same collective in every mode (each rank's (B,...) tensor stacked to (world*B,...)); the modes differ
 * only in what flows back to the rank's own input:
 *   off   Lightning all_gather(sync_grads=False): under no_grad, the result has no graph
 *   on    Lightning sync_grads=True / torch.distributed.nn.functional.all_gather: reduce_scatter SUM
 *   local open_clip gather_with_grad=False, torchmetrics: own slot put back, only its own gradient
 *   avg   Horovod allgather: all_reduce AVERAGE of the incoming gradient, then the own slot
 * Under MPI there is always a process group, also of one rank: there Lightning's sync_grads=False still
 * detaches (it skips the gather only without any process group), and the other modes are exact.
 */
#pragma once
#include "engine/autograd.h"
#include "comm/comm.h"

typedef enum { GCD_GATHER_OFF, GCD_GATHER_ON, GCD_GATHER_LOCAL, GCD_GATHER_AVG, GCD_GATHER_COUNT } gcd_gather_mode;

const char *gcd_gather_mode_name(int mode);      // "off", "on", "local", "avg"
const char *gcd_gather_mode_library(int mode, int local_loss);   // whose real code it is, in words
// the same for a tensor-parallel probe, where the mode is the replicated parameters' reduction across the group
const char *gcd_finalize_mode_library(int mode);
int gcd_gather_mode_parse(const char *s);        // -1 when unknown

// Every rank passes the same shapes, as MPI and NCCL need the same counts on every rank (gcd_run's ranks
// run one command: the CLI checks it in their first collective, and the shapes follow from it).
gcd_tensor *gcd_all_gather(gcd_ctx *c, gcd_comm *comm, gcd_tensor *x, gcd_gather_mode mode);
// k tensors in one collective: out[i] is what gcd_all_gather(c, comm, x[i], mode[i]) gives, each its
// own autograd node
void gcd_all_gather_many(gcd_ctx *c, gcd_comm *comm, int k, gcd_tensor *const *x, const gcd_gather_mode *mode, gcd_tensor **out);
void gcd_gather_backward(gcd_ctx *c, gcd_node *nd);
// Megatron's reduce_scatter_to_sequence_parallel_region: x (world*m, C) on every rank -> (m, C), this
// rank's rows of the sum over ranks; backward all_gathers the gradient (None where no rank has one)
gcd_tensor *gcd_reduce_scatter(gcd_ctx *c, gcd_comm *comm, gcd_tensor *x);
