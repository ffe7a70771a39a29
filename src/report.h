/*
 * report: the JSON document a run leaves behind (schema gradcheck-dist.report/1, built with cJSON)
 * and its renderings. Every rendering, the table `run` prints included, is made from the document,
 * so `report FILE` shows exactly what the run showed. Reports read results; they never run a probe.
 */
#pragma once
#include <cjson/cJSON.h>

#include "check.h"
#include "run.h"

#define GCD_REPORT_SCHEMA "gradcheck-dist.report/1"

typedef struct {
    const char *backend;
    int world;
    char **hostnames;        // (world)
    char **devices;          // (world) or NULL (mpi)
    char mpi_version[256];
    char nccl_version[64];   // "" when not used
    char cuda_version[64];
    char start_time[32];     // UTC ISO 8601
} gcd_env;

// ----------------------------------------------------------------------------
// building (report_json.c)

cJSON *gcd_report_new(int argc, char **argv, const gcd_env *env);
// role: "test" (the configuration under test) or "control"
void gcd_report_add_run(cJSON *doc, const gcd_run_result *res, const char *role, int summary_only);
// check: the dumps, their sha256, and each parameter's figures; sets the report's tolerance
void gcd_report_add_check(cJSON *doc, const gcd_check_set *set, const gcd_run_result *res);
void gcd_report_add_expectation(cJSON *doc, const char *probe, const char *mode, const char *role, int met, const char *message);
void gcd_report_finish(cJSON *doc, int exit_code, const char *error, int error_rank, double wall_seconds);
// The document as JSON text (malloc'd): each double in the shortest form that reads back exactly.
char *gcd_json_print(const cJSON *doc);
// Written whole or not at all: a temporary file beside path, then rename. "-": stdout.
int gcd_report_write(const cJSON *doc, const char *path, char *err, size_t len);
#define GCD_REPORT_MAX_BYTES (1ull << 30)   // a report over 1 GiB is refused before it is read
// Reads, parses and checks a report (a regular file, or "-" for stdin); NULL with a one-line reason,
// naming the file and the JSON path of a bad key, in err.
cJSON *gcd_report_load(const char *path, char *err, size_t len);
// The same from memory (name: for the messages).
cJSON *gcd_report_parse(const char *buf, size_t n, const char *name, char *err, size_t len);
double gcd_json_num(const cJSON *v);   // numbers, and the strings "nan", "inf", "-inf"; NAN for null
// A run's setup (initial weights, every rank's inputs): read it only through this.
const cJSON *gcd_report_run_setup(const cJSON *doc, const cJSON *run);

// ----------------------------------------------------------------------------
// renderings: malloc'd text

char *gcd_render_text(const cJSON *doc);    // report_text.c
char *gcd_render_md(const cJSON *doc);      // report_md.c
char *gcd_render_junit(const cJSON *doc);   // report_junit.c
