/*
 * simplenet: the two-layer comparison from the Lightning report. x = relu(fc1(input1)) is gathered
 * with the run's mode, y = relu(fc2(input2)) always with grad; loss = mean((x_ * y_)^2), MSE against
 * a zero target. With sync_grads=False fc1 gets no gradient at all, fc2 still does.
 */
#include "engine/ops.h"
#include "probes/probe.h"

// torch.manual_seed(42); nn.Linear(2, 2) twice: weights (out, in)
static const double fc1_w[] = { 0.5406103730201721, 0.5869042277336121, -0.16565565764904022, 0.6495562791824341 };
static const double fc1_b[] = { -0.15492962300777435, 0.14268755912780762 };
static const double fc2_w[] = { -0.34425848722457886, 0.4152715504169464, 0.6233449578285217, -0.5187534093856812 };
static const double fc2_b[] = { 0.6146144866943359, 0.13234160840511322 };

static void init(gcd_ctx *c, const gcd_probe_cfg *cfg, gcd_params *p) {
    (void)cfg;
    gcd_param_add(c, p, "fc1.weight", 2, (int[]){ 2, 2 }, fc1_w);
    gcd_param_add(c, p, "fc1.bias", 1, (int[]){ 2 }, fc1_b);
    gcd_param_add(c, p, "fc2.weight", 2, (int[]){ 2, 2 }, fc2_w);
    gcd_param_add(c, p, "fc2.bias", 1, (int[]){ 2 }, fc2_b);
}

static void inputs(gcd_ctx *c, const gcd_probe_cfg *cfg, int rank, gcd_tensor **in) {
    double v[4] = { 1, 2, 3, 2 };   // the seed's input1 = [[1, 2]], input2 = [[3, 2]] on every rank
    if (cfg->inputs_random) {
        gcd_rng r = gcd_rng_make(cfg->seed, 1 + (uint64_t)rank);
        for (int i = 0; i < 4; i++) v[i] = gcd_rng_normal(&r);
    }
    in[0] = gcd_tensor_from(c, 2, (int[]){ 1, 2 }, v);
    in[1] = gcd_tensor_from(c, 2, (int[]){ 1, 2 }, v + 2);
}

static void encode(gcd_ctx *c, const gcd_params *p, gcd_tensor **in, gcd_tensor **feat) {
    feat[0] = gcd_relu(c, gcd_linear(c, in[0], p->t[0], p->t[1]));   // x
    feat[1] = gcd_relu(c, gcd_linear(c, in[1], p->t[2], p->t[3]));   // y
}

static gcd_tensor *loss(gcd_ctx *c, const gcd_params *p, const gcd_probe_cfg *cfg, int rank, int world,
                        gcd_tensor **gathered, gcd_tensor **own) {
    (void)p, (void)cfg, (void)rank, (void)world, (void)own;
    gcd_tensor *x_ = gcd_view(c, gathered[0], 1, (int[]){ -1 });
    gcd_tensor *y_ = gcd_view(c, gathered[1], 1, (int[]){ -1 });
    return gcd_mse(c, gcd_mul(c, x_, y_), NULL);
}

const gcd_probe gcd_probe_simplenet = {
    .name = "simplenet",
    .nfeat = 2,
    .feat_follows_mode = { 1, 0 },
    .before_gather = 0x3,   // fc1.weight, fc1.bias
    .ninput = 2,
    .input_name = { "input1", "input2" },
    .init = init,
    .inputs = inputs,
    .encode = encode,
    .loss = loss,
};
