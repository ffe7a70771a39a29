// gradcheck.mesh: the device mesh the ranks sit on (its shape, its dimensions' names, each rank's
// coordinates), read from every rank's dump and checked against the others before any value is read.
#include <math.h>

#include <cjson/cJSON.h>
#include "check/internal.h"

static int whole(const cJSON *d, double below) {
    return cJSON_IsNumber(d) && d->valuedouble >= 0 && d->valuedouble < below && d->valuedouble == floor(d->valuedouble);
}

// rank k's record: shape and names (the first rank's set them, the others must agree) and coordinates
static int one_mesh(gcd_check_set *set, int k, const cJSON *doc, char *err, size_t len) {
    const char *path = set->rank[k].path;
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(doc, "shape"), *nm = cJSON_GetObjectItemCaseSensitive(doc, "names");
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(doc, "coords");
    int nd = cJSON_GetArraySize(sh);
    if (!cJSON_IsArray(sh) || nd < 1 || nd > 4 || !cJSON_IsArray(co) || cJSON_GetArraySize(co) != nd)
        return fail(err, len, "%s: gradcheck.mesh is not {\"shape\": [1 to 4 sizes], \"coords\": [one per dimension], ...}", path);
    if (k > 0 && nd != set->mesh_nd) return fail(err, len, "%s: gradcheck.mesh has %d dimensions, rank 0's %d", path, nd, set->mesh_nd);
    set->mesh_nd = nd;
    for (int i = 0; i < nd; i++) {
        const cJSON *s = cJSON_GetArrayItem(sh, i), *c = cJSON_GetArrayItem(co, i), *n = cJSON_IsArray(nm) ? cJSON_GetArrayItem(nm, i) : NULL;
        if (!whole(s, 1e9) || s->valuedouble < 1) return fail(err, len, "%s: gradcheck.mesh: dimension %d's size is not a whole number from 1", path, i);
        if (k > 0 && (int)s->valuedouble != set->mesh_shape[i]) return fail(err, len, "%s: gradcheck.mesh's shape differs from rank 0's", path);
        set->mesh_shape[i] = (int)s->valuedouble;
        if (!whole(c, s->valuedouble))
            return fail(err, len, "%s: rank %d's mesh coordinate %d is outside the mesh (dimension of size %d) (gradcheck.mesh)", path, k, i, set->mesh_shape[i]);
        set->mesh_coords[k * 4 + i] = (int)c->valuedouble;
        char name[16];
        snprintf(name, sizeof name, "%s", cJSON_IsString(n) ? n->valuestring : "");
        if (k > 0 && strcmp(name, set->mesh_names[i])) return fail(err, len, "%s: gradcheck.mesh names its dimensions unlike rank 0's", path);
        memcpy(set->mesh_names[i], name, sizeof name);
    }
    for (int q = 0; q < k; q++)
        if (!memcmp(&set->mesh_coords[q * 4], &set->mesh_coords[k * 4], (size_t)nd * sizeof(int)))
            return fail(err, len, "%s: rank %d claims the mesh coordinates of rank %d (gradcheck.mesh)", path, k, q);
    return 0;
}

int gcd_mesh_load(gcd_check_set *set, char *err, size_t len) {
    int W = set->world, any = 0, rc = 0;
    for (int k = 0; k < W; k++) any += gcd_st_meta(&set->rank[k], "gradcheck.mesh") != NULL;
    if (!any) return 0;
    set->mesh_coords = gcd_malloc((size_t)W * 4 * sizeof(int));
    for (int k = 0; !rc && k < W; k++) {
        const char *v = gcd_st_meta(&set->rank[k], "gradcheck.mesh");
        if (!v) { rc = fail(err, len, "%s: no gradcheck.mesh, which other ranks' dumps record", set->rank[k].path); break; }
        cJSON *doc = cJSON_Parse(v);
        rc = cJSON_IsObject(doc) ? one_mesh(set, k, doc, err, len) : fail(err, len, "%s: gradcheck.mesh is not a JSON object", set->rank[k].path);
        cJSON_Delete(doc);
    }
    return rc;
}
