/*
 * cli: gradcheck-dist's entry point. `run` parses and checks every argument first (exit 2 before any
 * rank starts), then either launches itself under mpirun -np N (launch.c) or, inside an MPI job, runs
 * as one rank (rank.c): every probe under every gather mode, the table and verdicts on rank 0, the JSON
 * report. `check` diagnoses the user's own dumps and `report FILE` renders a saved report (commands.c).
 */
#pragma once
#include <stddef.h>
#include <stdio.h>

#include "check/check.h"
#include "comm/comm.h"
#include "diagnose/expect.h"
#include "engine/ops.h"
#include "report/report.h"
#include "diagnose/run.h"
#include "diagnose/verdict.h"

#ifndef GCD_VERSION
#define GCD_VERSION "0.0.0"
#endif

typedef struct {
    int world;                       // 0: not given
    const char *probe;               // "all" or a probe's name
    int mode[GCD_GATHER_COUNT], nmode, mode_given;
    gcd_probe_cfg cfg;
    int steps;
    double lr;
    const char *hostfile, *json, *backend, *junit;
    int no_json, summary_only, full;
    int oversubscribe;               // more ranks than the allocation's slots (--oversubscribe)
    double timeout;                  // seconds a collective may take (--timeout, GCD_TIMEOUT, default 300)
} options;

extern const char *command;   // "run ", "check ", "report ": where the usage is

// Every command's options, one table: the parser, "did you mean" and --help read it (options.c).
enum { CMD_RUN = 1, CMD_CHECK = 2, CMD_REPORT = 4 };
typedef enum {
    OPT_WORLD = 1, OPT_PROBE, OPT_MODE, OPT_INPUTS, OPT_SEED, OPT_LOCAL_LOSS, OPT_BATCH, OPT_DIM_IMG, OPT_DIM_TXT, OPT_DIM_EMB,
    OPT_STEPS, OPT_LR, OPT_BACKEND, OPT_HOSTFILE, OPT_TIMEOUT, OPT_REF, OPT_IGNORE, OPT_TOL, OPT_JSON, OPT_NO_JSON, OPT_JUNIT,
    OPT_SUMMARY_ONLY, OPT_FULL, OPT_OVERSUBSCRIBE, OPT_SNIPPET, OPT_FORMAT, OPT_HELP
} opt_id;
typedef struct {
    int id;                 // opt_id; 0 ends the table
    const char *name;       // "--world"
    unsigned cmds;          // CMD_*: the commands that take it
    const char *arg;        // its value in --help ("N", "PATH|-"); NULL: a switch, which takes none
    const char *values;     // the values it accepts, comma-separated ("mpi,nccl"); NULL: checked by its parser
    const char *help;       // --help's line ("\n" continues it under the column)
} gcd_option;
extern const gcd_option gcd_options[];
void gcd_options_help(FILE *f, unsigned cmds);
int gcd_unknown_option(unsigned cmd, const char *word);
int gcd_next_option(int argc, char **argv, int *i, unsigned cmd, const gcd_option **opt, const char **v);

// main.c
int help(FILE *f, const char *cmd);
// options.c
int bad(const char *flag, const char *fmt, const char *value);
int unknown(const char *what, const char *word, const char *const *known);
int parse_int(const char *flag, const char *v, long lo, long hi, long *out);
int report_path_ok(const char *flag, const char *path);
int junit_path_ok(const char *junit, const char *json);
int parse_run(int argc, char **argv, options *o);
// launch.c
int launch(const options *o, int argc, char **argv);
// preflight.c: each 0, or the exit code having said why
int mpi_env_refusal(void);   // OMPI_COMM_WORLD_SIZE/RANK not as mpirun writes them: says so, 2
int pmi_unusable(void);   // srun --mpi=pmi2: says so (task 0) and returns 3; 0 otherwise
long physical_cores(void);                          // Open MPI counts its default slots by these
int slurm_refusal(const options *o, int world);     // srun without PMIx, more ranks than the allocation's tasks
int feasible(const options *o, int world);          // more ranks or memory than this machine has
int tmpdir_room(const char *tmpdir, int world);     // a TMPDIR too full for Open MPI's session files
int nccl_precheck(const options *o, int world);     // --backend nccl without NCCL or a GPU a rank
// rank.c
int run_rank(const options *o, int argc, char **argv);
// output.c
double now(void);                        // seconds, monotonic
int write_reports(cJSON *doc, char *json, int reserved, char *junit, int code, double seconds);
int default_report_path(char *path, size_t len);
void std_fds_guard(void);                // main's first call: a closed 0-2 held by /dev/null, read-only
int stream_lost(int fd);                 // closed, /dev/full or a full file system
int launcher_streams_code(int code);     // code, or 3 when what mpirun forwarded to stdout/stderr was lost
int stdout_done(const char *what);       // 0, or 3 having said on stderr that stdout failed
void put_path(FILE *f, const char *prefix, const char *path);   // prefix, path escaped for a terminal, newline
void say(const char *prefix, const char *text);   // "gradcheck-dist: " prefix text, text escaped for a terminal
// commands.c
int check_main(int argc, char **argv);
int report_main(int argc, char **argv);
