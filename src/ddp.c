#include "ddp.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

int gcd_ddp_mean(gcd_comm *comm, const double *local, size_t n, double *mean, double *all, unsigned char *has) {
    int W = comm->world;
    double *mine = gcd_malloc((n + 1) * sizeof(double));   // (n values, present flag)
    double *every = gcd_malloc((size_t)W * (n + 1) * sizeof(double));
    if (local) memcpy(mine, local, n * sizeof(double));
    mine[n] = local != NULL;
    comm->all_gather(comm, mine, every, n + 1);
    int nhave = 0;
    memset(mean, 0, n * sizeof(double));
    for (int k = 0; k < W; k++) {
        const double *g = every + (size_t)k * (n + 1);
        nhave += g[n] != 0;
        for (size_t i = 0; i < n; i++) mean[i] += g[i];
        if (all) memcpy(all + (size_t)k * n, g, n * sizeof(double));
        if (has) has[k] = g[n] != 0;
    }
    for (size_t i = 0; i < n; i++) mean[i] /= W;
    free(mine);
    free(every);
    return nhave;
}
