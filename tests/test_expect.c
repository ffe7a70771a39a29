// A control passes only when the numbers show exactly its signature. This binary is linked with a
// gather whose avg backward returns -7 times the right gradient (GCD_TEST_WRONG_AVG): the avg
// control must fail, saying what it expected and what it saw, while every other mode still passes. A probe
// that gathers nothing (tp: its modes reduce the norm's gradient in the probe) keeps every signature.
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "comm/comm.h"
#include "diagnose/expect.h"
#include "diagnose/verdict.h"

int main(int argc, char **argv) {
    gcd_mpi_init(&argc, &argv);
    gcd_comm *comm = gcd_comm_mpi();
    for (int pi = 0; gcd_probes[pi]; pi++)
        for (int mode = 0; mode < GCD_GATHER_COUNT; mode++) {
            gcd_run_opts o = { .probe = gcd_probes[pi], .mode = mode, .lr = 0.1,
                               .cfg = { .seed = 7, .batch = 3, .dim_img = 5, .dim_txt = 4, .dim_emb = 3 } };
            gcd_run_result res;
            gcd_run(comm, &o, &res);
            if (comm->rank == 0) {
                gcd_sb why = { 0 };
                int met = gcd_signature_met(&res, o.probe->before_gather, &why);
                const char *m = gcd_gather_mode_name(mode), *pr = o.probe->name;
                if (mode == GCD_GATHER_AVG && comm->world > 1 && o.probe->nfeat > 0) {
                    CHECK(!met, "%s: a -7x avg backward passed its control", pr);
                    CHECK(gcd_run_has_finding(&res), "%s: the wrong backward must still be a finding", pr);
                    CHECK(why.s && strstr(why.s, "expected scaled x1/world, saw mismatch (x-"), "%s avg: the message must say expected vs seen: %s", pr,
                          why.s ? why.s : "(none)");
                } else {
                    CHECK(met, "%s mode %s: the right backward must show its signature: %s", pr, m, why.s ? why.s : "");
                }
                gcd_sb_free(&why);
            }
            gcd_run_result_free(&res);
        }
    double failures = check_failures;
    comm->all_reduce(comm, &failures, 1);
    if (comm->rank == 0) printf("test_expect world %d: %s, %d failure(s)\n", comm->world, failures ? "FAILED" : "passed", (int)failures);
    gcd_mpi_finalize();
    return failures != 0;
}
