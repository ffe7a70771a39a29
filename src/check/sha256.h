/*
 * sha256: SHA-256 (FIPS 180-4) for fingerprinting inputs, configs and result files. A streaming
 * init/update/final context, a hex formatter, and two block functions behind one pointer: a portable
 * C one and, on x86-64 CPUs with the SHA extensions, a SHA-NI one picked at run time. Self-contained:
 * no other gcd module, no allocation, no global state besides the choice of block function.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];            // chaining state
    uint64_t bytes;           // total message length so far
    unsigned char buf[64];    // a partial block
    size_t nbuf;              // bytes in buf, 0..63
} gcd_sha256;

void gcd_sha256_init(gcd_sha256 *s);
void gcd_sha256_update(gcd_sha256 *s, const void *data, size_t n);
void gcd_sha256_final(gcd_sha256 *s, unsigned char out[32]);   // leaves s wiped; init again to reuse
void gcd_sha256_hex(const unsigned char dig[32], char hex[65]); // lowercase, NUL-terminated

// "sha-ni" or "portable": the block function that runs on this CPU now
const char *gcd_sha256_impl(void);

// For tests and benchmarks only: force (1) the portable path, or (0) go back to the run-time choice.
// Not thread-safe; call it before hashing, never while another thread hashes.
void gcd_sha256_force_portable(int on);
