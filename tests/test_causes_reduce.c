// The causes the verdict names from numbers a dump records (issue 38), on synthetic results: a double
// reduction from the ranks' losses and the batches' own (and the look-alikes it must not name), and the words
// for ranks that disagree after the reduce, from what check/stages.c measured (stage_cause).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "diagnose/verdict.h"

static const char *finding(const gcd_run_result *res, const char *kind) {
    for (int i = 0; i < res->nfinding; i++)
        if (res->finding[i].counts && !strcmp(res->finding[i].kind, kind)) return res->finding[i].message;
    return NULL;
}

static void free_findings(gcd_run_result *res) {
    for (int i = 0; i < res->nfinding; i++) free(res->finding[i].params), free(res->finding[i].message);
    free(res->finding);
    res->finding = NULL, res->nfinding = res->cap_finding = 0;
}

// ----------------------------------------------------------------------------
// x1/world: a double reduction only where every rank's loss is the mean of the batches' own, which differ

static void double_reduction_should_need_every_loss_to_be_the_batches_mean(void) {
    static const struct { const char *what; double rank[2], shard[2]; int named; } cases[] = {
        { "all-reduced: equal, the mean of differing batches'", { 0.673937, 0.673937 }, { 0.801381, 0.546493 }, 1 },
        { "divided by the world: the ranks' losses differ", { 0.4007, 0.2732 }, { 0.801381, 0.546493 }, 0 },
        { "a gathered loss: equal, but not the batches' mean", { 0.0312, 0.0312 }, { 0.0571, 0.0498 }, 0 },
        { "batches that give the same loss: equal losses say nothing", { 0.5, 0.5 }, { 0.5, 0.5 }, 0 },
        { "nearly equal: 1e-4 apart", { 0.673937, 0.674004 }, { 0.801381, 0.546493 }, 0 },
    };
    static double r[8] = { 1, -2, 3, 4, -5, 6, 7, 8 }, g[8];
    static unsigned char has[2] = { 1, 1 };
    for (int j = 0; j < 8; j++) g[j] = 0.5 * r[j];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        gcd_param_result p = { .name = "enc.weight", .n = 8, .has = has, .nhave = 2, .reduced = g, .reference = r };
        gcd_run_result res = { .probe = "check", .world = 2, .nparam = 1, .param = &p, .tol = 1e-5, .rank_loss = cases[i].rank,
                               .shard_loss = cases[i].shard };
        gcd_verdict(&res);
        const char *m = finding(&res, "scaled");
        int named = m && strstr(m, "a double reduction") && strstr(m, "Fix: backward each rank's own loss");
        CHECK(m && strstr(m, "x0.5 (= 1/world)"), "%s: a x0.5 finding: %s", cases[i].what, m ? m : "(none)");
        CHECK(named == cases[i].named, "%s: double reduction %s: %s", cases[i].what, cases[i].named ? "not named" : "named", m ? m : "(none)");
        free_findings(&res);
    }
    // not at another scale, and not without the losses
    static double g2[8];
    for (int j = 0; j < 8; j++) g2[j] = 0.25 * r[j];
    gcd_param_result p = { .name = "enc.weight", .n = 8, .has = has, .nhave = 2, .reduced = g2, .reference = r };
    gcd_run_result res = { .probe = "check", .world = 2, .nparam = 1, .param = &p, .tol = 1e-5, .rank_loss = cases[0].rank,
                           .shard_loss = cases[0].shard };
    gcd_verdict(&res);
    const char *m = finding(&res, "scaled");
    CHECK(m && !strstr(m, "double reduction"), "x0.25 at world 2 is no double reduction: %s", m ? m : "(none)");
    free_findings(&res);
    p = (gcd_param_result){ .name = "enc.weight", .n = 8, .has = has, .nhave = 2, .reduced = g, .reference = r };
    res = (gcd_run_result){ .probe = "check", .world = 2, .nparam = 1, .param = &p, .tol = 1e-5 };
    gcd_verdict(&res);
    m = finding(&res, "scaled");
    CHECK(m && !strstr(m, "double reduction"), "no losses recorded, no double reduction: %s", m ? m : "(none)");
    free_findings(&res);
}

// ----------------------------------------------------------------------------
// ranks that disagree: the words follow stage_cause, and name who holds the reference

static void disagree_words_should_follow_the_stage_cause(void) {
    static const struct { gcd_stage_cause sc; const char *want, *not; } cases[] = {
        { GCD_SC_UNREDUCED, "no all-reduce ran for it", "did not sync" },
        { GCD_SC_LAST_UNSYNCED, "the last backward of the gradient accumulation did not sync", "no all-reduce ran" },
        { GCD_SC_PART, "part the ranks' mean and part its own", "no all-reduce ran" },
        { GCD_SC_OTHER, "a gradient changed after the all-reduce", "did not sync" },
        { GCD_SC_NONE, "a gradient changed after the all-reduce", "did not sync" },
    };
    static unsigned char has[4] = { 1, 1, 1, 1 }, differs[4] = { 0, 0, 1, 0 };
    static double norm[4] = { 1, 1, 1, 1 }, own[4] = { 0.5, 0.5, 0.7, 0.5 }, ref[4] = { 1e-7, 2e-7, 0.5, 1e-7 };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        gcd_param_result p = { .name = "body.weight", .n = 8, .has = has, .nhave = 4, .status = GCD_ST_DISAGREE, .differs = differs,
                               .rank_norm = norm, .diff_rel = 0.5, .max_diff = 0.3, .tol = 1e-5, .allowed = 1e-5, .stage_cause = cases[i].sc,
                               .own_rel = own, .ref_rel = ref, .split_rel = 1e-8 };
        gcd_run_result res = { .probe = "check", .world = 4, .nparam = 1, .param = &p, .tol = 1e-5, .classified = 1 };
        gcd_verdict(&res);
        const char *m = finding(&res, "disagree");
        CHECK(m && strstr(m, cases[i].want) && !strstr(m, cases[i].not), "stage cause %d: %s", (int)cases[i].sc, m ? m : "(none)");
        CHECK(m && strstr(m, "ranks 0, 1 and 3 hold it, the other not"), "stage cause %d: who holds the reference: %s", (int)cases[i].sc,
              m ? m : "(none)");
        CHECK(res.nfinding && !strcmp(res.finding[0].kind, "disagree"), "stage cause %d: the first finding is the cause", (int)cases[i].sc);
        free_findings(&res);
    }
}

int main(void) {
    double_reduction_should_need_every_loss_to_be_the_batches_mean();
    disagree_words_should_follow_the_stage_cause();
    printf("test_causes_reduce: %s, %d failure(s)\n", check_failures ? "FAILED" : "passed", check_failures);
    return check_failures != 0;
}
