// Every probe, every gather mode, seed and random inputs, global and local loss, under mpirun at
// worlds 1-4, all in one launch (tp: the sequence-parallel block, every reduction of its norm). The statuses must be what the issues say the conventions do, the
// "on" mode must equal the single-process reference, and the reference itself must equal central
// differences of the objective it claims to differentiate. Every parameter's path says where its
// gradient breaks, and a test probe whose parameter only even ranks use is partial, "not used" on the rest.
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/ops.h"
#include "report/report.h"
#include "report/report_render.h"
#include "diagnose/run.h"
#include "diagnose/expect.h"
#include "diagnose/verdict.h"

// ----------------------------------------------------------------------------
// the reference objective, rebuilt here without a graph: mean over ranks of each rank's loss

static double objective(const gcd_run_opts *o, int W, gcd_params *P) {
    const gcd_probe *pr = o->probe;
    gcd_arena a = { 0 };
    gcd_ctx c = gcd_ctx_make(&a);
    gcd_set_grad_enabled(&c, 0);
    gcd_tensor *in[GCD_MAX_INPUTS], *feat[16][GCD_MAX_FEATS], *all[GCD_MAX_FEATS], *col[16], *loss[16];
    if (pr->whole) {   // tensor parallel: the block unsplit, on every rank's inputs
        gcd_tensor *every[16 * GCD_MAX_INPUTS];
        for (int k = 0; k < W; k++) pr->inputs(&c, &o->cfg, k, every + k * GCD_MAX_INPUTS);
        double v = pr->whole(&c, P, &o->cfg, W, every)->data[0];
        gcd_arena_free(&a);
        return v;
    }
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

// ----------------------------------------------------------------------------
// where the gradient breaks: the chain the text and the Markdown show, rendered from the JSON report

static cJSON *report_of(const gcd_run_result *res) {
    char *argv[] = { "test_probes" };
    gcd_env env = { .backend = "mpi", .world = res->world, .start_time = "2026-01-01T00:00:00Z" };
    cJSON *doc = gcd_report_new(1, argv, &env);
    gcd_report_add_run(doc, res, "test", 1);
    return doc;
}

static char *chain_of(const gcd_run_result *res, int i) {
    cJSON *doc = report_of(res);
    gcd_sb b = { 0 };
    gcd_chain(&b, cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "runs"), 0), "params"), i));
    cJSON_Delete(doc);
    return b.s ? b.s : gcd_strdup("");
}

static void paths_should_say_where_it_breaks(const gcd_run_result *res) {
    int W = res->world, simplenet = !strcmp(res->probe, "simplenet");
    const char *m = gcd_gather_mode_name(res->mode), *last = simplenet ? "mse_loss" : "mean";
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        const gcd_path *path = &p->path;
        char *chain = chain_of(res, i);
        const gcd_path_node *at = p->breaks_at >= 0 ? &path->node[p->breaks_at] : NULL;
        int enc = is_encoder(res->probe, p->name), gather = gcd_path_find_op(path, GCD_OP_GATHER);
        CHECK(path->n >= 2 && path->node[0].op == GCD_PATH_PARAM && path->node[0].label == i && !strcmp(gcd_path_op(&path->node[path->n - 1]), last),
              "%s mode %s: %s: the path must run from the parameter to the loss (%s): %s", res->probe, m, p->name, last, chain);
        if (p->status == GCD_ST_OK) CHECK(!at && !p->reason, "%s mode %s: %s is ok but breaks at %d: %s", res->probe, m, p->name, p->breaks_at, chain);
        if (p->status == GCD_ST_NONE) {   // off: cut where the gather ran under no_grad
            CHECK(at && at->op == GCD_OP_GATHER && at->cut == GCD_CUT_NO_GRAD && p->breaks_at == gather && p->reason &&
                      !strcmp(p->reason, "under no_grad (Lightning sync_grads=False)"),
                  "%s world %d mode %s: %s must break at the gather under no_grad: %s", res->probe, W, m, p->name, chain);
        }
        if (simplenet && res->mode == GCD_GATHER_OFF && i == 0)
            CHECK(!strcmp(chain, "fc1.weight -> linear(fc1) -> relu -> all_gather[off] ✂ under no_grad (Lightning sync_grads=False) -> view -> mul -> mse_loss"),
                  "simplenet off, world %d: chain %s", W, chain);
        if (!simplenet && !enc) CHECK(!at && gather < 0 && gcd_path_first_cut(path) < 0, "%s mode %s: logit_scale has a path and no break: %s", res->probe, m, chain);
        if (p->status == GCD_ST_SCALED || p->status == GCD_ST_MISMATCH) {
            CHECK(at && at->op == GCD_OP_GATHER && p->breaks_at == gather, "%s world %d mode %s: %s must be blamed on the gather: %s", res->probe, W, m,
                  p->name, chain);
            const char *want = res->mode == GCD_GATHER_OFF ? "no_grad (Lightning sync_grads=False); the loss side already differs: no gradient arrives"
                               : !res->cfg.local_loss      ? "≠ backward: each rank's own rows get one rank's gradient, not the sum over ranks (x0.25 = 1/world)"
                               : res->mode == GCD_GATHER_LOCAL ? "≠ backward: the gradient from the other ranks' slots is dropped (cosine"
                                                               : "≠ backward: the ranks' gradients for each slot are averaged, not summed (x";
            if (W == 4 || res->cfg.local_loss) CHECK(strstr(chain, want), "%s%s world %d mode %s: %s: expected \"%s\" in %s", res->probe,
                                                     res->cfg.local_loss ? " local_loss" : "", W, m, p->name, want, chain);
        }
        free(chain);
    }
}

// A test probe: `aux` enters the loss of the even ranks only; the odd ranks give DDP None for it.
static void some_init(gcd_ctx *c, const gcd_probe_cfg *cfg, gcd_params *p) {
    (void)cfg;
    gcd_param_add(c, p, "enc.weight", 2, (int[]){ 2, 2 }, (double[]){ 0.5, -0.3, 0.2, 0.8 });
    gcd_param_add(c, p, "aux", 0, NULL, (double[]){ 1.5 });
}
static void some_inputs(gcd_ctx *c, const gcd_probe_cfg *cfg, int rank, gcd_tensor **in) {
    gcd_rng r = gcd_rng_make(cfg->seed, 1 + (uint64_t)rank);
    in[0] = gcd_tensor_from(c, 2, (int[]){ 1, 2 }, (double[]){ gcd_rng_normal(&r), gcd_rng_normal(&r) });
}
static void some_encode(gcd_ctx *c, const gcd_params *p, gcd_tensor **in, gcd_tensor **feat) { feat[0] = gcd_linear(c, in[0], p->t[0], NULL); }
static gcd_tensor *some_loss(gcd_ctx *c, const gcd_params *p, const gcd_probe_cfg *cfg, int rank, int world, gcd_tensor **gathered, gcd_tensor **own) {
    (void)cfg, (void)world, (void)own;
    gcd_tensor *l = gcd_mse(c, gathered[0], NULL);
    return rank % 2 ? l : gcd_mean(c, gcd_concat(c, 2, (gcd_tensor *[]){ l, gcd_mul(c, p->t[1], l) }));
}
static int some_per_rank(const gcd_probe_cfg *cfg) { return (void)cfg, 1; }
static const gcd_probe probe_some_ranks = { .name = "some_ranks", .nfeat = 1, .feat_follows_mode = { 1 }, .before_gather = 0x1, .ninput = 1,
                                            .input_name = { "x" }, .init = some_init, .inputs = some_inputs, .encode = some_encode,
                                            .loss = some_loss, .loss_per_rank = some_per_rank };

static void unused_on_some_ranks_should_be_partial(gcd_comm *comm) {
    gcd_run_opts o = { .probe = &probe_some_ranks, .mode = GCD_GATHER_ON, .lr = 0.1, .cfg = { .seed = 3 } };
    gcd_run_result res;
    gcd_run(comm, &o, &res);
    if (comm->rank == 0) {
        int W = comm->world;
        const gcd_param_result *aux = &res.param[1];
        const char *want = W == 1 ? "aux -> mul(aux) -> concat -> mean" : W == 4 ? "aux ✂ not used on ranks 1 and 3 -> mul(aux) -> concat -> mean"
                                                                                 : "aux ✂ not used on rank 1 -> mul(aux) -> concat -> mean";
        char *chain = chain_of(&res, 1);
        CHECK(res.param[0].status == GCD_ST_OK, "enc.weight: %s", gcd_status_str(res.param[0].status));
        CHECK(aux->status == (W == 1 ? GCD_ST_OK : GCD_ST_PARTIAL) && aux->nhave == (W + 1) / 2, "world %d: aux is %s on %d ranks", W,
              gcd_status_str(aux->status), aux->nhave);
        CHECK(!strcmp(chain, want), "world %d: aux's chain %s, expected %s", W, chain, want);
        cJSON *doc = report_of(&res);
        char *text = gcd_render_text(doc), line[256];
        snprintf(line, sizeof line, "\n          path: %s\n", want);
        CHECK(W == 1 || strstr(text, line), "world %d: the text must show the chain under the partial finding:\n%s", W, text);
        free(text), free(chain);
        cJSON_Delete(doc);
    }
    gcd_run_result_free(&res);
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

// ----------------------------------------------------------------------------
// `run` gives every probe and mode one arena for their passes (gcd_run_opts.arena): a run in memory
// that the runs before it used, and left full of NaN, gives the report of a run in fresh memory

static void poison(gcd_arena *a) {
    for (int k = 0; k < 4; k++) memset(gcd_arena_alloc_raw(a, 1 << 20), 0xff, 1 << 20);   // NaN in every double
    gcd_arena_reset(a);
}

static void reused_arena_should_change_nothing(gcd_comm *comm, const gcd_run_opts *o, const gcd_run_result *res, gcd_arena *shared) {
    gcd_run_opts os = *o;
    os.arena = shared;
    poison(shared);
    gcd_run_result again;
    gcd_run(comm, &os, &again);
    if (comm->rank == 0) {
        cJSON *a = report_of(res), *b = report_of(&again);
        char *sa = cJSON_PrintUnformatted(a), *sb = cJSON_PrintUnformatted(b);
        size_t i = 0;
        while (sa[i] && sa[i] == sb[i]) i++;
        CHECK(!strcmp(sa, sb), "%s mode %s: the run in a reused arena differs from the run in its own, at byte %zu: ...%.60s vs ...%.60s",
              o->probe->name, gcd_gather_mode_name(o->mode), i, sa + i, sb + i);
        free(sa), free(sb), cJSON_Delete(a), cJSON_Delete(b);
    }
    gcd_run_result_free(&again);
}

// ----------------------------------------------------------------------------
// tp: the sequence-parallel block split over the ranks. on (the norm's gradient summed over the
// group) equals the unsplit block; off and local leave each rank its own share, named as copies that
// differ; avg is x1/world. Each rank's gradient of a sharded weight lies in its torch.chunk piece.

static void tp_piece_should_be_the_chunk(const gcd_param_result *p, int dim, int W) {
    int rows = p->shape[0], cols = p->ndim == 2 ? p->shape[1] : 1, F = p->shape[dim], per = (F + W - 1) / W;
    for (int k = 0; k < W; k++) {
        const double *g = p->local + (size_t)k * p->n;
        int inside = 0, outside = 0;
        for (int r = 0; r < rows; r++)
            for (int col = 0; col < cols; col++) {
                int at = dim == 0 ? r : col, mine = at >= k * per && at < (k + 1) * per;
                double v = g[(size_t)r * cols + col];
                inside += mine && v != 0, outside += !mine && v != 0;
            }
        CHECK(inside > 0 && outside == 0, "tp world %d: %s rank %d: %d nonzero values inside its piece, %d outside", W, p->name, k, inside, outside);
    }
}

static void tp_should_agree_when_the_norm_is_reduced(gcd_comm *comm, gcd_arena *shared) {
    int W = comm->world;
    for (int mode = 0; mode < GCD_GATHER_COUNT; mode++) {
        gcd_run_opts o = { .probe = &gcd_probe_tp, .mode = mode, .lr = 0.1, .cfg = { .seed = 11, .batch = 3, .dim_img = 5 } };
        gcd_run_result res;
        gcd_run(comm, &o, &res);
        inputs_should_be_rebuildable(comm, &o, &res);
        reused_arena_should_change_nothing(comm, &o, &res, shared);
        if (comm->rank == 0) {
            const char *m = gcd_gather_mode_name(mode);
            int own_share = W > 1 && (mode == GCD_GATHER_OFF || mode == GCD_GATHER_LOCAL), avg = W > 1 && mode == GCD_GATHER_AVG;
            for (int i = 0; i < res.nparam; i++) {
                const gcd_param_result *p = &res.param[i];
                int norm = !strncmp(p->name, "norm.", 5);
                gcd_status want = norm && own_share ? GCD_ST_DISAGREE : norm && avg ? GCD_ST_SCALED : GCD_ST_OK;
                CHECK(p->status == want && p->nhave == W, "tp world %d mode %s: %s is %s on %d ranks, expected %s (rel err %.3g, scale %.6g)", W, m,
                      p->name, gcd_status_str(p->status), p->nhave, gcd_status_str(want), p->rel_err, p->scale);
                if (want == GCD_ST_OK) CHECK(p->rel_err < 1e-12, "tp world %d mode %s: %s rel err %.3g", W, m, p->name, p->rel_err);
                if (norm && (own_share || avg)) CHECK(fabs(p->scale * W - 1) < 1e-9, "tp mode %s: %s's copies average %.17g x the reference, not 1/%d", m, p->name, p->scale, W);
                if (norm && own_share) CHECK(p->diff_rel > 0.1, "tp world %d mode %s: %s's copies differ by only %.3g", W, m, p->name, p->diff_rel);
                if (norm && !own_share) CHECK(p->diff_rel == 0, "tp world %d mode %s: %s's reduced copies differ by %.3g", W, m, p->name, p->diff_rel);
                if (!strcmp(p->name, "fc1.weight") || !strcmp(p->name, "fc1.bias")) tp_piece_should_be_the_chunk(p, 0, W);
                if (!strcmp(p->name, "fc2.weight")) tp_piece_should_be_the_chunk(p, 1, W);
                CHECK(p->path.n >= 2 && !strcmp(gcd_path_op(&p->path.node[p->path.n - 1]), "mse_loss"), "tp mode %s: %s's path does not reach the loss", m, p->name);
            }
            CHECK(gcd_run_has_finding(&res) == (own_share || avg), "tp world %d mode %s: has_finding %d", W, m, gcd_run_has_finding(&res));
            if (own_share) CHECK(has_finding(&res, "disagree", "norm.weight and norm.bias: replicated across the tensor-parallel ranks, but the copies differ"),
                                 "tp world %d mode %s: the finding must name the norm", W, m);
            if (avg) CHECK(has_finding(&res, "scaled", "norm.weight and norm.bias gradients are the reference x"), "tp world %d avg: the finding must name the norm", W);
            gcd_sb why = { 0 };
            CHECK(gcd_signature_met(&res, o.probe->before_gather, &why), "tp mode %s world %d: signature not met: %s", m, W, why.s ? why.s : "");
            gcd_sb_free(&why);
            if (mode == GCD_GATHER_ON) reference_should_match_central_differences(&o, &res);
        }
        gcd_run_result_free(&res);
    }
}

int main(int argc, char **argv) {
    gcd_mpi_init(&argc, &argv);
    gcd_comm *comm = gcd_comm_mpi();
    int nruns = 0;
    gcd_arena shared = { 0 };
    for (int pi = 0; gcd_probes[pi]; pi++)
        for (int variant = 0; variant < 2 && !gcd_probes[pi]->split; variant++)   // simplenet: seed/random inputs; contrastive: global/local loss
            for (int mode = 0; mode < GCD_GATHER_COUNT; mode++) {
                gcd_run_opts o = { .probe = gcd_probes[pi], .mode = mode, .lr = 0.1,
                                   .cfg = { .seed = 7, .batch = 3, .dim_img = 5, .dim_txt = 4, .dim_emb = 3 } };
                if (gcd_probes[pi] == &gcd_probe_simplenet) o.cfg.inputs_random = variant;
                else o.cfg.local_loss = variant;
                gcd_run_result res;
                gcd_run(comm, &o, &res);
                inputs_should_be_rebuildable(comm, &o, &res);
                reused_arena_should_change_nothing(comm, &o, &res, &shared);
                if (comm->rank == 0) {
                    statuses_should_match_convention(&res);
                    gcd_sb why = { 0 };
                    CHECK(gcd_signature_met(&res, o.probe->before_gather, &why), "%s mode %s world %d: signature not met: %s",
                          o.probe->name, gcd_gather_mode_name(mode), comm->world, why.s ? why.s : "");
                    gcd_sb_free(&why);
                    if (mode == GCD_GATHER_ON) reference_should_match_central_differences(&o, &res);
                    paths_should_say_where_it_breaks(&res);
                }
                gcd_run_result_free(&res);
                nruns++;
            }
    tp_should_agree_when_the_norm_is_reduced(comm, &shared);
    nruns += GCD_GATHER_COUNT;
    gcd_arena_free(&shared);
    for (int mode = 0; mode < GCD_GATHER_COUNT; mode++) steps_should_show_learning_stopped(comm, mode);
    unused_on_some_ranks_should_be_partial(comm);
    double failures = check_failures;
    comm->all_reduce(comm, &failures, 1);
    if (comm->rank == 0) printf("test_probes world %d: %d runs + 4 step runs, %s, %d failure(s)\n", comm->world, nruns, failures ? "FAILED" : "passed", (int)failures);
    gcd_mpi_finalize();
    return failures != 0;
}
