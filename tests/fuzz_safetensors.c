/*
 * fuzz_safetensors: a libFuzzer target for the strict safetensors reader. The input is a whole file:
 * gcd_st_parse validates it twice, once from the whole buffer and once, as gcd_st_open does, from a
 * heap copy of the 8-byte prefix and the header alone (so a read past the header is an ASan report).
 * On success every tensor is looked up, its offsets are checked against the data, its bytes are fetched
 * through gcd_st_bytes from the buffer itself (the "map") and every one of them touched, and
 * gradcheck.params goes through cJSON as check.c reads it. Build and run: tests/fuzz.sh BUILD_DIR.
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check/safetensors.h"
#include "util.h"

#define FUZZ_CHUNK 1024   // elements read at a time

#define require(c)                                                                              \
    do {                                                                                        \
        if (!(c)) {                                                                             \
            fprintf(stderr, "fuzz_safetensors: %s (%s:%d)\n", #c, __FILE__, __LINE__);          \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

// ----------------------------------------------------------------------------

static void empty(gcd_st_file *f) {
    memset(f, 0, sizeof *f);
    f->fd = -1;   // gcd_st_close closes fd >= 0: 0 would be stdin
    f->path = gcd_strdup("fuzz");
}

// gradcheck.params as check.c's meta_params reads it: a JSON array of unique strings
static void params(const gcd_st_file *f) {
    const char *v = gcd_st_meta(f, "gradcheck.params");
    if (!v) return;
    cJSON *a = cJSON_Parse(v);
    if (cJSON_IsArray(a)) {
        int n = cJSON_GetArraySize(a);
        for (int i = 0; i < n; i++) {
            const cJSON *s = cJSON_GetArrayItem(a, i);
            if (!cJSON_IsString(s)) break;
            for (int j = 0; j < i; j++)
                if (!strcmp(cJSON_GetArrayItem(a, j)->valuestring, s->valuestring)) break;
            (void)gcd_st_find(f, s->valuestring);
        }
    }
    cJSON_Delete(a);
}

static void walk(gcd_st_file *f, const uint8_t *data, size_t size) {
    require(f->data_start >= 8 && f->data_start <= size && f->size == size);
    uint64_t room = size - f->data_start, total = 0;
    for (int i = 0; i < f->ntensor; i++) {
        const gcd_st_tensor *t = &f->tensor[i];
        require(t->name && gcd_st_find(f, t->name) == t);   // names are unique
        require(t->ndim >= 0 && t->ndim <= GCD_ST_MAX_DIM);
        uint64_t n = 1;
        for (int d = 0; d < t->ndim; d++) {
            require(t->shape[d] >= 0);
            require(!__builtin_mul_overflow(n, (uint64_t)t->shape[d], &n));
        }
        require(n == t->n);
        require(t->begin <= t->end && t->end <= room);
        total += t->end - t->begin;
        if (t->dtype == GCD_DT_OTHER) continue;
        require(t->end - t->begin == t->n * gcd_dtype_size(t->dtype));
        require(strcmp(gcd_dtype_str(t->dtype), t->dtype_name) == 0);
    }
    require(total == room);   // the tensors tile the data

    // the values' bytes, through the reader, from the input itself: ASan sees every byte touched
    f->map = data;
    char err[512];
    unsigned sum = 0;
    for (int i = 0; i < f->ntensor; i++) {
        const gcd_st_tensor *t = &f->tensor[i];
        if (t->dtype == GCD_DT_OTHER) continue;
        size_t es = gcd_dtype_size(t->dtype);
        for (uint64_t at = 0; at < t->n; at += FUZZ_CHUNK) {
            size_t m = t->n - at < FUZZ_CHUNK ? (size_t)(t->n - at) : FUZZ_CHUNK;
            const unsigned char *b = gcd_st_bytes(f, t, at, m, err, sizeof err);
            require(b && b >= data + f->data_start && b + m * es <= data + size);
            for (size_t k = 0; k < m * es; k++) sum += b[k];
        }
        if (t->dtype == GCD_DT_F16 && t->n) sum += (unsigned)gcd_f16_table[0x3c00];   // 1.0
    }
    f->map = NULL;   // not ours to munmap
    volatile unsigned sink = sum;
    (void)sink;

    for (int i = 0; i < f->nmeta; i++) require(gcd_st_meta(f, f->meta_key[i]) == f->meta_val[i]);
    (void)gcd_st_meta(f, "gradcheck.rank");
    params(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[1024];
    gcd_st_file f;

    empty(&f);
    int rc = gcd_st_parse(&f, data, size, size, err, sizeof err);
    if (rc == 0) walk(&f, data, size);
    else require(err[0] && !strncmp(err, "fuzz: ", 6));
    gcd_st_close(&f);

    // as gcd_st_open: only the prefix and the header are in memory
    uint64_t n = 0;
    if (size >= 8)
        for (int i = 7; i >= 0; i--) n = n << 8 | data[i];
    size_t avail = size < 8 ? size : n <= size - 8 ? (size_t)(8 + n) : 8;
    unsigned char *head = malloc(avail ? avail : 1);
    require(head);
    memcpy(head, data, avail);
    empty(&f);
    int rc2 = gcd_st_parse(&f, head, avail, size, err, sizeof err);
    require(rc2 == rc);   // the data bytes never change the header's verdict
    gcd_st_close(&f);
    free(head);
    return 0;
}
