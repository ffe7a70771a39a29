// The dumps of one check listed (directories expanded), opened and validated one by one: metadata,
// parameter lists, dtypes; the wrappers' prefixes taken off every name.
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include "check/internal.h"

static int ends_with(const char *s, const char *tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && !strcmp(s + a - b, tail);
}

// one of the references (--ref), by device and inode
static int is_ref(const struct stat *ref_st, const int *have_ref, const struct stat *fs) {
    for (int r = 0; r < 2; r++)
        if (have_ref[r] && fs->st_dev == ref_st[r].st_dev && fs->st_ino == ref_st[r].st_ino) return 1;
    return 0;
}

static int expand(const gcd_check_opts *o, char ***out, int *n, char *err, size_t len) {
    struct stat ref_st[2];
    int have_ref[2];
    for (int r = 0; r < 2; r++) have_ref[r] = r < o->nref && stat(o->ref[r], &ref_st[r]) == 0;
    int cap = 16;
    char **paths = gcd_malloc((size_t)cap * sizeof *paths);
    *n = 0;
    for (int i = 0; i < o->ndumps; i++) {
        struct stat st;
        if (stat(o->dumps[i], &st)) return *out = paths, fail(err, len, "%s: %s", o->dumps[i], strerror(errno));
        int first = *n;
        if (S_ISDIR(st.st_mode)) {
            DIR *d = opendir(o->dumps[i]);
            if (!d) return *out = paths, fail(err, len, "%s: %s", o->dumps[i], strerror(errno));
            struct dirent *e;
            while ((e = readdir(d))) {
                if (!ends_with(e->d_name, ".safetensors") || e->d_name[0] == '.') continue;
                char *p = gcd_malloc(strlen(o->dumps[i]) + strlen(e->d_name) + 2);
                sprintf(p, "%s/%s", o->dumps[i], e->d_name);
                struct stat fs;
                if (stat(p, &fs) == 0 && is_ref(ref_st, have_ref, &fs)) { free(p); continue; }
                if (*n == cap) {
                    paths = realloc(paths, (size_t)(cap *= 2) * sizeof *paths);
                    mallocCheck(paths);
                }
                paths[(*n)++] = p;
            }
            closedir(d);
            qsort(paths + first, (size_t)(*n - first), sizeof *paths, by_str);
            if (*n == first) return *out = paths, fail(err, len, "%s: no *.safetensors file in this directory", o->dumps[i]);
        } else {
            if (*n == cap) {
                paths = realloc(paths, (size_t)(cap *= 2) * sizeof *paths);
                mallocCheck(paths);
            }
            paths[(*n)++] = gcd_strdup(o->dumps[i]);
        }
    }
    *out = paths;
    return 0;
}

static int meta_int(const gcd_st_file *f, const char *key, long lo, long hi, long *out, char *err, size_t len) {
    const char *v = gcd_st_meta(f, key);
    if (!v) return fail(err, len, "%s: no %s in its metadata: not a gradcheck dump (write it with gradcheck_dist.dump_grads)", f->path, key);
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) return fail(err, len, "%s: metadata %s is '%.40s', expected a whole number from %ld to %ld", f->path, key, v, lo, hi);
    *out = x;
    return 0;
}

// a sorted copy of list (the strings are shared), for in_sorted
static char **sorted_copy(char *const *list, int n) {
    char **s = gcd_malloc((size_t)(n ? n : 1) * sizeof *s);
    memcpy(s, list, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, by_str);
    return s;
}

const char *gcd_first_missing(char *const *a, int na, char *const *b, int nb) {
    char **sb = sorted_copy(b, nb);
    const char *miss = NULL;
    for (int i = 0; !miss && i < na; i++)
        if (!in_sorted(sb, nb, a[i])) miss = a[i];
    free(sb);
    return miss;
}


// ----------------------------------------------------------------------------
// original names: the wrappers' prefixes removed (FSDP, activation checkpointing, DDP, torch.compile)

void gcd_strip_wrappers(char *name) {
    static const char *const seg[] = { "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod." };
    if (!strncmp(name, "module.", 7)) memmove(name, name + 7, strlen(name + 7) + 1);   // DDP's, at the start only
    for (char *at = name; *at;) {   // the others at any dotted level
        int cut = 0;
        for (size_t i = 0; i < sizeof seg / sizeof seg[0] && !cut; i++) {
            size_t k = strlen(seg[i]);
            if ((at == name || at[-1] == '.') && !strncmp(at, seg[i], k)) memmove(at, at + k, strlen(at + k) + 1), cut = 1;
        }
        if (!cut) at++;
    }
}

static int rename_file(gcd_st_file *f, char *err, size_t len) {
    const char *dup = gcd_st_rename(f, gcd_strip_wrappers);
    if (dup) return fail(err, len, "%s: two tensors are both '%.80s' once wrapper prefixes (_fsdp_wrapped_module., module., ...) are removed", f->path, dup);
    return 0;
}


// Every dump stays mapped for the scan: more files than the kernel maps at once (vm.max_map_count, less
// room for the program's own mappings) ended in "out of memory: N bytes", exit 3. The user's input: exit 2.
static int too_many_files(int n, char *err, size_t len) {
    long maps = 65530;   // Linux's default, when /proc says nothing
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f) {
        if (fscanf(f, "%ld", &maps) != 1) maps = 65530;
        fclose(f);
    }
    long room = maps - 8192;
    if (n <= room) return 0;
    return fail(err, len, "%d dump files, more than this system can map at once (vm.max_map_count %ld, less 8192 for the program): "
                          "check at most %ld files at a time", n, maps, room > 0 ? room : 0);
}

// gcd.params as a list of unique strings
static int meta_params(const gcd_st_file *f, char ***out, int *n, char *err, size_t len) {
    *out = NULL, *n = 0;
    const char *v = gcd_st_meta(f, "gradcheck.params");
    if (!v) return fail(err, len, "%s: no gradcheck.params in its metadata: not a gradcheck dump (write it with gradcheck_dist.dump_grads)", f->path);
    cJSON *a = cJSON_Parse(v);
    int rc = 0;
    if (!cJSON_IsArray(a)) rc = fail(err, len, "%s: metadata gradcheck.params is not a JSON array of parameter names", f->path);
    *n = rc ? 0 : cJSON_GetArraySize(a);
    *out = gcd_malloc((size_t)(*n ? *n : 1) * sizeof **out);
    int i = 0;
    const cJSON *s;
    cJSON *list = rc ? NULL : a;
    cJSON_ArrayForEach(s, list) {   // not cJSON_GetArrayItem(a, i): that walks the list from the head each time
        if (!cJSON_IsString(s)) { rc = fail(err, len, "%s: metadata gradcheck.params[%d] is not a string", f->path, i); break; }
        (*out)[i++] = gcd_strdup(s->valuestring);
        gcd_strip_wrappers((*out)[i - 1]);
    }
    cJSON_Delete(a);
    if (rc) {
        free_strs(*out, i);
        *out = NULL, *n = 0;
        return rc;
    }
    char **sorted = sorted_copy(*out, *n);
    for (int i = 1; i < *n && !rc; i++)
        if (!strcmp(sorted[i], sorted[i - 1])) rc = fail(err, len, "%s: gradcheck.params names '%.80s' twice", f->path, sorted[i]);
    free(sorted);
    return rc;
}



// NAME@earlier, NAME a listed parameter: what a local dump holds beside NAME, the gradient accumulated
// before the last backward (LocalGradCapture.mark())
static int earlier_of(char **sorted, int np, const char *name) {
    size_t n = strlen(name), k = strlen("@earlier");
    if (n <= k || strcmp(name + n - k, "@earlier")) return 0;
    char *base = gcd_strdup(name);
    base[n - k] = 0;
    int in = in_sorted(sorted, np, base);
    free(base);
    return in;
}

static int check_file(const gcd_check_opts *o, const gcd_st_file *f, char **params, int np, char *err, size_t len) {
    const char *fmt = gcd_st_meta(f, "gradcheck.format");
    if (!fmt) return fail(err, len, "%s: no gradcheck.format in its metadata: not a gradcheck dump (write it with gradcheck_dist.dump_grads)", f->path);
    if (strcmp(fmt, "1")) return fail(err, len, "%s: gradcheck.format '%.20s' is not one this gradcheck-dist reads (1): upgrade it", f->path, fmt);
    const char *stage = gcd_st_meta(f, "gradcheck.stage");
    if (!stage || (strcmp(stage, "local") && strcmp(stage, "reduced")))
        return fail(err, len, "%s: metadata gradcheck.stage is '%.20s', expected local or reduced", f->path, stage ? stage : "(missing)");
    char **sorted = sorted_copy(params, np);
    int rc = 0;
    for (int i = 0; !rc && i < f->ntensor; i++) {
        const gcd_st_tensor *t = &f->tensor[i];
        if (!strcmp(stage, "local") && earlier_of(sorted, np, t->name)) continue;   // the gradient before the last backward (check/stages.c)
        if (!in_sorted(sorted, np, t->name))
            rc = fail(err, len, "%s: tensor '%.80s' is not in gradcheck.params (every gradient must be a listed parameter)", f->path, t->name);
        else if (t->dtype == GCD_DT_OTHER && !ignored(o, t->name))
            rc = fail(err, len, "%s: unsupported dtype %s for tensor '%.80s' (F64, F32, F16 and BF16 are read; --ignore it to leave it out)",
                      f->path, t->dtype_name, t->name);
    }
    free(sorted);
    return rc;
}

// 2 for a file that cannot be read; 3 when a limit of this process stopped it (too many open files)
static int open_failed(const gcd_st_file *f, char *err, size_t len) {
    if (f->open_errno != EMFILE && f->open_errno != ENFILE) return 2;
    size_t n = strlen(err);
    snprintf(err + n, len - n, " (a limit of this process, not bad input: raise `ulimit -n` or check fewer dumps at once)");
    return 3;
}

// the references first: a wrong --ref is named as such, also when it lies among the dumps
int gcd_ref_open(const gcd_check_opts *o, const char *path, gcd_st_file *ref, char ***params, int *np, char *err, size_t len) {
    long world, r0;
    int rc;
    if (gcd_st_open(ref, path, err, len)) return open_failed(ref, err, len);
    if ((rc = rename_file(ref, err, len))) return rc;
    // a sketch dump may be one rank's of another run (docs/guard.md: world W against world W/2)
    int sketch = gcd_st_meta(ref, "gradcheck.sketch") != NULL;
    if ((rc = meta_int(ref, "gradcheck.world", 1, 1 << 16, &world, err, len)) || (rc = meta_int(ref, "gradcheck.rank", 0, sketch ? world - 1 : 0, &r0, err, len)))
        return rc;
    if (world != 1 && !sketch) return fail(err, len, "%s: the reference must be one process (gradcheck.world 1), not %ld", path, world);
    if ((rc = meta_params(ref, params, np, err, len))) return rc;
    return check_file(o, ref, *params, *np, err, len);
}

int gcd_dumps_list(const gcd_check_opts *o, char ***out, int *n, char *err, size_t len) {
    int rc = expand(o, out, n, err, len);
    return rc ? rc : too_many_files(*n, err, len);
}

int gcd_dump_open(const gcd_check_opts *o, const char *path, gcd_st_file *f, long *world, long *rank, char ***params, int *np, char *err,
                  size_t len) {
    int rc;
    if (gcd_st_open(f, path, err, len)) return open_failed(f, err, len);
    if ((rc = rename_file(f, err, len)) || (rc = meta_int(f, "gradcheck.world", 1, 1 << 16, world, err, len)) ||
        (rc = meta_int(f, "gradcheck.rank", 0, *world - 1, rank, err, len)) || (rc = meta_params(f, params, np, err, len)))
        return rc;
    return check_file(o, f, *params, *np, err, len);
}

// ----------------------------------------------------------------------------

#include "gcd_snippet.h"   // gcd_check_snippet, generated by CMake from python/gradcheck_dist/snippet.txt
