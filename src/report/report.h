/*
 * report: the JSON document a run leaves behind (schema gradcheck-dist.report/2, built with cJSON)
 * and its renderings. Every rendering, the table `run` prints included, is made from the document,
 * so `report FILE` shows exactly what the run showed. Reports read results; they never run a probe.
 */
#pragma once
#include <cjson/cJSON.h>
#include <stdio.h>

#include "check/check.h"
#include "diagnose/run.h"

#define GCD_REPORT_VERSION 3          // written; /2 (a check dump's sha256) and /1 (a setup in every run, every value) are still read
#define GCD_REPORT_VERSION_OLDEST 1
#define GCD_REPORT_STR_(x) #x
#define GCD_REPORT_STR(x) GCD_REPORT_STR_(x)
#define GCD_REPORT_SCHEMA "gradcheck-dist.report/" GCD_REPORT_STR(GCD_REPORT_VERSION)

// Tensor values in a run's report: with more elements than GCD_VALUES_LIMIT a tensor is written as
// {"elided": true, "numel", "norm", "first": [its first GCD_VALUES_FIRST values]} unless --full.
#define GCD_VALUES_LIMIT 4096
#define GCD_VALUES_FIRST 16
typedef enum { GCD_VALUES_LIMITED = 0, GCD_VALUES_NONE = 1, GCD_VALUES_FULL = 2 } gcd_values;   // default, --summary-only, --full

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
// role: "test" (the configuration under test) or "control". The probe's setup (initial weights, every
// rank's inputs) goes once into the top-level "setups", with the first run of that probe.
void gcd_report_add_run(cJSON *doc, const gcd_run_result *res, const char *role, gcd_values values);
// check: the dumps, their XXH3-128 digests, and each parameter's figures; sets the report's tolerance
void gcd_report_add_check(cJSON *doc, const gcd_check_set *set, const gcd_run_result *res);
// guard: the reduced stage judged from the ranks' summaries (src/guard); returns the run, for the caller's additions
cJSON *gcd_report_add_guard(cJSON *doc, const gcd_run_result *res);
void gcd_report_add_expectation(cJSON *doc, const char *probe, const char *mode, const char *role, int met, const char *message);
void gcd_report_finish(cJSON *doc, int exit_code, const char *error, int error_rank, double wall_seconds);
// The document as JSON text (malloc'd): each double in the shortest form that reads back exactly.
char *gcd_json_print(const cJSON *doc);                // report_print.c
int gcd_json_print_file(const cJSON *doc, FILE *f);     // the text and a newline into f; 0 when a write failed (errno says why)
int gcd_num_shortest(char buf[32], double v);          // the fewest digits (15..17, %g) that read back as v
// ----------------------------------------------------------------------------
// output (report_output.c)
// Written whole or not at all: a temporary file beside path, then rename. "-": stdout.
int gcd_report_write(const cJSON *doc, const char *path, char *err, size_t len);
// The same for any text (the JUnit file): what names it in the message ("--junit: cannot write ...").
int gcd_text_write(const char *text, const char *what, const char *path, char *err, size_t len);
// Where a report may go, checked before any work: 0; -2 when refused (a link another user owns or
// controls the directory of, a directory: bad input); -1 when it cannot be reached. A FIFO is waited
// for at the write: 10 s for a reader to open it, 60 s for the reader to take each part.
// The writers walk the path the same way, one name at a time from a directory descriptor.
int gcd_output_check(const char *what, const char *path, char *err, size_t len);
// what a path (or "-": stdout) writes into: one file however spelled (links, /dev/stdout, a dangling link)
typedef struct {
    unsigned long long dev, ino;   // the file, or for a name not there yet its directory
    char name[256];                // "" for a file that exists, else the new name in that directory
} gcd_output_id;
int gcd_output_identity(const char *path, gcd_output_id *id);   // 0 when it cannot be told
int gcd_output_same(const char *a, const char *b);               // two outputs that write into one file or stream
// ----------------------------------------------------------------------------
// reading (report_load.c)
#define GCD_REPORT_MAX_BYTES (1ull << 30)   // a report over 1 GiB is refused before it is read
#define GCD_REPORT_MAX_TREE 1073741824.0     // nor one whose tree would take over 1 GiB of memory (~13M values)
// Reads, parses and checks a report (a regular file, or "-" for stdin); NULL with a one-line reason,
// naming the file and the JSON path of a bad key, in err.
cJSON *gcd_report_load(const char *path, char *err, size_t len);
// The same from memory (name: for the messages).
cJSON *gcd_report_parse(const char *buf, size_t n, const char *name, char *err, size_t len);
double gcd_json_num(const cJSON *v);   // numbers, and the strings "nan", "inf", "-inf"; NAN for null
// A run's setup, from either the run itself (schema /1) or the top-level "setups" entry of its probe
// (/2); NULL when it has none (check runs). In report_load.c, which the renderings and the fuzz target link.
const cJSON *gcd_report_run_setup(const cJSON *doc, const cJSON *run);

// ----------------------------------------------------------------------------
// The renderings' view of doc: doc itself, or (*copy, to be freed) a copy whose strings are escaped
// for a terminal (report_load.c); every rendering reads only this
const cJSON *gcd_report_safe(const cJSON *doc, cJSON **copy);
// renderings: malloc'd text

char *gcd_render_text(const cJSON *doc);    // report_text.c, as wide as gcd_text_width(stdout)
char *gcd_render_text_width(const cJSON *doc, int width);   // no table line longer than width
#define GCD_TEXT_MIN_WIDTH 40
int gcd_text_width(int fd);   // COLUMNS, else fd's terminal's width, else 100 (at least 40)
char *gcd_render_md(const cJSON *doc);      // report_md.c
char *gcd_render_junit(const cJSON *doc);   // report_junit.c
