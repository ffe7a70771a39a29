/*
 * f16: F16 (IEEE half) bits -> float, a table built by the compiler. Every value is exact (a whole
 * mantissa times a power of two), the same bits half_to_float gave when the table was filled at run time:
 * subnormals, infinities, and a quiet NaN for every NaN, with the half's sign. Constant: the check keeps no
 * mutable file-level state. Its own file: the table takes the compiler a few seconds.
 */
#include <math.h>

#include "check/safetensors.h"

// the magnitude of F16 bits h (the sign bit ignored); sign: nothing or '-'
#define F16_E(h) (((h) >> 10) & 0x1f)
#define F16_M(h) ((h) & 0x3ff)
#define F16_ABS(h) (F16_E(h) == 31 ? (F16_M(h) ? NAN : INFINITY) \
                    : (float)(F16_E(h) ? (F16_M(h) | 0x400) : F16_M(h)) * (float)(1u << (F16_E(h) ? F16_E(h) : 1)) / 33554432.0f)
#define F16(s, h) s F16_ABS(h)
// 16, 256, 4096 entries: the hex digits of h pasted one at a time
#define R16(s, p) F16(s, p##0), F16(s, p##1), F16(s, p##2), F16(s, p##3), F16(s, p##4), F16(s, p##5), F16(s, p##6), F16(s, p##7), \
                  F16(s, p##8), F16(s, p##9), F16(s, p##a), F16(s, p##b), F16(s, p##c), F16(s, p##d), F16(s, p##e), F16(s, p##f)
#define R256(s, p) R16(s, p##0), R16(s, p##1), R16(s, p##2), R16(s, p##3), R16(s, p##4), R16(s, p##5), R16(s, p##6), R16(s, p##7), \
                   R16(s, p##8), R16(s, p##9), R16(s, p##a), R16(s, p##b), R16(s, p##c), R16(s, p##d), R16(s, p##e), R16(s, p##f)
#define R4K(s, p) R256(s, p##0), R256(s, p##1), R256(s, p##2), R256(s, p##3), R256(s, p##4), R256(s, p##5), R256(s, p##6), R256(s, p##7), \
                  R256(s, p##8), R256(s, p##9), R256(s, p##a), R256(s, p##b), R256(s, p##c), R256(s, p##d), R256(s, p##e), R256(s, p##f)
#define HALF(s) R4K(s, 0x0), R4K(s, 0x1), R4K(s, 0x2), R4K(s, 0x3), R4K(s, 0x4), R4K(s, 0x5), R4K(s, 0x6), R4K(s, 0x7)

const float gcd_f16_table[65536] = { HALF(), HALF(-) };   // 0x0000..0x7fff, then the same negated (0x8000..0xffff)
