// The classifier over synthetic gradients, one table row per case: every status, the edges the
// probes never reach (negative and zero scale, a zero reference, partial, the first non-finite index),
// streamed sums against one pass, and the findings' words (prefix groups, "only 1 of N", forward).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/autograd.h"
#include "diagnose/expect.h"
#include "engine/gather.h"
#include "diagnose/verdict.h"

#define N 6

typedef struct {
    const char *name;
    double g[N];       // the gradient (NAN/INFINITY allowed)
    int none;          // g is None on every rank
    int nhave, world;  // ranks with a gradient
    double r[N];
    int no_ref;        // check without --ref
    double diff_rel;   // check, stage reduced: how far the ranks are apart
    gcd_status want;
    double scale;      // checked when want is scaled or mismatch (NAN: not checked)
    long first_nonfinite;
} row;

static const row rows[] = {
    { "ok", { 1, 2, 3, 4, 5, 6 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_OK, NAN, -1 },
    { "ok within tol", { 1, 2, 3, 4, 5, 6 + 1e-12 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_OK, NAN, -1 },
    // 10 to 25 x tol off: no longer ok (a looser "ok" would hide a real error)
    { "10 x tol too large is scaled", { 1 * (1 + 1e-8), 2 * (1 + 1e-8), 3 * (1 + 1e-8), 4 * (1 + 1e-8), 5 * (1 + 1e-8), 6 * (1 + 1e-8) },
      0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_SCALED, 1 + 1e-8, -1 },
    { "23 x tol off the direction is a mismatch", { 1 + 2e-7, 2 - 1e-7, 3, 4, 5, 6 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_MISMATCH, NAN, -1 },
    { "none", { 0 }, 1, 0, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_NONE, NAN, -1 },
    { "partial", { 1, 2, 3, 4, 5, 6 }, 0, 3, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_PARTIAL, NAN, -1 },
    { "zero", { 0, 0, 0, 0, 0, 0 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_ZERO, NAN, -1 },
    { "zero, tiny values are not zero", { 0, 0, 1e-300, 0, 0, 0 }, 0, 4, 4, { 0, 0, 0, 0, 0, 1 }, 0, 0, GCD_ST_MISMATCH, 0, -1 },
    { "nonfinite NaN", { 1, 2, NAN, 4, INFINITY, 6 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_NONFINITE, NAN, 2 },
    { "nonfinite -inf first", { -INFINITY, 2, 3, 4, 5, 6 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_NONFINITE, NAN, 0 },
    { "scaled 1/4", { .25, .5, .75, 1, 1.25, 1.5 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_SCALED, 0.25, -1 },
    { "scaled 3x", { 3, 6, 9, 12, 15, 18 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_SCALED, 3, -1 },
    { "negative scale is a mismatch", { -7, -14, -21, -28, -35, -42 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_MISMATCH, -7, -1 },
    { "orthogonal (scale 0) is a mismatch", { 2, -1, 0, 0, 0, 0 }, 0, 4, 4, { 1, 2, 0, 0, 0, 0 }, 0, 0, GCD_ST_MISMATCH, 0, -1 },
    { "wrong direction", { 1, 0, 0, 0, 0, 1 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 0, GCD_ST_MISMATCH, NAN, -1 },
    { "zero reference, zero g", { 0, 0, 0, 0, 0, 0 }, 0, 4, 4, { 0, 0, 0, 0, 0, 0 }, 0, 0, GCD_ST_OK, NAN, -1 },
    { "zero reference, non-zero g", { 0, 1, 0, 0, 0, 0 }, 0, 4, 4, { 0, 0, 0, 0, 0, 0 }, 0, 0, GCD_ST_MISMATCH, NAN, -1 },
    { "no reference: present", { 1, 2, 3, 4, 5, 6 }, 0, 4, 4, { 0 }, 1, 0, GCD_ST_PRESENT, NAN, -1 },
    { "no reference: zero", { 0, 0, 0, 0, 0, 0 }, 0, 4, 4, { 0 }, 1, 0, GCD_ST_ZERO, NAN, -1 },
    { "ranks disagree", { 1, 2, 3, 4, 5, 6 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 1e-3, GCD_ST_DISAGREE, NAN, -1 },
    { "ranks agree within tol", { 1, 2, 3, 4, 5, 6 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 1e-12, GCD_ST_OK, NAN, -1 },
    // just past the tolerance: a 100x looser "ranks disagree" would miss it
    { "ranks disagree by 10 x tol", { 1, 2, 3, 4, 5, 6 }, 0, 4, 4, { 1, 2, 3, 4, 5, 6 }, 0, 1e-8, GCD_ST_DISAGREE, NAN, -1 },
};

// ----------------------------------------------------------------------------
// measured noise: the reference r, a second reference b (the same step in another order), per tensor

enum { M = 256 };

typedef struct {
    const char *name;
    double truth, noise;   // the true gradient's scale (0: about zero) and the rounding noise's, per element
    double c, off;         // g = c * truth + off * noise-like term (the ranks' own rounding noise has scale noise)
    int zero;              // g is exactly zero
    double tol;            // the claimed tolerance
    int second;            // with the second reference
    gcd_status want;
} noisy;

static const noisy noisy_rows[] = {
    // a bias before normalize or BatchNorm: the true gradient is about zero, both references and the ranks hold
    // independent rounding noise: ok by the measured noise, a relative error of ~1 notwithstanding
    { "true zero, noise only: ok by the measured noise", 0, 1e-7, 1, 0, 0, 1e-5, 1, GCD_ST_OK },
    // the same with one reference: nothing says it is noise (undecided comes from the verdict, over the model)
    { "true zero, noise only, one reference: mismatch", 0, 1e-7, 1, 0, 0, 1e-5, 0, GCD_ST_MISMATCH },
    // a small real head under bf16: zeroed, negated or halved is signal at any size and any precision
    { "small head zeroed under bf16", 1e-5, 1e-8, 0, 0, 1, 1e-2, 1, GCD_ST_ZERO },
    { "small head zeroed under bf16, one reference", 1e-5, 1e-8, 0, 0, 1, 1e-2, 0, GCD_ST_ZERO },
    { "small head negated under bf16", 1e-5, 1e-8, -1, 0, 0, 1e-2, 1, GCD_ST_MISMATCH },
    { "small head negated under bf16, one reference", 1e-5, 1e-8, -1, 0, 0, 1e-2, 0, GCD_ST_MISMATCH },
    { "small head halved", 1e-5, 1e-8, 0.5, 0, 0, 1e-5, 1, GCD_ST_SCALED },
    // a real gradient at a few times its noise, halved: within 10 x the noise, yet the difference follows
    // the reference: signal, not noise
    { "halved at 6 x its noise: correlated, not noise", 6e-7, 1e-7, 0.5, 0, 0, 1e-5, 1, GCD_ST_SCALED },
    // an error 30 x the measured noise, uncorrelated: beyond k = 10 (a 100x looser k would call it ok)
    { "an error 30 x the noise is a mismatch", 1e-3, 1e-7, 1, 30, 0, 1e-5, 1, GCD_ST_MISMATCH },
    { "an error 3 x the noise is ok", 1e-3, 1e-7, 1, 3, 0, 1e-5, 1, GCD_ST_OK },
    // the reference is itself noise: an exact zero there is no evidence of anything
    { "zero where the reference is only noise", 0, 1e-7, 0, 0, 1, 1e-5, 1, GCD_ST_OK },
};

static void noisy_should_be_judged_per_tensor(void) {
    for (size_t i = 0; i < sizeof noisy_rows / sizeof *noisy_rows; i++) {
        const noisy *c = &noisy_rows[i];
        gcd_rng rng = gcd_rng_make(42, i);
        double t[M], r[M], b[M], g[M];
        for (int j = 0; j < M; j++) {
            t[j] = c->truth * (1 + gcd_rng_normal(&rng));
            r[j] = t[j] + c->noise * gcd_rng_normal(&rng);
            b[j] = t[j] + c->noise * gcd_rng_normal(&rng);
            g[j] = c->zero ? 0 : c->c * t[j] + c->noise * gcd_rng_normal(&rng) + c->off * c->noise * gcd_rng_normal(&rng);
        }
        gcd_param_result p = { .name = c->name, .n = M, .nhave = 4, .tol = c->tol };
        gcd_sums s;
        gcd_sums_init(&s, 1);
        gcd_sums_add(&s, g, r, M, 0);
        if (gcd_sums_need_resid(&s, c->tol)) gcd_sums_resid(&s, g, r, M);
        if (c->second && gcd_sums_need_noise(&s, c->tol)) gcd_sums_noise(&s, g, r, b, M);
        gcd_classify_sums(&p, &s, 4, c->tol);
        CHECK(p.status == c->want, "%s: %s, expected %s (rel err %.3g, noise %.3g, allowed %.3g, corr %.3g, scale %.3g)", c->name,
              gcd_status_str(p.status), gcd_status_str(c->want), p.rel_err, p.noise, p.allowed, p.corr, p.scale);
        if (c->second && c->want == GCD_ST_OK && c->truth == 0 && !c->zero)
            CHECK(p.tol_source == GCD_TOL_MEASURED, "%s: the tolerance must say it was measured", c->name);
    }
}

// dropout: the ranks and the reference draw their own masks (p = 0.1), the second reference partly the
// reference's, so a correct gradient differs from the reference by a term that follows it; recorded (masks), that is the noise the second
// reference measures, not a signal (a clean dropout step called x0.79 was a false alarm); not recorded, the same
// numbers are judged as they were
static void dropout_masks_should_not_read_as_signal(void) {
    enum { D = 4096 };
    double t[D], r[D], b[D], g[D];
    for (int masks = 0; masks <= 1; masks++) {
        gcd_rng rng = gcd_rng_make(7, 0);
        for (int j = 0; j < D; j++) {
            t[j] = 1e-3 * gcd_rng_normal(&rng);
            r[j] = gcd_rng_uniform(&rng) < 0.1 ? 0 : t[j] / 0.9;
            g[j] = gcd_rng_uniform(&rng) < 0.1 ? 0 : t[j] / 0.9;
            // the second reference is re-seeded alike with its rows permuted: where a mask falls on the same
            // sample it is the reference's own (here 80 % of the values), elsewhere another draw
            b[j] = gcd_rng_uniform(&rng) < 0.8 ? r[j] : gcd_rng_uniform(&rng) < 0.1 ? 0 : t[j] / 0.9;
        }
        gcd_param_result p = { .name = "head.weight", .n = D, .nhave = 2, .tol = 1e-5 };
        gcd_sums s;
        gcd_sums_init(&s, 1);
        s.masks = masks;
        gcd_sums_add(&s, g, r, D, 0);
        if (gcd_sums_need_resid(&s, 1e-5)) gcd_sums_resid(&s, g, r, D);
        if (gcd_sums_need_noise(&s, 1e-5)) gcd_sums_noise(&s, g, r, b, D);
        gcd_classify_sums(&p, &s, 2, 1e-5);
        if (masks)
            CHECK(p.status == GCD_ST_OK && p.tol_source == GCD_TOL_MEASURED, "dropout recorded: %s, expected ok by the measured noise "
                  "(rel err %.3g, noise %.3g, corr %.3g)", gcd_status_str(p.status), p.rel_err, p.noise, p.corr);
        else
            CHECK(p.status != GCD_ST_OK, "masks not recorded: %s, expected the correlated difference to count (corr %.3g)",
                  gcd_status_str(p.status), p.corr);
    }
}

// the streamed classifier, one chunk of `chunk` values at a time
static void classify(const row *c, gcd_param_result *p, size_t chunk) {
    memset(p, 0, sizeof *p);
    p->name = c->name;
    p->n = N;
    p->nhave = c->nhave;
    p->diff_rel = c->diff_rel;
    gcd_sums s;
    gcd_sums_init(&s, !c->no_ref);
    for (size_t at = 0; !c->none && at < N; at += chunk) gcd_sums_add(&s, c->g + at, c->no_ref ? NULL : c->r + at, chunk, at);
    if (c->none)
        for (int i = 0; i < N; i++) s.rr += c->r[i] * c->r[i];
    if (gcd_sums_need_resid(&s, GCD_TOL))
        for (size_t at = 0; at < N; at += chunk) gcd_sums_resid(&s, c->g + at, c->r + at, chunk);
    gcd_classify_sums(p, &s, c->world, GCD_TOL);
}

static void every_status_should_come_from_the_numbers(void) {
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const row *c = &rows[i];
        gcd_param_result one, streamed;
        classify(c, &one, N);
        classify(c, &streamed, 2);
        CHECK(one.status == c->want, "%s: %s, expected %s (scale %.6g, rel err %.3g)", c->name, gcd_status_str(one.status),
              gcd_status_str(c->want), one.scale, one.rel_err);
        CHECK(streamed.status == one.status, "%s: streamed in chunks of 2 gives %s, one pass %s", c->name, gcd_status_str(streamed.status),
              gcd_status_str(one.status));
        if (!isnan(c->scale)) CHECK(fabs(one.scale - c->scale) < 1e-12, "%s: scale %.17g, expected %g", c->name, one.scale, c->scale);
        if (c->want == GCD_ST_NONFINITE)
            CHECK(one.first_nonfinite == c->first_nonfinite && streamed.first_nonfinite == c->first_nonfinite,
                  "%s: first non-finite at %ld (streamed %ld), expected %ld", c->name, one.first_nonfinite, streamed.first_nonfinite,
                  c->first_nonfinite);
    }
}

// ----------------------------------------------------------------------------
// findings in words

static const char *finding(const gcd_run_result *res, const char *kind) {
    for (int i = 0; i < res->nfinding; i++)
        if (!strcmp(res->finding[i].kind, kind)) return res->finding[i].message;
    return NULL;
}

static void words_should_group_and_count(void) {
    // a CLIP-like model: 13 encoder tensors get None, only logit_scale learns
    static const char *names[] = { "visual.conv.weight", "visual.ln.weight", "visual.ln.bias", "visual.proj", "visual.blocks.0.attn.w",
                                   "visual.blocks.0.attn.b", "text.embed.weight", "text.ln.weight", "text.ln.bias", "text.proj",
                                   "text.blocks.0.mlp.w", "text.blocks.0.mlp.b", "text.pos", "logit_scale" };
    enum { P = sizeof names / sizeof names[0] };
    gcd_param_result params[P];
    memset(params, 0, sizeof params);
    static double g[1] = { 1 }, r[1] = { 1 };
    static unsigned char has[4] = { 1, 1, 1, 1 };
    for (int i = 0; i < P; i++) {
        params[i] = (gcd_param_result){ .name = names[i], .n = 1, .has = has, .nhave = i == P - 1 ? 4 : 0, .reduced = i == P - 1 ? g : NULL,
                                        .reference = r };
    }
    gcd_run_result res = { .probe = "check", .world = 4, .nparam = P, .param = params, .tol = GCD_TOL };
    gcd_verdict(&res);
    const char *m = finding(&res, "none");
    CHECK(m && strstr(m, "only 1 of 14 parameters receives a gradient: logit_scale"), "none finding: %s", m ? m : "(none)");
    CHECK(m && strstr(m, "visual.* and text.* get None"), "the towers must be grouped by prefix: %s", m ? m : "(none)");
    CHECK(gcd_run_has_finding(&res), "a None parameter is a finding");
    for (int i = 0; i < res.nfinding; i++) free(res.finding[i].params), free(res.finding[i].message);
    free(res.finding);

    // the forward: the ranks' mean loss must be the reference objective
    double loss[2] = { 1.0, 2.0 };
    params[0] = (gcd_param_result){ .name = "w", .n = 1, .has = has, .nhave = 2, .reduced = g, .reference = r };
    gcd_run_result fwd = { .probe = "simplenet", .world = 2, .nparam = 1, .param = params, .tol = GCD_TOL, .loss = loss, .nloss = 1,
                           .ref_loss = 1.5 + 1e-6 };
    gcd_verdict(&fwd);
    CHECK(finding(&fwd, "forward") != NULL, "a mean loss 1.5 against a reference 1.500001 must be a forward finding");
    fwd.ref_loss = 1.5;
    gcd_verdict(&fwd);
    CHECK(finding(&fwd, "forward") == NULL, "an exact forward must not be a finding");
    for (int i = 0; i < fwd.nfinding; i++) free(fwd.finding[i].params), free(fwd.finding[i].message);
    free(fwd.finding);
}

// the verdict over the model: a scale's words, the undecided tensors of one reference
static void scale_words_should_say_only_what_holds(void) {
    static const struct { double c; int world; const char *want, *not; } cases[] = {
        { 0.25, 4, "x0.25 (= 1/world)", NULL },
        { 0.5, 4, "x0.5", "1/world" },   // a downscale that is not 1/world is not called so
        { 0.75, 4, "x0.75", "1/world" },
        { 65536, 2, "x65536: a power of two", "accumulation" },
        { 2, 4, "x2: an integer factor, as a loss not divided by the gradient accumulation steps", "1/world" },
        { 4, 4, "x4 (= world)", NULL },
    };
    static double r[8] = { 1, -2, 3, 4, -5, 6, 7, 8 }, g[8];
    static unsigned char has[4] = { 1, 1, 1, 1 };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        for (int j = 0; j < 8; j++) g[j] = cases[i].c * r[j];
        gcd_param_result p = { .name = "enc.weight", .n = 8, .has = has, .nhave = cases[i].world, .reduced = g, .reference = r };
        gcd_run_result res = { .probe = "check", .world = cases[i].world, .nparam = 1, .param = &p, .tol = 1e-5 };
        gcd_verdict(&res);
        const char *m = finding(&res, "scaled");
        CHECK(m && strstr(m, cases[i].want) && (!cases[i].not || !strstr(m, cases[i].not)), "x%g at world %d: %s", cases[i].c, cases[i].world,
              m ? m : "(no scaled finding)");
        for (int k = 0; k < res.nfinding; k++) free(res.finding[k].params), free(res.finding[k].message);
        free(res.finding);
    }
}

// one reference: a tensor at rounding noise's size, uncorrelated with its reference, beside real gradients,
// is undecided (a finding: a pass must be a proof); zeroed or negated, it is a zero or a mismatch
static void one_reference_should_leave_noise_undecided(void) {
    enum { P = 64 };
    static double big[P], bigr[P], tiny[P], tinyr[P];
    static unsigned char has[2] = { 1, 1 };
    gcd_rng rng = gcd_rng_make(7, 0);
    for (int j = 0; j < P; j++) big[j] = bigr[j] = gcd_rng_normal(&rng), tinyr[j] = 1e-9 * gcd_rng_normal(&rng), tiny[j] = 1e-9 * gcd_rng_normal(&rng);
    static const struct { double c; gcd_status want; const char *kind; } cases[] = {
        { 1, GCD_ST_UNDECIDED, "undecided" }, { 0, GCD_ST_ZERO, "zero" }, { -1, GCD_ST_MISMATCH, "mismatch" } };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double g[P];
        for (int j = 0; j < P; j++) g[j] = cases[i].c == 1 ? tiny[j] : cases[i].c * tinyr[j];
        gcd_param_result p[2] = { { .name = "w", .n = P, .has = has, .nhave = 2, .reduced = big, .reference = bigr },
                                  { .name = "proj.bias", .n = P, .has = has, .nhave = 2, .reduced = g, .reference = tinyr } };
        gcd_run_result res = { .probe = "check", .world = 2, .nparam = 2, .param = p, .tol = 1e-5, .nref = 1 };
        gcd_verdict(&res);
        const char *m = finding(&res, cases[i].kind);
        CHECK(p[1].status == cases[i].want && m, "proj.bias x%g: %s, expected %s, finding %s", cases[i].c, gcd_status_str(p[1].status),
              gcd_status_str(cases[i].want), m ? m : "(none)");
        if (cases[i].want == GCD_ST_UNDECIDED) CHECK(m && strstr(m, "second reference"), "undecided must name the fix: %s", m ? m : "(none)");
        CHECK(gcd_run_has_finding(&res), "proj.bias x%g: exit 0 is no proof", cases[i].c);
        for (int k = 0; k < res.nfinding; k++) free(res.finding[k].params), free(res.finding[k].message);
        free(res.finding);
    }
}

// a partial finding at world 64 names every rank without a gradient
static void partial_should_name_every_rank(void) {
    static unsigned char has[64];
    static double g[1] = { 1 }, r[1] = { 1 };
    for (int k = 0; k < 64; k++) has[k] = k != 3 && k != 17 && k != 58;
    gcd_param_result p = { .name = "head.weight", .n = 1, .has = has, .nhave = 61, .reduced = g, .reference = r };
    gcd_run_result res = { .probe = "check", .world = 64, .nparam = 1, .param = &p, .tol = GCD_TOL };
    gcd_verdict(&res);
    const char *m = finding(&res, "partial");
    CHECK(m && strstr(m, "on 61 of 64 ranks; None on ranks 3, 17 and 58"), "partial: %s", m ? m : "(none)");
    for (int i = 0; i < res.nfinding; i++) free(res.finding[i].params), free(res.finding[i].message);
    free(res.finding);
}

// a tensor with no elements, shape (0, 3): nothing can be wrong with it
static void empty_tensor_should_be_fine(void) {
    gcd_param_result p = { .name = "empty", .n = 0, .nhave = 4 };
    gcd_sums s;
    gcd_sums_init(&s, 1);
    gcd_classify_sums(&p, &s, 4, GCD_TOL);
    CHECK(p.status == GCD_ST_OK, "an empty tensor with a reference: %s, expected ok", gcd_status_str(p.status));
    gcd_sums_init(&s, 0);
    gcd_classify_sums(&p, &s, 4, GCD_TOL);
    CHECK(p.status == GCD_ST_PRESENT, "an empty tensor without a reference: %s, expected present", gcd_status_str(p.status));
}

// a control's signature: "scaled" means exactly 1/world, not roughly
static void signature_should_want_exactly_one_over_world(void) {
    gcd_param_result p[2] = { { .name = "enc.weight", .status = GCD_ST_SCALED }, { .name = "head.weight", .status = GCD_ST_OK, .scale = 1 } };
    gcd_run_result res = { .probe = "synthetic", .mode = GCD_GATHER_LOCAL, .world = 4, .nparam = 2, .param = p };
    static const struct { double scale; int met; } cases[] = { { 0.25, 1 }, { 0.25 * (1 + 1e-9), 1 }, { 0.2501, 0 }, { 1.0 / 3, 0 }, { 0.3, 0 }, { 0.5, 0 } };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        p[0].scale = cases[i].scale;
        gcd_sb why = { 0 };
        int met = gcd_signature_met(&res, 1u, &why);
        CHECK(met == cases[i].met, "world 4, mode local, scale %.17g: signature %s, expected %s (%s)", cases[i].scale, met ? "met" : "not met",
              cases[i].met ? "met" : "not met", why.s ? why.s : "");
        gcd_sb_free(&why);
    }
}

// every enum value has its name (the tables use designated initializers; a hole reads "?")
static void every_enum_should_have_a_name(void) {
    for (int s = 0; s < GCD_ST_COUNT; s++) CHECK(strcmp(gcd_status_str(s), "?"), "status %d has no name", s);
    for (int op = 0; op < GCD_OP_COUNT; op++) CHECK(strcmp(gcd_op_name(op), "?"), "op %d has no name", op);
    for (int m = 0; m < GCD_GATHER_COUNT; m++) {
        CHECK(strcmp(gcd_gather_mode_name(m), "?") && gcd_gather_mode_parse(gcd_gather_mode_name(m)) == m, "gather mode %d has no name", m);
        CHECK(strcmp(gcd_gather_mode_library(m, 0), "?") && strcmp(gcd_gather_mode_library(m, 1), "?"), "gather mode %d names no library", m);
    }
}

int main(void) {
    every_enum_should_have_a_name();
    signature_should_want_exactly_one_over_world();
    empty_tensor_should_be_fine();
    every_status_should_come_from_the_numbers();
    noisy_should_be_judged_per_tensor();
    dropout_masks_should_not_read_as_signal();
    scale_words_should_say_only_what_holds();
    one_reference_should_leave_noise_undecided();
    words_should_group_and_count();
    partial_should_name_every_rank();
    printf("test_verdict: %s, %d failure(s)\n", check_failures ? "FAILED" : "passed", check_failures);
    return check_failures != 0;
}
