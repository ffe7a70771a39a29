// SHA-256 (FIPS 180-4): a portable block function, a SHA-NI one for x86-64, and the streaming API.
#include "sha256.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#if defined(__clang__)
#include <cpuid.h>
#endif
#endif

typedef void (*blocks_fn)(uint32_t h[8], const unsigned char *p, size_t nblocks);

static const uint32_t K[64] __attribute__((aligned(16))) = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static const uint32_t H0[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

// ----------------------------------------------------------------------------
// portable block function

static inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static inline uint32_t load_be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline void store_be32(unsigned char *p, uint32_t x) {
    p[0] = (unsigned char)(x >> 24);
    p[1] = (unsigned char)(x >> 16);
    p[2] = (unsigned char)(x >> 8);
    p[3] = (unsigned char)x;
}

// the schedule lives in a rolling 16-word window; rounds are unrolled by 16 with the eight working
// variables renamed instead of shifted
#define BSIG0(x) (rotr(x, 2) ^ rotr(x, 13) ^ rotr(x, 22))
#define BSIG1(x) (rotr(x, 6) ^ rotr(x, 11) ^ rotr(x, 25))
#define SSIG0(x) (rotr(x, 7) ^ rotr(x, 18) ^ ((x) >> 3))
#define SSIG1(x) (rotr(x, 17) ^ rotr(x, 19) ^ ((x) >> 10))
#define SCHED(j) (w[(j) & 15] += SSIG1(w[((j) + 14) & 15]) + w[((j) + 9) & 15] + SSIG0(w[((j) + 1) & 15]))
#define ROUND(a, b, c, d, e, f, g, h, k, wj)                                         \
    do {                                                                            \
        uint32_t t1_ = h + BSIG1(e) + (g ^ (e & (f ^ g))) + (k) + (wj);             \
        d += t1_;                                                                   \
        h = t1_ + BSIG0(a) + ((a & b) | (c & (a | b)));                             \
    } while (0)
#define ROUNDS8(i, wj)                                                              \
    do {                                                                            \
        ROUND(a, b, c, d, e, f, g, hh, K[(i) + 0], wj((i) + 0));                    \
        ROUND(hh, a, b, c, d, e, f, g, K[(i) + 1], wj((i) + 1));                    \
        ROUND(g, hh, a, b, c, d, e, f, K[(i) + 2], wj((i) + 2));                    \
        ROUND(f, g, hh, a, b, c, d, e, K[(i) + 3], wj((i) + 3));                    \
        ROUND(e, f, g, hh, a, b, c, d, K[(i) + 4], wj((i) + 4));                    \
        ROUND(d, e, f, g, hh, a, b, c, K[(i) + 5], wj((i) + 5));                    \
        ROUND(c, d, e, f, g, hh, a, b, K[(i) + 6], wj((i) + 6));                    \
        ROUND(b, c, d, e, f, g, hh, a, K[(i) + 7], wj((i) + 7));                    \
    } while (0)
#define W_LOAD(j) (w[(j) & 15])
#define W_SCHED(j) SCHED(j)

static void blocks_portable(uint32_t h[8], const unsigned char *p, size_t nblocks) {
    for (; nblocks; nblocks--, p += 64) {
        uint32_t w[16];
        for (int j = 0; j < 16; j++) w[j] = load_be32(p + 4 * j);
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        ROUNDS8(0, W_LOAD);
        ROUNDS8(8, W_LOAD);
        for (int i = 16; i < 64; i += 16) {
            ROUNDS8(i, W_SCHED);
            ROUNDS8(i + 8, W_SCHED);
        }
        h[0] += a;
        h[1] += b;
        h[2] += c;
        h[3] += d;
        h[4] += e;
        h[5] += f;
        h[6] += g;
        h[7] += hh;
    }
}

#undef BSIG0
#undef BSIG1
#undef SSIG0
#undef SSIG1
#undef SCHED
#undef ROUND
#undef ROUNDS8
#undef W_LOAD
#undef W_SCHED

// ----------------------------------------------------------------------------
// SHA-NI block function (x86-64 with the SHA extensions; chosen at run time)

#if defined(__x86_64__)

// four rounds from message vector m and K[k..k+3]; sha256rnds2 does two rounds per call
#define SHA_NI_ROUNDS4(k, m)                                                      \
    do {                                                                          \
        __m128i t_ = _mm_add_epi32((m), _mm_load_si128((const __m128i *)&K[k]));  \
        st1 = _mm_sha256rnds2_epu32(st1, st0, t_);                                \
        st0 = _mm_sha256rnds2_epu32(st0, st1, _mm_shuffle_epi32(t_, 0x0e));       \
    } while (0)
// the schedule: next += sigma0 part (msg1 earlier) + w[t-7] (alignr), then the sigma1 part (msg2)
#define SHA_NI_MSG1(prev, cur) prev = _mm_sha256msg1_epu32(prev, cur)
#define SHA_NI_MSG2(next, cur, prev) \
    next = _mm_sha256msg2_epu32(_mm_add_epi32(next, _mm_alignr_epi8(cur, prev, 4)), cur)

__attribute__((target("sha,sse4.1")))
static void blocks_sha_ni(uint32_t h[8], const unsigned char *p, size_t nblocks) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    // h[0..7] = a..h into the (a, b, e, f) / (c, d, g, h) pairs sha256rnds2 wants
    __m128i t = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[0]), 0xb1);   // c d a b
    __m128i st1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[4]), 0x1b); // e f g h
    __m128i st0 = _mm_alignr_epi8(t, st1, 8);                                        // a b e f
    st1 = _mm_blend_epi16(st1, t, 0xf0);                                             // c d g h

    for (; nblocks; nblocks--, p += 64) {
        __m128i save0 = st0, save1 = st1;
        __m128i m0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 0)), bswap);
        __m128i m1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16)), bswap);
        __m128i m2 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 32)), bswap);
        __m128i m3 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 48)), bswap);

        SHA_NI_ROUNDS4(0, m0);
        SHA_NI_ROUNDS4(4, m1);  SHA_NI_MSG1(m0, m1);
        SHA_NI_ROUNDS4(8, m2);  SHA_NI_MSG1(m1, m2);
        SHA_NI_ROUNDS4(12, m3); SHA_NI_MSG2(m0, m3, m2); SHA_NI_MSG1(m2, m3);
        SHA_NI_ROUNDS4(16, m0); SHA_NI_MSG2(m1, m0, m3); SHA_NI_MSG1(m3, m0);
        SHA_NI_ROUNDS4(20, m1); SHA_NI_MSG2(m2, m1, m0); SHA_NI_MSG1(m0, m1);
        SHA_NI_ROUNDS4(24, m2); SHA_NI_MSG2(m3, m2, m1); SHA_NI_MSG1(m1, m2);
        SHA_NI_ROUNDS4(28, m3); SHA_NI_MSG2(m0, m3, m2); SHA_NI_MSG1(m2, m3);
        SHA_NI_ROUNDS4(32, m0); SHA_NI_MSG2(m1, m0, m3); SHA_NI_MSG1(m3, m0);
        SHA_NI_ROUNDS4(36, m1); SHA_NI_MSG2(m2, m1, m0); SHA_NI_MSG1(m0, m1);
        SHA_NI_ROUNDS4(40, m2); SHA_NI_MSG2(m3, m2, m1); SHA_NI_MSG1(m1, m2);
        SHA_NI_ROUNDS4(44, m3); SHA_NI_MSG2(m0, m3, m2); SHA_NI_MSG1(m2, m3);
        SHA_NI_ROUNDS4(48, m0); SHA_NI_MSG2(m1, m0, m3); SHA_NI_MSG1(m3, m0);
        SHA_NI_ROUNDS4(52, m1); SHA_NI_MSG2(m2, m1, m0);
        SHA_NI_ROUNDS4(56, m2); SHA_NI_MSG2(m3, m2, m1);
        SHA_NI_ROUNDS4(60, m3);

        st0 = _mm_add_epi32(st0, save0);
        st1 = _mm_add_epi32(st1, save1);
    }

    t = _mm_shuffle_epi32(st0, 0x1b);                 // f e b a
    st1 = _mm_shuffle_epi32(st1, 0xb1);               // d c h g
    st0 = _mm_blend_epi16(t, st1, 0xf0);              // d c b a
    st1 = _mm_alignr_epi8(st1, t, 8);                 // h g f e
    _mm_storeu_si128((__m128i *)&h[0], st0);
    _mm_storeu_si128((__m128i *)&h[4], st1);
}

#undef SHA_NI_ROUNDS4
#undef SHA_NI_MSG1
#undef SHA_NI_MSG2

#endif // __x86_64__

// ----------------------------------------------------------------------------
// run-time choice

static int force_portable;

static int have_sha_ni(void) {
#if defined(__x86_64__) && defined(__clang__)
    // clang (14) rejects __builtin_cpu_supports("sha"): ask cpuid. SHA: leaf 7 EBX bit 29;
    // SSSE3, SSE4.1: leaf 1 ECX bits 9, 19. All use xmm state only, which x86-64 always enables.
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & 1u << 9) || !(c & 1u << 19)) return 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & 1u << 29);
#elif defined(__x86_64__)
    return __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1");
#else
    return 0;
#endif
}

static blocks_fn pick_blocks(void) {
#if defined(__x86_64__)
    if (!force_portable && have_sha_ni()) return blocks_sha_ni;
#endif
    return blocks_portable;
}

const char *gcd_sha256_impl(void) { return pick_blocks() == blocks_portable ? "portable" : "sha-ni"; }

void gcd_sha256_force_portable(int on) { force_portable = on != 0; }

// ----------------------------------------------------------------------------
// streaming API

void gcd_sha256_init(gcd_sha256 *s) {
    memcpy(s->h, H0, sizeof H0);
    s->bytes = 0;
    s->nbuf = 0;
}

void gcd_sha256_update(gcd_sha256 *s, const void *data, size_t n) {
    const unsigned char *p = data;
    blocks_fn blocks = pick_blocks();
    s->bytes += n;
    if (s->nbuf) {
        size_t take = 64 - s->nbuf < n ? 64 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += take;
        p += take;
        n -= take;
        if (s->nbuf < 64) return;
        blocks(s->h, s->buf, 1);
        s->nbuf = 0;
    }
    if (n >= 64) {
        blocks(s->h, p, n / 64);
        p += n / 64 * 64;
        n %= 64;
    }
    if (n) memcpy(s->buf, p, n);
    s->nbuf = n;
}

void gcd_sha256_final(gcd_sha256 *s, unsigned char out[32]) {
    blocks_fn blocks = pick_blocks();
    uint64_t bits = s->bytes * 8;
    s->buf[s->nbuf++] = 0x80;
    if (s->nbuf > 56) {
        memset(s->buf + s->nbuf, 0, 64 - s->nbuf);
        blocks(s->h, s->buf, 1);
        s->nbuf = 0;
    }
    memset(s->buf + s->nbuf, 0, 56 - s->nbuf);
    store_be32(s->buf + 56, (uint32_t)(bits >> 32));
    store_be32(s->buf + 60, (uint32_t)bits);
    blocks(s->h, s->buf, 1);
    for (int i = 0; i < 8; i++) store_be32(out + 4 * i, s->h[i]);
    memset(s, 0, sizeof *s);
}

void gcd_sha256_hex(const unsigned char dig[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[dig[i] >> 4];
        hex[2 * i + 1] = digits[dig[i] & 15];
    }
    hex[64] = '\0';
}
