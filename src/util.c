#include "util.h"

#include <pthread.h>
#include <unistd.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// fatal errors

// process-wide: a fatal error ends the whole job from wherever it is raised, without a context to pass
static int fatal_rank = -1;
static void (*fatal_abort)(int code);
static void (*fatal_hook)(const char *message);

void gcd_fatal_setup(int rank, void (*abort_job)(int code), void (*hook)(const char *message)) {
    fatal_rank = rank;
    fatal_abort = abort_job;
    fatal_hook = hook;
}

static pthread_t fatal_owner;   // the thread that set the hook: the only one that may run it (and MPI)
static int fatal_owned;

void gcd_fatal_hook(void (*hook)(const char *message)) {
    fatal_hook = hook;
    fatal_owner = pthread_self(), fatal_owned = 1;
}

void gcd_fatal_at(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (fatal_rank >= 0) fprintf(stderr, "gradcheck-dist: rank %d: %s (%s:%d)\n", fatal_rank, msg, file, line);
    else fprintf(stderr, "gradcheck-dist: %s (%s:%d)\n", msg, file, line);
    fflush(stderr);
    if (fatal_owned && !pthread_equal(pthread_self(), fatal_owner)) _exit(3);   // a helper thread (rank 0's reference): no MPI from here
    void (*hook)(const char *) = fatal_hook;
    fatal_hook = NULL;   // a failure inside the hook must not recurse
    if (hook) hook(msg);
    if (fatal_abort) fatal_abort(3);
    exit(3);
}

void *gcd_malloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) GCD_FATAL("out of memory: %zu bytes", bytes);
    return p;
}

char *gcd_strdup(const char *s) {
    char *p = gcd_malloc(strlen(s) + 1);
    return strcpy(p, s);
}

void gcd_xxh128_hex(uint64_t high, uint64_t low, char hex[33]) {
    snprintf(hex, 33, "%016llx%016llx", (unsigned long long)high, (unsigned long long)low);
}

// ----------------------------------------------------------------------------
// arena

struct gcd_chunk {
    gcd_chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};

static int fits(const gcd_chunk *c, size_t bytes) { return c && c->cap - c->used >= bytes; }

void *gcd_arena_alloc_raw(gcd_arena *a, size_t bytes) {
    bytes = (bytes + 15) & ~(size_t)15;
    if (!fits(a->cur, bytes)) {
        if (a->cur && fits(a->cur->next, bytes)) a->cur = a->cur->next;   // a kept chunk, in the same order as last pass
        else {   // a new one, right after the current one (a kept one too small waits for a later request)
            size_t cap = bytes > (1u << 20) ? bytes : (1u << 20);
            gcd_chunk *c = malloc(sizeof *c + cap);
            if (!c) GCD_FATAL("arena: out of memory: need %zu bytes more, %zu in use", cap, a->bytes);
            c->cap = cap;
            c->used = 0;
            if (a->cur) c->next = a->cur->next, a->cur->next = c;
            else c->next = a->head, a->head = c;   // the first chunk of this arena or of this pass
            a->cur = c;
        }
    }
    void *p = a->cur->data + a->cur->used;
    a->cur->used += bytes;
    a->bytes += bytes;
    return p;
}

void *gcd_arena_alloc(gcd_arena *a, size_t bytes) { return memset(gcd_arena_alloc_raw(a, bytes), 0, bytes); }

void gcd_arena_reset(gcd_arena *a) {
    for (gcd_chunk *c = a->head; c; c = c->next) c->used = 0;
    a->cur = a->head;
    a->bytes = 0;
}

void gcd_arena_free(gcd_arena *a) {
    gcd_chunk *c = a->head;
    while (c) { gcd_chunk *n = c->next; free(c); c = n; }
    a->head = a->cur = NULL;
    a->bytes = 0;
}

// ----------------------------------------------------------------------------
// random numbers: splitmix64

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

gcd_rng gcd_rng_make(uint64_t seed, uint64_t stream) {
    uint64_t s = seed ^ (stream * 0xD1B54A32D192ED03ull);
    gcd_rng r = { splitmix(&s) };
    return r;
}

double gcd_rng_uniform(gcd_rng *r) { return (splitmix(&r->s) >> 11) * 0x1.0p-53; }

double gcd_rng_normal(gcd_rng *r) {
    double u1 = gcd_rng_uniform(r), u2 = gcd_rng_uniform(r);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

// ----------------------------------------------------------------------------
// string builder

void gcd_sb_printf(gcd_sb *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (k < 0) GCD_FATAL("format failed: %s", fmt);
        if (b->s && b->len + (size_t)k < b->cap) { b->len += (size_t)k; return; }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap <= b->len + (size_t)k) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) GCD_FATAL("out of memory: %zu bytes", cap);
        b->s = s;
        b->cap = cap;
    }
}

void gcd_sb_append(gcd_sb *b, const void *bytes, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = 2 * (b->len + n + 1);
        char *s = realloc(b->s, cap);
        if (!s) GCD_FATAL("out of memory: %zu bytes", cap);
        b->s = s;
        b->cap = cap;
    }
    memcpy(b->s + b->len, bytes, n);
    b->len += n;
    b->s[b->len] = 0;
}

void gcd_sb_free(gcd_sb *b) {
    free(b->s);
    b->s = NULL;
    b->len = b->cap = 0;
}

// ----------------------------------------------------------------------------
// UTF-8

size_t gcd_utf8_char(const unsigned char *s, size_t n) {
    if (!n) return 0;
    unsigned c = s[0], k = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : 9;
    if (k == 9 || (k == 1 && c < 0xc2) || (k == 3 && c > 0xf4) || k >= n) return 0;
    unsigned cp = k == 0 ? c : c & (0x3f >> k);
    for (unsigned j = 1; j <= k; j++) {
        if ((s[j] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[j] & 0x3f);
    }
    if ((k == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff))) return 0;   // overlong, surrogate
    return k + 1;
}

// ----------------------------------------------------------------------------
// text from outside (tensor and file names, a report's strings) as a terminal may show it

// the code point of the valid character at s (k bytes)
static unsigned utf8_cp(const unsigned char *s, size_t k) {
    unsigned cp = k == 1 ? s[0] : s[0] & (0x3f >> (k - 1));
    for (size_t j = 1; j < k; j++) cp = cp << 6 | (s[j] & 0x3f);
    return cp;
}

// shown escaped: C0 and C1 controls, DEL, the line and paragraph separators, the bidirectional
// overrides and marks (they reorder what a terminal shows), the BOM and the noncharacters U+FFFE/U+FFFF
static int unsafe_cp(unsigned cp) {
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x200e || cp == 0x200f || (cp >= 0x2028 && cp <= 0x202e) ||
           (cp >= 0x2066 && cp <= 0x2069) || cp == 0xfeff || cp == 0xfffe || cp == 0xffff;
}

int gcd_term_needs_char(const unsigned char *s, size_t k) { return unsafe_cp(utf8_cp(s, k)); }

int gcd_term_needs(const char *str) {
    const unsigned char *s = (const unsigned char *)str, *end = s + strlen(str);
    while (s < end) {
        size_t k = *s < 0x80 ? (*s >= 0x20 && *s != 0x7f) : gcd_utf8_char(s, (size_t)(end - s));
        if (!k || unsafe_cp(utf8_cp(s, k))) return 1;
        s += k;
    }
    return 0;
}

void gcd_sb_term(gcd_sb *b, const char *str) {
    const unsigned char *s = (const unsigned char *)str, *end = s + strlen(str);
    while (s < end) {
        size_t k = gcd_utf8_char(s, (size_t)(end - s));
        unsigned cp = k ? utf8_cp(s, k) : 0;
        if (!k) gcd_sb_printf(b, "\\x%02x", *s), k = 1;   // not UTF-8: the byte, in hex
        else if (cp == '\n') gcd_sb_printf(b, "\\n");
        else if (cp == '\r') gcd_sb_printf(b, "\\r");
        else if (cp == '\t') gcd_sb_printf(b, "\\t");
        else if (cp == 0x1b) gcd_sb_printf(b, "\\e");
        else if (cp < 0x80 && unsafe_cp(cp)) gcd_sb_printf(b, "\\x%02x", cp);
        else if (unsafe_cp(cp)) gcd_sb_printf(b, "\\u%04x", cp);
        else gcd_sb_append(b, s, k);
        s += k;
    }
    if (!b->s) gcd_sb_append(b, "", 0);
}

char *gcd_term_str(const char *s) {
    gcd_sb b = { 0 };
    gcd_sb_term(&b, s);
    return b.s;
}
