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

/* exp(v) for v <= 0 (a log kernel weight), with v < -708.39 flushed to 0 (results under
 * 2.3e-308, down to the smallest normal number and below): every sum of kernel weights
 * above 1e-307 is unchanged.
 * The reduction is by ln 2 / 2, not ln 2: k = round(2 v / ln 2), r = v - k ln 2 / 2 in two
 * parts (|r| <= ln 2 / 4, so a degree-9 polynomial suffices where dkern_exp1's needs 12:
 * four fewer multiply-adds, the most of a fused Gaussian entry's time), and
 * 2^(k/2) = 2^floor(k/2) times sqrt 2 for odd k, built as one float from the bits of the
 * shifted 2 v / ln 2 itself: (k + 2046) / 2 is floor(k/2) + 1023, the biased exponent
 * (k >= -2044 for v >= -708.39), and sqrt 2's mantissa bits are added for odd k.
 * The polynomial is 1 + r + r^2 q(r), q interpolating (e^r - 1 - r) / r^2 at the 8
 * Chebyshev nodes of [-ln 2 / 4, ln 2 / 4] in 50-digit arithmetic (mpmath), its
 * coefficients then rounded: p(r) / e^r - 1 stays under 7e-17 on the interval. Rows past
 * the floor compute garbage (the shift is not valid there) that the last select drops:
 * NaN stays NaN (the comparison is false). */
static inline double dkern_exp_nonpositive(double v) {
    const double two_log2e = 2.8853900817779268, half_ln2_hi = 3.46573590184561908245e-01,
                 half_ln2_lo = 9.54107464635293850010e-11, shifter = 0x1.8p52;
    const uint64_t sqrt2_mantissa = dkern_bits_of(1.4142135623730951) - dkern_bits_of(1.0);
    int tiny = v < -708.39;
    double shifted = v * two_log2e + shifter, k = shifted - shifter;
    double r = (v - k * half_ln2_hi) - k * half_ln2_lo;
    double r2 = r * r, r4 = r2 * r2;  /* Estrin's scheme: short dependent chains */
    double q = ((0.4999999999999982 + r * 0.16666666666666652)
                + r2 * (0.0416666666685329 + r * 0.008333333333502979))
               + r4 * ((0.0013888885781551924 + r * 0.00019841267016596002)
                       + r2 * (2.4818142507284034e-05 + r * 2.757236868671373e-06));
    double p = 1.0 + (r + r2 * q);
    uint64_t biased = dkern_bits_of(shifted) - dkern_bits_of(shifter) + 2046;  /* k + 2046 */
    double scale = dkern_double_of(((biased >> 1) << 52)
                                   + ((0 - (biased & 1)) & sqrt2_mantissa));
    return tiny ? 0.0 : p * scale;
}
#endif
