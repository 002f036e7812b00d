/* One hardware vector of doubles, by GCC's and Clang's vector extension (8 lanes with
 * AVX-512, 4 with AVX, else 2); shared by fused_gaussian.c and benchmarks/_peak.c, so the
 * peak that benchmark measures is that of the fused loop's own vectors. */
#ifndef DKERN_VEC_H
#define DKERN_VEC_H
#if defined(__AVX512F__)
#define VW 8
#elif defined(__AVX__)
#define VW 4
#else
#define VW 2
#endif
typedef double vec __attribute__((vector_size(VW * sizeof(double))));
#endif
