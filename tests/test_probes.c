// Both probes, every gather mode, seed and random inputs, global and local loss, under mpirun at
// worlds 1-4, all in one launch. The statuses must be what the issues say the conventions do, the
// "on" mode must equal the single-process reference, and the reference itself must equal central
// differences of the objective it claims to differentiate.
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ops.h"
#include "run.h"
#include "expect.h"
#include "verdict.h"

// ----------------------------------------------------------------------------
// the reference objective, rebuilt here without a graph: mean over ranks of each rank's loss

static double objective(const gcd_run_opts *o, int W, gcd_params *P) {
    const gcd_probe *pr = o->probe;
    gcd_arena a = { 0 };
    gcd_ctx c = gcd_ctx_make(&a);
    gcd_set_grad_enabled(&c, 0);
    gcd_tensor *in[GCD_MAX_INPUTS], *feat[16][GCD_MAX_FEATS], *all[GCD_MAX_FEATS], *col[16], *loss[16];
    for (int k = 0; k < W; k++) pr->inputs(&c, &o->cfg, k, in), pr->encode(&c, P, in, feat[k]);
    for (int f = 0; f < pr->nfeat; f++) {
        for (int k = 0; k < W; k++) col[k] = feat[k][f];
        all[f] = gcd_concat(&c, W, col);
    }
    for (int k = 0; k < W; k++) loss[k] = pr->loss(&c, P, &o->cfg, k, W, all, feat[k]);
    double v = gcd_mean(&c, gcd_concat(&c, W, loss))->data[0];
    gcd_arena_free(&a);
    return v;
}

static void reference_should_match_central_differences(const gcd_run_opts *o, const gcd_run_result *res) {
    gcd_arena a = { 0 };
    gcd_ctx c = gcd_ctx_make(&a);
    gcd_params P = { 0 };
    o->probe->init(&c, &o->cfg, &P);
    CHECK(fabs(objective(o, res->world, &P) - res->ref_loss) <= 1e-12 * fabs(res->ref_loss), "%s: reference objective %.17g != %.17g",
          res->probe, objective(o, res->world, &P), res->ref_loss);
    double worst = 0, eps = 1e-6;
    for (int i = 0; i < P.n; i++)
        for (size_t k = 0; k < P.t[i]->n; k++) {
            double x0 = P.t[i]->data[k];
            CHECK(x0 == res->param[i].init[k], "%s: init differs", P.name[i]);
            P.t[i]->data[k] = x0 + eps;
            double fp = objective(o, res->world, &P);
            P.t[i]->data[k] = x0 - eps;
            double fm = objective(o, res->world, &P);
            P.t[i]->data[k] = x0;
            double num = (fp - fm) / (2 * eps), ref = res->param[i].reference[k];
            worst = fmax(worst, fabs(num - ref));
            CHECK(close_to(num, ref, 1e-6), "%s %s[%zu]: reference %.12g, central difference %.12g", res->probe, P.name[i], k, ref, num);
        }
    gcd_arena_free(&a);
}

// ----------------------------------------------------------------------------
// what each convention must show

static int is_encoder(const char *probe, const char *name) {
    return !strcmp(probe, "simplenet") ? !strncmp(name, "fc1.", 4) : strcmp(name, "logit_scale") != 0;
}

static int has_finding(const gcd_run_result *res, const char *kind, const char *text) {
    for (int i = 0; i < res->nfinding; i++)
        if (!strcmp(res->finding[i].kind, kind) && (!text || strstr(res->finding[i].message, text))) return 1;
    return 0;
}

static void statuses_should_match_convention(const gcd_run_result *res) {
    int W = res->world;
    const char *m = gcd_gather_mode_name(res->mode);
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        int enc = is_encoder(res->probe, p->name);
        gcd_status want = GCD_ST_OK;   // world 1 is a one-rank process group: off still detaches, the rest are exact
        if (enc && res->mode != GCD_GATHER_ON && (W > 1 || res->mode == GCD_GATHER_OFF)) {
            if (res->cfg.local_loss) want = GCD_ST_MISMATCH;
            else if (res->mode == GCD_GATHER_OFF) want = GCD_ST_NONE;
            else want = GCD_ST_SCALED;
        }
        CHECK(p->status == want, "%s%s world %d mode %s: %s is %s, expected %s (rel err %.3g, scale %.6g)", res->probe,
              res->cfg.local_loss ? " local_loss" : "", W, m, p->name, gcd_status_str(p->status), gcd_status_str(want), p->rel_err, p->scale);
        if (want == GCD_ST_OK) CHECK(p->rel_err < 1e-12, "%s mode %s: %s rel err %.3g", res->probe, m, p->name, p->rel_err);
        if (want == GCD_ST_SCALED) CHECK(fabs(p->scale * W - 1) < 1e-9, "%s mode %s: %s scale %.17g, expected 1/%d", res->probe, m, p->name, p->scale, W);
        if (want == GCD_ST_NONE) CHECK(p->nhave == 0 && !p->reduced, "%s: %s none but %d ranks had a gradient", res->probe, p->name, p->nhave);
        if (want != GCD_ST_NONE) CHECK(p->nhave == W, "%s: %s has a gradient on %d of %d ranks", res->probe, p->name, p->nhave, W);
    }
    int found = res->mode != GCD_GATHER_ON && (W > 1 || res->mode == GCD_GATHER_OFF);
    CHECK(gcd_run_has_finding(res) == found, "%s world %d mode %s: has_finding %d", res->probe, W, m, gcd_run_has_finding(res));
    if (W == 1) CHECK(has_finding(res, "note", "world 1: a one-rank process group still detaches"), "world 1 must say what a one-rank group does");
    if (!strcmp(res->probe, "contrastive") && !res->cfg.local_loss && res->mode == GCD_GATHER_OFF)
        CHECK(has_finding(res, "none", "only 1 of 5 parameters receives a gradient: logit_scale"), "contrastive off: the words must name logit_scale");
    if (W > 1 && !res->cfg.local_loss && (res->mode == GCD_GATHER_LOCAL || res->mode == GCD_GATHER_AVG))
        CHECK(has_finding(res, "scaled", "(= 1/world)"), "%s mode %s: the words must say 1/world", res->probe, m);
}

// every rank used the inputs rank 0 recorded for the report's replay setup
static void inputs_should_be_rebuildable(gcd_comm *comm, const gcd_run_opts *o, const gcd_run_result *res) {
    gcd_arena a = { 0 };
    gcd_ctx c = gcd_ctx_make(&a);
    gcd_tensor *in[GCD_MAX_INPUTS];
    o->probe->inputs(&c, &o->cfg, comm->rank, in);
    for (int j = 0; j < o->probe->ninput; j++) {
        double *all = malloc((size_t)comm->world * in[j]->n * sizeof(double));
        comm->all_gather(comm, in[j]->data, all, in[j]->n);
        if (comm->rank == 0) {
            CHECK(!memcmp(all, res->inputs[j], (size_t)comm->world * in[j]->n * sizeof(double)), "%s: %s recorded != used", res->probe, o->probe->input_name[j]);
            if (comm->world > 1 && (o->cfg.inputs_random || o->probe == &gcd_probe_contrastive))
                CHECK(memcmp(all, all + in[j]->n, in[j]->n * sizeof(double)), "%s: ranks 0 and 1 drew the same inputs", res->probe);
        }
        free(all);
    }
    gcd_arena_free(&a);
}

// ----------------------------------------------------------------------------
// --steps: with sync_grads off the loss moves while the encoders never do

static void steps_should_show_learning_stopped(gcd_comm *comm, int mode) {
    gcd_run_opts o = { .probe = &gcd_probe_contrastive, .cfg = { .seed = 42, .batch = 4, .dim_img = 8, .dim_txt = 6, .dim_emb = 4 },
                       .mode = mode, .steps = 20, .lr = 0.1 };
    gcd_run_result res;
    gcd_run(comm, &o, &res);
    int W = comm->world, stuck_expected = mode == GCD_GATHER_OFF;
    for (int i = 0; i < res.nparam; i++) {
        const gcd_param_result *p = &res.param[i];
        int enc = is_encoder("contrastive", p->name);
        CHECK(p->moved_any == !(enc && stuck_expected), "world %d mode %s: %s moved_any %d (moved %.3g)", W, gcd_gather_mode_name(mode),
              p->name, p->moved_any, p->moved);
        double all[64];
        comm->all_gather(comm, &p->moved, all, 1);   // DDP keeps the replicas bit-identical
        for (int k = 1; k < W; k++) CHECK(all[k] == all[0], "%s: rank %d moved %.17g, rank 0 %.17g", p->name, k, all[k], all[0]);
    }
    if (comm->rank == 0) {
        double l0 = 0, l1 = 0;
        for (int k = 0; k < W; k++) l0 += res.loss[k], l1 += res.loss[(size_t)(res.nloss - 1) * W + k];
        CHECK(l0 != l1, "mode %s: the loss never changed over 20 steps", gcd_gather_mode_name(mode));
        CHECK(has_finding(&res, "learning_stopped", NULL) == stuck_expected, "world %d mode %s: learning_stopped finding %d", W,
              gcd_gather_mode_name(mode), has_finding(&res, "learning_stopped", NULL));
    }
    gcd_run_result_free(&res);
}

int main(int argc, char **argv) {
    gcd_mpi_init(&argc, &argv);
    gcd_comm *comm = gcd_comm_mpi();
    int nruns = 0;
    for (int pi = 0; gcd_probes[pi]; pi++)
        for (int variant = 0; variant < 2; variant++)   // simplenet: seed/random inputs; contrastive: global/local loss
            for (int mode = 0; mode < GCD_GATHER_COUNT; mode++) {
                gcd_run_opts o = { .probe = gcd_probes[pi], .mode = mode, .lr = 0.1,
                                   .cfg = { .seed = 7, .batch = 3, .dim_img = 5, .dim_txt = 4, .dim_emb = 3 } };
                if (gcd_probes[pi] == &gcd_probe_simplenet) o.cfg.inputs_random = variant;
                else o.cfg.local_loss = variant;
                gcd_run_result res;
                gcd_run(comm, &o, &res);
                inputs_should_be_rebuildable(comm, &o, &res);
                if (comm->rank == 0) {
                    statuses_should_match_convention(&res);
                    gcd_sb why = { 0 };
                    CHECK(gcd_signature_met(&res, o.probe->before_gather, &why), "%s mode %s world %d: signature not met: %s",
                          o.probe->name, gcd_gather_mode_name(mode), comm->world, why.s ? why.s : "");
                    gcd_sb_free(&why);
                    if (mode == GCD_GATHER_ON) reference_should_match_central_differences(&o, &res);
                }
                gcd_run_result_free(&res);
                nruns++;
            }
    for (int mode = 0; mode < GCD_GATHER_COUNT; mode++) steps_should_show_learning_stopped(comm, mode);
    double failures = check_failures;
    comm->all_reduce(comm, &failures, 1);
    if (comm->rank == 0) printf("test_probes world %d: %d runs + 4 step runs, %s, %d failure(s)\n", comm->world, nruns, failures ? "FAILED" : "passed", (int)failures);
    gcd_mpi_finalize();
    return failures != 0;
}
