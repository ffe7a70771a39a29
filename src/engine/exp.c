#include "engine/exp.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "util.h"

#if defined(__x86_64__) && defined(__GNUC__) && __has_include(<sys/platform/x86.h>)
#include <sys/platform/x86.h>   // glibc 2.33 has the header, 2.34 its CPU_FEATURE_ACTIVE
#endif
#if defined(__x86_64__) && defined(__GNUC__) && defined(CPU_FEATURE_ACTIVE)
#define EXP_BATCH 1
#include <immintrin.h>

// ----------------------------------------------------------------------------
// glibc's exp on x86-64 (2.28 on) is ARM's optimized-routines exp, also musl's; where the CPU has AVX2
// and FMA glibc runs its __exp_fma build, in which each a*b+c of the C source is one FMA. For
// 2^-54 <= |x| < 512: k = round(x 128/ln2), r = x - k ln2/128 (in two parts), and
// exp(x) = 2^(k/128) (1 + tail + r + r^2 (C2 + r C3) + r^4 (C4 + r C5)), 2^(k/128) from the table.
// Below, those operations in that order (read off __exp_fma's code), four values at a time; any
// other x goes to exp() itself. The constants are optimized-routines' (MIT licence; musl's exp_data.c).

static const uint64_t tab[256] = {   // per k mod 128: the tail's bits, then 2^(k/128)'s bits less k << 45
    0x0000000000000000, 0x3ff0000000000000, 0x3c9b3b4f1a88bf6e, 0x3feff63da9fb3335,
    0xbc7160139cd8dc5d, 0x3fefec9a3e778061, 0xbc905e7a108766d1, 0x3fefe315e86e7f85,
    0x3c8cd2523567f613, 0x3fefd9b0d3158574, 0xbc8bce8023f98efa, 0x3fefd06b29ddf6de,
    0x3c60f74e61e6c861, 0x3fefc74518759bc8, 0x3c90a3e45b33d399, 0x3fefbe3ecac6f383,
    0x3c979aa65d837b6d, 0x3fefb5586cf9890f, 0x3c8eb51a92fdeffc, 0x3fefac922b7247f7,
    0x3c3ebe3d702f9cd1, 0x3fefa3ec32d3d1a2, 0xbc6a033489906e0b, 0x3fef9b66affed31b,
    0xbc9556522a2fbd0e, 0x3fef9301d0125b51, 0xbc5080ef8c4eea55, 0x3fef8abdc06c31cc,
    0xbc91c923b9d5f416, 0x3fef829aaea92de0, 0x3c80d3e3e95c55af, 0x3fef7a98c8a58e51,
    0xbc801b15eaa59348, 0x3fef72b83c7d517b, 0xbc8f1ff055de323d, 0x3fef6af9388c8dea,
    0x3c8b898c3f1353bf, 0x3fef635beb6fcb75, 0xbc96d99c7611eb26, 0x3fef5be084045cd4,
    0x3c9aecf73e3a2f60, 0x3fef54873168b9aa, 0xbc8fe782cb86389d, 0x3fef4d5022fcd91d,
    0x3c8a6f4144a6c38d, 0x3fef463b88628cd6, 0x3c807a05b0e4047d, 0x3fef3f49917ddc96,
    0x3c968efde3a8a894, 0x3fef387a6e756238, 0x3c875e18f274487d, 0x3fef31ce4fb2a63f,
    0x3c80472b981fe7f2, 0x3fef2b4565e27cdd, 0xbc96b87b3f71085e, 0x3fef24dfe1f56381,
    0x3c82f7e16d09ab31, 0x3fef1e9df51fdee1, 0xbc3d219b1a6fbffa, 0x3fef187fd0dad990,
    0x3c8b3782720c0ab4, 0x3fef1285a6e4030b, 0x3c6e149289cecb8f, 0x3fef0cafa93e2f56,
    0x3c834d754db0abb6, 0x3fef06fe0a31b715, 0x3c864201e2ac744c, 0x3fef0170fc4cd831,
    0x3c8fdd395dd3f84a, 0x3feefc08b26416ff, 0xbc86a3803b8e5b04, 0x3feef6c55f929ff1,
    0xbc924aedcc4b5068, 0x3feef1a7373aa9cb, 0xbc9907f81b512d8e, 0x3feeecae6d05d866,
    0xbc71d1e83e9436d2, 0x3feee7db34e59ff7, 0xbc991919b3ce1b15, 0x3feee32dc313a8e5,
    0x3c859f48a72a4c6d, 0x3feedea64c123422, 0xbc9312607a28698a, 0x3feeda4504ac801c,
    0xbc58a78f4817895b, 0x3feed60a21f72e2a, 0xbc7c2c9b67499a1b, 0x3feed1f5d950a897,
    0x3c4363ed60c2ac11, 0x3feece086061892d, 0x3c9666093b0664ef, 0x3feeca41ed1d0057,
    0x3c6ecce1daa10379, 0x3feec6a2b5c13cd0, 0x3c93ff8e3f0f1230, 0x3feec32af0d7d3de,
    0x3c7690cebb7aafb0, 0x3feebfdad5362a27, 0x3c931dbdeb54e077, 0x3feebcb299fddd0d,
    0xbc8f94340071a38e, 0x3feeb9b2769d2ca7, 0xbc87deccdc93a349, 0x3feeb6daa2cf6642,
    0xbc78dec6bd0f385f, 0x3feeb42b569d4f82, 0xbc861246ec7b5cf6, 0x3feeb1a4ca5d920f,
    0x3c93350518fdd78e, 0x3feeaf4736b527da, 0x3c7b98b72f8a9b05, 0x3feead12d497c7fd,
    0x3c9063e1e21c5409, 0x3feeab07dd485429, 0x3c34c7855019c6ea, 0x3feea9268a5946b7,
    0x3c9432e62b64c035, 0x3feea76f15ad2148, 0xbc8ce44a6199769f, 0x3feea5e1b976dc09,
    0xbc8c33c53bef4da8, 0x3feea47eb03a5585, 0xbc845378892be9ae, 0x3feea34634ccc320,
    0xbc93cedd78565858, 0x3feea23882552225, 0x3c5710aa807e1964, 0x3feea155d44ca973,
    0xbc93b3efbf5e2228, 0x3feea09e667f3bcd, 0xbc6a12ad8734b982, 0x3feea012750bdabf,
    0xbc6367efb86da9ee, 0x3fee9fb23c651a2f, 0xbc80dc3d54e08851, 0x3fee9f7df9519484,
    0xbc781f647e5a3ecf, 0x3fee9f75e8ec5f74, 0xbc86ee4ac08b7db0, 0x3fee9f9a48a58174,
    0xbc8619321e55e68a, 0x3fee9feb564267c9, 0x3c909ccb5e09d4d3, 0x3feea0694fde5d3f,
    0xbc7b32dcb94da51d, 0x3feea11473eb0187, 0x3c94ecfd5467c06b, 0x3feea1ed0130c132,
    0x3c65ebe1abd66c55, 0x3feea2f336cf4e62, 0xbc88a1c52fb3cf42, 0x3feea427543e1a12,
    0xbc9369b6f13b3734, 0x3feea589994cce13, 0xbc805e843a19ff1e, 0x3feea71a4623c7ad,
    0xbc94d450d872576e, 0x3feea8d99b4492ed, 0x3c90ad675b0e8a00, 0x3feeaac7d98a6699,
    0x3c8db72fc1f0eab4, 0x3feeace5422aa0db, 0xbc65b6609cc5e7ff, 0x3feeaf3216b5448c,
    0x3c7bf68359f35f44, 0x3feeb1ae99157736, 0xbc93091fa71e3d83, 0x3feeb45b0b91ffc6,
    0xbc5da9b88b6c1e29, 0x3feeb737b0cdc5e5, 0xbc6c23f97c90b959, 0x3feeba44cbc8520f,
    0xbc92434322f4f9aa, 0x3feebd829fde4e50, 0xbc85ca6cd7668e4b, 0x3feec0f170ca07ba,
    0x3c71affc2b91ce27, 0x3feec49182a3f090, 0x3c6dd235e10a73bb, 0x3feec86319e32323,
    0xbc87c50422622263, 0x3feecc667b5de565, 0x3c8b1c86e3e231d5, 0x3feed09bec4a2d33,
    0xbc91bbd1d3bcbb15, 0x3feed503b23e255d, 0x3c90cc319cee31d2, 0x3feed99e1330b358,
    0x3c8469846e735ab3, 0x3feede6b5579fdbf, 0xbc82dfcd978e9db4, 0x3feee36bbfd3f37a,
    0x3c8c1a7792cb3387, 0x3feee89f995ad3ad, 0xbc907b8f4ad1d9fa, 0x3feeee07298db666,
    0xbc55c3d956dcaeba, 0x3feef3a2b84f15fb, 0xbc90a40e3da6f640, 0x3feef9728de5593a,
    0xbc68d6f438ad9334, 0x3feeff76f2fb5e47, 0xbc91eee26b588a35, 0x3fef05b030a1064a,
    0x3c74ffd70a5fddcd, 0x3fef0c1e904bc1d2, 0xbc91bdfbfa9298ac, 0x3fef12c25bd71e09,
    0x3c736eae30af0cb3, 0x3fef199bdd85529c, 0x3c8ee3325c9ffd94, 0x3fef20ab5fffd07a,
    0x3c84e08fd10959ac, 0x3fef27f12e57d14b, 0x3c63cdaf384e1a67, 0x3fef2f6d9406e7b5,
    0x3c676b2c6c921968, 0x3fef3720dcef9069, 0xbc808a1883ccb5d2, 0x3fef3f0b555dc3fa,
    0xbc8fad5d3ffffa6f, 0x3fef472d4a07897c, 0xbc900dae3875a949, 0x3fef4f87080d89f2,
    0x3c74a385a63d07a7, 0x3fef5818dcfba487, 0xbc82919e2040220f, 0x3fef60e316c98398,
    0x3c8e5a50d5c192ac, 0x3fef69e603db3285, 0x3c843a59ac016b4b, 0x3fef7321f301b460,
    0xbc82d52107b43e1f, 0x3fef7c97337b9b5f, 0xbc892ab93b470dc9, 0x3fef864614f5a129,
    0x3c74b604603a88d3, 0x3fef902ee78b3ff6, 0x3c83c5ec519d7271, 0x3fef9a51fbc74c83,
    0xbc8ff7128fd391f0, 0x3fefa4afa2a490da, 0xbc8dae98e223747d, 0x3fefaf482d8e67f1,
    0x3c8ec3bc41aa2008, 0x3fefba1bee615a27, 0x3c842b94c3a9eb32, 0x3fefc52b376bba97,
    0x3c8a64a931d185ee, 0x3fefd0765b6e4540, 0xbc8e37bae43be3ed, 0x3fefdbfdad9cbe14,
    0x3c77893b4d91cd9d, 0x3fefe7c1819e90d8, 0x3c5305c14160cc89, 0x3feff3c22b8f71f1,
};

__attribute__((target("avx2,fma"))) static void exp_fma4(double *y, const double *x, size_t n) {
    const __m256d inv_ln2n = _mm256_set1_pd(0x1.71547652b82fep7), shift = _mm256_set1_pd(0x1.8p52);
    const __m256d neg_ln2hi = _mm256_set1_pd(-0x1.62e42fefa0000p-8), neg_ln2lo = _mm256_set1_pd(-0x1.cf79abc9e3b3ap-47);
    const __m256d c2 = _mm256_set1_pd(0x1.ffffffffffdbdp-2), c3 = _mm256_set1_pd(0x1.555555555543cp-3);
    const __m256d c4 = _mm256_set1_pd(0x1.55555cf172b91p-5), c5 = _mm256_set1_pd(0x1.1111167a4d017p-7);
    const __m256i below = _mm256_set1_epi64x(0x3c9 - 1), above = _mm256_set1_epi64x(0x408), exp_mask = _mm256_set1_epi64x(0x7ff);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d v = _mm256_loadu_pd(x + i);
        __m256i top = _mm256_and_si256(_mm256_srli_epi64(_mm256_castpd_si256(v), 52), exp_mask);   // |x|'s exponent field
        __m256i in = _mm256_and_si256(_mm256_cmpgt_epi64(top, below), _mm256_cmpgt_epi64(above, top));
        if (_mm256_movemask_pd(_mm256_castsi256_pd(in)) != 0xf) {   // 0, tiny, large or not finite: exp() itself
            for (int j = 0; j < 4; j++) y[i + j] = exp(x[i + j]);
            continue;
        }
        __m256d kd = _mm256_fmadd_pd(v, inv_ln2n, shift);
        __m256i ki = _mm256_castpd_si256(kd);
        kd = _mm256_sub_pd(kd, shift);
        __m256d r = _mm256_fmadd_pd(kd, neg_ln2lo, _mm256_fmadd_pd(kd, neg_ln2hi, v));
        __m256i idx = _mm256_slli_epi64(_mm256_and_si256(ki, _mm256_set1_epi64x(127)), 1);
        __m256d tail = _mm256_i64gather_pd((const double *)tab, idx, 8);
        __m256i sbits = _mm256_add_epi64(_mm256_i64gather_epi64((const long long *)(tab + 1), idx, 8), _mm256_slli_epi64(ki, 45));
        __m256d r2 = _mm256_mul_pd(r, r);
        __m256d t = _mm256_fmadd_pd(_mm256_fmadd_pd(r, c3, c2), r2, _mm256_add_pd(r, tail));
        t = _mm256_fmadd_pd(_mm256_mul_pd(r2, r2), _mm256_fmadd_pd(r, c5, c4), t);
        __m256d scale = _mm256_castsi256_pd(sbits);
        _mm256_storeu_pd(y + i, _mm256_fmadd_pd(scale, t, scale));
    }
    for (; i < n; i++) y[i] = exp(x[i]);
}

// The loop above only where glibc runs __exp_fma: where it runs another build (a CPU without AVX2 or
// FMA, or either masked by GLIBC_TUNABLES) its roundings differ in about 1 value in 1000, and so do a
// correctly rounded exp's (1 in 1300). The check below starts with values on which __exp_fma differs
// from both (found by comparing them here), then spans every range: one difference keeps exp().
// process-wide: the CPU and glibc a process runs on do not change under it, so the choice is made once
static int fast;
static pthread_once_t chosen = PTHREAD_ONCE_INIT;

static const double telling[] = {
    -0x1.5019b208fd14ap+2, -0x1.6c6345e9f20a8p+2, -0x1.54faee019fb58p+3, -0x1.6d22a98a65e9fp+2,   // a correctly rounded exp differs
    -0x1.0bedc57f91c8bp+5, -0x1.bbd020ded97cp+4, -0x1.4918fb7365262p+1, -0x1.54718c142f843p+4,
    -0x1.364d81364ef4ap+4, -0x1.47a43cd55d07bp+3, -0x1.cc802569c67acp+3, -0x1.e8dc5ca8570d4p+4,   // glibc's build without FMA differs
    -0x1.374ab2e81734p+2, -0x1.8aafc3c5d5817p+4, -0x1.cb1532a70fa85p+2, -0x1.7dfe790d7b56cp+2,
};

static void choose(void) {
    if (!CPU_FEATURE_ACTIVE(AVX2) || !CPU_FEATURE_ACTIVE(FMA)) return;   // glibc's own test, tunables applied
    enum { T = sizeof telling / sizeof *telling, K = 512 };
    double x[K], got[K];
    gcd_rng r = gcd_rng_make(1, 0);
    for (int i = 0; i < K; i++)   // every table entry and every range the cross-entropy meets, and beyond it
        x[i] = i < T ? telling[i] : (gcd_rng_uniform(&r) - 0.75) * (i < K / 2 ? 64.0 : 1500.0);
    exp_fma4(got, x, K);
    for (int i = 0; i < K; i++) {
        double want = exp(x[i]);
        if (memcmp(&got[i], &want, sizeof want)) return;
    }
    fast = 1;
}

#endif

int gcd_exp_fast(void) {
#ifdef EXP_BATCH
    pthread_once(&chosen, choose);
    return fast;
#else
    return 0;
#endif
}

void gcd_exp_n(double *y, const double *x, size_t n) {
#ifdef EXP_BATCH
    if (gcd_exp_fast()) {
        exp_fma4(y, x, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) y[i] = exp(x[i]);
}
