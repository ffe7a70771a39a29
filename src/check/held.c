// What the dumps record of the step beyond the gradients, for the verdict's causes:
// - gradcheck.held: parameters whose .grad is None on a rank while its wrapper holds their gradient in a
//   buffer of its own (Megatron-style DDP's param.main_grad, a pipeline stage's data-parallel bucket),
//   as dump_grads records them: {"name": {"attr": "main_grad", "norm": 0.53}}. Over every rank's dump
//   (the judged stage): per name the attribute, the largest norm, and on how many ranks it was filled.
// - gradcheck.loss: each rank's loss of the step, and the reference's (its objective).
#include <math.h>

#include <cjson/cJSON.h>
#include "check/internal.h"

static int by_held(const void *a, const void *b) { return strcmp(((const gcd_held *)a)->name, ((const gcd_held *)b)->name); }

const gcd_held *gcd_held_find(const gcd_check_set *set, const char *name) {
    gcd_held key = { .name = (char *)name };
    return set->nheld ? bsearch(&key, set->held, (size_t)set->nheld, sizeof key, by_held) : NULL;
}

// one file's record, added to set->held (entries of one name from several ranks are merged later)
static int held_one(gcd_check_set *set, const gcd_st_file *f, char *err, size_t len) {
    const char *v = gcd_st_meta(f, "gradcheck.held");
    if (!v) return 0;
    cJSON *doc = cJSON_Parse(v);
    int rc = cJSON_IsObject(doc) ? 0 : fail(err, len, "%s: metadata gradcheck.held is not a JSON object {\"name\": {\"attr\": ..., \"norm\": ...}}", f->path);
    const cJSON *e, *list = rc ? NULL : doc;
    cJSON_ArrayForEach(e, list) {
        const cJSON *attr = cJSON_GetObjectItemCaseSensitive(e, "attr"), *norm = cJSON_GetObjectItemCaseSensitive(e, "norm");
        if (!cJSON_IsString(attr) || !attr->valuestring[0] || !(cJSON_IsNumber(norm) || cJSON_IsNull(norm))) {
            rc = fail(err, len, "%s: gradcheck.held['%.80s'] is not {\"attr\": a name, \"norm\": a number or null}", f->path, e->string ? e->string : "");
            break;
        }
        set->held = realloc(set->held, (size_t)(set->nheld + 1) * sizeof *set->held);
        mallocCheck(set->held);
        gcd_held *h = &set->held[set->nheld++];
        *h = (gcd_held){ gcd_strdup(e->string), gcd_strdup(attr->valuestring), cJSON_IsNumber(norm) ? norm->valuedouble : NAN, 0 };
        gcd_strip_wrappers(h->name);
        h->filled = h->norm > 0 && isfinite(h->norm);
    }
    cJSON_Delete(doc);
    return rc;
}

int gcd_held_load(gcd_check_set *set, char *err, size_t len) {
    int rc = 0;
    for (int k = 0; !rc && k < set->world; k++) {
        rc = held_one(set, &set->rank[k], err, len);
    }
    if (!set->nheld) return rc;
    qsort(set->held, (size_t)set->nheld, sizeof *set->held, by_held);
    int n = 0;
    for (int i = 0; i < set->nheld; i++) {   // one entry per name: the largest norm, the ranks it was filled on
        gcd_held *h = &set->held[i];
        if (n && !strcmp(h->name, set->held[n - 1].name)) {
            gcd_held *o = &set->held[n - 1];
            if (h->norm > o->norm || isnan(o->norm)) o->norm = h->norm;
            o->filled += h->filled;
            free(h->name), free(h->attr);
            continue;
        }
        set->held[n++] = *h;
    }
    set->nheld = n;
    return rc;
}

void gcd_held_free(gcd_check_set *set) {
    for (int i = 0; i < set->nheld; i++) free(set->held[i].name), free(set->held[i].attr);
    free(set->held);
    set->held = NULL, set->nheld = 0;
}

// gradcheck.loss of one file: 1 when recorded (finite), 0 when absent; 2 when it is not a number
static int loss_of(const gcd_st_file *f, double *x, char *err, size_t len) {
    const char *v = gcd_st_meta(f, "gradcheck.loss");
    if (!v) return 0;
    char *end;
    *x = strtod(v, &end);
    if (end == v || *end) return fail(err, len, "%s: metadata gradcheck.loss is '%.40s', not a number", f->path, v);
    return isfinite(*x) ? 1 : 0;
}

int gcd_ref_multi(const gcd_check_set *set) {
    const char *w = set->has_ref ? gcd_st_meta(&set->ref, "gradcheck.world") : NULL;
    return w && strcmp(w, "1") != 0;
}

int gcd_losses_load(gcd_check_set *set, char *err, size_t len) {
    double sum = 0, x = 0;
    int have = 0, rc;
    for (int k = 0; k < set->world; k++) {
        if ((rc = loss_of(&set->rank[k], &x, err, len)) == 2) return 2;
        if (rc) sum += x, have++;
    }
    if (!set->has_ref || (rc = loss_of(&set->ref, &x, err, len)) == 2) return set->has_ref ? rc : 0;
    set->loss_known = rc && have == set->world && !gcd_ref_multi(set);   // every rank's and the reference's, or none; a
                                                                          // reference run of several ranks records one rank's
    set->loss_mean = sum / set->world, set->loss_ref = x;
    return 0;
}
