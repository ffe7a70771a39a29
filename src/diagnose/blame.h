/*
 * blame: where each parameter's gradient goes wrong, for the report.
 *   none, partial      the shortest forward path to the loss (every rank's graph) and the first node on
 *                      it that cut the gradient, why (from what the node recorded), and on which ranks;
 *                      or the ranks whose loss does not use the parameter at all
 *   scaled, mismatch   the first checkpoint around the gather where the gradient departs from the
 *                      single-process reference, measured: (1) arriving at the gathered features,
 *                      (2) leaving the gather's backward into each rank's own rows, (3) the parameter
 * Nothing here reads the gather mode: a gather's mode is only its name in the chain.
 */
#pragma once
#include "diagnose/run.h"

// Sets every parameter's path, breaks_at and reason from res's graphs and checkpoints (rank 0, after
// gcd_verdict). Parameters without a recorded graph (check) are left without a path.
void gcd_blame(gcd_run_result *res);
