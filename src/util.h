/*
 * util: what every module shares. Fatal checks that name the rank and the call and stop the whole
 * job, the arena that holds one pass's tensors, and the seeded random numbers that let any rank
 * rebuild any other rank's inputs from (seed, rank) alone.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

// the hot loops, built twice on x86-64 with GCC: AVX2 where the CPU has it (chosen at load time),
// the baseline otherwise
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GCD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define GCD_CLONES
#endif

// ----------------------------------------------------------------------------
// fatal errors: print "rank R: message (file:line)", run the hook (rank 0 writes its error report),
// then stop every rank through the abort function (MPI_Abort) or exit(3)

void gcd_fatal_at(const char *file, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
void gcd_fatal_setup(int rank, void (*abort_job)(int code), void (*hook)(const char *message));
void gcd_fatal_hook(void (*hook)(const char *message));   // keeps the rank and the abort function
#define GCD_FATAL(...) gcd_fatal_at(__FILE__, __LINE__, __VA_ARGS__)
#define mallocCheck(p) do { if (!(p)) GCD_FATAL("out of memory"); } while (0)
void *gcd_malloc(size_t bytes);   // zeroed; fatal on failure
char *gcd_strdup(const char *s);

// the XXH3-128 of what was hashed, as the 32 lowercase hex digits `xxh128sum` prints (canonical order)
void gcd_xxh128_hex(uint64_t high, uint64_t low, char hex[33]);

// ----------------------------------------------------------------------------
// arena: bump allocation in chunks, everything released at once. A reset keeps the chunks for the
// next pass (the same shapes every step: no malloc, free or fresh page faults after the first);
// gcd_arena_free returns them.

typedef struct gcd_chunk gcd_chunk;
typedef struct {
    gcd_chunk *head;   // the first chunk; the others follow in the order they are filled
    gcd_chunk *cur;    // the chunk being filled
    size_t bytes;      // handed out since the last reset
} gcd_arena;

void *gcd_arena_alloc(gcd_arena *a, size_t bytes);   // zeroed, 16-byte aligned
void *gcd_arena_alloc_raw(gcd_arena *a, size_t bytes);   // the same, not zeroed: for what is fully overwritten
void gcd_arena_reset(gcd_arena *a);
void gcd_arena_free(gcd_arena *a);

// ----------------------------------------------------------------------------
// random numbers: one independent stream per (seed, stream); streams are "params", "rank k", ...

typedef struct { uint64_t s; } gcd_rng;
gcd_rng gcd_rng_make(uint64_t seed, uint64_t stream);
double gcd_rng_uniform(gcd_rng *r);   // [0, 1)
double gcd_rng_normal(gcd_rng *r);    // N(0, 1)

// ----------------------------------------------------------------------------
// string builder for the renderings

typedef struct {
    char *s;
    size_t len, cap;
} gcd_sb;

void gcd_sb_printf(gcd_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gcd_sb_append(gcd_sb *b, const void *bytes, size_t n);   // raw bytes, NUL-terminated after
void gcd_sb_free(gcd_sb *b);

// ----------------------------------------------------------------------------
// UTF-8: the length (1-4) of the valid, shortest-form character at s (n bytes left), or 0 when invalid

size_t gcd_utf8_char(const unsigned char *s, size_t n);
// Text from outside (a tensor or file name, a report's string) for a terminal: control characters (C0,
// C1, DEL, ESC as \e, newline as \n), bidirectional overrides, line separators, U+FFFE/U+FFFF shown
// escaped and invalid UTF-8 bytes as \xNN, so that it can never start a line or move the cursor.
int gcd_term_needs(const char *s);         // 1 when gcd_sb_term would change s
int gcd_term_needs_char(const unsigned char *s, size_t k);   // the same for one valid character of k bytes
void gcd_sb_term(gcd_sb *b, const char *s);
char *gcd_term_str(const char *s);         // malloc'd
