// The autograd all_gather and the DDP mean under mpirun. Every rank rebuilds every other rank's
// tensors from (seed, rank), so each checks the collective's forward and backward locally; the
// mismatches are summed over ranks and any makes every rank exit non-zero.
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/ddp.h"
#include "engine/gather.h"

#define B 3
#define D 2

static void fill(double *v, size_t n, uint64_t seed, int rank) {
    gcd_rng r = gcd_rng_make(seed, 100 + (uint64_t)rank);
    for (size_t i = 0; i < n; i++) v[i] = gcd_rng_normal(&r);
}

// grad_on: which ranks give the gathered result a gradient (bit k: rank k)
static void gather_mode_should_route_gradients(gcd_comm *comm, int mode, unsigned grad_on) {
    int W = comm->world, R = comm->rank;
    gcd_arena a = { 0 };
    gcd_ctx c = gcd_ctx_make(&a);
    gcd_tensor *x = gcd_tensor_new(&c, 2, (int[]){ B, D });
    x->requires_grad = 1;
    fill(x->data, x->n, 1, R);
    gcd_tensor *y = gcd_all_gather(&c, comm, x, mode);
    const char *m = gcd_gather_mode_name(mode);

    // forward: every rank's x in rank order
    CHECK(y->ndim == 2 && y->shape[0] == W * B && y->shape[1] == D, "%s: gathered shape (%d,%d)", m, y->shape[0], y->shape[1]);
    double *expect = malloc((size_t)W * B * D * sizeof(double));
    for (int k = 0; k < W; k++) fill(expect + k * B * D, B * D, 1, k);
    for (int i = 0; i < W * B * D; i++) CHECK(y->data[i] == expect[i], "rank %d %s forward [%d]: %g != %g", R, m, i, y->data[i], expect[i]);

    // backward from G_r, a rank-seeded gradient, on the ranks in grad_on
    int mine = (grad_on >> R) & 1;
    if (mine) fill(gcd_grad_buf(&c, y), y->n, 2, R);
    gcd_backward_from(&c, y);
    double want[B * D] = { 0 }, *G = malloc(y->n * sizeof(double));
    int any = 0;
    for (int k = 0; k < W; k++) {
        if (!((grad_on >> k) & 1)) continue;
        fill(G, y->n, 2, k);
        int counts = mode == GCD_GATHER_ON || mode == GCD_GATHER_AVG || (mode == GCD_GATHER_LOCAL && k == R);   // off: never, world 1 too
        if (!counts) continue;
        any = 1;
        for (int i = 0; i < B * D; i++) want[i] += G[R * B * D + i] / (mode == GCD_GATHER_AVG && W > 1 ? W : 1);
    }
    if (!any) {
        CHECK(x->grad == NULL, "rank %d %s: no gradient reached the gather, x must keep None", R, m);
    } else {
        CHECK(x->grad != NULL, "rank %d %s: x got None, expected a gradient", R, m);
        for (int i = 0; x->grad && i < B * D; i++)
            CHECK(close_to(x->grad[i], want[i], 1e-14), "rank %d %s backward [%d]: %.17g != %.17g", R, m, i, x->grad[i], want[i]);
    }
    free(G);
    free(expect);
    gcd_arena_free(&a);
}

static void ddp_mean_should_track_none(gcd_comm *comm) {
    int W = comm->world, R = comm->rank;
    double g[5], mean[5], *all = malloc((size_t)W * 5 * sizeof(double));
    unsigned char *has = malloc((size_t)W);
    fill(g, 5, 3, R);
    int nhave = gcd_ddp_mean(comm, R % 2 ? NULL : g, 5, mean, all, has);   // None on odd ranks
    CHECK(nhave == (W + 1) / 2, "rank %d: %d ranks with a gradient, expected %d", R, nhave, (W + 1) / 2);
    for (int i = 0; i < 5; i++) {
        double want = 0, gk[5];
        for (int k = 0; k < W; k += 2) fill(gk, 5, 3, k), want += gk[i];
        CHECK(close_to(mean[i], want / W, 1e-15), "rank %d: mean[%d] %.17g != %.17g", R, i, mean[i], want / W);
    }
    for (int k = 0; k < W; k++) CHECK(has[k] == !(k % 2), "rank %d: has[%d] = %d", R, k, has[k]);
    free(all);
    free(has);
}

// DDP's bucket: three tensors (one None on odd ranks, one None everywhere) in one collective give each
// the same bits as its own gcd_ddp_mean, and the same every-rank copies
static void ddp_bucket_should_equal_one_at_a_time(gcd_comm *comm) {
    int W = comm->world, R = comm->rank;
    enum { K = 3 };
    size_t n[K] = { 7, 1, 4 };
    double g0[7], g1[1], g2[4], *mean[K], *one[K], *all[K], *all1[K];
    unsigned char *has[K], *has1[K];
    fill(g0, 7, 5, R), fill(g1, 1, 6, R), fill(g2, 4, 7, R);
    const double *local[K] = { g0, R % 2 ? NULL : g1, NULL };
    int nhave[K];
    for (int i = 0; i < K; i++) {
        mean[i] = malloc(n[i] * sizeof(double)), one[i] = malloc(n[i] * sizeof(double));
        all[i] = malloc((size_t)W * n[i] * sizeof(double)), all1[i] = malloc((size_t)W * n[i] * sizeof(double));
        has[i] = malloc((size_t)W), has1[i] = malloc((size_t)W);
    }
    gcd_ddp_mean_bucket(comm, K, local, n, mean, all, has, nhave, 0);
    double *keep = mean[0];   // a NULL mean: that tensor's copies and count, no mean
    unsigned char has0[64];
    mean[0] = NULL;
    if (W <= 64) {
        memset(all1[0], 0, (size_t)W * n[0] * sizeof(double));
        int got[K];
        gcd_ddp_mean_bucket(comm, 1, local, n, mean, all1, (unsigned char *[]){ has0 }, got, 0);
        CHECK(got[0] == W && !memcmp(all[0], all1[0], (size_t)W * n[0] * sizeof(double)) && !memcmp(has0, has[0], (size_t)W),
              "rank %d: a NULL mean must still give the count and every rank's copy", R);
    }
    mean[0] = keep;
    for (int i = 0; i < K; i++) {
        int want = gcd_ddp_mean(comm, local[i], n[i], one[i], all1[i], has1[i]);
        CHECK(nhave[i] == want, "rank %d: bucket tensor %d: %d ranks with a gradient, alone %d", R, i, nhave[i], want);
        CHECK(!memcmp(mean[i], one[i], n[i] * sizeof(double)), "rank %d: bucket tensor %d: the mean differs from its own (first %.17g vs %.17g)",
              R, i, mean[i][0], one[i][0]);
        CHECK(!memcmp(all[i], all1[i], (size_t)W * n[i] * sizeof(double)) && !memcmp(has[i], has1[i], (size_t)W),
              "rank %d: bucket tensor %d: every rank's copies differ", R, i);
        free(mean[i]), free(one[i]), free(all[i]), free(all1[i]), free(has[i]), free(has1[i]);
    }
    CHECK(nhave[0] == W && nhave[1] == (W + 1) / 2 && nhave[2] == 0, "rank %d: bucket counts %d %d %d", R, nhave[0], nhave[1], nhave[2]);
}

// root_only (a run without SGD steps): rank 0 gets the bits every rank gets without it; another rank
// gets counts of 0 and its outputs untouched
static void ddp_bucket_root_only_should_equal_everywhere_on_rank0(gcd_comm *comm) {
    int W = comm->world, R = comm->rank;
    enum { K = 2 };
    size_t n[K] = { 5, 3 };
    double g0[5], g1[3], *mean[K], *want[K], *all[K], *allw[K];
    unsigned char *has[K], *hasw[K];
    fill(g0, 5, 8, R), fill(g1, 3, 9, R);
    const double *local[K] = { g0, R % 2 ? NULL : g1 };
    int nhave[K], nhavew[K];
    for (int i = 0; i < K; i++) {
        mean[i] = malloc(n[i] * sizeof(double)), want[i] = malloc(n[i] * sizeof(double));
        all[i] = malloc((size_t)W * n[i] * sizeof(double)), allw[i] = malloc((size_t)W * n[i] * sizeof(double));
        has[i] = malloc((size_t)W), hasw[i] = malloc((size_t)W);
        for (size_t j = 0; j < n[i]; j++) mean[i][j] = -1;   // a sentinel: untouched off rank 0
    }
    gcd_ddp_mean_bucket(comm, K, local, n, want, allw, hasw, nhavew, 0);
    gcd_ddp_mean_bucket(comm, K, local, n, mean, all, has, nhave, 1);
    for (int i = 0; i < K; i++) {
        if (R == 0) {
            CHECK(nhave[i] == nhavew[i] && !memcmp(mean[i], want[i], n[i] * sizeof(double)) &&
                  !memcmp(all[i], allw[i], (size_t)W * n[i] * sizeof(double)) && !memcmp(has[i], hasw[i], (size_t)W),
                  "rank 0: root_only bucket tensor %d differs from every rank's (count %d vs %d)", i, nhave[i], nhavew[i]);
        } else {
            CHECK(nhave[i] == 0 && mean[i][0] == -1 && mean[i][n[i] - 1] == -1, "rank %d: root_only must leave tensor %d alone (count %d)", R,
                  i, nhave[i]);
        }
        free(mean[i]), free(want[i]), free(all[i]), free(allw[i]), free(has[i]), free(hasw[i]);
    }
}

// k tensors in one collective: the same gathered values and the same gradients back, bit for bit, as k
// gathers one at a time (two shapes, each pair of modes)
static void gathered_pair(gcd_comm *comm, gcd_arena *a, int many, const gcd_gather_mode *mode, gcd_tensor **x, gcd_tensor *out) {
    gcd_ctx c = gcd_ctx_make(a);
    static const int shape[2][2] = { { 3, 2 }, { 2, 5 } };
    gcd_tensor *y[2];
    for (int i = 0; i < 2; i++) {
        x[i] = gcd_tensor_new(&c, 2, (int[]){ shape[i][0], shape[i][1] });
        x[i]->requires_grad = 1;
        fill(x[i]->data, x[i]->n, 10 + (uint64_t)i, comm->rank);
    }
    if (many) gcd_all_gather_many(&c, comm, 2, x, mode, y);
    else for (int i = 0; i < 2; i++) y[i] = gcd_all_gather(&c, comm, x[i], mode[i]);
    for (int i = 0; i < 2; i++)
        if (y[i]->requires_grad) fill(gcd_grad_buf(&c, y[i]), y[i]->n, 20 + (uint64_t)i, comm->rank);
    for (int i = 0; i < 2; i++) out[i] = *y[i];   // data stays in the arena
    gcd_backward_from(&c, y[1]);
}

static void gather_many_should_equal_one_at_a_time(gcd_comm *comm) {
    for (int m0 = 0; m0 < GCD_GATHER_COUNT; m0++)
        for (int m1 = 0; m1 < GCD_GATHER_COUNT; m1++) {
            gcd_gather_mode mode[2] = { m0, m1 };
            gcd_arena a = { 0 }, b = { 0 };
            gcd_tensor *x[2], *x1[2], y[2], y1[2];
            gathered_pair(comm, &a, 1, mode, x, y);
            gathered_pair(comm, &b, 0, mode, x1, y1);
            for (int i = 0; i < 2; i++) {
                CHECK(y[i].n == y1[i].n && y[i].shape[0] == y1[i].shape[0] && y[i].shape[1] == y1[i].shape[1] &&
                      !memcmp(y[i].data, y1[i].data, y[i].n * sizeof(double)),
                      "rank %d modes %s,%s: tensor %d gathered differs from its own gather", comm->rank, gcd_gather_mode_name(m0),
                      gcd_gather_mode_name(m1), i);
                CHECK(!x[i]->grad == !x1[i]->grad && (!x[i]->grad || !memcmp(x[i]->grad, x1[i]->grad, x[i]->n * sizeof(double))),
                      "rank %d modes %s,%s: tensor %d's gradient differs from its own gather's", comm->rank, gcd_gather_mode_name(m0),
                      gcd_gather_mode_name(m1), i);
            }
            gcd_arena_free(&a), gcd_arena_free(&b);
        }
}

int main(int argc, char **argv) {
    gcd_mpi_init(&argc, &argv);
    gcd_comm *comm = gcd_comm_mpi();
    unsigned every = (1u << comm->world) - 1;
    for (int mode = 0; mode < GCD_GATHER_COUNT; mode++) {
        gather_mode_should_route_gradients(comm, mode, every);   // every rank reaches the gather
        gather_mode_should_route_gradients(comm, mode, 1);       // rank 0 only
        gather_mode_should_route_gradients(comm, mode, 0);       // no rank: every input keeps None
    }
    ddp_mean_should_track_none(comm);
    ddp_bucket_should_equal_one_at_a_time(comm);
    ddp_bucket_root_only_should_equal_everywhere_on_rank0(comm);
    gather_many_should_equal_one_at_a_time(comm);
    double failures = check_failures;
    comm->all_reduce(comm, &failures, 1);
    if (comm->rank == 0) printf("test_gather world %d: %s, %d failure(s) over all ranks\n", comm->world, failures ? "FAILED" : "passed", (int)failures);
    gcd_mpi_finalize();
    return failures != 0;
}
