// Blame is measured, not read off the mode. This binary links its own ops.c, built with GCD_TEST_WRONG_OP:
// the op the test names has its backward multiplied by 1.5 on every rank but 0 (the reference runs on rank
// 0, in one process: it stays right, as for an op that goes wrong only when distributed). A wrong op on
// the encode side must be blamed there, a wrong op on the loss side must take the blame from the gather
// (mode local), and a wrong encode op under mode local must leave it on the gather, the first to depart.
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/comm.h"
#include "engine/ops.h"
#include "diagnose/run.h"
#include "diagnose/verdict.h"

extern int gcd_test_wrong_op;
extern double gcd_test_wrong_factor;

static int is_encoder(const gcd_run_result *res, const char *name) {
    return !strcmp(res->probe, "simplenet") ? !strncmp(name, "fc1.", 4) : strcmp(name, "logit_scale") != 0;
}

static const char *reason(const gcd_param_result *p) { return p->reason ? p->reason : "(none)"; }

// runs probe under mode with op wrong, and checks where each wrong parameter's blame lands: the stage's
// node, and words that name it
static void blame_should_land(gcd_comm *comm, const gcd_probe *probe, int mode, int wrong_op) {
    gcd_run_opts o = { .probe = probe, .mode = mode, .lr = 0.1, .cfg = { .seed = 7, .batch = 3, .dim_img = 5, .dim_txt = 4, .dim_emb = 3 } };
    gcd_test_wrong_op = wrong_op;
    // not an integer: with ranks alike under mode local, a factor of world + 1 would cancel 1/world exactly
    gcd_test_wrong_factor = comm->rank == 0 ? 1 : 1.5;
    gcd_run_result res;
    gcd_run(comm, &o, &res);
    if (comm->rank == 0) {
        const char *m = gcd_gather_mode_name(mode), *op = wrong_op < 0 ? "no op" : gcd_op_name(wrong_op);
        int loss_side = wrong_op == GCD_OP_MSE || wrong_op == GCD_OP_CROSS_ENTROPY;
        for (int i = 0; i < res.nparam; i++) {
            const gcd_param_result *p = &res.param[i];
            int enc = is_encoder(&res, p->name), gather = gcd_path_find_op(&p->path, GCD_OP_GATHER);
            if (!enc && mode != GCD_GATHER_ON && wrong_op < 0) continue;   // after the gather, nothing is wrong
            if (!strcmp(p->name, "logit_scale") && !loss_side) continue;   // normalize's backward does not reach it
            CHECK(p->status == GCD_ST_SCALED || p->status == GCD_ST_MISMATCH, "%s %s, %s wrong: %s is %s", probe->name, m, op, p->name,
                  gcd_status_str(p->status));
            const char *stage, *words;
            int at;
            if (loss_side && gather < 0) stage = "loss side only", at = 1, words = "the loss side: the parameter is used after the gather only";
            else if (loss_side) stage = "loss side", at = gather + 1, words = "the loss side already differs";
            else if (enc && mode != GCD_GATHER_ON) stage = "gather", at = gather, words = "backward: ";
            else stage = "encode side", at = gather - 1, words = !strcmp(probe->name, "simplenet") ? "the encode side's backward (linear(fc" : "the encode side's backward (linear(";
            CHECK(p->breaks_at == at && strstr(reason(p), words), "%s %s, %s wrong: %s must be blamed on the %s (node %d, \"%s\"), not node %d: %s",
                  probe->name, m, op, p->name, stage, at, words, p->breaks_at, reason(p));
            if (!strcmp(stage, "encode side"))
                CHECK(strstr(reason(p), op), "%s %s: the encode side's ops must include %s: %s", probe->name, m, op, reason(p));
        }
    }
    gcd_run_result_free(&res);
}

int main(int argc, char **argv) {
    gcd_mpi_init(&argc, &argv);
    gcd_comm *comm = gcd_comm_mpi();
    static const struct { const gcd_probe *probe; int encode_op, loss_op; } cases[] = {
        { &gcd_probe_simplenet, GCD_OP_RELU, GCD_OP_MSE },
        { &gcd_probe_contrastive, GCD_OP_NORMALIZE, GCD_OP_CROSS_ENTROPY },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        blame_should_land(comm, cases[c].probe, GCD_GATHER_LOCAL, -1);                  // the gather's backward
        blame_should_land(comm, cases[c].probe, GCD_GATHER_AVG, -1);
        blame_should_land(comm, cases[c].probe, GCD_GATHER_ON, cases[c].encode_op);     // moved to the encode side
        blame_should_land(comm, cases[c].probe, GCD_GATHER_LOCAL, cases[c].encode_op);  // the gather departs first
        blame_should_land(comm, cases[c].probe, GCD_GATHER_LOCAL, cases[c].loss_op);    // moved to the loss side
    }
    double failures = check_failures;
    comm->all_reduce(comm, &failures, 1);
    if (comm->rank == 0) printf("test_blame world %d: %s, %d failure(s)\n", comm->world, failures ? "FAILED" : "passed", (int)failures);
    gcd_mpi_finalize();
    return failures != 0;
}
