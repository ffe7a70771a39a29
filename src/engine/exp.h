/*
 * exp: exp() over an array, with this process's libm's bits; several values at a time where that can
 * be done bit for bit (glibc's exp on a CPU with AVX2 and FMA), one exp() call each elsewhere.
 */
#pragma once
#include <stddef.h>

void gcd_exp_n(double *y, const double *x, size_t n);   // y (n) = exp(x (n)); y may be x
int gcd_exp_fast(void);   // 1 where gcd_exp_n runs four at a time (it then checked itself against exp())
