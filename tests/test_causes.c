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

// Four tensors before a gather at 0.7 of their reference plus a part of their own (cosine ~0.99), and
// optionally logit_scale after it, exact. What names the own-slot gather and what must not.
enum { M = 16, P = 5 };
typedef struct {
    const char *what;
    double c;             // each wrong tensor's part of its reference
    int losses;           // 0: none recorded; 1: equal; 2: the forward differs
    int after;            // logit_scale recorded, exact
    int dropout, zero;    // the dumps record dropout; one more tensor is exactly zero
    int want;             // named like local
} own_case;

static void own_slot_should_need_its_signature(void) {
    static const own_case cases[] = {
        { "losses equal", 0.7, 1, 0, 0, 0, 1 },
        { "logit_scale exact, no losses", 0.7, 0, 1, 0, 0, 0 },   // no proof alone: a module some ranks never used
        { "both", 0.7, 1, 1, 0, 0, 1 },
        { "the forward differs (a rank's temperature)", 0.7, 2, 1, 0, 0, 0 },
        { "no evidence the forward is right", 0.7, 0, 0, 0, 0, 0 },
        { "more than the reference (a rank colder)", 1.3, 1, 1, 0, 0, 0 },
        { "less than 1/world", 0.3, 1, 1, 0, 0, 0 },
        { "dropout recorded", 0.7, 1, 1, 1, 0, 0 },
        { "another finding beside", 0.7, 1, 1, 0, 1, 0 },
    };
    static const char *names[P] = { "backbone.weight", "backbone.bias", "head.weight", "head.bias", "logit_scale" };
    static double r[P][M], g[P][M], z[M];
    static unsigned char has[2] = { 1, 1 };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const own_case *c = &cases[i];
        gcd_param_result p[P + 1];
        memset(p, 0, sizeof p);
        for (int t = 0; t < P; t++) {
            for (int e = 0; e < M; e++) {
                r[t][e] = sin(1.0 + t * M + e);
                g[t][e] = t == P - 1 ? r[t][e] : c->c * r[t][e] + 0.08 * cos(3.0 * e + t);   // logit_scale: exact
            }
            p[t] = (gcd_param_result){ .name = names[t], .n = t == P - 1 ? 1 : M, .has = has, .nhave = 2, .reduced = g[t], .reference = r[t] };
        }
        int np = c->after ? P : P - 1;
        if (c->zero) p[np++] = (gcd_param_result){ .name = "aux", .n = M, .has = has, .nhave = 2, .reduced = z, .reference = r[0] };
        gcd_run_result res = { .probe = "check", .world = 2, .nparam = np, .param = p, .tol = 1e-5, .nref = 1,
                               .loss_known = c->losses != 0, .loss_mean = c->losses == 2 ? 2.5 : 2.0, .loss_ref = 2.0,
                               .nondeterministic = c->dropout ? "drop (Dropout p=0.1)" : NULL };
        gcd_verdict(&res);
        char all[8192];
        const char *m = finding(&res, "own_slot");
        int named = strstr(all_words(&res, all, sizeof all), "like a gather whose backward keeps only this rank's slot") != NULL;
        CHECK(named == c->want, "%s: named like local %d, want %d: %s", c->what, named, c->want, all);
        if (c->want) {
            int counting = 0;
            for (int k = 0; k < res.nfinding; k++) counting += res.finding[k].counts;
            CHECK(counting == 1 && m && strstr(m, "torch.distributed.nn.functional.all_gather"), "%s: one finding with the fix: %s", c->what, all);
            CHECK(!strcmp(res.finding[0].params, "backbone.weight,backbone.bias,head.weight,head.bias"), "%s: its tensors: %s", c->what,
                  res.finding[0].params);
        }
        free_findings(&res);
    }
}

int main(void) {
    none_should_say_buffer_or_cut();
    own_slot_should_need_its_signature();
    printf("test_causes: %s, %d failure(s)\n", check_failures ? "FAILED" : "passed", check_failures);
    return check_failures != 0;
}
