/*
 * report_render: what the renderings share: reading a report's fields (absent or odd values read as
 * "" or NAN, never a crash), grouping runs by probe configuration, and one table cell per gradient.
 */
#pragma once
#include <cjson/cJSON.h>

#include "util.h"

const char *gcd_jstr(const cJSON *o, const char *key);   // "" when absent
double gcd_jnum(const cJSON *o, const char *key);         // NAN when absent or null
int gcd_jint(const cJSON *o, const char *key);            // -1 when absent, null, NaN or out of int's range
int gcd_int_of(double v);
int gcd_jbool(const cJSON *o, const char *key);
char *gcd_jshape(const cJSON *o, char *buf, size_t len);  // "(4,8)" from o's "shape"
// runs with the same probe, local_loss and inputs form one table; returns how many groups and fills
// group[i] with each run's group index (at most 64 runs)
int gcd_run_groups(const cJSON *runs, int *group, int max);
// the runs of group g, in order, into cols (at most max); returns how many
int gcd_group_runs(const cJSON *runs, const int *group, int g, const cJSON **cols, int max);
// the params of each column walked in step (no O(n) lookup per row): cur[c] is column c's on this row
void gcd_rows_begin(const cJSON **cur, const cJSON *const *cols, int ncol);
void gcd_rows_next(const cJSON **cur, int ncol);
char *gcd_run_title(const cJSON *run, char *buf, size_t len);    // "contrastive (local_loss, inputs random)"
char *gcd_cell(const cJSON *param, char *buf, size_t len);       // "scaled    5.829e-02 x0.25"
// a param's forward path as one chain, "fc1.weight -> linear(fc1) -> all_gather[off] ✂ under no_grad ... -> mse_loss":
// ✂ where the gradient was cut (none, partial, or a detached node), ≠ where it departs; 0 when it has none
int gcd_chain(gcd_sb *b, const cJSON *param);
// the param named first in a finding, for the findings that have a path (none, partial, scaled, mismatch)
const cJSON *gcd_finding_param(const cJSON *run, const cJSON *finding);
