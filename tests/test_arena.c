// The arena: every request zeroed, 16-byte aligned and disjoint from the others; a reset keeps the
// chunks, so a pass with the same requests as the last gets the same addresses (no new chunk), and a
// different pass still gets zeroed, disjoint memory.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "util.h"

#define NREQ 64

// request sizes for pass `seed`: small ones, a few over a chunk (1 MiB) and a few that just miss a chunk's end
static size_t size_of(int seed, int i) {
    uint64_t z = (uint64_t)(seed * 1000 + i) * 0x9E3779B97F4A7C15ull;
    z ^= z >> 29;
    if (i % 17 == 5) return (1u << 20) + (size_t)(z % 4096);
    if (i % 13 == 7) return (1u << 19) + (size_t)(z % 100000);
    return 1 + (size_t)(z % 20000);
}

static void pass(gcd_arena *a, int seed, unsigned char **p, size_t *n) {
    for (int i = 0; i < NREQ; i++) {
        n[i] = size_of(seed, i);
        p[i] = gcd_arena_alloc(a, n[i]);
        CHECK(((uintptr_t)p[i] & 15) == 0, "pass %d request %d: %p is not 16-byte aligned", seed, i, (void *)p[i]);
        size_t nonzero = 0;
        for (size_t k = 0; k < n[i]; k++) nonzero += p[i][k] != 0;
        CHECK(nonzero == 0, "pass %d request %d (%zu bytes): %zu bytes not zeroed", seed, i, n[i], nonzero);
        memset(p[i], 0xA5, n[i]);   // dirty it for the next pass
    }
    for (int i = 0; i < NREQ; i++)   // disjoint: every byte still holds its own request's mark
        for (int j = i + 1; j < NREQ; j++)
            CHECK(p[i] + n[i] <= p[j] || p[j] + n[j] <= p[i], "pass %d: requests %d and %d overlap", seed, i, j);
}

static void arena_should_reuse_chunks_across_resets(void) {
    gcd_arena a = { 0 };
    unsigned char *p0[NREQ], *p1[NREQ];
    size_t n0[NREQ], n1[NREQ];
    pass(&a, 1, p0, n0);
    gcd_arena_reset(&a);
    CHECK(a.bytes == 0, "reset: %zu bytes still counted", a.bytes);
    pass(&a, 1, p1, n1);
    int moved = 0;
    for (int i = 0; i < NREQ; i++) moved += p0[i] != p1[i];
    CHECK(moved == 0, "the same requests after a reset: %d of %d at new addresses", moved, NREQ);
    for (int seed = 2; seed < 6; seed++) {   // other requests, then the first ones again
        gcd_arena_reset(&a);
        pass(&a, seed, p1, n1);
    }
    gcd_arena_reset(&a);
    pass(&a, 1, p1, n1);
    gcd_arena_free(&a);
    CHECK(a.head == NULL && a.cur == NULL && a.bytes == 0, "free: the arena is not empty");
    pass(&a, 3, p1, n1);   // usable again after free
    gcd_arena_free(&a);
}

int main(void) {
    arena_should_reuse_chunks_across_resets();
    printf("test_arena: %d failure(s)\n", check_failures);
    return check_failures != 0;
}
