/* exp of one float64, written so that the compiler vectorises the loops that call it
 * (AVX2, AVX-512, NEON); shared by fastexp.c and fused_gaussian.c.
 *
 * numpy's float64 exp is vectorised only on AVX-512 CPUs; elsewhere it calls libm once per
 * value (~5 ns), which makes exp the dominant cost of a Gaussian kernel tile. Here:
 * k = round(x / ln 2) by the 1.5 * 2^52 shifter, r = x - k ln 2 in two parts (Cody & Waite),
 * exp(r) by its degree-12 Taylor polynomial (truncation < 2e-16 for |r| <= ln 2 / 2), and
 * 2^k as two halves built from exponent bits, so results down to the subnormals are right
 * (dkern_exp1: NaN, +-inf, overflow and underflow as numpy; its error against numpy is
 * checked when built, fastexp.py). Build with -fno-trapping-math so the clamps become branch-free selects.
 */
#ifndef DKERN_EXP_H
#define DKERN_EXP_H
#include <stdint.h>
#include <string.h>

static inline uint64_t dkern_bits_of(double d) { uint64_t b; memcpy(&b, &d, 8); return b; }
static inline double dkern_double_of(uint64_t b) { double d; memcpy(&d, &b, 8); return d; }

/* exp(r) for |r| <= ln 2 / 2: the degree-12 Taylor polynomial with its terms above r
 * grouped by Estrin's scheme (a few dependent multiply-adds where Horner's takes thirteen:
 * a loop of exps is bound by this chain's latency, not by the multiply-adds' count), and
 * 1 + r added last, so their rounding is the only one at the result's scale. */
static inline double dkern_exp_reduced(double r) {
    double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
    double a = 1.0 / 2 + r * (1.0 / 6);
    double b = (1.0 / 24 + r * (1.0 / 120)) + r2 * (1.0 / 720 + r * (1.0 / 5040));
    double c = (1.0 / 40320 + r * (1.0 / 362880))
               + r2 * (1.0 / 3628800 + r * (1.0 / 39916800)) + r4 * (1.0 / 479001600);
    return 1.0 + (r + (r2 * a + (r4 * b + r8 * c)));
}

static inline double dkern_exp1(double v) {
    const double log2e = 1.4426950408889634, ln2_hi = 6.93147180369123816490e-01,
                 ln2_lo = 1.90821492927058770002e-10, shifter = 0x1.8p52;
    const uint64_t shifter_bits = dkern_bits_of(shifter);
    v = v < -746.0 ? -746.0 : v; /* exp(-746) underflows to 0: NaN passes both tests */
    v = v > 710.0 ? 710.0 : v;   /* exp(710) overflows to inf */
    double k = (v * log2e + shifter) - shifter;
    double p = dkern_exp_reduced((v - k * ln2_hi) - k * ln2_lo);
    /* 2^k = 2^k1 * 2^k2 with k1 = round(k / 2): each half stays a normal number */
    double k1 = (k * 0.5 + shifter) - shifter, k2 = k - k1;
    double s1 = dkern_double_of((dkern_bits_of(k1 + shifter) - shifter_bits + 1023) << 52);
    double s2 = dkern_double_of((dkern_bits_of(k2 + shifter) - shifter_bits + 1023) << 52);
    return p * s1 * s2;
}

/* exp(v) for v <= 0 (a log kernel weight), with results below the smallest normal
 * number (v < -708.39) flushed to 0: one scaling by 2^k, built from the bits of the
 * shifted v / ln 2 itself. Every sum of kernel weights above 1e-308 is unchanged. */
static inline double dkern_exp_nonpositive(double v) {
    const double log2e = 1.4426950408889634, ln2_hi = 6.93147180369123816490e-01,
                 ln2_lo = 1.90821492927058770002e-10, shifter = 0x1.8p52;
    int tiny = v < -708.39;
    v = tiny ? 0.0 : v;
    double shifted = v * log2e + shifter, k = shifted - shifter;
    double p = dkern_exp_reduced((v - k * ln2_hi) - k * ln2_lo);
    double scale = dkern_double_of((dkern_bits_of(shifted) - dkern_bits_of(shifter) + 1023)
                                   << 52);
    return tiny ? 0.0 : p * scale;
}
#endif
