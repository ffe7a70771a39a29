#include "diagnose/expect.h"

#include <math.h>
#include <string.h>

#include "engine/gather.h"
#include "diagnose/verdict.h"

// ----------------------------------------------------------------------------
// the table: the encoders' status at world 1 and above it, and the rest's (measured against the
// libraries' real code in float64 with real DDP: see README, "Gather modes")

static const struct {
    int mode, local_loss;
    gcd_status before_world1, before, after;
} table[] = {
    { GCD_GATHER_OFF, 0, GCD_ST_NONE, GCD_ST_NONE, GCD_ST_OK },                // no graph through the gather
    { GCD_GATHER_OFF, 1, GCD_ST_MISMATCH, GCD_ST_MISMATCH, GCD_ST_OK },        // only the own, local-loss path
    { GCD_GATHER_ON, 0, GCD_ST_OK, GCD_ST_OK, GCD_ST_OK },
    { GCD_GATHER_ON, 1, GCD_ST_OK, GCD_ST_OK, GCD_ST_OK },
    { GCD_GATHER_LOCAL, 0, GCD_ST_OK, GCD_ST_SCALED, GCD_ST_OK },              // own slot only: 1/world
    { GCD_GATHER_LOCAL, 1, GCD_ST_OK, GCD_ST_MISMATCH, GCD_ST_OK },            // the other ranks' terms are lost
    { GCD_GATHER_AVG, 0, GCD_ST_OK, GCD_ST_SCALED, GCD_ST_OK },                // averaged: 1/world
    { GCD_GATHER_AVG, 1, GCD_ST_OK, GCD_ST_MISMATCH, GCD_ST_OK },              // averaged gathered path, full own path
};

// a tensor-parallel probe: the replicated parameters after the mode's reduction across the group (each
// rank's own share differs from the others': disagree; averaged: 1/world of the sum), the rest
static const struct {
    gcd_status before_world1, before, after;
} finalize_table[GCD_GATHER_COUNT] = {
    [GCD_GATHER_OFF] = { GCD_ST_OK, GCD_ST_DISAGREE, GCD_ST_OK },
    [GCD_GATHER_ON] = { GCD_ST_OK, GCD_ST_OK, GCD_ST_OK },
    [GCD_GATHER_LOCAL] = { GCD_ST_OK, GCD_ST_DISAGREE, GCD_ST_OK },
    [GCD_GATHER_AVG] = { GCD_ST_OK, GCD_ST_SCALED, GCD_ST_OK },
};

gcd_signature gcd_expected_signature(int mode, int local_loss, int world, int finalize) {
    if (finalize && mode >= 0 && mode < GCD_GATHER_COUNT)
        return (gcd_signature){ world > 1 ? finalize_table[mode].before : finalize_table[mode].before_world1, finalize_table[mode].after };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (table[i].mode == mode && table[i].local_loss == (local_loss != 0))
            return (gcd_signature){ world > 1 ? table[i].before : table[i].before_world1, table[i].after };
    GCD_FATAL("expect: no signature for mode %s, local_loss %d", gcd_gather_mode_name(mode), local_loss);
}

// ----------------------------------------------------------------------------

static void describe(gcd_sb *b, const gcd_param_result *p) {
    gcd_sb_printf(b, "%s", gcd_status_str(p->status));
    if (p->status == GCD_ST_SCALED || p->status == GCD_ST_MISMATCH) gcd_sb_printf(b, " (x%.6g, cosine %.3g)", p->scale, p->cosine);
}

int gcd_signature_met(const gcd_run_result *res, unsigned before_mask, gcd_sb *msg) {
    gcd_signature sig = gcd_expected_signature(res->mode, res->cfg.local_loss, res->world, res->finalize);
    int met = 1, told = 0;
    for (int i = 0; i < res->nparam; i++) {
        const gcd_param_result *p = &res->param[i];
        gcd_status want = (before_mask >> i) & 1 ? sig.before : sig.after;
        int ok = p->status == want;
        if (ok && want == GCD_ST_SCALED) ok = p->scale > 0 && fabs(p->scale * res->world - 1) <= 1e-6;   // exactly 1/world
        if (ok) continue;
        met = 0;
        if (told++ < 3) {
            gcd_sb_printf(msg, "%s%s: expected %s%s, saw ", told > 1 ? "; " : "", p->name, gcd_status_str(want),
                          want == GCD_ST_SCALED ? " x1/world" : "");
            describe(msg, p);
        }
    }
    if (told > 3) gcd_sb_printf(msg, "; and %d more", told - 3);
    return met;
}
