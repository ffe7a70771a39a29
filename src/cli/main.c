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

#include "cli.h"

static const char usage_top[] =
    "gradcheck-dist " GCD_VERSION ": finds gradients that distributed training silently drops\n"
    "\n"
    "usage:\n"
    "  gradcheck-dist run [options]        run the probes across ranks and compare every gradient\n"
    "  gradcheck-dist check DUMP...|DIR [options]   diagnose your own training's gradients (safetensors dumps)\n"
    "  gradcheck-dist report FILE|- [--format text|md|junit]   render a saved JSON report\n"
    "  gradcheck-dist --help | -V | --version | version\n"
    "  gradcheck-dist COMMAND --help       that command's usage alone\n";
static const char usage_run[] =
    "run options:\n"
    "  --world N            ranks to launch (default 2); inside mpirun it must equal the job's size\n"
    "  --probe NAME|all     simplenet, contrastive or all (default all)\n"
    "  --mode LIST|all      gather modes under test, comma-separated: off,on,local,avg. Without it every\n"
    "                       mode runs: on is under test, the others are controls that must show a finding\n"
    "  --inputs seed|random simplenet: the seed's inputs on every rank, or rank-distinct ones (default seed)\n"
    "  --seed S             seed for weights and inputs (default 42)\n"
    "  --local-loss         contrastive: open_clip local_loss=True\n"
    "  --batch B --dim-img D --dim-txt D --dim-emb E   contrastive sizes (default 4, 8, 6, 4)\n"
    "  --steps N --lr X     then take N SGD steps per mode (default 0, at most 100000; lr 0.1)\n"
    "  --backend mpi|nccl   collectives over Open MPI on the CPU, or NCCL on CUDA devices (default mpi)\n"
    "  --hostfile FILE      passed to mpirun\n"
    "  --oversubscribe      more ranks than the Slurm allocation's tasks (else refused, exit 2)\n"
    "  --timeout S          a collective not complete after S seconds stops the run, exit 3 (default 300,\n"
    "                       or GCD_TIMEOUT): a stopped, hung or dead rank never hangs the job\n"
    "  --json PATH|-        where the JSON report goes (default reports/gradcheck-<UTC time>.json;\n"
    "                       -: stdout, and the table goes to stderr)\n"
    "  --no-json            write no report\n"
    "  --junit PATH|-       also write the result as JUnit XML for CI (also with --no-json)\n"
    "  --summary-only       leave tensor values out of the report, keep the statuses\n"
    "  --full               every tensor's values (default: one over 4096 elements as its norm and first 16)\n"
    "progress goes to stderr: a live line on a terminal, else one line per probe and mode\n"
    "\n"
    "gather modes:\n"
    "  off    Lightning all_gather(sync_grads=False): gathered under no_grad\n"
    "  on     Lightning sync_grads=True / torch.distributed.nn.functional.all_gather\n"
    "  local  open_clip gather_with_grad=False / torchmetrics: own slot put back\n"
    "  avg    Horovod allgather: backward averages over ranks\n";
static const char usage_check[] =
    "check options:\n"
    "  DUMP...|DIR          one safetensors dump per rank (gradcheck_dist.dump_grads), or a directory of them\n"
    "  --ref FILE           the single-process reference: same starting weights, the whole batch, world 1\n"
    "  --ignore GLOB        leave parameters matching GLOB out (repeatable; fnmatch, e.g. 'head.*')\n"
    "  --tol X              relative tolerance (default from the dtypes: F64 1e-9, F32 1e-5, F16/BF16 1e-2)\n"
    "  --json PATH|- --no-json --junit PATH|-   as for run\n"
    "  --snippet            print the recipe that writes the dumps (PyTorch, Lightning) and exit\n";
static const char usage_report[] =
    "report options:\n"
    "  FILE|-               a JSON report gradcheck-dist wrote (-: read it from stdin)\n"
    "  --format text|md|junit   the table (as wide as COLUMNS, else the terminal, else 100 columns),\n"
    "                       a Markdown ticket, or JUnit XML (default text)\n";
static const char usage_tail[] =
    "statuses: none (no rank got a gradient), partial (some ranks did not), zero, nonfinite, ok,\n"
    "scaled (a multiple of the reference), mismatch (wrong direction), disagree (ranks differ after\n"
    "DDP's all-reduce; check), present (check without --ref: finite, non-zero, the same on every rank)\n"
    "\n"
    "exit status:\n"
    "  0  no unexpected finding     1  gradient findings (or a control that showed none)\n"
    "  2  bad input (flag, dump, report file)   3  runtime failure (MPI, NCCL, I/O)\n";

// NULL: every command's; "run", "check", "report": that command's alone
int help(FILE *f, const char *cmd) {
    if (!cmd) fprintf(f, "%s\n%s\n%s\n%s\n%s", usage_top, usage_run, usage_check, usage_report, usage_tail);
    else if (!strcmp(cmd, "run")) fprintf(f, "usage: gradcheck-dist run [options]\n\n%s\n%s", usage_run, usage_tail);
    else if (!strcmp(cmd, "check")) fprintf(f, "usage: gradcheck-dist check DUMP...|DIR [options]\n\n%s\n%s", usage_check, usage_tail);
    else if (!strcmp(cmd, "report")) fprintf(f, "usage: gradcheck-dist report FILE|- [--format text|md|junit]\n\n%s", usage_report);
    else return help(f, NULL);
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
    static const char *const commands[] = { "run", "check", "report", "version", "help", NULL };
    int c = 0;
    while (commands[c] && strcmp(cmd, commands[c])) c++;
    if (c > 2) return unknown("unknown command: expected run, check or report", cmd, commands);
    command = c == 0 ? "run " : c == 1 ? "check " : "report ";
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return help(stdout, cmd);
    if (!strcmp(cmd, "report")) return report_main(argc, argv);
    if (!strcmp(cmd, "check")) return check_main(argc, argv);
    options o;
    int rc = parse_run(argc, argv, &o);
    if (rc) return rc;
    if ((rc = pmi_unusable())) return rc;   // before MPI_Init, which would abort
    return gcd_mpi_inside_job() ? run_rank(&o, argc, argv) : launch(&o, argc, argv);
}
