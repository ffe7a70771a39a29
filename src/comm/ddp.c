#include "comm/ddp.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

int gcd_ddp_mean(gcd_comm *comm, const double *local, size_t n, double *mean, double *all, unsigned char *has) {
    int nhave;
    gcd_ddp_mean_bucket(comm, 1, &local, &n, &mean, &all, &has, &nhave, 0);
    return nhave;
}

void gcd_ddp_mean_bucket(gcd_comm *comm, int k, const double *const *local, const size_t *n, double **mean,
                         double **all, unsigned char **has, int *nhave, int root_only) {
    int W = comm->world, to_root = root_only && comm->gather;
    size_t per = 0;   // one rank's bucket: each tensor's n values, then its present flag
    for (int i = 0; i < k; i++) per += n[i] + 1;
    double *mine = gcd_malloc(per * sizeof(double)), *every = !to_root || comm->rank == 0 ? gcd_malloc((size_t)W * per * sizeof(double)) : NULL;
    for (size_t i = 0, off = 0; i < (size_t)k; off += n[i] + 1, i++) {
        if (local[i]) memcpy(mine + off, local[i], n[i] * sizeof(double));   // None: zeros (gcd_malloc)
        mine[off + n[i]] = local[i] != NULL;
    }
    if (to_root) comm->gather(comm, mine, every, per);   // W times less data than every rank taking every bucket
    else comm->all_gather(comm, mine, every, per);
    for (size_t i = 0, off = 0; i < (size_t)k; off += n[i] + 1, i++) {
        double *m = mean[i];
        nhave[i] = 0;
        if (!every) continue;   // root_only, not rank 0: only the counts (0) are written
        if (m) memset(m, 0, n[i] * sizeof(double));
        for (int r = 0; r < W; r++) {   // in rank order: every rank sums alike
            const double *g = every + (size_t)r * per + off;
            nhave[i] += g[n[i]] != 0;
            for (size_t j = 0; m && j < n[i]; j++) m[j] += g[j];
            if (all && all[i]) memcpy(all[i] + (size_t)r * n[i], g, n[i] * sizeof(double));
            if (has && has[i]) has[i][r] = g[n[i]] != 0;
        }
        for (size_t j = 0; m && j < n[i]; j++) m[j] /= W;
    }
    free(mine);
    free(every);
}
