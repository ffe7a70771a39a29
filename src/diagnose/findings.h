/*
 * findings: what the verdict's judgements share (internal to src/diagnose/). A verdict context (the
 * run, the parameters by name, what was measured over the whole model) passed to every judgement, in
 * place of file-level state; the parameters named in words ("a, b and c", "prefix.*"); a finding
 * appended; the scale as a user reads it. The judgements are judgements.c's table, their causes causes.c.
 */
#pragma once
#include "diagnose/verdict.h"

typedef struct {
    gcd_run_result *res;
    int check;                         // the dumps' check (a user's training), not a probe
    int *by_name;                      // (nparam) indices into res->param, sorted by name
    const gcd_param_result *loosest;   // the ok tensor that accepted the largest relative error (NULL: none)
} gcd_verdict_ctx;

// 1 when the judgement looks at p (arg: the judgement's own, often NULL)
typedef int (*gcd_pick_fn)(const gcd_param_result *p, const void *arg);

// builds and frees v->by_name
void gcd_names_index(gcd_verdict_ctx *v);
void gcd_names_index_free(gcd_verdict_ctx *v);
int gcd_names_count(const gcd_run_result *res, gcd_pick_fn pick, const void *arg);
// writes the picked parameters' names in words into out (and, when ids is given, every picked name
// comma-separated); returns how many were picked
int gcd_names_words(const gcd_verdict_ctx *v, gcd_pick_fn pick, const void *arg, gcd_sb *out, gcd_sb *ids);
// [*lo, *hi): the run of names sorted in v->by_name that start with the k bytes of prefix
void gcd_names_prefix_run(const gcd_verdict_ctx *v, const char *prefix, size_t k, int *lo, int *hi);
const char *gcd_plural(int n, const char *one, const char *many);
// "DDP's all-reduce", "FSDP2's reduce-scatter", ...: the step that reduced the gradients, from what the dumps
// record (gradcheck.wrapper; NULL: DDP's, as before the dumps recorded it)
const char *gcd_reducer_words(const char *wrapper);
const char *gcd_ref_words(const gcd_run_result *res);   // "the single-process reference", or "the reference run"

// appends a finding to res that takes over the strings of msg and ids (ids NULL: no parameters)
void gcd_finding_emit(gcd_run_result *res, const char *kind, int counts, gcd_sb *ids, gcd_sb *msg);
// "lo to hi" at 3 digits, or one figure where both print alike
void gcd_finding_range(gcd_sb *m, double lo, double hi);

// The scale as a user reads it: a simple fraction or a power of two within tol of c, else c
double gcd_shown_scale(double c, double tol);
int gcd_same_shown(double a, double b, double tol);

// What one judgement was given (judgements.c's table): its parameters, and those it picked
typedef struct {
    gcd_pick_fn pick;             // the parameters the judgement looks at
    const gcd_param_result *p;    // one finding per parameter: the one
    const char *names;            // one finding for all: the picked in words
    int n;                        // one finding for all: how many were picked
} gcd_judged;

// judgements.c: every row of the table, in order: res->finding
void gcd_judgements_run(const gcd_verdict_ctx *v);

// ---- causes.c: the judgements that write their own findings (a table row's `say`, per OWN)
enum { GCD_MISMATCH_GROUPS = 6 };   // more mismatches than this: grouped into at most this many findings
void gcd_cause_stage(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids);
void gcd_cause_scaled(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids);
void gcd_cause_batchnorm(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids);
void gcd_cause_mismatch_groups(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids);
// the signature of a gather whose backward keeps only the rank's own slot (run's mode local) in check's numbers:
// 0, or the evidence that the forward is right (1: the recorded losses, 2: tensors that match, or both)
int gcd_own_slot_evidence(const gcd_verdict_ctx *v);
void gcd_cause_own_slot(const gcd_verdict_ctx *v, const gcd_judged *j, gcd_sb *m, gcd_sb *ids);
