#include "check/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader converts without swapping"
#endif

// ----------------------------------------------------------------------------
// dtypes: the four read as numbers, and the other safetensors dtypes, whose size lets the offsets be
// checked even when the values cannot be read

static const struct { const char *name; gcd_dtype dtype; unsigned size; } dtypes[] = {
    [GCD_DT_F64] = { "F64", GCD_DT_F64, 8 },   [GCD_DT_F32] = { "F32", GCD_DT_F32, 4 },
    [GCD_DT_F16] = { "F16", GCD_DT_F16, 2 },   [GCD_DT_BF16] = { "BF16", GCD_DT_BF16, 2 },
    [GCD_DT_OTHER] = { "BOOL", GCD_DT_OTHER, 1 },   // this entry and those after it: unreadable, sized
    { "U8", GCD_DT_OTHER, 1 }, { "I8", GCD_DT_OTHER, 1 }, { "F8_E5M2", GCD_DT_OTHER, 1 },
    { "F8_E4M3", GCD_DT_OTHER, 1 }, { "I16", GCD_DT_OTHER, 2 }, { "U16", GCD_DT_OTHER, 2 }, { "I32", GCD_DT_OTHER, 4 },
    { "U32", GCD_DT_OTHER, 4 }, { "I64", GCD_DT_OTHER, 8 }, { "U64", GCD_DT_OTHER, 8 },
};
_Static_assert(GCD_DT_OTHER == 4, "dtypes[]: a readable dtype added to gcd_dtype needs its entry here");

size_t gcd_dtype_size(gcd_dtype d) { return d < GCD_DT_OTHER ? dtypes[d].size : 0; }
const char *gcd_dtype_str(gcd_dtype d) { return d < GCD_DT_OTHER ? dtypes[d].name : "other"; }

// ----------------------------------------------------------------------------
// errors: "PATH: tensor 'NAME': what", with the name's control bytes shown as '?'

static int fail(char *err, size_t len, const char *path, const char *tensor, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int fail(char *err, size_t len, const char *path, const char *tensor, const char *fmt, ...) {
    char name[96] = "";
    if (tensor) {
        size_t k = 0;
        for (const char *s = tensor; *s && k < sizeof name - 4; s++) name[k++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
        if (strlen(tensor) > k) strcpy(name + k, "...");
    }
    int n = tensor ? snprintf(err, len, "%s: tensor '%s': ", path, name) : snprintf(err, len, "%s: ", path);
    if (n >= 0 && (size_t)n < len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, len - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

// ----------------------------------------------------------------------------
// parsing

static int utf8_valid(const unsigned char *s, size_t n, size_t *bad) {
    for (size_t i = 0, k; i < n; i += k)
        if (!(k = gcd_utf8_char(s + i, n - i))) return *bad = i, 0;
    return 1;
}

// the first NUL in JSON text, raw or as the escape \u0000 (outside strings a backslash is not JSON,
// so every one starts an escape): 1 with its byte offset in *at
static int nul_escape(const unsigned char *s, size_t n, size_t *at) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] == 0) return *at = i, 1;
        if (s[i] != '\\' || i + 1 == n) continue;
        if (s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) return *at = i, 1;
        i++;   // the escaped character: "\\" then "u0000" is no escape
    }
    return 0;
}

// a JSON number that is a whole number in [0, 2^53]
static int whole(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != floor(d)) return 0;
    *out = (uint64_t)d;
    return 1;
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(const gcd_st_tensor *const *)a)->name, (*(const gcd_st_tensor *const *)b)->name);
}
static int by_begin(const void *a, const void *b) {
    const gcd_st_tensor *x = *(const gcd_st_tensor *const *)a, *y = *(const gcd_st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

static int tensor_entry(gcd_st_tensor *t, const cJSON *v, const char *path, char *err, size_t len) {
    if (!cJSON_IsObject(v)) return fail(err, len, path, t->name, "entry is not an object");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(v, "dtype"), *sh = cJSON_GetObjectItemCaseSensitive(v, "shape"),
                *off = cJSON_GetObjectItemCaseSensitive(v, "data_offsets");
    if (!cJSON_IsString(dt)) return fail(err, len, path, t->name, "dtype is missing or not a string");
    size_t di = 0, nd = sizeof dtypes / sizeof dtypes[0];
    while (di < nd && strcmp(dt->valuestring, dtypes[di].name)) di++;
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dt->valuestring);
    for (char *c = t->dtype_name; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f) *c = '?';
    if (di == nd) return fail(err, len, path, t->name, "unknown dtype '%s'", t->dtype_name);
    t->dtype = dtypes[di].dtype;
    if (!cJSON_IsArray(sh)) return fail(err, len, path, t->name, "shape is missing or not an array");
    int nsh = cJSON_GetArraySize(sh);
    if (nsh > GCD_ST_MAX_DIM) return fail(err, len, path, t->name, "shape has %d dimensions, at most %d are read", nsh, GCD_ST_MAX_DIM);
    t->ndim = nsh;
    t->n = 1;
    for (int i = 0; i < nsh; i++) {
        uint64_t d;
        if (!whole(cJSON_GetArrayItem(sh, i), &d) || d > INT_MAX)
            return fail(err, len, path, t->name, "shape[%d] is not a whole number from 0 to %d", i, INT_MAX);
        t->shape[i] = (int64_t)d;
        if (__builtin_mul_overflow(t->n, d, &t->n)) return fail(err, len, path, t->name, "the shape's element count overflows 64 bits");
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(t->n, (uint64_t)dtypes[di].size, &bytes))
        return fail(err, len, path, t->name, "the shape's byte count overflows 64 bits");
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !whole(cJSON_GetArrayItem(off, 0), &t->begin) ||
        !whole(cJSON_GetArrayItem(off, 1), &t->end))
        return fail(err, len, path, t->name, "data_offsets is not [begin, end] of whole numbers");
    if (t->begin > t->end)
        return fail(err, len, path, t->name, "data_offsets [%llu, %llu]: begin is after end", (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end - t->begin != bytes)
        return fail(err, len, path, t->name, "data_offsets [%llu, %llu] hold %llu bytes, but %s x %llu elements need %llu",
                    (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)(t->end - t->begin), t->dtype_name,
                    (unsigned long long)t->n, (unsigned long long)bytes);
    return 0;
}

static int prefix(const unsigned char *buf, uint64_t file_size, uint64_t *n, const char *path, char *err, size_t len) {
    if (file_size < 8) return fail(err, len, path, NULL, "%llu bytes: too short for a safetensors file (8-byte header length first)", (unsigned long long)file_size);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | buf[i];
    if (v == 0) return fail(err, len, path, NULL, "header length is 0: not a safetensors file");
    if (v > GCD_ST_MAX_HEADER) return fail(err, len, path, NULL, "header length %llu is over the 100 MB limit: not a safetensors file", (unsigned long long)v);
    if (v > file_size - 8)
        return fail(err, len, path, NULL, "header length %llu is larger than the file (%llu bytes): truncated?", (unsigned long long)v, (unsigned long long)file_size);
    *n = v;
    return 0;
}

static int by_string(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// a metadata key given twice: refused, naming it (n log n over the keys)
static int meta_twice(const gcd_st_file *f, const char *path, char *err, size_t len) {
    char **keys = gcd_malloc((size_t)(f->nmeta ? f->nmeta : 1) * sizeof *keys);
    memcpy(keys, f->meta_key, (size_t)f->nmeta * sizeof *keys);
    qsort(keys, (size_t)f->nmeta, sizeof *keys, by_string);
    int rc = 0;
    for (int i = 1; i < f->nmeta && !rc; i++)
        if (!strcmp(keys[i], keys[i - 1])) rc = fail(err, len, path, NULL, "metadata key '%.80s' appears twice", keys[i]);
    free(keys);
    return rc;
}

// __metadata__: an object of strings, each key once
static int read_metadata(gcd_st_file *f, const cJSON *v, const char *path, char *err, size_t len) {
    if (!cJSON_IsObject(v)) return fail(err, len, path, NULL, "__metadata__ is not an object");
    int m = cJSON_GetArraySize(v);
    f->meta_key = gcd_malloc((size_t)(m ? m : 1) * sizeof(char *));
    f->meta_val = gcd_malloc((size_t)(m ? m : 1) * sizeof(char *));
    const cJSON *kv;
    cJSON_ArrayForEach(kv, v) {
        if (!cJSON_IsString(kv)) return fail(err, len, path, NULL, "metadata value of '%.80s' is not a string", kv->string);
        f->meta_key[f->nmeta] = gcd_strdup(kv->string);
        f->meta_val[f->nmeta++] = gcd_strdup(kv->valuestring);
    }
    return meta_twice(f, path, err, len);   // sorted once: a lookup per key was quadratic (100,000 keys: 34 s)
}

// names are unique (f->by_name: the tensors sorted by name)
static int names_unique(gcd_st_file *f, const char *path, char *err, size_t len) {
    gcd_st_tensor **sorted = f->by_name = gcd_malloc((size_t)(f->ntensor ? f->ntensor : 1) * sizeof *sorted);
    for (int i = 0; i < f->ntensor; i++) sorted[i] = &f->tensor[i];
    qsort(sorted, (size_t)f->ntensor, sizeof *sorted, by_name);
    for (int i = 1; i < f->ntensor; i++)
        if (!strcmp(sorted[i]->name, sorted[i - 1]->name)) return fail(err, len, path, sorted[i]->name, "appears twice in the header");
    return 0;
}

// the tensors tile the data exactly: sorted by begin, each starts where the last ended
static int data_tiled(const gcd_st_file *f, const char *path, char *err, size_t len) {
    gcd_st_tensor **at = gcd_malloc((size_t)(f->ntensor ? f->ntensor : 1) * sizeof *at);
    for (int i = 0; i < f->ntensor; i++) at[i] = &f->tensor[i];
    qsort(at, (size_t)f->ntensor, sizeof *at, by_begin);
    uint64_t pos = 0, data = f->size - f->data_start;
    int rc = 0;
    for (int i = 0; i < f->ntensor && !rc; i++) {
        const gcd_st_tensor *t = at[i];
        if (t->begin < pos)
            rc = fail(err, len, path, t->name, "data_offsets [%llu, %llu] overlap the previous tensor (which ends at %llu)",
                      (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)pos);
        else if (t->begin > pos)
            rc = fail(err, len, path, t->name, "data_offsets [%llu, %llu] leave a hole of %llu bytes before it", (unsigned long long)t->begin,
                      (unsigned long long)t->end, (unsigned long long)(t->begin - pos));
        else if (t->end > data)
            rc = fail(err, len, path, t->name, "data_offsets [%llu, %llu] go past the end of the data (%llu bytes): truncated?",
                      (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)data);
        pos = t->end;
    }
    free(at);
    if (!rc && pos != data)
        rc = fail(err, len, path, NULL, "%llu bytes after the last tensor's data are not described by the header", (unsigned long long)(data - pos));
    return rc;
}

int gcd_st_parse(gcd_st_file *f, const unsigned char *buf, uint64_t avail, uint64_t file_size, char *err, size_t len) {
    const char *path = f->path;
    uint64_t n;
    if (avail < 8 && file_size >= 8) return fail(err, len, path, NULL, "read only %llu bytes", (unsigned long long)avail);
    if (prefix(buf, file_size, &n, path, err, len)) return -1;
    if (avail < 8 + n) return fail(err, len, path, NULL, "header: read only %llu of %llu bytes", (unsigned long long)avail, (unsigned long long)(8 + n));
    const unsigned char *h = buf + 8;
    size_t bad;
    if (!utf8_valid(h, n, &bad)) return fail(err, len, path, NULL, "header is not UTF-8 (byte %zu)", bad);
    if (nul_escape(h, n, &bad)) {   // cJSON would end the string there: "local\u0000x" would read as "local"
        char near[48];
        size_t from = bad > 40 ? bad - 40 : 0, k = 0;
        for (size_t i = from; i < bad; i++) near[k++] = h[i] < 0x20 || h[i] >= 0x7f ? '?' : (char)h[i];
        near[k] = 0;
        return fail(err, len, path, NULL, "header: a JSON string holds a NUL character (\\u0000 at byte %zu, after '%s'): not a name or value this reader accepts",
                    bad, near);
    }
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts((const char *)h, n, &end, 0);
    if (!doc) {
        size_t at = end ? (size_t)(end - (const char *)h) : 0;
        return fail(err, len, path, NULL, "header is not JSON (error at byte %zu of %llu)", at, (unsigned long long)n);
    }
    int rc = -1;
    for (const char *s = end; s < (const char *)h + n; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r') {
            fail(err, len, path, NULL, "header has bytes after its JSON object (at byte %zu)", (size_t)(s - (const char *)h));
            goto out;
        }
    if (!cJSON_IsObject(doc)) {
        fail(err, len, path, NULL, "header is not a JSON object");
        goto out;
    }
    f->size = file_size;
    f->data_start = 8 + n;
    int count = cJSON_GetArraySize(doc);
    f->tensor = gcd_malloc((size_t)(count ? count : 1) * sizeof *f->tensor);
    const cJSON *v;
    int seen_meta = 0;
    cJSON_ArrayForEach(v, doc) {
        if (!strcmp(v->string, "__metadata__")) {
            if (seen_meta++) { fail(err, len, path, NULL, "__metadata__ appears twice"); goto out; }
            if (read_metadata(f, v, path, err, len)) goto out;
            continue;
        }
        gcd_st_tensor *t = &f->tensor[f->ntensor++];
        t->name = gcd_strdup(v->string);
        if (tensor_entry(t, v, path, err, len)) goto out;
    }
    if (names_unique(f, path, err, len) || data_tiled(f, path, err, len)) goto out;
    rc = 0;
out:
    cJSON_Delete(doc);
    return rc;
}

// ----------------------------------------------------------------------------
// files

static int64_t mtime_ns(const struct stat *st) { return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec; }

static int pread_all(int fd, void *buf, size_t n, uint64_t off, size_t *got) {
    *got = 0;
    while (*got < n) {
        ssize_t k = pread(fd, (char *)buf + *got, n - *got, (off_t)(off + *got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) break;
        *got += (size_t)k;
    }
    return 0;
}

int gcd_st_open(gcd_st_file *f, const char *path, char *err, size_t len) {
    memset(f, 0, sizeof *f);
    f->path = gcd_strdup(path);
    f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);   // a FIFO must not block: fstat rejects it below
    if (f->fd < 0) {
        f->open_errno = errno;
        return fail(err, len, path, NULL, "%s", strerror(errno));
    }
    struct stat st;
    if (fstat(f->fd, &st)) return fail(err, len, path, NULL, "fstat: %s", strerror(errno));
    if (S_ISDIR(st.st_mode)) return fail(err, len, path, NULL, "is a directory");
    if (!S_ISREG(st.st_mode)) return fail(err, len, path, NULL, "not a regular file");
    f->dev = st.st_dev, f->ino = st.st_ino, f->mtime_ns = mtime_ns(&st);
    uint64_t size = (uint64_t)st.st_size, n = 0;
    unsigned char head[8];
    size_t got;
    if (pread_all(f->fd, head, 8, 0, &got)) return fail(err, len, path, NULL, "read: %s", strerror(errno));
    if (got < 8 && size >= 8) return fail(err, len, path, NULL, "shrank while being read");
    if (prefix(head, size, &n, path, err, len)) return -1;
    unsigned char *buf = malloc(8 + n);
    if (!buf) return fail(err, len, path, NULL, "header of %llu bytes: out of memory", (unsigned long long)n);
    int rc = pread_all(f->fd, buf, 8 + n, 0, &got);
    if (rc) fail(err, len, path, NULL, "read: %s", strerror(errno));
    else rc = gcd_st_parse(f, buf, got, size, err, len);
    free(buf);
    if (rc) return -1;
    if (size > 0) {   // map the file; a failure only means pread, chunk by chunk
        void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, f->fd, 0);
        if (m != MAP_FAILED) {
            f->map = m;
            close(f->fd);   // the mapping is enough: thousands of dumps open at once stay under `ulimit -n`
            f->fd = -1;
        }
    }
    return 0;
}

const char *gcd_st_meta(const gcd_st_file *f, const char *key) {
    for (int i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta_key[i], key)) return f->meta_val[i];
    return NULL;
}

const gcd_st_tensor *gcd_st_find(const gcd_st_file *f, const char *name) {
    gcd_st_tensor key = { .name = (char *)name }, *k = &key, **t;
    if (!f->by_name) return NULL;
    t = bsearch(&k, f->by_name, (size_t)f->ntensor, sizeof *f->by_name, by_name);
    return t ? *t : NULL;
}

const char *gcd_st_rename(gcd_st_file *f, void (*fn)(char *name)) {
    for (int i = 0; i < f->ntensor; i++) fn(f->tensor[i].name);
    qsort(f->by_name, (size_t)f->ntensor, sizeof *f->by_name, by_name);
    for (int i = 1; i < f->ntensor; i++)
        if (!strcmp(f->by_name[i]->name, f->by_name[i - 1]->name)) return f->by_name[i]->name;
    return NULL;
}

int gcd_st_unchanged(const gcd_st_file *f, char *err, size_t len) {
    struct stat st, now;
    if (f->fd < 0) {   // mapped and closed: the path again
        if (stat(f->path, &now) || now.st_dev != f->dev || now.st_ino != f->ino)
            return fail(err, len, f->path, NULL, "was replaced or removed while being read");
        st = now;
    } else if (fstat(f->fd, &st)) return fail(err, len, f->path, NULL, "fstat: %s", strerror(errno));
    if ((uint64_t)st.st_size != f->size || mtime_ns(&st) != f->mtime_ns)
        return fail(err, len, f->path, NULL, "changed while being read (%llu bytes at open, %llu now): the verdict would not be about one file",
                    (unsigned long long)f->size, (unsigned long long)st.st_size);
    if (stat(f->path, &now) || now.st_dev != f->dev || now.st_ino != f->ino)
        return fail(err, len, f->path, NULL, "was replaced or removed while being read");
    return 0;
}

void gcd_st_close(gcd_st_file *f) {
    if (f->map) munmap((void *)f->map, f->size);
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->ntensor; i++) free(f->tensor[i].name);
    for (int i = 0; i < f->nmeta; i++) free(f->meta_key[i]), free(f->meta_val[i]);
    free(f->tensor), free(f->by_name), free(f->meta_key), free(f->meta_val), free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

// ----------------------------------------------------------------------------
// values: raw little-endian bytes, a chunk at a time; F16 through a table (f16.c)

const unsigned char *gcd_st_bytes(const gcd_st_file *f, const gcd_st_tensor *t, uint64_t at, size_t count, char *err, size_t len) {
    size_t es = gcd_dtype_size(t->dtype);
    if (!es || at + count > t->n)
        GCD_FATAL("gcd_st_bytes: elements [%llu, %llu) of %s (%s) are outside its %llu", (unsigned long long)at,
                  (unsigned long long)(at + count), t->name, t->dtype_name, (unsigned long long)t->n);
    uint64_t off = f->data_start + t->begin + at * es;
    if (f->map) return f->map + off;
    static _Thread_local unsigned char *buf;
    static _Thread_local size_t cap;
    if (count * es > cap) {
        free(buf);
        cap = count * es;
        buf = malloc(cap);
        mallocCheck(buf);
    }
    size_t got;
    if (pread_all(f->fd, buf, count * es, off, &got)) return fail(err, len, f->path, t->name, "read: %s", strerror(errno)), NULL;
    if (got < count * es) return fail(err, len, f->path, t->name, "the file shrank while being read"), NULL;
    return buf;
}

void gcd_st_release(const gcd_st_file *f, const gcd_st_tensor *t) {
    if (!f->map) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)(f->map + f->data_start + t->begin), b = (uintptr_t)(f->map + f->data_start + t->end);
    a = (a + page - 1) & ~(page - 1), b &= ~(page - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);   // shared file pages: unmapped here, kept in the page cache
}

// ----------------------------------------------------------------------------
// SIGBUS: a mapped file truncated under us

// process-wide by nature: a signal handler takes no context, so each thread leaves its own jump point here
_Thread_local sigjmp_buf *gcd_st_jmp;

static void on_sigbus(int sig) {
    if (gcd_st_jmp) siglongjmp(*gcd_st_jmp, 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void guard_install_once(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

// once per process, whichever thread comes first (pthread_once: no shared flag read and written unlocked)
void gcd_st_guard_install(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, guard_install_once);
}
