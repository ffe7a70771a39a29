/*
 * check: the tests' one assertion style. CHECK counts a failure, prints where and what, and goes on,
 * so a test reports every broken case; main returns the count (non-zero fails ctest).
 */
#pragma once
#include <math.h>
#include <stdio.h>

static int check_failures;

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            check_failures++;                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                         \
            fprintf(stderr, "\n");                                                \
        }                                                                         \
    } while (0)

// relative closeness with a floor of 1 on the scale: |a - b| <= tol * max(1, |a|, |b|)
static inline int close_to(double a, double b, double tol) {
    double s = fmax(1.0, fmax(fabs(a), fabs(b)));
    return fabs(a - b) <= tol * s;
}
