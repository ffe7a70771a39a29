// The entry point: usage, --help, --version, and the command dispatch.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/prctl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

static const char usage_top[] =
    "gradcheck-dist " GCD_VERSION ": finds gradients that distributed training silently drops\n"
    "\n"
    "usage:\n"
    "  gradcheck-dist run [options]        run the probes across ranks and compare every gradient\n"
    "  gradcheck-dist check DUMP...|DIR [options]   diagnose your own training's gradients (safetensors dumps)\n"
    "  gradcheck-dist report FILE|- [--format text|md|junit]   render a saved JSON report\n"
    "  gradcheck-dist --help | -V | --version | version\n"
    "  gradcheck-dist COMMAND --help       that command's usage alone\n";
static const char usage_modes[] =
    "progress goes to stderr: a live line on a terminal, else one line per probe and mode\n"
    "\n"
    "gather modes:\n"
    "  off    Lightning all_gather(sync_grads=False): gathered under no_grad\n"
    "  on     Lightning sync_grads=True / torch.distributed.nn.functional.all_gather\n"
    "  local  open_clip gather_with_grad=False / torchmetrics: the rank's own rows (its slot) put back\n"
    "  avg    Horovod allgather: backward averages over ranks\n";
static const char usage_check[] =
    "  DUMP...|DIR          one safetensors dump per rank (gradcheck_dist.dump_grads), or a directory of them\n";
static const char usage_report[] =
    "  FILE|-               a JSON report gradcheck-dist wrote (-: read it from stdin)\n";
static const char usage_tail[] =
    "statuses: none (no rank got a gradient), partial (some ranks did not), zero, nonfinite, ok,\n"
    "scaled (a multiple of the reference), mismatch (wrong direction), disagree (ranks differ after\n"
    "DDP's all-reduce; check), present (check without --ref: finite, non-zero, the same on every rank)\n"
    "\n"
    "exit status:\n"
    "  0  no unexpected finding     1  gradient findings (or a control that showed none)\n"
    "  2  bad input (flag, dump, report file)   3  runtime failure (MPI, NCCL, I/O)\n";

// one command's options, from the table
static void options_of(FILE *f, const char *cmd, unsigned bit, const char *words) {
    fprintf(f, "%s options:\n%s", cmd, words);
    gcd_options_help(f, bit);
}

// NULL: every command's; "run", "check", "report": that command's alone
int help(FILE *f, const char *cmd) {
    if (!cmd) {
        fprintf(f, "%s\n", usage_top);
        options_of(f, "run", CMD_RUN, ""), fprintf(f, "%s\n", usage_modes);
        options_of(f, "check", CMD_CHECK, usage_check), fprintf(f, "\n");
        options_of(f, "report", CMD_REPORT, usage_report), fprintf(f, "\n%s", usage_tail);
    } else if (!strcmp(cmd, "run")) {
        fprintf(f, "usage: gradcheck-dist run [options]\n\n");
        options_of(f, "run", CMD_RUN, ""), fprintf(f, "%s\n%s", usage_modes, usage_tail);
    } else if (!strcmp(cmd, "check")) {
        fprintf(f, "usage: gradcheck-dist check DUMP...|DIR [options]\n\n");
        options_of(f, "check", CMD_CHECK, usage_check), fprintf(f, "\n%s", usage_tail);
    } else if (!strcmp(cmd, "report")) {
        fprintf(f, "usage: gradcheck-dist report FILE|- [--format text|md|junit]\n\n");
        options_of(f, "report", CMD_REPORT, usage_report);
    } else return help(f, NULL);
    if (f == stdout) return stdout_done("--help");
    return fflush(f) || ferror(f) ? 3 : 0;
}
int main(int argc, char **argv) {
    std_fds_guard();
    if (argc < 2) return help(stderr, NULL), 2;
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) return help(stdout, argc > 2 ? argv[2] : NULL);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
        printf("gradcheck-dist " GCD_VERSION "\nBLAS: %s, linked in\n", gcd_blas_config());
        return stdout_done("--version");
    }
    static const char *const commands[] = { "run", "check", "report", "version", "help", "--version", "--help", NULL };
    int c = 0;
    while (commands[c] && strcmp(cmd, commands[c])) c++;
    if (c > 2) return unknown("unknown command: expected run, check or report", cmd, commands);   // --verison: did you mean --version?
    command = c == 0 ? "run " : c == 1 ? "check " : "report ";
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return help(stdout, cmd);
    if (!strcmp(cmd, "report")) return report_main(argc, argv);
    if (!strcmp(cmd, "check")) return check_main(argc, argv);
    options o;
    int rc = parse_run(argc, argv, &o);
    if (rc) return rc;
#ifdef GCD_NO_MPI   // built without MPI (CMake GCD_MPI): launch.c and rank.c are not in this program
    fprintf(stderr, "gradcheck-dist: run: this build has no MPI, which run needs (check and report work without it).\n"
                    "  Install Open MPI (Debian/Ubuntu, as root: apt-get install libopenmpi-dev openmpi-bin), then build\n"
                    "  again: pip install --force-reinstall --no-cache-dir SOURCE_DIR_OR_SDIST, or cmake --build BUILD_DIR\n");
    return 2;
#else
    if ((rc = mpi_env_refusal())) return rc;
    if ((rc = pmi_unusable())) return rc;   // before MPI_Init, which would abort
    return gcd_mpi_inside_job() ? run_rank(&o, argc, argv) : launch(&o, argc, argv);
#endif
}
