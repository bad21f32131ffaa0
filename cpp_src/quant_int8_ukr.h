// quant_int8_ukr.h — what the three int8 GEMM ladders share (quant_int8_gemm.cpp: per-call int8_gemm;
// quant_int8_packed.cpp: int8_pack / int8_gemm_packed; quant_int8_dynamic.cpp: the fused dynamic Linear; and
// quant_int8_strassen.cpp): the packed-B byte layout (pack_b_vnni, NPW, KCB), the feature check, the int8 argument
// check, and the packed-B ladder's micro-kernels (scalar, avx2_u7, avx2_madd16, avx2_wino, avx512vnni) behind micro().
// Header-only, in namespace tl::q8 (inline: one copy of each function in the extension).
// Why one file (> 500 lines): the five micro-kernels read one packed-B layout and one A-operand layout and are
// chosen by one switch (micro); the layout, its kernels and the switch change together.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "cpu_features.h"
#include "registry.h"

namespace tl::q8 {

using i8 = int8_t;
using i32 = int32_t;

// ---------------------------------------------------------------- AVX-512 VNNI (dpbusd with offset)
constexpr int NV = 4;         // zmm vectors of 16 columns per panel -> 64 columns
constexpr int NPW = 16 * NV;  // panel width
constexpr ssize_t KCB = 64;   // K block in 4-byte words: a 64 x 64-column B block is 16 KB and stays in L1

// P[p][kq][c][t] (c < NPW, t < 4) = B[4kq+t][NPW p+c] (0 outside); colsum[j] = sum_k B[k][j]
inline void pack_b_vnni(const i8* B, i8* P, i32* colsum, ssize_t K, ssize_t N) {
  const ssize_t K4 = (K + 3) / 4, NP = (N + NPW - 1) / NPW;
#pragma omp parallel for schedule(static)
  for (ssize_t p = 0; p < NP; ++p) {
    const ssize_t j0 = NPW * p, nj = std::min<ssize_t>(NPW, N - j0);
    i32* cs = colsum + p * NPW;
    for (int c = 0; c < NPW; ++c) cs[c] = 0;
    for (ssize_t kq = 0; kq < K4; ++kq) {
      i8* dst = P + (p * K4 + kq) * NPW * 4;
      for (int t = 0; t < 4; ++t) {
        const ssize_t k = 4 * kq + t;
        const i8* src = (k < K) ? B + k * N + j0 : nullptr;
        for (int c = 0; c < NPW; ++c) {
          const i8 v = (src && c < nj) ? src[c] : i8(0);
          dst[c * 4 + t] = v;
          cs[c] += v;
        }
      }
    }
  }
}

// Effective features (tl::cpu_has honours TINYLEARN_CPU_FEATURES=scalar|avx2|avx512).
inline bool has(const char* f) {
  if (std::string(f) == "avx2") return tl::cpu_has("avx2");
  if (std::string(f) == "avx512vnni")
    return tl::cpu_has("avx512f") && tl::cpu_has("avx512bw") && tl::cpu_has("avx512vnni");
  return false;
}

inline py::array_t<i8, py::array::c_style> as_int8(const py::array& x, const char* name) {
  if (!x.dtype().is(py::dtype::of<i8>()))
    throw py::type_error(std::string("int8_gemm: ") + name + " must have dtype int8, got " +
                         std::string(py::str(x.dtype())));
  if (x.ndim() != 2)
    tl::value_error(std::string("int8_gemm: ") + name + " must be 2-D, got ndim " + std::to_string(x.ndim()));
  return py::array_t<i8, py::array::c_style>::ensure(x);
}

// ================================================================ packed-B ladder (one byte layout, every path)
// B is packed once (int8_pack: the pack_b_vnni layout [N/64][K/4][64][4] plus colsum(B)) and every path reads the
// same bytes. A reaches the kernels as u8 "codes" Au (rows padded to MR, K padded to 4): int8 A is offset to
// a ^ 0x80 = a + 128, uint8 A (dynamic activations) is taken as is. Each kernel computes S = Au @ B exactly and
// the epilogue removes the offset: C = S - offset * colsum(B).
//   vnni          zmm vpdpbusd: u8 x s8, 4 products per int32 lane summed straight into int32 (exact)
//   avx2_madd16   ymm: B bytes sign-extended to int16 (vpmovsxbw) once per call and K block, shared by the threads
//                 (WideB), A as int16, vpmaddwd + vpaddd.
//                 int16 x int16 pair sums land in int32: exact for the full u8 (0..255) x s8 range
//   avx2_u7       ymm: vpmaddubsw (u8 x s8 pairs summed to int16 WITH SATURATION) + vpmaddwd by ones + vpaddd.
//                 Exact only when every A byte is <= 127 (|pair| <= 2*127*128 = 32512 < 32767): fbgemm's
//                 reduce_range trick. The driver checks the bound and refuses larger codes.
//   scalar        portable loops on the same layout
// maddubs_saturating runs the avx2_u7 kernel WITHOUT the bound check: a teaching rung that shows what the
// instruction does to 8-bit activations (int8_gemm_maddubs_saturating); never chosen by dispatch.
//   avx2_wino     ymm: Winograd's inner-product trick (S. Winograd, "A new algorithm for inner product", IEEE Trans.
//                 Computers 1968): for each k quad, (a0 + b1)(a1 + b0) + (a2 + b3)(a3 + b2) = a.b + (a0 a1 + a2 a3)
//                 + (b0 b1 + b2 b3), so ONE vpmaddwd lane covers 4 products of a column (madd16 needs two) at the
//                 price of two vpaddw; the row term is computed once per A row (kept in the row's padding), the
//                 column term once per B block (vpmaddwd of B's own halves). Sums a + b fit int16 (|.| <= 383),
//                 products and lane sums fit int32, everything else wraps mod 2^32 like the other paths: exact.
//                 It halves the multiplies, not the instructions (4 per 32 MACs, like madd16): it wins on cores whose
//                 one integer-multiply pipe is the bottleneck (Zen 2: 1 vpmaddwd per cycle next to 2 FMAs)
enum class Kern { scalar, avx2_madd16, avx2_u7, vnni, avx2_wino };

// S - off * colsum modulo 2^32: S may have wrapped (offset codes reach K * 255 * 128), the true result fits int32
inline i32 unoffset(i32 s, i32 off, i32 colsum) { return i32(uint32_t(s) - uint32_t(off) * uint32_t(colsum)); }

// micro kernels: R (<= MR) rows of A (row stride lda elements), B panel bp, kq in [k0, k1), ct[R][NPW] += S
template <int R>
void mk_scalar(const uint8_t* ap, ssize_t lda, const i8* bp, ssize_t k0, ssize_t k1, i32* ct) {
  for (int r = 0; r < R; ++r) {
    const uint8_t* a = ap + r * lda;
    i32* c = ct + r * NPW;
    for (ssize_t kq = k0; kq < k1; ++kq) {
      const i8* b = bp + kq * NPW * 4;
      const i32 a0 = a[4 * kq], a1 = a[4 * kq + 1], a2 = a[4 * kq + 2], a3 = a[4 * kq + 3];
      // the quad sum fits int32; the running sum wraps modulo 2^32 like the SIMD adds (no signed overflow)
      for (int j = 0; j < NPW; ++j)
        c[j] = i32(uint32_t(c[j]) + uint32_t(a0 * b[4 * j] + a1 * b[4 * j + 1] + a2 * b[4 * j + 2] + a3 * b[4 * j + 3]));
    }
  }
}

// sign-extend kq rows [k0, k1) of a packed B panel to int16 (once per block, reused by every row block), regrouped
// as [8 column groups][k1 - k0][8 columns x 4 k] for mk_madd16_6
__attribute__((target("avx2"))) inline void widen_block(const i8* bp, ssize_t k0, ssize_t k1, int16_t* bw) {
  const ssize_t kb = k1 - k0;
  for (ssize_t kq = k0; kq < k1; ++kq)
    for (int g = 0; g < NPW / 8; ++g) {
      const i8* src = bp + (kq * NPW + 8 * g) * 4;
      int16_t* dst = bw + (g * kb + (kq - k0)) * 32;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16),
                          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16))));
    }
}

template <int R>
__attribute__((target("avx2"))) void mk_u7(const uint8_t* ap, ssize_t lda, const i8* bp, ssize_t k0, ssize_t k1,
                                           i32* ct) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int cb = 0; cb < NPW; cb += 16) {
    __m256i acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (ssize_t kq = k0; kq < k1; ++kq) {
      const i8* b = bp + (kq * NPW + cb) * 4;
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
      for (int r = 0; r < R; ++r) {
        i32 a4;
        std::memcpy(&a4, ap + r * lda + 4 * kq, 4);
        const __m256i a = _mm256_set1_epi32(a4);
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b0), ones));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b1), ones));
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 2; ++v) {
        __m256i* c = reinterpret_cast<__m256i*>(ct + r * NPW + cb + 8 * v);
        _mm256_storeu_si256(c, _mm256_add_epi32(_mm256_loadu_si256(c), acc[r][v]));
      }
  }
}

// The 4-row kernel: 8 accumulators + 2 B + ones + a broadcast + 2 products = 14 ymm. Left to itself GCC hoisted
// the 4 broadcasts of a step ahead of the products and spilled an accumulator to the stack (a store-to-load chain
// every step; the -march=native build, with 32 registers, hid it): B and the accumulators are pinned per step, as
// in mk_madd16_6 below. True AVX2 build, 512x1024x1024: 3.55 -> 2.9 ms.
#define TL_PIN_U7(a, b, c, d, e, f, g, h) \
  __asm__("" : "+v"(a), "+v"(b), "+v"(c), "+v"(d), "+v"(e), "+v"(f), "+v"(g), "+v"(h))
template <>
__attribute__((target("avx2"))) inline void mk_u7<4>(const uint8_t* ap, ssize_t lda, const i8* bp, ssize_t k0, ssize_t k1,
                                              i32* ct) {
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* a0p = ap;
  const uint8_t* a1p = ap + lda;
  const uint8_t* a2p = ap + 2 * lda;
  const uint8_t* a3p = ap + 3 * lda;
  for (int cb = 0; cb < NPW; cb += 16) {
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00;
    for (ssize_t kq = k0; kq < k1; ++kq) {
      const i8* b = bp + (kq * NPW + cb) * 4;
      __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
      __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
      __asm__("" : "+v"(b0), "+v"(b1));
      i32 t;
#define TL_ROW(r)                                                                                   \
  std::memcpy(&t, a##r##p + 4 * kq, 4);                                                             \
  {                                                                                                 \
    const __m256i a = _mm256_set1_epi32(t);                                                         \
    c##r##0 = _mm256_add_epi32(c##r##0, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b0), ones));      \
    c##r##1 = _mm256_add_epi32(c##r##1, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b1), ones));      \
  }
      TL_ROW(0) TL_ROW(1) TL_ROW(2) TL_ROW(3)
#undef TL_ROW
      TL_PIN_U7(c00, c01, c10, c11, c20, c21, c30, c31);
    }
#define TL_ST(r, v)                                                         \
  {                                                                         \
    __m256i* c = reinterpret_cast<__m256i*>(ct + r * NPW + cb + 8 * v);     \
    _mm256_storeu_si256(c, _mm256_add_epi32(_mm256_loadu_si256(c), c##r##v)); \
  }
    TL_ST(0, 0) TL_ST(0, 1) TL_ST(1, 0) TL_ST(1, 1) TL_ST(2, 0) TL_ST(2, 1) TL_ST(3, 0) TL_ST(3, 1)
#undef TL_ST
  }
}

// 6-row blocks (the default for vnni and madd16): 24 zmm / 12 ymm accumulators. The B vectors of a K step are
// loaded once into registers and reused by all 6 rows; the empty asm pins them there -- left to itself GCC folds
// the loads into every dpbusd/madd (a memory operand per row), and on Zen 4 (two 256-bit loads per cycle) those
// loads, not the multiply units, then set the pace (the 4-row kernels these replaced ran at about half of peak).
#define TL_PIN(x) __asm__("" : "+v"(x))
// R = 1..6 rows: one template, every row's code under `if constexpr (r < R)` so unused accumulators vanish and
// short tail blocks (M % 6) cost in proportion to their rows (the 4-row array kernels they replaced were slower)
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void mk_vnni6(const uint8_t* ap, ssize_t lda, const i8* bp,
                                                                    ssize_t k0, ssize_t k1, i32* ct) {
  static_assert(R >= 1 && R <= 6, "rows");
  const __m512i z = _mm512_setzero_si512();
#define TL_LD(r, v) __m512i c##r##v = (r < R) ? _mm512_loadu_si512(ct + r * NPW + 16 * v) : z;
#define TL_ROW(r) TL_LD(r, 0) TL_LD(r, 1) TL_LD(r, 2) TL_LD(r, 3)
  TL_ROW(0) TL_ROW(1) TL_ROW(2) TL_ROW(3) TL_ROW(4) TL_ROW(5)
#undef TL_ROW
#undef TL_LD
  const uint8_t* a0p = ap;
  const uint8_t* a1p = ap + lda;
  const uint8_t* a2p = ap + 2 * lda;
  const uint8_t* a3p = ap + 3 * lda;
  const uint8_t* a4p = ap + 4 * lda;
  const uint8_t* a5p = ap + 5 * lda;
  const i8* b = bp + k0 * NPW * 4;
  for (ssize_t kq = k0; kq < k1; ++kq, b += NPW * 4) {
    __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 64), b2 = _mm512_loadu_si512(b + 128),
            b3 = _mm512_loadu_si512(b + 192);
    TL_PIN(b0);
    TL_PIN(b1);
    TL_PIN(b2);
    TL_PIN(b3);
    i32 t;
#define TL_ROW(r)                                    \
  if constexpr (r < R) {                             \
    std::memcpy(&t, a##r##p + 4 * kq, 4);            \
    const __m512i a = _mm512_set1_epi32(t);          \
    c##r##0 = _mm512_dpbusd_epi32(c##r##0, a, b0);   \
    c##r##1 = _mm512_dpbusd_epi32(c##r##1, a, b1);   \
    c##r##2 = _mm512_dpbusd_epi32(c##r##2, a, b2);   \
    c##r##3 = _mm512_dpbusd_epi32(c##r##3, a, b3);   \
  }
    TL_ROW(0) TL_ROW(1) TL_ROW(2) TL_ROW(3) TL_ROW(4) TL_ROW(5)
#undef TL_ROW
  }
#define TL_ST(r, v) \
  if constexpr (r < R) _mm512_storeu_si512(ct + r * NPW + 16 * v, c##r##v);
#define TL_ROW(r) TL_ST(r, 0) TL_ST(r, 1) TL_ST(r, 2) TL_ST(r, 3)
  TL_ROW(0) TL_ROW(1) TL_ROW(2) TL_ROW(3) TL_ROW(4) TL_ROW(5)
#undef TL_ROW
#undef TL_ST
}

// 6 rows x 8 columns per step: 12 ymm accumulators + 2 B + A + the madd result = all 16 ymm registers
template <int R>
__attribute__((target("avx2"))) void mk_madd16_6(const int16_t* ap, ssize_t lda, const int16_t* bw, ssize_t k0,
                                                 ssize_t k1, i32* ct) {
  static_assert(R >= 1 && R <= 6, "rows");
  const int16_t* a0p = ap;
  const int16_t* a1p = ap + lda;
  const int16_t* a2p = ap + 2 * lda;
  const int16_t* a3p = ap + 3 * lda;
  const int16_t* a4p = ap + 4 * lda;
  const int16_t* a5p = ap + 5 * lda;
  for (int cb = 0; cb < NPW; cb += 8) {
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const int16_t* b = bw + (cb / 8) * (k1 - k0) * 32;
    for (ssize_t kq = k0; kq < k1; ++kq, b += 32) {
      __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
      __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
      TL_PIN(b0);
      TL_PIN(b1);
      long long t;
#define TL_ROW(r)                                                    \
  if constexpr (r < R) {                                             \
    std::memcpy(&t, a##r##p + 4 * kq, 8);                            \
    const __m256i a = _mm256_set1_epi64x(t);                         \
    c##r##0 = _mm256_add_epi32(c##r##0, _mm256_madd_epi16(a, b0));   \
    c##r##1 = _mm256_add_epi32(c##r##1, _mm256_madd_epi16(a, b1));   \
  }
      TL_ROW(0) TL_ROW(1) TL_ROW(2) TL_ROW(3) TL_ROW(4) TL_ROW(5)
#undef TL_ROW
      // pin the accumulators at the end of the step too: without it GCC renames them every step and adds up to
      // 12 register moves per iteration, which on its own exceeds the 6-wide dispatch budget of the 24 madd/add
      // (pinning per row instead of here brings the moves back)
      __asm__("" : "+v"(c00), "+v"(c01), "+v"(c10), "+v"(c11), "+v"(c20), "+v"(c21));
      __asm__("" : "+v"(c30), "+v"(c31), "+v"(c40), "+v"(c41), "+v"(c50), "+v"(c51));
    }
#define TL_RED(r)                                                                             \
  if constexpr (r < R) {                                                                      \
    const __m256i h = _mm256_permute4x64_epi64(_mm256_hadd_epi32(c##r##0, c##r##1), 0xD8);   \
    __m256i* c = reinterpret_cast<__m256i*>(ct + r * NPW + cb);                               \
    _mm256_storeu_si256(c, _mm256_add_epi32(_mm256_loadu_si256(c), h));                       \
  }
    TL_RED(0) TL_RED(1) TL_RED(2) TL_RED(3) TL_RED(4) TL_RED(5)
#undef TL_RED
  }
}

// Winograd operand layouts. B: kq rows [k0, k1) of a packed panel as [2 halves][k1 - k0][4 column groups][X | Y],
// X = the 8 columns' (b1, b3), Y = their (b0, b2), int16: one kq of a 32-column half is 256 contiguous bytes and a
// half's block is contiguous (16 KB at 64 kq), so it spreads over every L1 set (a [kq][8 groups] layout read one
// half at a time maps onto half of them). A rows: each quad stored (a0, a2, a1, a3), so (a0, a2) and (a1, a3) are
// one 32-bit broadcast each; the row term a0 a1 + a2 a3 summed over the row sits (int32) at element K4 * 4.
__attribute__((target("avx2"))) inline void widen_block_wino(const i8* bp, ssize_t k0, ssize_t k1, int16_t* bw) {
  // per 128-bit lane (4 columns x 4 k bytes): odd k bytes (b1, b3) first, then even (b0, b2)
  const __m256i sel = _mm256_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                       0, 2, 4, 6, 8, 10, 12, 14);
  for (ssize_t kq = k0; kq < k1; ++kq)
    for (int g = 0; g < NPW / 8; ++g) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + (kq * NPW + 8 * g) * 4));
      // [X cols 0-3 | Y cols 0-3 | X cols 4-7 | Y cols 4-7] -> [X 0-3 | X 4-7 | Y 0-3 | Y 4-7]
      const __m256i q = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, sel), 0xD8);
      int16_t* dst = bw + (g / 4) * (k1 - k0) * 128 + (kq - k0) * 128 + (g % 4) * 32;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)));
    }
}

// the column terms of a widened Winograd block: cc[c] = sum_kq b0 b1 + b2 b3 (vpmaddwd of X and Y)
__attribute__((target("avx2"))) inline void wino_col_terms(const int16_t* bw, ssize_t kb, i32* cc) {
  __m256i acc[NPW / 8];
  for (int g = 0; g < NPW / 8; ++g) acc[g] = _mm256_setzero_si256();
  for (ssize_t t = 0; t < kb; ++t)
    for (int g = 0; g < NPW / 8; ++g) {
      const int16_t* b = bw + (g / 4) * kb * 128 + t * 128 + (g % 4) * 32;
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
      const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
      acc[g] = _mm256_add_epi32(acc[g], _mm256_madd_epi16(x, y));
    }
  for (int g = 0; g < NPW / 8; ++g) _mm256_storeu_si256(reinterpret_cast<__m256i*>(cc + 8 * g), acc[g]);
}

// 3 rows x 32 columns per step (two steps per 64-column panel): per row and k quad, two broadcasts xa = (a0, a2),
// ya = (a1, a3) serve four column groups: x = xa + X, y = ya + Y (B as memory operands), acc += vpmaddwd(x, y), one
// int32 lane per column (no final hadd). Measured on Zen 2: a 6 x 8 tile (one column group per broadcast pair) ran 7%
// slower than a 4 x 16 one (before the layout and alignment fixes); with them, 4 x 16 with B held in registers runs
// 8-10% slower than this tile (broadcasts, not loads, are what it saves), and this loop unrolled by 2 7% slower.
// The full tile is one asm block with fixed registers (GCC's allocator renamed the accumulators of an intrinsics
// loop every step): ymm0-11 accumulators (row r, group g in 4r + g), 12-13 the broadcasts, 14-15 x and y.
constexpr int WINO_MR = 3;
template <int R>
__attribute__((target("avx2"))) void mk_wino(const int16_t* ap, ssize_t lda, const int16_t* bw, ssize_t k0,
                                             ssize_t k1, i32* ct, int h0 = 0, int h1 = NPW / 32) {
  static_assert(R >= 1 && R <= WINO_MR, "rows");
  static_assert(NPW == 64, "the asm's tile offsets assume 64-column (256-byte) tile rows and 256-byte B steps");
  const ssize_t n = k1 - k0;
  if (n <= 0) return;
  for (int cb = 32 * h0; cb < 32 * h1; cb += 32) {
    const int16_t* b = bw + (cb / 32) * n * 128;  // this 32-column half's first kq
    i32* c = ct + cb;
    if constexpr (R == WINO_MR) {
      const int16_t* p0 = ap + 4 * k0;
      const int16_t* p1 = ap + lda + 4 * k0;
      const int16_t* p2 = ap + 2 * lda + 4 * k0;
      ssize_t left = n;
#define TL_WG(g, A)                                                                                              \
  "vpaddw " #g "*64(%[b]), %%ymm12, %%ymm14\n vpaddw " #g "*64+32(%[b]), %%ymm13, %%ymm15\n"                     \
  "vpmaddwd %%ymm15, %%ymm14, %%ymm14\n vpaddd %%ymm14, %%ymm" #A ", %%ymm" #A "\n"
#define TL_WR(P, A0, A1, A2, A3)                                                                                 \
  "vpbroadcastd (%[" #P "]), %%ymm12\n vpbroadcastd 4(%[" #P "]), %%ymm13\n" TL_WG(0, A0) TL_WG(1, A1)          \
      TL_WG(2, A2) TL_WG(3, A3) "add $8, %[" #P "]\n"
#define TL_WS(A, OFF) "vpaddd " #OFF "(%[c]), %%ymm" #A ", %%ymm" #A "\n vmovdqu %%ymm" #A ", " #OFF "(%[c])\n"
      __asm__ volatile(
          "vpxor %%xmm0, %%xmm0, %%xmm0\n vpxor %%xmm1, %%xmm1, %%xmm1\n vpxor %%xmm2, %%xmm2, %%xmm2\n"
          "vpxor %%xmm3, %%xmm3, %%xmm3\n vpxor %%xmm4, %%xmm4, %%xmm4\n vpxor %%xmm5, %%xmm5, %%xmm5\n"
          "vpxor %%xmm6, %%xmm6, %%xmm6\n vpxor %%xmm7, %%xmm7, %%xmm7\n vpxor %%xmm8, %%xmm8, %%xmm8\n"
          "vpxor %%xmm9, %%xmm9, %%xmm9\n vpxor %%xmm10, %%xmm10, %%xmm10\n vpxor %%xmm11, %%xmm11, %%xmm11\n"
          ".p2align 6\n1:\n" TL_WR(p0, 0, 1, 2, 3) TL_WR(p1, 4, 5, 6, 7) TL_WR(p2, 8, 9, 10, 11)
          "add $256, %[b]\n dec %[left]\n jnz 1b\n"
          TL_WS(0, 0) TL_WS(1, 32) TL_WS(2, 64) TL_WS(3, 96) TL_WS(4, 256) TL_WS(5, 288) TL_WS(6, 320)
          TL_WS(7, 352) TL_WS(8, 512) TL_WS(9, 544) TL_WS(10, 576) TL_WS(11, 608)
          : [p0] "+r"(p0), [p1] "+r"(p1), [p2] "+r"(p2), [b] "+r"(b), [left] "+r"(left)
          : [c] "r"(c)
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
            "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory");
#undef TL_WS
#undef TL_WR
#undef TL_WG
    } else {  // the last rows of a block: the same step in intrinsics
      __m256i acc[R][4];
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < 4; ++g) acc[r][g] = _mm256_setzero_si256();
      for (ssize_t kq = k0; kq < k1; ++kq, b += 128)
        for (int r = 0; r < R; ++r) {
          int32_t u, v;
          std::memcpy(&u, ap + r * lda + 4 * kq, 4);
          std::memcpy(&v, ap + r * lda + 4 * kq + 2, 4);
          const __m256i xa = _mm256_set1_epi32(u), ya = _mm256_set1_epi32(v);
          for (int g = 0; g < 4; ++g) {
            const __m256i* bg = reinterpret_cast<const __m256i*>(b + g * 32);
            const __m256i x = _mm256_add_epi16(xa, _mm256_loadu_si256(bg));
            const __m256i y = _mm256_add_epi16(ya, _mm256_loadu_si256(bg + 1));
            acc[r][g] = _mm256_add_epi32(acc[r][g], _mm256_madd_epi16(x, y));
          }
        }
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < 4; ++g) {
          __m256i* cp = reinterpret_cast<__m256i*>(c + r * NPW + 8 * g);
          _mm256_storeu_si256(cp, _mm256_add_epi32(_mm256_loadu_si256(cp), acc[r][g]));
        }
    }
  }
}

// an int16 operand row for the Winograd kernel: quads reordered (a0, a2, a1, a3), K padding zeroed, the row term
// sum a0 a1 + a2 a3 (mod 2^32) stored as int32 at element K4 * 4 (inside the row's stride, see wino_lda)
template <typename T>
__attribute__((target("avx2"))) void wino_row(const T* a, ssize_t K, int16_t* dst, ssize_t lda) {
  static_assert(sizeof(T) <= 2, "int8 / uint8 codes, or int16 values (Strassen's operand sums, |v| <= 510)");
  const ssize_t K4 = (K + 3) / 4;
  // 16 codes (4 quads) per step: widen to int16, reorder each quad's words (a0, a1, a2, a3) -> (a0, a2, a1, a3)
  // (vpshufb within 128-bit lanes), row term from vpmaddwd of the reordered vector and its dword-swapped copy
  // (lane 2q and 2q + 1 both hold a0 a1 + a2 a3: the even lanes are kept)
  const __m256i sel = _mm256_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15,  //
                                       0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15);
  __m256i acc = _mm256_setzero_si256();
  ssize_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m256i w;
    if constexpr (sizeof(T) == 2) {
      w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + k));
    } else {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + k));
      w = std::is_signed_v<T> ? _mm256_cvtepi8_epi16(raw) : _mm256_cvtepu8_epi16(raw);
    }
    const __m256i r = _mm256_shuffle_epi8(w, sel);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), r);
    const __m256i t = _mm256_madd_epi16(r, _mm256_shuffle_epi32(r, 0xB1));
    acc = _mm256_add_epi32(acc, _mm256_blend_epi32(_mm256_setzero_si256(), t, 0x55));
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  uint32_t t = 0;
  for (int l = 0; l < 8; ++l) t += uint32_t(lanes[l]);
  for (ssize_t q = k / 4; q < K4; ++q) {  // the tail, K padding zero
    int16_t v[4];
    for (int u = 0; u < 4; ++u) v[u] = 4 * q + u < K ? int16_t(a[4 * q + u]) : int16_t(0);
    dst[4 * q] = v[0];
    dst[4 * q + 1] = v[2];
    dst[4 * q + 2] = v[1];
    dst[4 * q + 3] = v[3];
    t += uint32_t(int32_t(v[0]) * v[1] + int32_t(v[2]) * v[3]);
  }
  const i32 ti = i32(t);
  std::memcpy(dst + 4 * K4, &ti, 4);
  for (ssize_t e = 4 * K4 + 2; e < lda; ++e) dst[e] = 0;
}
inline i32 wino_row_term(const int16_t* row, ssize_t K4) {
  i32 t;
  std::memcpy(&t, row + 4 * K4, 4);
  return t;
}
#undef TL_PIN

// rows of A per micro-kernel block: 6 for vnni and madd16 (the register-blocked kernels above), 4 otherwise.
// A operands are padded to a multiple of MRP rows (zeros) so a block may read past M.
constexpr int MRP = 12;
inline int kern_mr(Kern k) {
  return (k == Kern::vnni || k == Kern::avx2_madd16) ? 6 : k == Kern::avx2_wino ? WINO_MR : 4;
}
inline bool kern_wide(Kern k) { return k == Kern::avx2_madd16 || k == Kern::avx2_wino; }  // int16 A operand
inline ssize_t padded_rows(ssize_t M) { return (M + MRP - 1) / MRP * MRP; }

// one (row block, K block) step of kernel `kern` for `rows` (1..kern_mr(kern)) rows
template <typename AT>
void micro(Kern kern, int rows, const AT* ap, ssize_t lda, const i8* bp, const int16_t* bw, ssize_t k0, ssize_t k1,
           i32* ct) {
#define TL_MK_CASES(FN, BPTR)                          \
  switch (rows) {                                      \
    case 1: FN<1>(ap, lda, BPTR, k0, k1, ct); break;   \
    case 2: FN<2>(ap, lda, BPTR, k0, k1, ct); break;   \
    case 3: FN<3>(ap, lda, BPTR, k0, k1, ct); break;   \
    default: FN<4>(ap, lda, BPTR, k0, k1, ct); break;  \
  }
#define TL_MK6_CASES(FN, BPTR)                            \
  switch (rows) {                                         \
    case 1: FN<1>(ap, lda, BPTR, k0, k1, ct); break;      \
    case 2: FN<2>(ap, lda, BPTR, k0, k1, ct); break;      \
    case 3: FN<3>(ap, lda, BPTR, k0, k1, ct); break;      \
    case 4: FN<4>(ap, lda, BPTR, k0, k1, ct); break;      \
    case 5: FN<5>(ap, lda, BPTR, k0, k1, ct); break;      \
    default: FN<6>(ap, lda, BPTR, k0, k1, ct); break;     \
  }
  if constexpr (std::is_same_v<AT, int16_t>) {
    (void)bp;
    if (kern == Kern::avx2_wino) {
      switch (rows) {
        case 1: mk_wino<1>(ap, lda, bw, k0, k1, ct); break;
        case 2: mk_wino<2>(ap, lda, bw, k0, k1, ct); break;
        default: mk_wino<3>(ap, lda, bw, k0, k1, ct); break;
      }
    } else {
      TL_MK6_CASES(mk_madd16_6, bw)
    }
  } else {
    (void)bw;
    if (kern == Kern::vnni) {
      TL_MK6_CASES(mk_vnni6, bp)
    } else if (kern == Kern::avx2_u7) {
      TL_MK_CASES(mk_u7, bp)
    } else {
      TL_MK_CASES(mk_scalar, bp)
    }
  }
#undef TL_MK6_CASES
#undef TL_MK_CASES
}

}  // namespace tl::q8
