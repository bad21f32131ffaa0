// simd_ukr.h — the SIMD GEMM micro-kernel, written once: TL_UKR_DEFINE stamps out one kernel per ISA, dtype and
// row count (gemm.cpp's 6-row kernels, conv_implicit.cpp's 8-row AVX-512 ones).
//
// Contract (the one in gemm_ukr.h): c[i*ldc + j] += sum_k a[k*MR + i] * b[k*NR + j] for the full MR x NR tile,
// NR = 2 vectors; b 64-byte aligned (aligned loads), c any ldc (unaligned loads/stores).
// Per k: two loads of B, one broadcast of each of the MR values of A, 2*MR FMAs. The 2*MR accumulators are named
// registers (c00, c01, c10, ...): with an array of vectors GCC kept them in memory.
//
// Why macros and not a template: a kernel needs its own __attribute__((target(...))) and the intrinsics it calls
// must be inlined under that target. A template body compiled once for "avx2" and "avx512f" would either refuse to
// inline (target mismatch) or, compiled under the union of targets, let AVX-512 instructions into the AVX2 kernel.
#pragma once
#include <immintrin.h>
#include <sys/types.h>

// The op sets, one per ISA x dtype: TL_<ISA>_<DTYPE>_<op>. The prefixes themselves are never macros (they are
// pasted, not expanded).
#define TL_AVX2_F32_VEC __m256
#define TL_AVX2_F32_LANES 8
#define TL_AVX2_F32_ZERO _mm256_setzero_ps
#define TL_AVX2_F32_LOAD _mm256_load_ps
#define TL_AVX2_F32_LOADU _mm256_loadu_ps
#define TL_AVX2_F32_STOREU _mm256_storeu_ps
#define TL_AVX2_F32_BCAST _mm256_broadcast_ss
#define TL_AVX2_F32_FMA _mm256_fmadd_ps
#define TL_AVX2_F32_ADD _mm256_add_ps

#define TL_AVX2_F64_VEC __m256d
#define TL_AVX2_F64_LANES 4
#define TL_AVX2_F64_ZERO _mm256_setzero_pd
#define TL_AVX2_F64_LOAD _mm256_load_pd
#define TL_AVX2_F64_LOADU _mm256_loadu_pd
#define TL_AVX2_F64_STOREU _mm256_storeu_pd
#define TL_AVX2_F64_BCAST _mm256_broadcast_sd
#define TL_AVX2_F64_FMA _mm256_fmadd_pd
#define TL_AVX2_F64_ADD _mm256_add_pd

#define TL_AVX512_F32_VEC __m512
#define TL_AVX512_F32_LANES 16
#define TL_AVX512_F32_ZERO _mm512_setzero_ps
#define TL_AVX512_F32_LOAD _mm512_load_ps
#define TL_AVX512_F32_LOADU _mm512_loadu_ps
#define TL_AVX512_F32_STOREU _mm512_storeu_ps
#define TL_AVX512_F32_BCAST(p) _mm512_set1_ps(*(p))
#define TL_AVX512_F32_FMA _mm512_fmadd_ps
#define TL_AVX512_F32_ADD _mm512_add_ps

#define TL_AVX512_F64_VEC __m512d
#define TL_AVX512_F64_LANES 8
#define TL_AVX512_F64_ZERO _mm512_setzero_pd
#define TL_AVX512_F64_LOAD _mm512_load_pd
#define TL_AVX512_F64_LOADU _mm512_loadu_pd
#define TL_AVX512_F64_STOREU _mm512_storeu_pd
#define TL_AVX512_F64_BCAST(p) _mm512_set1_pd(*(p))
#define TL_AVX512_F64_FMA _mm512_fmadd_pd
#define TL_AVX512_F64_ADD _mm512_add_pd

// per row i of the tile, with op set O
#define TL_UKR_DECL(i, O) O##_VEC c##i##0 = O##_ZERO(), c##i##1 = O##_ZERO();
#define TL_UKR_ROW(i, O)          \
  ai = O##_BCAST(a + i);          \
  c##i##0 = O##_FMA(ai, b0, c##i##0); \
  c##i##1 = O##_FMA(ai, b1, c##i##1);
#define TL_UKR_STORE(i, O)                                          \
  O##_STOREU(c + i * ldc, O##_ADD(O##_LOADU(c + i * ldc), c##i##0)); \
  O##_STOREU(c + i * ldc + O##_LANES, O##_ADD(O##_LOADU(c + i * ldc + O##_LANES), c##i##1));
#define TL_UKR_ROWS6(X, O) X(0, O) X(1, O) X(2, O) X(3, O) X(4, O) X(5, O)
#define TL_UKR_ROWS8(X, O) TL_UKR_ROWS6(X, O) X(6, O) X(7, O)

// AVX512_BF16 (gemm.cpp's bf16_matmul): a and b hold bf16 pairs (two consecutive k in one 32-bit lane); vdpbf16ps
// adds both products of each lane pair to the fp32 accumulator, so one "k" of the loop is two k of the GEMM. The
// pairs travel in __m512 registers (loads and the 32-bit broadcast move bits, no arithmetic) and are reinterpreted
// as __m512bh for the dot product.
#define TL_AVX512_BF16_VEC __m512
#define TL_AVX512_BF16_LANES 16
#define TL_AVX512_BF16_ZERO _mm512_setzero_ps
#define TL_AVX512_BF16_LOAD(p) _mm512_load_ps(reinterpret_cast<const float*>(p))
#define TL_AVX512_BF16_LOADU _mm512_loadu_ps
#define TL_AVX512_BF16_STOREU _mm512_storeu_ps
#define TL_AVX512_BF16_BCAST(p) _mm512_set1_ps(*reinterpret_cast<const float*>(p))
#define TL_AVX512_BF16_FMA(a, b, c) _mm512_dpbf16_ps(c, (__m512bh)(a), (__m512bh)(b))
#define TL_AVX512_BF16_ADD _mm512_add_ps

// void NAME(ssize_t kc, const P* a, const P* b, T* c, ssize_t ldc): an MR x (2 vectors) kernel, MR = 6 or 8, over
// packed elements P (T itself, or gemm.cpp's Bf16Pair) accumulating into T
#define TL_UKR_DEFINE(NAME, TARGET, T, O, MR) TL_UKR_DEFINE_PACKED(NAME, TARGET, T, T, O, MR)
#define TL_UKR_DEFINE_PACKED(NAME, TARGET, P, T, O, MR)                                              \
  __attribute__((target(TARGET))) void NAME(ssize_t kc, const P* a, const P* b, T* c, ssize_t ldc) { \
    TL_UKR_ROWS##MR(TL_UKR_DECL, O) for (ssize_t k = 0; k < kc; ++k, a += MR, b += 2 * O##_LANES) {  \
      const O##_VEC b0 = O##_LOAD(b), b1 = O##_LOAD(b + O##_LANES);                                  \
      O##_VEC ai;                                                                                    \
      TL_UKR_ROWS##MR(TL_UKR_ROW, O)                                                                 \
    }                                                                                                \
    TL_UKR_ROWS##MR(TL_UKR_STORE, O)                                                                 \
  }
