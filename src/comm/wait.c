#include "comm/wait.h"

#include <stdio.h>

#include "util.h"

gcd_wait_status gcd_wait(const gcd_wait_ops *ops, void *ctx, const char *what, int stream, double timeout, char *msg, size_t len) {
    double t0 = -1;   // when every rank had entered the call; until then no clock runs
    for (;;) {
        char why[512] = "";
        gcd_poll p = ops->comm(ctx, why, sizeof why);
        if (p == GCD_POLL_DONE && stream) p = ops->stream(ctx, why, sizeof why);
        if (p == GCD_POLL_DONE) return GCD_WAIT_OK;
        if (p == GCD_POLL_FAILED) {
            ops->abort(ctx);
            snprintf(msg, len, "%s: %s", what, why);
            return GCD_WAIT_FAILED;
        }
        if (t0 < 0 && ops->arrived(ctx)) t0 = ops->now(ctx);
        if (t0 >= 0 && ops->now(ctx) - t0 > timeout) {
            ops->abort(ctx);
            snprintf(msg, len, "%s: no progress %g s after every rank had entered it: a peer rank is dead or stuck (GCD_NCCL_TIMEOUT sets the limit)",
                     what, timeout);
            return GCD_WAIT_TIMEOUT;
        }
        ops->pause(ctx);
    }
}

void gcd_wait_check(const gcd_wait_ops *ops, void *ctx, const char *what, int stream, double timeout) {
    char msg[768];
    if (gcd_wait(ops, ctx, what, stream, timeout, msg, sizeof msg) != GCD_WAIT_OK) GCD_FATAL("%s", msg);
}
