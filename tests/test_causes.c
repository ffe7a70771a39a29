// The causes the verdict names from the numbers of a check (issue 38, D2): None on every rank told apart
// as a wrapper's own buffer (gradcheck.held, filled) or a cut graph; the gradients a gather's backward
// that keeps only the rank's own slot leaves (run's mode local), grouped as one finding, and the
// look-alikes not named so.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "diagnose/verdict.h"

static const char *finding(const gcd_run_result *res, const char *kind) {
    for (int i = 0; i < res->nfinding; i++)
        if (!strcmp(res->finding[i].kind, kind)) return res->finding[i].message;
    return NULL;
}

static const char *all_words(const gcd_run_result *res, char *buf, size_t len) {
    buf[0] = 0;
    for (int i = 0; i < res->nfinding; i++) strncat(buf, res->finding[i].message, len - strlen(buf) - 1);
    return buf;
}

static void free_findings(gcd_run_result *res) {
    for (int i = 0; i < res->nfinding; i++) free(res->finding[i].params), free(res->finding[i].message);
    free(res->finding);
    res->finding = NULL, res->nfinding = res->cap_finding = 0;
}

// trunk.* None on both ranks; head.* with a gradient. held: trunk's main_grad recorded with this norm
// (NAN: no buffer recorded)
static void none_should_say_buffer_or_cut(void) {
    static const struct { double norm; const char *kind, *want, *not; } cases[] = {
        { 0.25, "held", "in the wrapper's own buffer (main_grad), never copied to .grad", "cut the graph (" },
        { 0, "none", "recorded and zero on every rank", "never copied" },   // the buffer is there, empty: a cut
        { NAN, "none", "cut the graph", "main_grad" },
    };
    static double g[2] = { 1, 2 }, r[2] = { 1, 2 };
    static unsigned char has[2] = { 1, 1 };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        gcd_param_result p[3] = {
            { .name = "trunk.weight", .n = 2, .reference = r }, { .name = "trunk.bias", .n = 2, .reference = r },
            { .name = "head.weight", .n = 2, .has = has, .nhave = 2, .reduced = g, .reference = r } };
        for (int k = 0; k < 2 && !isnan(cases[i].norm); k++)
            p[k].held_attr = "main_grad", p[k].held_norm = cases[i].norm, p[k].held_filled = cases[i].norm > 0 ? 2 : 0;
        gcd_run_result res = { .probe = "check", .world = 2, .nparam = 3, .param = p, .tol = 1e-5, .nref = 1 };
        gcd_verdict(&res);
        char all[4096];
        const char *m = res.nfinding ? res.finding[0].message : NULL;
        CHECK(m && !strcmp(res.finding[0].kind, cases[i].kind) && strstr(m, cases[i].want), "main_grad norm %g: the first finding %s: %s",
              cases[i].norm, res.nfinding ? res.finding[0].kind : "-", m ? m : "(none)");
        CHECK(!strstr(all_words(&res, all, sizeof all), cases[i].not), "main_grad norm %g must not say '%s': %s", cases[i].norm, cases[i].not, all);
        CHECK(gcd_run_has_finding(&res), "main_grad norm %g: None in .grad is a finding", cases[i].norm);
        free_findings(&res);
    }
}

int main(void) {
    none_should_say_buffer_or_cut();
    printf("test_causes: %s, %d failure(s)\n", check_failures ? "FAILED" : "passed", check_failures);
    return check_failures != 0;
}
