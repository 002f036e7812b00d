/* Fused Gaussian kernel products and smoothing sums on the CPU: distance, kernel value
 * and accumulation, a strip of kernel values at a time in L1, never a tile in memory
 * (dkern/backends/fused_cpu.py calls these).
 *
 * k(x, z) = exp(c * sum_k (w_k (x_k - z_k))^2): differences first, then the lengthscale,
 * as numpy's exact path, so a far row keeps the digits of a small difference. A scalar
 * lengthscale folds into c (w = NULL): one multiply per entry instead of one per feature.
 *
 * Layout: z is packed in blocks of PACK columns, each block's d x PACK values contiguous
 * (zP[b][k][u] = z[b PACK + u][k], as a GEMM packs its operands: every load of the
 * distance loop is sequential, however many features), and v is transposed (t x ld).
 * The distances are vectorised over columns, ROWS rows of x at a time, so each z value
 * loaded serves ROWS rows; the exps and sums are loops the compiler vectorises
 * (#pragma omp simd, built with -fopenmp-simd), the ROWS rows side by side as
 * independent chains. A panel of columns stays in L2 while every row of x walks it.
 * Everything lives on the stack or in the caller's arrays: the functions are reentrant
 * (ctypes releases the GIL; dask runs tasks side by side).
 */
#include <math.h>
#include <stddef.h>
#include <string.h>
#include "dkern_exp.h"
/* vec, VW doubles: the distances are written with vectors because the auto-vectoriser,
 * given the loop over features inside the loop over columns, vectorises the features (a
 * reduction per column) and loses the sums kept in registers across them. */
#include "dkern_vec.h"

enum { STRIP = 256, ROWS = 4, PACK = 16, PANEL_BYTES = 256 * 1024 };

static inline vec load(const double *p) { vec v; memcpy(&v, p, sizeof v); return v; }
static inline void store(double *p, vec v) { memcpy(p, &v, sizeof v); }

/* e[r][j] = c * s(x_r, z_{j0 + j}) for the ROWS rows of x at xr[r] (rows may repeat),
 * j < cols rounded up to 2 VW (zP holds whole blocks of PACK columns); s is the squared
 * distance, each difference times w[k] (unless w is NULL) before squaring.
 * ROWS x 2 independent sums: enough to hide the multiply-add's latency. */
static inline __attribute__((always_inline)) void strip_logs(
        const double *const xr[ROWS], const double *zP, ptrdiff_t d,
        const double *w, double c, ptrdiff_t j0, int cols, double e[ROWS][STRIP]) {
    for (int j = 0; j < cols; j += 2 * VW) {
        vec s[ROWS][2] = {{{0.0}}};
        const double *block = zP + (j0 + j) / PACK * d * PACK + (j0 + j) % PACK;
        for (ptrdiff_t k = 0; k < d; k++) {
            vec za = load(block + k * PACK), zb = load(block + k * PACK + VW);
            for (int r = 0; r < ROWS; r++) {
                vec a = xr[r][k] - za, b = xr[r][k] - zb;
                if (w) { a *= w[k]; b *= w[k]; }
                s[r][0] += a * a; s[r][1] += b * b;
            }
        }
        for (int r = 0; r < ROWS; r++) {
            store(&e[r][j], c * s[r][0]);
            store(&e[r][j + VW], c * s[r][1]);
        }
    }
}

/* e[r] = exp(e[r] - shift[r]) in place for the strip's ROWS rows, the rows' exps side by
 * side: each exp is a chain of dependent multiply-adds, and independent chains keep the
 * units busy. A pass of its own over the strip (in L1): the exp inside the distance loop,
 * beside its ROWS x 2 sums, ran out of registers and was slower (~20%, AVX2). */
static inline void exp_rows(double e[ROWS][STRIP], int cols, const double shift[ROWS]) {
    const double s0 = shift[0], s1 = shift[1], s2 = shift[2], s3 = shift[3];
    #pragma omp simd
    for (int j = 0; j < cols; j++) {
        e[0][j] = dkern_exp_nonpositive(e[0][j] - s0);
        e[1][j] = dkern_exp_nonpositive(e[1][j] - s1);
        e[2][j] = dkern_exp_nonpositive(e[2][j] - s2);
        e[3][j] = dkern_exp_nonpositive(e[3][j] - s3);
    }
}

/* out[r * stride] += scale * sum_j e[r][j] v[j] for r < rows: the ROWS sums side by side
 * (one sum alone would wait on its own adds) and each v[j] loaded once for all rows. */
static inline void accumulate(double e[ROWS][STRIP], int cols, const double *v, double scale,
                              double *out, ptrdiff_t stride, int rows) {
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    #pragma omp simd reduction(+:a0, a1, a2, a3)
    for (int j = 0; j < cols; j++) {
        a0 += e[0][j] * v[j]; a1 += e[1][j] * v[j]; a2 += e[2][j] * v[j]; a3 += e[3][j] * v[j];
    }
    double a[ROWS] = {a0, a1, a2, a3};
    for (int r = 0; r < rows; r++) out[r * stride] += scale * a[r];
}

/* Columns of z per panel: as many strips as fit PANEL_BYTES (half an L2 cache), so the
 * panel stays in L2 while every row of x walks it. */
static inline ptrdiff_t panel_columns(ptrdiff_t d) {
    ptrdiff_t strips = PANEL_BYTES / (8 * STRIP * (d > 0 ? d : 1));
    return STRIP * (strips > 1 ? strips : 1);
}

/* The rows i0 .. i0 + ROWS - 1 of x, the last repeated past n (their results unused). */
static inline void row_pointers(const double *x, ptrdiff_t n, ptrdiff_t d, ptrdiff_t i0,
                                const double *xr[ROWS]) {
    for (int r = 0; r < ROWS; r++) xr[r] = x + (i0 + r < n ? i0 + r : n - 1) * d;
}

/* Raise each row's running maximum (out row r: [max log weight, sums...], stride apart)
 * to the strip's where that is larger, rescaling the row's sums (an online log-sum-exp);
 * shift[r] = the row's maximum after, by which the strip's weights are then scaled. */
static inline void raise_maxima(double e[ROWS][STRIP], int cols, double *out,
                                ptrdiff_t stride, ptrdiff_t t, int rows, double shift[ROWS]) {
    double t0 = -INFINITY, t1 = -INFINITY, t2 = -INFINITY, t3 = -INFINITY;
    #pragma omp simd reduction(max:t0, t1, t2, t3)
    for (int j = 0; j < cols; j++) {
        t0 = e[0][j] > t0 ? e[0][j] : t0; t1 = e[1][j] > t1 ? e[1][j] : t1;
        t2 = e[2][j] > t2 ? e[2][j] : t2; t3 = e[3][j] > t3 ? e[3][j] : t3;
    }
    const double top[ROWS] = {t0, t1, t2, t3};
    for (int r = 0; r < ROWS; r++) {
        double *row = out + (r < rows ? r : 0) * stride;
        if (r < rows && top[r] > row[0]) {  /* exp(-inf) = 0: the empty start rescales to 0 */
            double rescale = exp(row[0] - top[r]);
            for (ptrdiff_t q = 0; q < t; q++) row[1 + q] *= rescale;
            row[0] = top[r];
        }
        shift[r] = r < rows ? row[0] : top[r];  /* a repeated row's weights stay <= 1 */
        /* no finite weight yet (every distance so far overflowed): exp(-inf - 0) = 0,
         * where the shift -inf gave exp(-inf + inf) = NaN */
        if (shift[r] == -INFINITY) shift[r] = 0.0;
    }
}

/* The loop both entry points share: each panel of columns, each ROWS rows of x, each strip
 * of the panel; the strip's c * distances, then (log_sums) the online log-sum-exp of
 * dkern_gaussian_log_sums or (else) the product of dkern_gaussian_matvec. Inlined into each
 * with log_sums a constant, so neither carries the other's branch. */
static inline __attribute__((always_inline)) void walk_strips(
        const double *x, const double *zP, const double *vT, const double *w, ptrdiff_t n,
        ptrdiff_t m, ptrdiff_t ld, ptrdiff_t d, ptrdiff_t t, double c, double scale,
        double *out, int log_sums) {
    double e[ROWS][STRIP], shift[ROWS] = {0.0};
    const double *xr[ROWS];
    ptrdiff_t panel = panel_columns(d), width = log_sums ? 1 + t : t;
    for (ptrdiff_t p0 = 0; p0 < m; p0 += panel) {
        ptrdiff_t p1 = p0 + panel < m ? p0 + panel : m;
        for (ptrdiff_t i0 = 0; i0 < n; i0 += ROWS) {
            row_pointers(x, n, d, i0, xr);
            int rows = n - i0 < ROWS ? (int)(n - i0) : ROWS;
            double *rows_out = out + i0 * width;
            for (ptrdiff_t j0 = p0; j0 < p1; j0 += STRIP) {
                int cols = p1 - j0 < STRIP ? (int)(p1 - j0) : STRIP;
                if (w) strip_logs(xr, zP, d, w, c, j0, cols, e);
                else strip_logs(xr, zP, d, NULL, c, j0, cols, e);
                if (log_sums) raise_maxima(e, cols, rows_out, width, t, rows, shift);
                exp_rows(e, cols, shift);
                for (ptrdiff_t q = 0; q < t; q++)
                    accumulate(e, cols, vT + q * ld + j0, scale, rows_out + log_sums + q, width,
                               rows);
            }
        }
    }
}

/* out (n x t, row-major) += K(x, z) v: x (n x d), z packed as zP (module comment), vT
 * (t x ld) with ld >= m rounded up to PACK (the padding read, never used), w (d) or NULL,
 * c = -1/2 (times 1/l^2 for a scalar lengthscale, and the kernel's constant in scale). */
void dkern_gaussian_matvec(const double *restrict x, const double *restrict zP,
                           const double *restrict vT, const double *restrict w,
                           ptrdiff_t n, ptrdiff_t m, ptrdiff_t ld, ptrdiff_t d, ptrdiff_t t,
                           double c, double scale, double *restrict out) {
    walk_strips(x, zP, vT, w, n, m, ld, d, t, c, scale, out, 0);
}

/* out (n x (1 + t)) = [max_j L_ij, sum_j e^(L_ij - max) vT[:, j]] per row, L = c * s:
 * the log-scaled weighted sums of kernel smoothing (an online log-sum-exp over strips);
 * out's rows start as [-inf, 0 ...] (the empty sum) or a previous call's result. */
void dkern_gaussian_log_sums(const double *restrict x, const double *restrict zP,
                             const double *restrict vT, const double *restrict w,
                             ptrdiff_t n, ptrdiff_t m, ptrdiff_t ld, ptrdiff_t d, ptrdiff_t t,
                             double c, double *restrict out) {
    walk_strips(x, zP, vT, w, n, m, ld, d, t, c, 1.0, out, 1);
}
