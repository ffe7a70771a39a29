// SHA-256 against the FIPS 180-2 vectors and sha256sum, in one update and in random pieces,
// the portable and the SHA-NI block functions agreeing.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "sha256.h"

enum { PORTABLE, NATIVE };   // NATIVE: the run-time choice (sha-ni where the CPU has it)

static int have_sha_ni;
static int mismatches;   // digests that differed; only the first few are printed in full

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng_next(void) {   // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// hash data in one update (pieces == 0) or in random-sized pieces, some of them empty
static void hash(int path, const unsigned char *data, size_t n, int pieces, char hex[65]) {
    gcd_sha256_force_portable(path == PORTABLE);
    gcd_sha256 s;
    unsigned char dig[32];
    gcd_sha256_init(&s);
    if (!pieces) gcd_sha256_update(&s, data, n);
    else {
        size_t off = 0;
        while (off < n) {
            uint64_t r = rng_next();
            size_t max = (r & 3) == 0 ? 200 : (r & 3) == 1 ? 64 : 9;   // mostly small, sometimes > a block
            size_t k = (size_t)(r >> 8) % (max + 1);
            if (k > n - off) k = n - off;
            gcd_sha256_update(&s, data + off, k);
            off += k;
        }
        gcd_sha256_update(&s, data + n, 0);
    }
    gcd_sha256_final(&s, dig);
    gcd_sha256_hex(dig, hex);
    gcd_sha256_force_portable(0);
}

static void expect_hex(const char *what, size_t n, const char *got, const char *want) {
    if (strcmp(got, want) == 0) return;
    if (mismatches++ < 3) CHECK(0, "%s, %zu bytes:\n  got  %s\n  want %s", what, n, got, want);
    else check_failures++;
}

// every path (portable, native) x (one update, pieces) must give want
static void expect_all_paths(const char *what, const unsigned char *data, size_t n, const char *want) {
    static const char *names[2][2] = { { "portable, one update", "portable, pieces" },
                                       { "sha-ni, one update", "sha-ni, pieces" } };
    char hex[65], label[160];
    for (int path = PORTABLE; path <= (have_sha_ni ? NATIVE : PORTABLE); path++)
        for (int pieces = 0; pieces <= 1; pieces++) {
            hash(path, data, n, pieces, hex);
            snprintf(label, sizeof label, "%s (%s)", what, names[path][pieces]);
            expect_hex(label, n, hex, want);
        }
}

// ----------------------------------------------------------------------------
// the FIPS 180-2 vectors

static void sha256_should_match_fips_vectors(void) {
    static const struct { const char *msg, *hex; } v[] = {
        { "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
        { "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
        { "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        expect_all_paths("fips vector", (const unsigned char *)v[i].msg, strlen(v[i].msg), v[i].hex);

    size_t n = 1000000;
    unsigned char *a = malloc(n);
    CHECK(a != NULL, "malloc %zu", n);
    if (!a) return;
    memset(a, 'a', n);
    expect_all_paths("fips vector, one million 'a'", a, n,
                     "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}

// ----------------------------------------------------------------------------
// every length 0..300: one update == pieces, portable == sha-ni

static void every_length_should_agree_across_paths_and_pieces(const unsigned char *buf) {
    char ref[65], hex[65];
    for (size_t n = 0; n <= 300; n++) {
        hash(PORTABLE, buf, n, 0, ref);
        hash(PORTABLE, buf, n, 1, hex);
        expect_hex("length sweep: portable pieces vs portable one update", n, hex, ref);
        if (!have_sha_ni) continue;
        hash(NATIVE, buf, n, 0, hex);
        expect_hex("length sweep: sha-ni one update vs portable", n, hex, ref);
        hash(NATIVE, buf, n, 1, hex);
        expect_hex("length sweep: sha-ni pieces vs portable", n, hex, ref);
    }
}

// a long random buffer, so the bulk (many blocks per call) path runs on both sides
static void long_buffer_should_agree_across_paths(const unsigned char *buf, size_t n) {
    char ref[65], hex[65];
    hash(PORTABLE, buf, n, 0, ref);
    hash(PORTABLE, buf, n, 1, hex);
    expect_hex("long buffer: portable pieces vs portable one update", n, hex, ref);
    if (!have_sha_ni) return;
    hash(NATIVE, buf, n, 0, hex);
    expect_hex("long buffer: sha-ni one update vs portable", n, hex, ref);
    hash(NATIVE, buf, n, 1, hex);
    expect_hex("long buffer: sha-ni pieces vs portable", n, hex, ref);
}

// ----------------------------------------------------------------------------
// against sha256sum on a temp file

static int sha256sum_of(const unsigned char *data, size_t n, char hex[65]) {
    const char *dir = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/test_sha256.XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp %s", path);
    if (fd < 0) return 0;
    FILE *f = fdopen(fd, "wb");
    int ok = f && fwrite(data, 1, n, f) == n;
    ok = (f && fclose(f) == 0) && ok;
    CHECK(ok, "writing %zu bytes to %s", n, path);
    char cmd[600], line[256] = "";
    snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
    FILE *p = ok ? popen(cmd, "r") : NULL;
    if (p) {
        if (!fgets(line, sizeof line, p)) line[0] = '\0';
        int rc = pclose(p);
        ok = rc == 0 && strlen(line) >= 64;
        CHECK(ok, "%s: exit status %d, output \"%s\" (is coreutils' sha256sum on PATH?)", cmd, rc, line);
    } else if (ok) {
        ok = 0;
        CHECK(0, "popen %s failed", cmd);
    }
    unlink(path);
    if (!ok) return 0;
    memcpy(hex, line, 64);
    hex[64] = '\0';
    return 1;
}

static void sha256_should_match_sha256sum(const unsigned char *buf) {
    // around the padding edges (55/56, 63/64, 119/120) and a few multi-block lengths
    static const size_t lens[] = { 0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 300, 4096, 100003 };
    char want[65];
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        if (!sha256sum_of(buf, lens[i], want)) continue;
        expect_all_paths("vs sha256sum", buf, lens[i], want);
    }
}

int main(void) {
    gcd_sha256_force_portable(0);
    have_sha_ni = strcmp(gcd_sha256_impl(), "sha-ni") == 0;
    gcd_sha256_force_portable(1);
    CHECK(strcmp(gcd_sha256_impl(), "portable") == 0, "forced: impl %s", gcd_sha256_impl());
    gcd_sha256_force_portable(0);
    printf("sha256: run-time choice %s%s\n", gcd_sha256_impl(),
           have_sha_ni ? "" : " (no SHA-NI on this CPU: the portable path only)");

    size_t nbuf = 1 << 20;
    unsigned char *buf = malloc(nbuf);
    CHECK(buf != NULL, "malloc %zu", nbuf);
    if (!buf) return 1;
    for (size_t i = 0; i < nbuf; i++) buf[i] = (unsigned char)(rng_next() >> 56);

    sha256_should_match_fips_vectors();
    every_length_should_agree_across_paths_and_pieces(buf);
    long_buffer_should_agree_across_paths(buf + 1, nbuf - 1);   // odd offset: unaligned loads
    sha256_should_match_sha256sum(buf);
    free(buf);

    if (mismatches > 3) fprintf(stderr, "  %d digests differed in all (first 3 shown)\n", mismatches);
    printf("%s: %d failure(s)\n", check_failures ? "FAILED" : "passed", check_failures);
    return check_failures != 0;
}
