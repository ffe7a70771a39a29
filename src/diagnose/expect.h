/*
 * expect: what each gather mode must show, written once. A probe's parameters split at the gather:
 * those that feed a tensor gathered with the run's mode ("before") and the rest ("after"). For each
 * (mode, local loss, world) the table gives the status each side must have; `scaled` means exactly
 * 1/world. A control passes only when the numbers show exactly its signature. The verdict never reads
 * this table: it is checked after classification, against the statuses the numbers gave.
 */
#pragma once
#include "diagnose/run.h"

typedef struct {
    gcd_status before, after;
} gcd_signature;

// finalize: a tensor-parallel probe, whose "before" parameters are the replicated ones the mode reduces
gcd_signature gcd_expected_signature(int mode, int local_loss, int world, int finalize);
// 1 when every parameter of res shows its signature; otherwise 0 and msg says, for the first parameters
// that differ, what was expected and what was seen. before_mask: bit i set when param i is "before".
int gcd_signature_met(const gcd_run_result *res, unsigned before_mask, gcd_sb *msg);
