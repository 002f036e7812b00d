/* The host's peak multiply-add rate: ten independent chains of vector multiply-adds (enough
 * to cover the latency of two units), compiled by dkern's native machinery with the flags
 * the fused loops get (benchmarks/_results.py, peak_rates). */
#include <stddef.h>
#include "../dkern/kernels/dkern_vec.h"
enum { CHAINS = 10 };

/* Runs `iterations` rounds of CHAINS vector multiply-adds; returns the lane multiply-adds
 * done, and their sum in *sink (so the compiler keeps them). */
long dkern_peak_fma(long iterations, double *sink) {
    vec a[CHAINS], b, c;
    for (int u = 0; u < VW; u++) { b[u] = 1.0 - 1e-9; c[u] = 1e-9; }
    for (int i = 0; i < CHAINS; i++) for (int u = 0; u < VW; u++) a[i][u] = i + u;
    for (long it = 0; it < iterations; it++)
        for (int i = 0; i < CHAINS; i++) a[i] = a[i] * b + c;
    double s = 0.0;
    for (int i = 0; i < CHAINS; i++) for (int u = 0; u < VW; u++) s += a[i][u];
    *sink = s;
    return iterations * CHAINS * VW;
}
