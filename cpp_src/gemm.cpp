// gemm.cpp — C = A @ B from the textbook loop to a BLIS-style packed SIMD kernel (tinylearn._C.gemm).
//
// The ladder (each step keeps the previous step's idea and adds one; all take any strides, fp32 or fp64):
//   naive     i-j-k triple loop: the inner k loop walks B down a column (stride N), one cache line per FMA
//   ikj       loop order i-k-j: the inner loop streams a row of B and a row of C (unit stride, vectorisable)
//   blocked   ikj over KC x NC blocks of B and MC rows of A so the working set stays in L2 (cache blocking)
//   packed    BLIS loops: copy an MC x KC block of A and a KC x NC panel of B into contiguous micro-panels
//             (MR rows / NR columns interleaved, zero-padded) then a portable C++ MR x NR micro-kernel
//   simd      the same packing with a hand-written register-blocked micro-kernel: MR x NR accumulators held in
//             vector registers, one broadcast of A and NR/lanes loads of B per k, FMA (AVX2 6x16 / AVX-512
//             6x32 for fp32; 6x8 / 6x16 for fp64); runtime ISA dispatch, a scalar kernel as the fallback. Its
//             packing is vectorised where the packed layout is a transpose of the source (a row-major A, a
//             column-major B such as W.T): 8x8 register transposes (pack_a_t8 / pack_b_t8), 2-3x the scalar copy
//   parallel  simd + OpenMP: threads share the packed B panel and split C's rows into MC-sized blocks of whole
//             MR-row units spread evenly (each thread the same rows to one unit); each thread zeroes its own
//             blocks of C and runs the epilogue (bf16_matmul's bias and rounding) on them while they are in cache
// ISA dispatch: the best of avx512 > avx2 > scalar this CPU has; TINYLEARN_CPU_FEATURES=scalar|avx2|avx512 (or the
// isa= argument) forces one (ValueError when the CPU lacks it). The SIMD kernels are compiled with
// __attribute__((target(...))) so a portable build still contains them.
//   bf16_matmul  simd/parallel with bfloat16 operands widened to fp32 in the packing (autocast's GEMM, tl.amp);
//                on AVX512_BF16 (Zen 4, Sapphire Rapids) the same loops over bf16 pairs with vdpbf16ps (2 k per
//                instruction, half the packed bytes), checked against the widening path and fp64
// Also here: fma_peak (the compute roof: machine.cpp's register-only FMA loop on every thread), pack_a / pack_b
// (exposed for the tests).
// Checked against numpy in tests/gemm/test_gemm.py.
// Why one file: the ladder is read top to bottom as one story (each kernel is the previous one plus one idea), and
// the rungs share the packing routines, the stride/dtype dispatch and the ISA-targeted micro-kernels; one
// translation unit also lets the compiler inline the micro-kernels into the packed loops.
#include <immintrin.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bf16.h"
#include "common.h"
#include "cpu_features.h"
#include "gemm_ukr.h"
#include "machine_probe.h"
#include "registry.h"
#include "simd_ukr.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace py = pybind11;

namespace {

// Effective features: tl::cpu_has (cpu_features.h) honours TINYLEARN_CPU_FEATURES=scalar|avx2|avx512. Named
// gemm_path_ok, not cpu_has: in the unity build an unqualified cpu_has("avx512f") in a later file of the batch found
// this one (which knows only path names) and every AVX-512 path after it was silently skipped.
bool gemm_path_ok(const std::string& f) {
  if (f == "avx2") return tl::cpu_has("avx2") && tl::cpu_has("fma");
  if (f == "avx512") return tl::cpu_has("avx512f");
  return f == "scalar";
}

std::string gemm_best_path() {
  return gemm_path_ok("avx512") ? "avx512" : gemm_path_ok("avx2") ? "avx2" : "scalar";
}

// "auto": TINYLEARN_CPU_FEATURES if set, else the best this CPU has.
std::string pick_isa(const std::string& requested) {
  std::string isa = requested, source = "isa";
  if (isa == "auto") {
    const char* env = std::getenv("TINYLEARN_CPU_FEATURES");
    if (env && *env) {
      isa = env;
      source = "TINYLEARN_CPU_FEATURES";
      for (auto& ch : isa) ch = char(std::tolower(ch));
    } else {
      return gemm_best_path();
    }
  }
  if (isa != "scalar" && isa != "avx2" && isa != "avx512")
    tl::value_error("gemm: " + source + "='" + isa + "' is not one of auto, scalar, avx2, avx512");
  if (source == "TINYLEARN_CPU_FEATURES") return gemm_best_path();  // a level: the best path at or below it
  if (!gemm_path_ok(isa)) {
    const std::string forced = tl::cpu_features_forced();
    tl::value_error("gemm: " + source + "='" + isa + "' but this CPU does not support " + isa +
                    (forced.empty() ? "" : " (TINYLEARN_CPU_FEATURES=" + forced + ")"));
  }
  return isa;
}


// A strided view of a matrix: element (i, j) is p[i*rs + j*cs] (strides in elements, may be negative).
template <class T>
struct View {
  const T* p;
  ssize_t rs, cs;
  T operator()(ssize_t i, ssize_t j) const { return p[i * rs + j * cs]; }
};

struct Dims {
  ssize_t M, N, K;
};

// bfloat16 as a source type of the packed GEMM (bf16_matmul): the upper 16 bits of a float32. The packing widens
// it (bits << 16, exact), so the micro-kernels are the fp32 ones: products of bf16-rounded values accumulated in fp32.
struct Bf16 {
  uint16_t bits;
};
inline float widen(float x) { return x; }
inline double widen(double x) { return x; }
inline float widen(Bf16 x) { return tl::bf16_to_float(x.bits); }

// ------------------------------------------------------------------------------------------- 1-3: plain loops
// naive: C[i,j] = sum_k A[i,k] B[k,j], inner loop over k (B column walk: a new cache line every iteration).
template <class T>
void gemm_naive(View<T> A, View<T> B, T* C, Dims d) {
  for (ssize_t i = 0; i < d.M; ++i)
    for (ssize_t j = 0; j < d.N; ++j) {
      T acc = 0;
      for (ssize_t k = 0; k < d.K; ++k) acc += A(i, k) * B(k, j);
      C[i * d.N + j] = acc;
    }
}

// c[0:n] += a * b[0:n*bs:bs]; the unit-stride case is a separate loop so the compiler vectorises it.
template <class T>
inline void axpy(ssize_t n, T a, const T* b, ssize_t bs, T* c) {
  if (bs == 1) {
    for (ssize_t j = 0; j < n; ++j) c[j] += a * b[j];
  } else {
    for (ssize_t j = 0; j < n; ++j) c[j] += a * b[j * bs];
  }
}

// ikj: for each (i, k) stream row k of B into row i of C (unit stride when B is row-major).
template <class T>
void gemm_ikj(View<T> A, View<T> B, T* C, Dims d) {
  std::fill(C, C + d.M * d.N, T(0));
  for (ssize_t i = 0; i < d.M; ++i)
    for (ssize_t k = 0; k < d.K; ++k) axpy(d.N, A(i, k), B.p + k * B.rs, B.cs, C + i * d.N);
}

// blocked: ikj restricted to an MC x KC block of A times a KC x NC block of B, so B's block (KC*NC elements) is
// reused from L2 by all MC rows instead of streaming from memory once per row.
template <class T>
void gemm_blocked(View<T> A, View<T> B, T* C, Dims d) {
  constexpr ssize_t MC = 64, KC = 256, NC = 512;
  std::fill(C, C + d.M * d.N, T(0));
  for (ssize_t jc = 0; jc < d.N; jc += NC) {
    const ssize_t nc = std::min(NC, d.N - jc);
    for (ssize_t pc = 0; pc < d.K; pc += KC) {
      const ssize_t kc = std::min(KC, d.K - pc);
      for (ssize_t ic = 0; ic < d.M; ic += MC) {
        const ssize_t mc = std::min(MC, d.M - ic);
        for (ssize_t i = ic; i < ic + mc; ++i)
          for (ssize_t k = pc; k < pc + kc; ++k) axpy(nc, A(i, k), B.p + k * B.rs + jc * B.cs, B.cs, C + i * d.N + jc);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------- 4: packing
struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
std::unique_ptr<T[], AlignedFree> aligned_buffer(size_t n) {
  size_t bytes = ((n * sizeof(T) + 63) / 64) * 64;
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  if (!p) throw std::bad_alloc();
  return std::unique_ptr<T[], AlignedFree>(static_cast<T*>(p));
}

// ---- transposing packs (AVX2): the packed layouts are k-major, so a row-major A or a column-major B is transposed
// on the way in. Scalar code moves one element per load/store pair (with bf16, a widening in between); these load 8
// consecutive k of 8 rows (columns), transpose them in registers and store 8 k-slices: ~3x fewer instructions.
__attribute__((target("avx2"))) inline __m256 load8_f32(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2"))) inline __m256 load8_f32(const Bf16* p) {  // 8 bf16 -> fp32 (exact: bits << 16)
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// r[j][i] <- r[i][j] for 8 rows of 8 floats
__attribute__((target("avx2"), always_inline)) inline void transpose8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3 (h = 0) and 4-7 (h = 1)
    u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
    r[j + 4] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
  }
}

// One MR-row panel of a row-major A (row i at src + i * ld, MR = 6 or 8): dst[k * MR + i] = A[i][k] for k below
// kc rounded down to 8; returns that k (the caller packs the rest). With MR = 6 rows 6-7 are zeros and each 8-wide
// store spills two of them into the next k-slice, which the next store (or the caller's remainder, or the next
// panel) overwrites; the last slice of the buffer spills 2 floats past it (gemm_packed allocates 8 spare).
template <class S>
__attribute__((target("avx2"))) ssize_t pack_a_t8(const S* src, ssize_t ld, ssize_t kc, ssize_t MR, float* dst) {
  ssize_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    __m256 r[8];
    for (ssize_t i = 0; i < 8; ++i) r[i] = i < MR ? load8_f32(src + i * ld + k) : _mm256_setzero_ps();
    transpose8x8(r);
    for (int v = 0; v < 8; ++v) _mm256_storeu_ps(dst + (k + v) * MR, r[v]);
  }
  return k;
}

// One NR-column panel of a column-major B (column j at src + j * ld, NR a multiple of 8): dst[k * NR + j] = B[k][j]
// for k below kc rounded down to 8; returns that k.
template <class S>
__attribute__((target("avx2"))) ssize_t pack_b_t8(const S* src, ssize_t ld, ssize_t kc, ssize_t NR, float* dst) {
  ssize_t k = 0;
  for (; k + 8 <= kc; k += 8)
    for (ssize_t g = 0; g < NR; g += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = load8_f32(src + (g + i) * ld + k);
      transpose8x8(r);
      for (int v = 0; v < 8; ++v) _mm256_storeu_ps(dst + (k + v) * NR + g, r[v]);
    }
  return k;
}

// pack_a: rows [i0, i0+mc) x cols [p0, p0+kc) of A into ceil(mc/MR) micro-panels; panel r holds, for each k,
// the MR values A[i0+r*MR : i0+r*MR+MR, p0+k] next to each other (rows past mc are zero). The micro-kernel then
// reads A with unit stride: MR scalars per k.
// S is the stored element type (T itself, or Bf16 widened to T = float on the way in).
// simd: the kernel is AVX2 or AVX-512 (so the CPU has AVX2): a row-major A (unit column stride, where the
// packing is a transpose) goes through 8x8 register transposes (pack_a_t8).
template <class T, class S>
void pack_a(View<S> A, ssize_t i0, ssize_t mc, ssize_t p0, ssize_t kc, ssize_t MR, T* dst, bool simd = false) {
  for (ssize_t r = 0; r < mc; r += MR) {
    const ssize_t rows = std::min(MR, mc - r);
    ssize_t k = 0;
    if constexpr (std::is_same_v<T, float>) {
      if (simd && A.cs == 1 && rows == MR && (MR == 6 || MR == 8)) {
        k = pack_a_t8(A.p + (i0 + r) * A.rs + p0, A.rs, kc, MR, dst);
        dst += k * MR;
      }
    }
    for (; k < kc; ++k) {
      for (ssize_t ii = 0; ii < rows; ++ii) dst[ii] = widen(A(i0 + r + ii, p0 + k));
      for (ssize_t ii = rows; ii < MR; ++ii) dst[ii] = T(0);
      dst += MR;
    }
  }
}

// pack_b: rows [p0, p0+kc) x cols [j0, j0+nc) of B into ceil(nc/NR) micro-panels; panel c holds, for each k,
// B[p0+k, j0+c*NR : j0+c*NR+NR] contiguous (columns past nc are zero): NR/lanes aligned vector loads per k.
// simd: as pack_a's; a column-major B (unit row stride: a transposed weight, x @ W.T) through 8x8 transposes.
template <class T, class S>
void pack_b(View<S> B, ssize_t p0, ssize_t kc, ssize_t j0, ssize_t nc, ssize_t NR, T* dst, bool simd = false) {
  for (ssize_t c = 0; c < nc; c += NR) {
    const ssize_t cols = std::min(NR, nc - c);
    ssize_t k = 0;
    if constexpr (std::is_same_v<T, float>) {
      if (simd && B.rs == 1 && B.cs != 1 && cols == NR && NR % 8 == 0) {
        k = pack_b_t8(B.p + p0 + (j0 + c) * B.cs, B.cs, kc, NR, dst);
        dst += k * NR;
      }
    }
    for (; k < kc; ++k) {
      const S* src = B.p + (p0 + k) * B.rs + (j0 + c) * B.cs;
      if (B.cs == 1) {
        for (ssize_t jj = 0; jj < cols; ++jj) dst[jj] = widen(src[jj]);
      } else {
        for (ssize_t jj = 0; jj < cols; ++jj) dst[jj] = widen(src[jj * B.cs]);
      }
      for (ssize_t jj = cols; jj < NR; ++jj) dst[jj] = T(0);
      dst += NR;
    }
  }
}

// ------------------------------------------------------------------------------------------- micro-kernels
// Contract: c[i*ldc + j] += sum_k a[k*MR + i] * b[k*NR + j] for the full MR x NR tile (a, b packed, b 64-byte
// aligned). Edge tiles go through a zeroed MR x NR scratch tile (see macro_kernel).
using UkrF = void (*)(ssize_t, const float*, const float*, float*, ssize_t);
using UkrD = void (*)(ssize_t, const double*, const double*, double*, ssize_t);

// portable kernel ("packed"): plain loops over a local accumulator tile; the compiler vectorises what it can.
template <class T, int MR, int NR>
void ukr_generic(ssize_t kc, const T* a, const T* b, T* c, ssize_t ldc) {
  T acc[MR][NR] = {};
  for (ssize_t k = 0; k < kc; ++k, a += MR, b += NR)
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) acc[i][j] += a[i] * b[j];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) c[i * ldc + j] += acc[i][j];
}

// scalar kernel ("simd" with isa=scalar): the same loops with auto-vectorisation switched off — the honest
// one-FLOP-at-a-time baseline for the SIMD kernels.
template <class T, int MR, int NR>
__attribute__((optimize("no-tree-vectorize"))) void ukr_scalar(ssize_t kc, const T* a, const T* b, T* c,
                                                                ssize_t ldc) {
  T acc[MR][NR] = {};
  for (ssize_t k = 0; k < kc; ++k, a += MR, b += NR)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] += a[i] * b[j];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) c[i * ldc + j] += acc[i][j];
}

// The SIMD micro-kernels (simd_ukr.h): 6 rows x 2 vectors.
// AVX2 fp32 6x16: 12 ymm accumulators + 2 ymm of B + 1 broadcast of A = 15 of 16 registers; 12 FMAs per k.
TL_UKR_DEFINE(ukr_avx2_f32, "avx2,fma", float, TL_AVX2_F32, 6)
// AVX2 fp64 6x8: the same register budget with 4 lanes.
TL_UKR_DEFINE(ukr_avx2_f64, "avx2,fma", double, TL_AVX2_F64, 6)
// AVX-512 fp32 6x32: 12 zmm accumulators (of 32 registers), 16 lanes.
TL_UKR_DEFINE(ukr_avx512_f32, "avx512f", float, TL_AVX512_F32, 6)
// AVX-512 fp64 6x16.
TL_UKR_DEFINE(ukr_avx512_f64, "avx512f", double, TL_AVX512_F64, 6)

// ---- bf16 with AVX512_BF16: vdpbf16ps, two k per instruction ----------------------------------------------------
// Packed element of the dpbf16 kernel: the values of two consecutive k (k even, then k + 1; zero past K) of one row
// of A or one column of B in one 32-bit lane. vdpbf16ps multiplies the two bf16 halves of a lane of A by those of
// B and adds both products to the fp32 lane: products of two bf16 are exact in fp32, so this is fp32 accumulation of
// exact products as in the widening path, in another order, except that the instruction treats bf16 subnormal
// inputs as zero and flushes subnormal fp32 results (|x| < 2^-126) to zero (Intel SDM, VDPBF16PS: DAZ/FTZ, RNE).
struct Bf16Pair {
  uint16_t lo, hi;
};

// A pair whose two k are adjacent in memory (unit stride along k: row-major A, or B = W.T) is one 32-bit load.
inline Bf16Pair load_pair(const Bf16* p) {
  Bf16Pair v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Row-major B with pairs: row 2p and row 2p+1 interleaved (16 columns per step: vpunpckl/hwd, then the 128-bit
// halves put back in column order); returns the pairs packed (the caller packs the rest).
__attribute__((target("avx2"))) ssize_t pack_b_pairs_rows(const Bf16* src, ssize_t rs, ssize_t kc, ssize_t NR,
                                                          Bf16Pair* dst) {
  ssize_t p = 0;
  for (; 2 * p + 1 < kc; ++p)
    for (ssize_t g = 0; g < NR; g += 16) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * p * rs + g));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (2 * p + 1) * rs + g));
      const __m256i a = _mm256_unpacklo_epi16(lo, hi), b = _mm256_unpackhi_epi16(lo, hi);  // cols 0-3 8-11 | 4-7 12-15
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + p * NR + g), _mm256_permute2x128_si256(a, b, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + p * NR + g + 8), _mm256_permute2x128_si256(a, b, 0x31));
    }
  return p;
}

// Column-major A (g.T in dW = g.T @ x) with pairs, MR = 6: columns 2p and 2p+1 (contiguous over the rows)
// interleaved 8 rows at a time, of which the 6 of the panel are stored (the caller guarantees rows 6-7 exist in the
// block, so the loads stay inside A); returns the pairs packed.
ssize_t pack_a_pairs_cols6(const Bf16* src, ssize_t cs, ssize_t kc, Bf16Pair* dst) {
  ssize_t p = 0;
  for (; 2 * p + 1 < kc; ++p, dst += 6) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * p * cs));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (2 * p + 1) * cs));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_unpacklo_epi16(lo, hi));      // rows 0-3
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + 4), _mm_unpackhi_epi16(lo, hi));  // rows 4-5
  }
  return p;
}

// simd (the dpbf16 kernel: AVX-512, so AVX2): a pair of adjacent k is one 32-bit lane, so a row-major A and a
// column-major B (W.T) are the fp32 transposes of pack_a_t8 / pack_b_t8 on those lanes (bits moved, never
// converted), a row-major B interleaves two rows (pack_b_pairs_rows); odd strides and the last k % 16 go scalar.
void pack_a(View<Bf16> A, ssize_t i0, ssize_t mc, ssize_t p0, ssize_t kc, ssize_t MR, Bf16Pair* dst, bool simd = false) {
  for (ssize_t r = 0; r < mc; r += MR) {
    const ssize_t rows = std::min(MR, mc - r);
    ssize_t k0 = 0;
    if (simd && A.cs == 1 && A.rs % 2 == 0 && p0 % 2 == 0 && rows == MR && (MR == 6 || MR == 8)) {
      const float* src = reinterpret_cast<const float*>(A.p + (i0 + r) * A.rs + p0);
      const ssize_t np = pack_a_t8(src, A.rs / 2, kc / 2, MR, reinterpret_cast<float*>(dst));
      k0 = 2 * np;
      dst += np * MR;
    } else if (simd && A.rs == 1 && A.cs != 1 && rows == MR && MR == 6 && r + 8 <= mc) {
      const ssize_t np = pack_a_pairs_cols6(A.p + i0 + r + p0 * A.cs, A.cs, kc, dst);
      k0 = 2 * np;
      dst += np * MR;
    }
    for (ssize_t k = k0; k < kc; k += 2) {
      if (A.cs == 1 && k + 1 < kc)
        for (ssize_t ii = 0; ii < rows; ++ii) dst[ii] = load_pair(&A.p[(i0 + r + ii) * A.rs + p0 + k]);
      else
        for (ssize_t ii = 0; ii < rows; ++ii)
          dst[ii] = {A(i0 + r + ii, p0 + k).bits, k + 1 < kc ? A(i0 + r + ii, p0 + k + 1).bits : uint16_t(0)};
      for (ssize_t ii = rows; ii < MR; ++ii) dst[ii] = {0, 0};
      dst += MR;
    }
  }
}

void pack_b(View<Bf16> B, ssize_t p0, ssize_t kc, ssize_t j0, ssize_t nc, ssize_t NR, Bf16Pair* dst, bool simd = false) {
  for (ssize_t c = 0; c < nc; c += NR) {
    const ssize_t cols = std::min(NR, nc - c);
    ssize_t k0 = 0;
    if (simd && cols == NR && NR % 16 == 0 && p0 % 2 == 0) {
      ssize_t np = 0;
      if (B.rs == 1 && B.cs != 1 && B.cs % 2 == 0)
        np = pack_b_t8(reinterpret_cast<const float*>(B.p + p0 + (j0 + c) * B.cs), B.cs / 2, kc / 2, NR,
                       reinterpret_cast<float*>(dst));
      else if (B.cs == 1)
        np = pack_b_pairs_rows(B.p + p0 * B.rs + j0 + c, B.rs, kc, NR, dst);
      k0 = 2 * np;
      dst += np * NR;
    }
    for (ssize_t k = k0; k < kc; k += 2) {
      const Bf16* lo = B.p + (p0 + k) * B.rs + (j0 + c) * B.cs;
      const bool has_hi = k + 1 < kc;
      if (B.rs == 1 && has_hi)
        for (ssize_t jj = 0; jj < cols; ++jj) dst[jj] = load_pair(lo + jj * B.cs);
      else
        for (ssize_t jj = 0; jj < cols; ++jj)
          dst[jj] = {lo[jj * B.cs].bits, has_hi ? lo[B.rs + jj * B.cs].bits : uint16_t(0)};
      for (ssize_t jj = cols; jj < NR; ++jj) dst[jj] = {0, 0};
      dst += NR;
    }
  }
}

// AVX512_BF16 6x32: the AVX-512 fp32 kernel's register tile (12 zmm accumulators), each vdpbf16ps doing 2 k.
TL_UKR_DEFINE_PACKED(ukr_avx512_dpbf16, "avx512f,avx512bf16", Bf16Pair, float, TL_AVX512_BF16, 6)

// k per packed element: 1, or 2 for the bf16 pairs
template <class P>
constexpr ssize_t kPerElement = 1;
template <>
constexpr ssize_t kPerElement<Bf16Pair> = 2;

// A micro-kernel with its tile shape and cache-block sizes. KC x NR of B (16 KB for fp32 6x16) stays in L1 while
// the MR x KC sliver of A streams; the MC x KC block of A (~150 KB) lives in L2; the KC x NC panel of B in L3.
// P: the packed element (T, or Bf16Pair for the dpbf16 kernel).
template <class T, class P = T>
struct Kernel {
  void (*ukr)(ssize_t, const P*, const P*, T*, ssize_t);
  ssize_t MR, NR, KC, MC, NC;
  bool simd_pack = false;  // an AVX2/AVX-512 kernel: the packs may use AVX2 (pack_a_t8 / pack_b_t8)
};

// dpbf16: KC = 512 k is 256 pairs, so the KC x NR sliver of B is 32 KB as in the fp32 6x32 kernel.
const Kernel<float, Bf16Pair> kDpbf16Kernel{&ukr_avx512_dpbf16, 6, 32, 512, 96, 4096, true};

template <class T>
Kernel<T> kernel_for(const std::string& version, const std::string& isa);

template <>
Kernel<float> kernel_for<float>(const std::string& version, const std::string& isa) {
  if (version == "packed") return {&ukr_generic<float, 6, 16>, 6, 16, 256, 144, 4080};
  if (isa == "avx512") return {&ukr_avx512_f32, 6, 32, 256, 96, 4096, true};
  if (isa == "avx2") return {&ukr_avx2_f32, 6, 16, 256, 144, 4080, true};
  return {&ukr_scalar<float, 6, 16>, 6, 16, 256, 144, 4080};
}

template <>
Kernel<double> kernel_for<double>(const std::string& version, const std::string& isa) {
  if (version == "packed") return {&ukr_generic<double, 6, 8>, 6, 8, 256, 72, 2040};
  if (isa == "avx512") return {&ukr_avx512_f64, 6, 16, 256, 48, 2048};
  if (isa == "avx2") return {&ukr_avx2_f64, 6, 8, 256, 72, 2040};
  return {&ukr_scalar<double, 6, 8>, 6, 8, 256, 72, 2040};
}

// The two inner loops around the micro-kernel (BLIS loops 2 and 1) over one packed A block and B panel.
template <class T, class P>
void macro_kernel(const Kernel<T, P>& kn, ssize_t mc, ssize_t nc, ssize_t kc, const P* Ap, const P* Bp, T* C,
                  ssize_t ldc) {
  alignas(64) T tile[6 * 32];
  kc = (kc + kPerElement<P> - 1) / kPerElement<P>;  // packed elements per row of a micro-panel
  for (ssize_t jr = 0; jr < nc; jr += kn.NR) {
    const ssize_t nr = std::min(kn.NR, nc - jr);
    for (ssize_t ir = 0; ir < mc; ir += kn.MR) {
      const ssize_t mr = std::min(kn.MR, mc - ir);
      const P* a = Ap + ir * kc;
      const P* b = Bp + jr * kc;
      T* c = C + ir * ldc + jr;
      if (mr == kn.MR && nr == kn.NR) {
        kn.ukr(kc, a, b, c, ldc);
      } else {  // edge: full tile into scratch, add the valid mr x nr corner
        std::fill(tile, tile + kn.MR * kn.NR, T(0));
        kn.ukr(kc, a, b, tile, kn.NR);
        for (ssize_t i = 0; i < mr; ++i)
          for (ssize_t j = 0; j < nr; ++j) c[i * ldc + j] += tile[i * kn.NR + j];
      }
    }
  }
}

// An epilogue called on each finished block of C: rows [i0, i0 + mc), columns [j0, j0 + nc).
struct NoEpilogue {
  void operator()(ssize_t, ssize_t, ssize_t, ssize_t) const {}
};

// BLIS loop nest (jc, pc, ic) with packing; `threads` > 1 shares each packed B panel and splits the ic loop.
// epi(i0, mc, j0, nc) runs on each block of C once its last k block is summed, by the thread that summed it (the
// block is still in its caches): bf16_matmul's bias and rounding, in parallel and without another pass over C.
template <class T, class S, class P, class Epi = NoEpilogue>
void gemm_packed(View<S> A, View<S> B, T* C, Dims d, const Kernel<T, P>& kn, int threads, const Epi& epi = Epi()) {
  if (d.M == 0 || d.N == 0 || d.K == 0) {
    std::fill(C, C + d.M * d.N, T(0));
    if (d.M > 0 && d.N > 0) epi(0, d.M, 0, d.N);
    return;
  }
  const ssize_t nc_max = std::min(kn.NC, ((d.N + kn.NR - 1) / kn.NR) * kn.NR);
  const ssize_t kc_max = std::min(kn.KC, d.K);
  // balance: split M into a multiple of `threads` blocks of about MC rows, in whole MR-row units spread evenly
  // (block b holds units [b U / nblk, (b+1) U / nblk)): the static schedule then gives every thread the same rows
  // to one unit per block. (Rounding one block size up to MR and cutting M by it left the last block short: M = 512
  // on two threads was 270 rows against 242.)
  const ssize_t units = (d.M + kn.MR - 1) / kn.MR;
  ssize_t nblk = (d.M + kn.MC - 1) / kn.MC;
  nblk = std::min(((nblk + threads - 1) / threads) * threads, std::max<ssize_t>(units, 1));
  const ssize_t mc_blk = ((units + nblk - 1) / nblk) * kn.MR;  // the largest block
  const ssize_t kp_max = (kc_max + kPerElement<P> - 1) / kPerElement<P>;  // packed elements along k
  auto Bp = aligned_buffer<P>(size_t(kp_max) * nc_max);
  std::vector<std::unique_ptr<P[], AlignedFree>> Aps;
  for (int t = 0; t < threads; ++t) Aps.push_back(aligned_buffer<P>(size_t(mc_blk) * kp_max + 8));  // + pack_a_t8's spill
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
#ifdef _OPENMP
    P* Ap = Aps[omp_get_thread_num()].get();
#else
    P* Ap = Aps[0].get();
#endif
    for (ssize_t jc = 0; jc < d.N; jc += kn.NC) {
      const ssize_t nc = std::min(kn.NC, d.N - jc);
      for (ssize_t pc = 0; pc < d.K; pc += kn.KC) {
        const ssize_t kc = std::min(kn.KC, d.K - pc);
        const ssize_t npanels = (nc + kn.NR - 1) / kn.NR;
        const ssize_t kp = (kc + kPerElement<P> - 1) / kPerElement<P>;
#pragma omp for schedule(static)
        for (ssize_t q = 0; q < npanels; ++q)
          pack_b(B, pc, kc, jc + q * kn.NR, std::min(kn.NR, nc - q * kn.NR), kn.NR, Bp.get() + q * kn.NR * kp,
                 kn.simd_pack);
        // implicit barrier: the B panel is complete before anyone reads it
#pragma omp for schedule(static)
        for (ssize_t blk = 0; blk < nblk; ++blk) {
          const ssize_t ic = blk * units / nblk * kn.MR;
          const ssize_t mc = std::min((blk + 1) * units / nblk * kn.MR, d.M) - ic;
          if (mc <= 0) continue;
          pack_a(A, ic, mc, pc, kc, kn.MR, Ap, kn.simd_pack);
          if (pc == 0)  // the block's rows of C, zeroed by the thread that accumulates into them (in its cache)
            for (ssize_t i = ic; i < ic + mc; ++i) std::fill(C + i * d.N + jc, C + i * d.N + jc + nc, T(0));
          macro_kernel(kn, mc, nc, kc, Ap, Bp.get(), C + ic * d.N + jc, d.N);
          if (pc + kc == d.K) epi(ic, mc, jc, nc);
        }
        // implicit barrier: nobody repacks B while another thread still reads it
      }
    }
  }
}

const std::vector<std::string> kVersions = {"naive", "ikj", "blocked", "packed", "simd", "parallel"};

// Cache-block overrides (tinylearn.tune searches them): 0 keeps the kernel's own value; MC is rounded up to a
// multiple of MR and NC to a multiple of NR (the packed loops assume whole micro-panels per block).
struct Blocking {
  ssize_t mc = 0, kc = 0, nc = 0;
};

template <class T, class P>
void apply_blocking(Kernel<T, P>& kn, const Blocking& blk) {
  if (blk.mc > 0) kn.MC = ((blk.mc + kn.MR - 1) / kn.MR) * kn.MR;
  if (blk.kc > 0) kn.KC = blk.kc;
  if (blk.nc > 0) kn.NC = ((blk.nc + kn.NR - 1) / kn.NR) * kn.NR;
}

template <class T>
void run_version(const std::string& version, View<T> A, View<T> B, T* C, Dims d, const std::string& isa,
                 int threads, const Blocking& blk) {
  if (version == "naive") return gemm_naive(A, B, C, d);
  if (version == "ikj") return gemm_ikj(A, B, C, d);
  if (version == "blocked") return gemm_blocked(A, B, C, d);
  Kernel<T> kn = kernel_for<T>(version, isa);
  apply_blocking(kn, blk);
  gemm_packed(A, B, C, d, kn, version == "parallel" ? threads : 1);
}

// A cache-block argument: an int in [0, 1 << 20] (0 = the kernel's default); anything else names itself.
ssize_t block_arg(const py::object& v, const char* name) {
  if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr()))
    throw py::type_error(std::string("gemm.matmul: ") + name + " must be an int (0 = the kernel's default), got " +
                         std::string(py::str(py::repr(v))));
  py::object idx = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!idx) throw py::error_already_set();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(idx.ptr(), &overflow);
  if (overflow != 0 || x < 0 || x > (1 << 20))
    tl::value_error(std::string("gemm.matmul: ") + name + " must be in [0, 1048576] (0 = the kernel's default), got " +
                    std::string(py::str(idx)));
  return ssize_t(x);
}

std::string shape_str(const py::array& x) {
  std::string s = "(";
  for (ssize_t i = 0; i < x.ndim(); ++i) s += (i ? ", " : "") + std::to_string(x.shape(i));
  return s + (x.ndim() == 1 ? ",)" : ")");
}

template <class T>
View<T> view_of(const py::array& x) {
  return {static_cast<const T*>(x.data()), ssize_t(x.strides(0) / ssize_t(sizeof(T))),
          ssize_t(x.strides(1) / ssize_t(sizeof(T)))};
}

// A strided 2-D view is used as is when its strides are whole elements; anything else is copied first.
py::array as_view_array(const py::array& x) {
  const ssize_t item = x.itemsize();
  if (x.strides(0) % item == 0 && x.strides(1) % item == 0) return x;
  return py::array::ensure(x, py::array::c_style);
}

// Most OpenMP threads a `threads=` argument gets: asking for 100000 used to segfault (a buffer per thread and a team
// the runtime cannot create); beyond this the extra threads only time-slice the same cores.
constexpr long long kMaxThreads = 1024;

// The `threads=` argument of matmul / fma_peak: an integer (Python int or numpy integer, operator.index semantics;
// bool and float are a TypeError), 0 = OpenMP's default, negative a ValueError, above kMaxThreads clamped to it.
int threads_arg(const py::object& t, const char* fn) {
  if (PyBool_Check(t.ptr()) || !PyIndex_Check(t.ptr()))
    throw py::type_error(std::string(fn) + ": threads must be an int (0 = OpenMP default), got " +
                         std::string(py::str(py::repr(t))) + " of type " +
                         std::string(py::str(t.get_type().attr("__name__"))));
  py::object idx = py::reinterpret_steal<py::object>(PyNumber_Index(t.ptr()));
  if (!idx) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(idx.ptr(), &overflow);
  if (overflow < 0 || (overflow == 0 && v < 0))
    tl::value_error(std::string(fn) + ": threads must be >= 0 (0 = OpenMP default), got " +
                    std::string(py::str(idx)));
  if (overflow > 0 || v > kMaxThreads) return int(kMaxThreads);
  return v == 0 ? tl::n_threads() : int(v);
}

py::array matmul(const py::array& a_in, const py::array& b_in, const std::string& version, const std::string& isa_req,
                 const py::object& threads_obj, const py::object& mc_obj, const py::object& kc_obj,
                 const py::object& nc_obj) {
  if (std::find(kVersions.begin(), kVersions.end(), version) == kVersions.end())
    tl::value_error("gemm.matmul: version='" + version +
                    "' is not one of naive, ikj, blocked, packed, simd, parallel");
  const bool f32 = a_in.dtype().is(py::dtype::of<float>()), f64 = a_in.dtype().is(py::dtype::of<double>());
  if (!f32 && !f64)
    throw py::type_error("gemm.matmul: a must have dtype float32 or float64, got " + std::string(py::str(a_in.dtype())));
  if (!b_in.dtype().is(a_in.dtype()))
    throw py::type_error("gemm.matmul: b has dtype " + std::string(py::str(b_in.dtype())) + " but a has " +
                         std::string(py::str(a_in.dtype())));
  if (a_in.ndim() != 2) tl::value_error("gemm.matmul: a must be 2-D, got shape " + shape_str(a_in));
  if (b_in.ndim() != 2) tl::value_error("gemm.matmul: b must be 2-D, got shape " + shape_str(b_in));
  if (a_in.shape(1) != b_in.shape(0))
    tl::value_error("gemm.matmul: inner dimensions differ: a is " + shape_str(a_in) + ", b is " + shape_str(b_in));
  const std::string isa = pick_isa(isa_req);
  const int threads = threads_arg(threads_obj, "gemm.matmul");
  const Blocking blk{block_arg(mc_obj, "mc"), block_arg(kc_obj, "kc"), block_arg(nc_obj, "nc")};
  py::array a = as_view_array(a_in), b = as_view_array(b_in);
  const Dims d{a.shape(0), b.shape(1), a.shape(1)};
  py::array c = f32 ? py::array(py::array_t<float>({d.M, d.N})) : py::array(py::array_t<double>({d.M, d.N}));
  void* cp = c.mutable_data();
  {
    py::gil_scoped_release release;
    if (f32)
      run_version<float>(version, view_of<float>(a), view_of<float>(b), static_cast<float*>(cp), d, isa, threads,
                         blk);
    else
      run_version<double>(version, view_of<double>(a), view_of<double>(b), static_cast<double*>(cp), d, isa,
                          threads, blk);
  }
  return c;
}

// bf16_matmul: C = A @ B for bfloat16 A [M, K] and B [K, N] given as their uint16 bit patterns (any strides), the
// "simd"/"parallel" rungs with the packing widening bf16 to fp32: every product of two bf16 values is exact in fp32,
// the sums are fp32 (the numerics of torch's CPU bf16 GEMM without AVX512_BF16: fp32 accumulation of bf16-rounded
// inputs). out="float32" returns the fp32 accumulator, out="bfloat16" its round-to-nearest-even bf16 bits (uint16).
// The packed panels are fp32, so B panel and A block hold the same bytes as an fp32 GEMM's (KC/MC/NC unchanged);
// what bf16 halves is the traffic of reading A and B from memory, once per panel.
// dot: "auto" (the AVX512_BF16 vdpbf16ps kernel where the CPU has it and the path is avx512, else the widening one),
// "widen" or "dpbf16" (ValueError where it cannot run). bf16_dot_path() says what "auto" takes now.
constexpr long long kBf16FlopsPerThread = 1LL << 22;  // ~4 MFLOP: 10-20 us of one core's bf16 GEMM

bool dpbf16_ok(const std::string& isa) { return isa == "avx512" && tl::cpu_has("avx512bf16"); }

bool use_dpbf16(const std::string& dot, const std::string& isa) {
  if (dot == "widen") return false;
  if (dot == "auto") return dpbf16_ok(isa);
  if (dot != "dpbf16") tl::value_error("gemm.bf16_matmul: dot must be 'auto', 'widen' or 'dpbf16', got '" + dot + "'");
  if (!dpbf16_ok(isa))
    tl::value_error("gemm.bf16_matmul: dot='dpbf16' needs AVX512_BF16 on the avx512 path; this CPU or "
                    "TINYLEARN_CPU_FEATURES / isa= gives path '" + isa + "'" +
                    (tl::cpu_detected("avx512bf16") ? "" : " and the CPU has no AVX512_BF16"));
  return true;
}

py::array bf16_matmul(const py::array& a_in, const py::array& b_in, const std::string& out, const std::string& isa_req,
                      const py::object& threads_obj, const py::object& bias_obj, const std::string& dot) {
  for (auto [name, x] : {std::pair<const char*, const py::array*>{"a", &a_in}, {"b", &b_in}}) {
    if (!x->dtype().is(py::dtype::of<uint16_t>()))
      throw py::type_error(std::string("gemm.bf16_matmul: ") + name +
                           " must be the uint16 bit patterns of a bfloat16 array (x.view(numpy.uint16)), got dtype " +
                           std::string(py::str(x->dtype())));
    if (x->ndim() != 2)
      tl::value_error(std::string("gemm.bf16_matmul: ") + name + " must be 2-D, got shape " + shape_str(*x));
  }
  if (a_in.shape(1) != b_in.shape(0))
    tl::value_error("gemm.bf16_matmul: inner dimensions differ: a is " + shape_str(a_in) + ", b is " +
                    shape_str(b_in));
  if (out != "float32" && out != "bfloat16")
    tl::value_error("gemm.bf16_matmul: out must be 'float32' or 'bfloat16', got '" + out + "'");
  py::array bias;  // optional bf16 [N] added to the fp32 accumulator before the one rounding (addmm's epilogue)
  if (!bias_obj.is_none()) {
    bias = py::array::ensure(bias_obj, py::array::c_style);
    if (!bias || !bias.dtype().is(py::dtype::of<uint16_t>()))
      throw py::type_error("gemm.bf16_matmul: bias must be the uint16 bit patterns of a bfloat16 vector or None");
    if (bias.ndim() != 1 || bias.shape(0) != b_in.shape(1))
      tl::value_error("gemm.bf16_matmul: bias must have shape (" + std::to_string(b_in.shape(1)) + ",), got " +
                      shape_str(bias));
  }
  const Bf16* bp = bias_obj.is_none() ? nullptr : static_cast<const Bf16*>(bias.data());
  const std::string isa = pick_isa(isa_req);
  int threads = threads_arg(threads_obj, "gemm.bf16_matmul");
  py::array a = as_view_array(a_in), b = as_view_array(b_in);
  const Dims d{a.shape(0), b.shape(1), a.shape(1)};
  // threads=0 (autocast's "parallel"): one thread per kBf16FlopsPerThread of work at most. A [128, 128] @ [128, 10]
  // (a classifier head) on a 2-thread team took 120-135 us per call on the busy 2-core box (the team waits for its
  // second thread), ~10 us on one; the split over M rows does not change any sum, so the bits are the same
  if (py::int_(threads_obj).cast<long long>() == 0)
    threads = int(std::max<long long>(1, std::min<long long>(threads, 2LL * d.M * d.N * d.K / kBf16FlopsPerThread)));
  const View<Bf16> A{static_cast<const Bf16*>(a.data()), ssize_t(a.strides(0) / 2), ssize_t(a.strides(1) / 2)};
  const View<Bf16> B{static_cast<const Bf16*>(b.data()), ssize_t(b.strides(0) / 2), ssize_t(b.strides(1) / 2)};
  // isa="auto" on the scalar level (a CPU without AVX2, or TINYLEARN_CPU_FEATURES=scalar): the portable packed kernel,
  // which the compiler vectorises with the x86-64 baseline (SSE2), ~8x the no-SIMD kernel; isa="scalar" named
  // explicitly: the no-SIMD baseline of the ladder
  const Kernel<float> kn = kernel_for<float>(isa == "scalar" && isa_req == "auto" ? "packed" : "simd", isa);
  const bool dp = use_dpbf16(dot, isa);
  const bool to_bf16 = out == "bfloat16";
  py::array_t<float> c({d.M, d.N});
  py::array_t<uint16_t> r(to_bf16 ? std::vector<ssize_t>{d.M, d.N} : std::vector<ssize_t>{0});
  float* cp = c.mutable_data();
  uint16_t* rp = r.mutable_data();
  // the epilogue on each finished block (gemm_packed): + bias in fp32, then the one rounding to bf16
  auto epi = [&](ssize_t i0, ssize_t mc, ssize_t j0, ssize_t nc) {
    for (ssize_t i = i0; i < i0 + mc; ++i) {
      float* ci = cp + i * d.N;
      if (bp)
        for (ssize_t j = j0; j < j0 + nc; ++j) ci[j] += widen(bp[j]);
      if (to_bf16)
        for (ssize_t j = j0; j < j0 + nc; ++j) rp[i * d.N + j] = tl::bf16_round(ci[j]);
    }
  };
  {
    py::gil_scoped_release release;  // no Python object is touched (copied, returned) without the GIL
    if (dp)
      gemm_packed(A, B, cp, d, kDpbf16Kernel, threads, epi);
    else
      gemm_packed(A, B, cp, d, kn, threads, epi);
  }
  if (to_bf16) return r;
  return c;
}

// pack_a / pack_b of a whole matrix (kc = K, one block), for tests and the notebook: shape (panels, K, MR|NR).
// panel_axis: the axis cut into panels of w (0: A's rows, pack_a; 1: B's columns, pack_b); K is the other one.
template <class Pack>
py::array_t<float> pack_whole(py::array_t<float> in, ssize_t w, int panel_axis, const std::string& fn,
                              const char* mat, const char* warg, Pack pack, bool simd) {
  if (simd && !tl::cpu_has("avx2"))
    tl::value_error(fn + ": simd=True needs AVX2 (the transposing packs); this CPU or TINYLEARN_CPU_FEATURES has none");
  if (in.ndim() != 2) tl::value_error(fn + ": " + mat + " must be 2-D, got shape " + shape_str(in));
  if (w < 1) tl::value_error(fn + ": " + warg + " must be >= 1, got " + std::to_string(w));
  py::array v = as_view_array(in);
  const ssize_t R = v.shape(0), C = v.shape(1), L = v.shape(panel_axis), K = v.shape(1 - panel_axis);
  // + 8: pack_a_t8's spill past the last k-slice (as gemm_packed's buffers)
  std::vector<float> buf(size_t((L + w - 1) / w) * K * w + 8);
  pack(view_of<float>(v), 0, R, 0, C, w, buf.data(), simd);
  py::array_t<float> out({(L + w - 1) / w, K, w});
  std::copy(buf.begin(), buf.end() - 8, out.mutable_data());
  return out;
}

py::array_t<float> pack_a_py(py::array_t<float> a_in, ssize_t mr, bool simd) {
  return pack_whole(a_in, mr, 0, "gemm.pack_a", "a", "mr", pack_a<float, float>, simd);
}

py::array_t<float> pack_b_py(py::array_t<float> b_in, ssize_t nr, bool simd) {
  return pack_whole(b_in, nr, 1, "gemm.pack_b", "b", "nr", pack_b<float, float>, simd);
}

// ------------------------------------------------------------------------------------------------ FMA peak
// The compute roof: every thread runs machine.cpp's register-only FMA loop (tl::mac_loop: fp32_fma_zmm / _ymm, or
// the scalar fp32_fma_scalar; 10 independent accumulator chains, more than FMA latency x FMA ports, no memory
// traffic); FLOPs = 2 x the multiply-accumulates of all threads over the wall time of the parallel region.

// Best-of-`repeat` FP32 GFLOP/s of `threads` threads each running the register FMA loop for `iters` iterations
// (an iteration is 12 FMAs, as in the loop this probe replaced: tl::mac_loop runs 20 per trip).
py::dict fma_peak(long iters, const py::object& threads_obj, int repeat, const std::string& isa_req) {
  if (iters < 1) tl::value_error("gemm.fma_peak: iters must be >= 1, got " + std::to_string(iters));
  if (repeat < 1) tl::value_error("gemm.fma_peak: repeat must be >= 1, got " + std::to_string(repeat));
  const std::string isa = pick_isa(isa_req);
  const int threads = threads_arg(threads_obj, "gemm.fma_peak");
  const std::string kind = isa == "avx512" ? "fp32_fma_zmm" : isa == "avx2" ? "fp32_fma_ymm" : "fp32_fma_scalar";
  const int64_t trips = std::max<int64_t>(1, int64_t(iters) * 12 / 20);
  tl::mac_loop(kind, 1);  // checks the kind against the CPU here, not inside the parallel region
  double best = 0;
  {
    py::gil_scoped_release release;
    for (int r = 0; r < repeat; ++r) {
      double macs = 0;
      const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : macs)
      macs += tl::mac_loop(kind, trips);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, 2 * macs / s / 1e9);
    }
  }
  py::dict out;
  out["gflops"] = best;
  out["threads"] = threads;
  out["isa"] = isa;
  return out;
}

}  // namespace

// The micro-kernel of gemm.matmul(version="simd", isa="auto") for other translation units (gemm_ukr.h).
namespace tl {
namespace {
const char* isa_name(const std::string& isa) { return isa == "avx512" ? "avx512" : isa == "avx2" ? "avx2" : "scalar"; }
}  // namespace

GemmMicroKernel<float> gemm_micro_kernel_f32() {
  const std::string isa = pick_isa("auto");
  const Kernel<float> k = kernel_for<float>("simd", isa);
  return {k.ukr, k.MR, k.NR, isa_name(isa)};
}

GemmMicroKernel<double> gemm_micro_kernel_f64() {
  const std::string isa = pick_isa("auto");
  const Kernel<double> k = kernel_for<double>("simd", isa);
  return {k.ukr, k.MR, k.NR, isa_name(isa)};
}
}  // namespace tl

TL_REGISTER(gemm) {
  m.doc() = "fp32/fp64 GEMM ladder: naive, ikj, blocked, packed, simd (AVX2/AVX-512 FMA micro-kernel), parallel";
  m.def("matmul", &matmul, py::arg("a"), py::arg("b"), py::arg("version") = "parallel", py::arg("isa") = "auto",
        py::arg("threads") = 0, py::arg("mc") = 0, py::arg("kc") = 0, py::arg("nc") = 0,
        "C = a @ b (float32 or float64, any strides) with one rung of the ladder; isa: auto|scalar|avx2|avx512 "
        "(auto reads TINYLEARN_CPU_FEATURES); threads (parallel only): 0 = OpenMP default, at most 1024 (more is "
        "clamped), negative is a ValueError; mc, kc, nc (packed, simd, parallel): cache-block overrides, 0 = the "
        "kernel's own (kernel_shape), MC rounded up to a multiple of MR and NC of NR");
  m.def("versions", []() { return kVersions; }, "the ladder, slowest first");
  m.def("isa", []() { return pick_isa("auto"); }, "the micro-kernel ISA a call with isa='auto' uses");
  m.def("isa_paths", []() {
    std::vector<std::string> out;
    for (const char* p : {"avx512", "avx2", "scalar"})
      if (gemm_path_ok(p)) out.push_back(p);
    return out;
  }, "micro-kernel ISAs this CPU can run, best first");
  m.def("max_threads", &tl::n_threads, "OpenMP's default thread count");
  m.def("kernel_shape", [](const std::string& version, const std::string& isa, const std::string& dtype) {
    auto shape = [](auto kn) {
      return py::dict(py::arg("MR") = kn.MR, py::arg("NR") = kn.NR, py::arg("KC") = kn.KC, py::arg("MC") = kn.MC,
                      py::arg("NC") = kn.NC);
    };
    if (dtype == "float64") return shape(kernel_for<double>(version, pick_isa(isa)));
    if (dtype != "float32") tl::value_error("gemm.kernel_shape: dtype must be float32 or float64, got " + dtype);
    return shape(kernel_for<float>(version, pick_isa(isa)));
  }, py::arg("version") = "simd", py::arg("isa") = "auto", py::arg("dtype") = "float32",
     "micro-kernel tile MR x NR and cache blocks KC, MC, NC of a packed version");
  m.def("bf16_matmul", &bf16_matmul, py::arg("a"), py::arg("b"), py::arg("out") = "float32", py::arg("isa") = "auto",
        py::arg("threads") = 0, py::arg("bias") = py::none(), py::arg("dot") = "auto",
        "C = a @ b for bfloat16 a, b given as uint16 bit patterns (any strides): the packed SIMD GEMM with bf16 "
        "widened to fp32 in the packing (fp32 accumulation of the bf16 values), or on AVX512_BF16 the vdpbf16ps "
        "kernel on bf16 pairs; out='float32' (the accumulator) or "
        "'bfloat16' (uint16 bits, round to nearest even); isa: auto|scalar|avx2|avx512; threads: 0 = OpenMP default; "
        "bias: bf16 bits [N] added in fp32 before the rounding, or None; dot: auto|widen|dpbf16 (dpbf16 treats "
        "subnormal bf16 inputs as zero)");
  m.def(
      "bf16_dot_path", [](const std::string& isa) { return std::string(dpbf16_ok(pick_isa(isa)) ? "dpbf16" : "widen"); },
      py::arg("isa") = "auto", "the kernel bf16_matmul(dot='auto') runs now: 'dpbf16' (AVX512_BF16) or 'widen'");
  m.def("pack_a", &pack_a_py, py::arg("a"), py::arg("mr"), py::arg("simd") = false,
        "pack a (M, K) float32 matrix into (ceil(M/mr), K, mr) micro-panels, zero-padded; simd=True: the AVX2 "
        "transposing pack for a row-major a where it applies (mr 6 or 8), as the AVX2/AVX-512 GEMM kernels use");
  m.def("pack_b", &pack_b_py, py::arg("b"), py::arg("nr"), py::arg("simd") = false,
        "pack a (K, N) float32 matrix into (ceil(N/nr), K, nr) micro-panels, zero-padded; simd=True: the AVX2 "
        "transposing pack for a column-major b (e.g. W.T) where it applies (nr a multiple of 8)");
  m.def("fma_peak", &fma_peak, py::arg("iters") = 20000000, py::arg("threads") = 0, py::arg("repeat") = 3,
        py::arg("isa") = "auto",
        "register-only FMA loop: best-of-repeat fp32 GFLOP/s on `threads` threads (0 = OpenMP default, at most 1024)");
}
