// memcpy_bw: this machine's single-thread memcpy bandwidth, the yardstick for `check` throughput.
// Copies a 256 MiB buffer into another (both touched first, so no page faults are timed), best of
// several reps, and prints one machine-readable line: `memcpy_gbs X` (bytes copied per second / 1e9).
// usage: memcpy_bw [MiB] [reps]       build: cc -O2 -o memcpy_bw memcpy_bw.c
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 256;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (mib == 0 || reps <= 0) {
        fprintf(stderr, "usage: %s [MiB > 0] [reps > 0]\n", argv[0]);
        return 2;
    }
    size_t n = mib << 20;
    unsigned char *src = malloc(n), *dst = malloc(n);
    if (!src || !dst) {
        fprintf(stderr, "memcpy_bw: cannot allocate 2 x %zu MiB\n", mib);
        return 3;
    }
    for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 131u + 7u);
    memset(dst, 1, n);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        memcpy(dst, src, n);
        t = now_s() - t;
        if (t < best) best = t;
        src[(size_t)r * 4099u % n] ^= dst[(size_t)r * 8191u % n]; // keep the copies observable
    }
    unsigned sum = 0;
    for (size_t i = 0; i < n; i += 4096) sum += dst[i];
    fprintf(stderr, "memcpy_bw: %zu MiB x %d reps, best %.4f s (checksum %u)\n", mib, reps, best, sum);
    printf("memcpy_gbs %.2f\n", (double)n / best / 1e9);
    free(src);
    free(dst);
    return 0;
}
