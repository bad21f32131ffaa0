// quant_int8_gemm.cpp — exact int8 x int8 -> int32 GEMM, C[M,N] = A[M,K] @ B[K,N], for tinylearn.quant.
//
// Versions (all exact; each is checked against numpy's int64 matmul in tests/test_quant_gemm.py):
//   scalar       portable i-k-j loops with int32 accumulators (any CPU)
//   avx2         B packed as int16 pairs [N/8][K/2][8][2]; A pairs broadcast; _mm256_madd_epi16 (int16 x int16 ->
//                int32 pair sums, exact: |a*b + a'*b'| <= 2 * 128 * 128). Sign-extending avoids the trap of
//                _mm256_maddubs_epi16, which is u8 x s8 with *saturating* int16 pair sums (255*-128*2 overflows).
//   avx512vnni   B packed as bytes [N/16][K/4][16][4]; _mm512_dpbusd_epi32 is u8 x s8 with exact int32 sums, so A
//                is offset to unsigned (a + 128 = a ^ 0x80) and the offset is removed afterwards:
//                sum_k (a_ik + 128) b_kj = C_ij + 128 * colsum_j(B).
// Dispatch happens at run time (tl::cpu_has in cpu_features.h, which honours TINYLEARN_CPU_FEATURES) and each
// SIMD path is compiled with __attribute__((target(...))), so a portable (-march=x86-64) build still uses them.
// Register blocking: 6 rows x 4 zmm (VNNI, 24 accumulators) or 6 rows x 2 ymm (avx2_madd16), 3 rows x 4 ymm
// (avx2_wino, Winograd's inner product, see the packed-B ladder below), 4 rows for avx2_u7 and scalar.
// Threads: the per-call int8_gemm versions split column panels; the packed GEMM and the dynamic Linear run in
// one OpenMP region with no barrier inside (run_row_items: row chunks that prepare their own rows, or column panels
// for small M).
#include "cpu_features.h"
#include "machine_probe.h"
#include "registry.h"

#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <cstdint>
#include <type_traits>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using i8 = int8_t;
using i32 = int32_t;

// ---------------------------------------------------------------- scalar
void gemm_scalar(const i8* A, const i8* B, i32* C, ssize_t M, ssize_t K, ssize_t N) {
#pragma omp parallel for schedule(static)
  for (ssize_t i = 0; i < M; ++i) {
    i32* c = C + i * N;
    for (ssize_t j = 0; j < N; ++j) c[j] = 0;
    for (ssize_t k = 0; k < K; ++k) {
      const i32 a = A[i * K + k];
      const i8* b = B + k * N;
      for (ssize_t j = 0; j < N; ++j) c[j] += a * b[j];
    }
  }
}

constexpr int MR = 4;

// ---------------------------------------------------------------- AVX2 (int16 madd)
// packed B: panels of 16 columns (2 x 8-lane vectors); panel p, pair kk: 16 columns x 2 int16 = 32 int16
__attribute__((target("avx2"))) void pack_b_avx2(const i8* B, int16_t* P, ssize_t K, ssize_t N, ssize_t K2,
                                                 ssize_t NP) {
  // P[p][kk][c][t] with c in 0..15, t in 0..1 ; value B[2kk+t][16p+c] (0 outside). Rows of B are read
  // contiguously (t outer, c inner) so the pack streams through B once.
#pragma omp parallel for schedule(static)
  for (ssize_t p = 0; p < NP; ++p) {
    const ssize_t j0 = 16 * p, nj = std::min<ssize_t>(16, N - j0);
    for (ssize_t kk = 0; kk < K2; ++kk) {
      int16_t* dst = P + (p * K2 + kk) * 32;
      for (int t = 0; t < 2; ++t) {
        const ssize_t k = 2 * kk + t;
        const i8* src = (k < K) ? B + k * N + j0 : nullptr;
        for (int c = 0; c < 16; ++c) dst[c * 2 + t] = (src && c < nj) ? int16_t(src[c]) : int16_t(0);
      }
    }
  }
}

__attribute__((target("avx2"))) void gemm_avx2(const i8* A, const i8* B, i32* C, ssize_t M, ssize_t K, ssize_t N) {
  const ssize_t K2 = (K + 1) / 2, NP = (N + 15) / 16, MP = (M + MR - 1) / MR;
  std::vector<int16_t> P(size_t(NP) * K2 * 32);
  pack_b_avx2(B, P.data(), K, N, K2, NP);
  // A as int16 pairs packed in int32: Ap[i][kk] = (a[i,2kk] & 0xffff) | a[i,2kk+1] << 16
  std::vector<i32> Ap(size_t(MP) * MR * K2, 0);
#pragma omp parallel for schedule(static)
  for (ssize_t i = 0; i < M; ++i)
    for (ssize_t kk = 0; kk < K2; ++kk) {
      const int16_t lo = A[i * K + 2 * kk];
      const int16_t hi = (2 * kk + 1 < K) ? A[i * K + 2 * kk + 1] : 0;
      Ap[i * K2 + kk] = i32(uint16_t(lo)) | i32(uint32_t(uint16_t(hi)) << 16);
    }
#pragma omp parallel for collapse(2) schedule(static)
  for (ssize_t p = 0; p < NP; ++p)
    for (ssize_t ib = 0; ib < MP; ++ib) {
      __m256i acc[MR][2];
      for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
      const int16_t* bp = P.data() + p * K2 * 32;
      const i32* ap = Ap.data() + ib * MR * K2;
      for (ssize_t kk = 0; kk < K2; ++kk) {
        const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + kk * 32));
        const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + kk * 32 + 16));
        for (int r = 0; r < MR; ++r) {
          const __m256i a = _mm256_set1_epi32(ap[r * K2 + kk]);
          acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(a, b0));
          acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(a, b1));
        }
      }
      for (int r = 0; r < MR; ++r) {
        const ssize_t i = ib * MR + r;
        if (i >= M) break;
        alignas(32) i32 tmp[16];
        _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), acc[r][0]);
        _mm256_store_si256(reinterpret_cast<__m256i*>(tmp + 8), acc[r][1]);
        const ssize_t j0 = p * 16, nj = std::min<ssize_t>(16, N - j0);
        std::memcpy(C + i * N + j0, tmp, size_t(nj) * sizeof(i32));
      }
    }
}

// ---------------------------------------------------------------- AVX-512 VNNI (dpbusd with offset)
constexpr int NV = 4;         // zmm vectors of 16 columns per panel -> 64 columns
constexpr int NPW = 16 * NV;  // panel width
constexpr ssize_t KCB = 64;   // K block in 4-byte words: a 64 x 64-column B block is 16 KB and stays in L1

// P[p][kq][c][t] (c < NPW, t < 4) = B[4kq+t][NPW p+c] (0 outside); colsum[j] = sum_k B[k][j]
void pack_b_vnni(const i8* B, i8* P, i32* colsum, ssize_t K, ssize_t N) {
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

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void gemm_vnni_packed(const i8* A, const i8* P,
                                                                               const i32* colsum, i32* C, ssize_t M,
                                                                               ssize_t K, ssize_t N) {
  const ssize_t K4 = (K + 3) / 4, NP = (N + NPW - 1) / NPW, MP = (M + MR - 1) / MR;
  // A offset to unsigned, rows padded to MR, K padded to 4 (padding bytes meet zero B entries)
  std::vector<uint8_t> Au(size_t(MP) * MR * K4 * 4, 0x80);
#pragma omp parallel for schedule(static)
  for (ssize_t i = 0; i < M; ++i)
    for (ssize_t k = 0; k < K; ++k) Au[i * K4 * 4 + k] = uint8_t(A[i * K + k]) ^ 0x80;
  // parallel over column panels when there are enough of them, else over row blocks
  const bool by_panel = NP >= 2 * 2;
#pragma omp parallel
  {
#pragma omp for collapse(2) schedule(static)
    for (ssize_t p = 0; p < NP; ++p)
      for (ssize_t ibo = 0; ibo < (by_panel ? 1 : MP); ++ibo) {
        const ssize_t ib0 = by_panel ? 0 : ibo, ib1 = by_panel ? MP : ibo + 1;
        const i8* bpanel = P + p * K4 * NPW * 4;
        // C tile rows [ib0*MR, ib1*MR) x panel columns, accumulated over K blocks in an int32 scratch
        std::vector<i32> ctile(size_t(ib1 - ib0) * MR * NPW, 0);
        for (ssize_t k0 = 0; k0 < K4; k0 += KCB) {
          const ssize_t k1 = std::min(K4, k0 + KCB);
          for (ssize_t ib = ib0; ib < ib1; ++ib) {
            i32* ct = ctile.data() + (ib - ib0) * MR * NPW;
            __m512i acc[MR][NV];
            for (int r = 0; r < MR; ++r)
              for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_loadu_si512(ct + r * NPW + 16 * v);
            const uint8_t* ap = Au.data() + ib * MR * K4 * 4;
            for (ssize_t kq = k0; kq < k1; ++kq) {
              __m512i b[NV];
              for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_si512(bpanel + (kq * NPW + 16 * v) * 4);
              for (int r = 0; r < MR; ++r) {
                i32 a4;
                std::memcpy(&a4, ap + (r * K4 + kq) * 4, 4);
                const __m512i a = _mm512_set1_epi32(a4);
                for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], a, b[v]);
              }
            }
            for (int r = 0; r < MR; ++r)
              for (int v = 0; v < NV; ++v) _mm512_storeu_si512(ct + r * NPW + 16 * v, acc[r][v]);
          }
        }
        const ssize_t j0 = p * NPW, nj = std::min<ssize_t>(NPW, N - j0);
        for (ssize_t ib = ib0; ib < ib1; ++ib)
          for (int r = 0; r < MR; ++r) {
            const ssize_t i = ib * MR + r;
            if (i >= M) break;
            const i32* ct = ctile.data() + ((ib - ib0) * MR + r) * NPW;
            // * 128, not << 7: colsum may be negative (left shift of a negative int is UB)
            for (ssize_t c = 0; c < nj; ++c) C[i * N + j0 + c] = ct[c] - colsum[p * NPW + c] * 128;
          }
      }
  }
}

void gemm_vnni(const i8* A, const i8* B, i32* C, ssize_t M, ssize_t K, ssize_t N) {
  const ssize_t K4 = (K + 3) / 4, NP = (N + NPW - 1) / NPW;
  std::vector<i8> P(size_t(NP) * K4 * NPW * 4);
  std::vector<i32> colsum(size_t(NP) * NPW);
  pack_b_vnni(B, P.data(), colsum.data(), K, N);
  gemm_vnni_packed(A, P.data(), colsum.data(), C, M, K, N);
}

// Effective features (tl::cpu_has honours TINYLEARN_CPU_FEATURES=scalar|avx2|avx512).
bool has(const char* f) {
  if (std::string(f) == "avx2") return tl::cpu_has("avx2");
  if (std::string(f) == "avx512vnni")
    return tl::cpu_has("avx512f") && tl::cpu_has("avx512bw") && tl::cpu_has("avx512vnni");
  return false;
}

std::vector<std::string> paths() {
  std::vector<std::string> out;
  if (has("avx512vnni")) out.push_back("avx512vnni");
  if (has("avx2")) out.push_back("avx2");
  out.push_back("scalar");
  return out;
}

py::array_t<i8, py::array::c_style> as_int8(const py::array& x, const char* name) {
  if (!x.dtype().is(py::dtype::of<i8>()))
    throw py::type_error(std::string("int8_gemm: ") + name + " must have dtype int8, got " +
                         std::string(py::str(x.dtype())));
  if (x.ndim() != 2)
    tl::value_error(std::string("int8_gemm: ") + name + " must be 2-D, got ndim " + std::to_string(x.ndim()));
  return py::array_t<i8, py::array::c_style>::ensure(x);
}

py::array_t<i32> int8_gemm(const py::array& a_in, const py::array& b_in, const std::string& path) {
  auto a = as_int8(a_in, "a");
  auto b = as_int8(b_in, "b");
  const ssize_t M = a.shape(0), K = a.shape(1), N = b.shape(1);
  if (b.shape(0) != K)
    tl::value_error("int8_gemm: inner dimensions differ: a is (" + std::to_string(M) + ", " + std::to_string(K) +
                    "), b is (" + std::to_string(b.shape(0)) + ", " + std::to_string(N) + ")");
  if (K > (ssize_t(1) << 17))
    tl::value_error("int8_gemm: inner dimension K=" + std::to_string(K) +
                    " > 131072 could overflow the int32 accumulator (|C| <= K * 2^14)");
  std::string p = path;
  if (p == "auto") p = paths().front();
  if (p != "scalar" && p != "avx2" && p != "avx512vnni")
    tl::value_error("int8_gemm: unknown path '" + path + "' (auto, avx512vnni, avx2, scalar)");
  if ((p == "avx2" && !has("avx2")) || (p == "avx512vnni" && !has("avx512vnni")))
    tl::value_error("int8_gemm: path '" + p + "' is not supported by this CPU");
  py::array_t<i32> c({M, N});
  const i8* pa = a.data();
  const i8* pb = b.data();
  i32* pc = c.mutable_data();
  if (M == 0 || N == 0) return c;
  {
    py::gil_scoped_release release;
    if (K == 0)
      std::memset(pc, 0, size_t(M * N) * sizeof(i32));
    else if (p == "avx512vnni")
      gemm_vnni(pa, pb, pc, M, K, N);
    else if (p == "avx2")
      gemm_avx2(pa, pb, pc, M, K, N);
    else
      gemm_scalar(pa, pb, pc, M, K, N);
  }
  return c;
}

// Pre-packed B for repeated products with the same weights (what a quantized Linear stores): returns
// (packed bytes, colsum). int8_gemm_prepacked(a, packed, colsum, n) then only offsets A and runs the kernel.
py::tuple pack_b(const py::array& b_in) {
  if (!has("avx512vnni")) tl::value_error("int8_pack_b: needs the avx512vnni path, which this CPU lacks");
  auto b = as_int8(b_in, "b");
  const ssize_t K = b.shape(0), N = b.shape(1), K4 = (K + 3) / 4, NP = (N + NPW - 1) / NPW;
  py::array_t<i8> P(NP * K4 * NPW * 4);
  py::array_t<i32> cs(NP * NPW);
  {
    py::gil_scoped_release release;
    pack_b_vnni(b.data(), P.mutable_data(), cs.mutable_data(), K, N);
  }
  return py::make_tuple(P, cs);
}

py::array_t<i32> gemm_prepacked(const py::array& a_in, py::array_t<i8, py::array::c_style> P,
                                py::array_t<i32, py::array::c_style> cs, ssize_t N) {
  auto a = as_int8(a_in, "a");
  const ssize_t M = a.shape(0), K = a.shape(1), K4 = (K + 3) / 4, NP = (N + NPW - 1) / NPW;
  if (N < 1 || P.size() != NP * K4 * NPW * 4 || cs.size() != NP * NPW)
    tl::value_error("int8_gemm_prepacked: packed weights do not match a with K=" + std::to_string(K) +
                    " and n=" + std::to_string(N));
  py::array_t<i32> c({M, N});
  if (M == 0) return c;
  {
    py::gil_scoped_release release;
    gemm_vnni_packed(a.data(), P.data(), cs.data(), c.mutable_data(), M, K, N);
  }
  return c;
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
__attribute__((target("avx2"))) void widen_block(const i8* bp, ssize_t k0, ssize_t k1, int16_t* bw) {
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
__attribute__((target("avx2"))) void mk_u7<4>(const uint8_t* ap, ssize_t lda, const i8* bp, ssize_t k0, ssize_t k1,
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
__attribute__((target("avx2"))) void widen_block_wino(const i8* bp, ssize_t k0, ssize_t k1, int16_t* bw) {
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
__attribute__((target("avx2"))) void wino_col_terms(const int16_t* bw, ssize_t kb, i32* cc) {
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

int thread_num() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// S = A' @ B for the packed B, A' rows of stride lda (rows padded to MRP); ep(i, j0, nj, s_row) writes row i's
// columns [j0, j0 + nj) from the int32 sums s_row. Work items: (64-column panel, chunk of mr-row blocks), each with
// its own int32 tile, K blocked by KCB (a 16 KB B block stays in L1 while the chunk's rows stream past it).
template <typename AT, typename EP>
void run_packed(Kern kern, const AT* A, ssize_t lda, ssize_t M, ssize_t K4, const i8* P, ssize_t N, EP ep) {
  if (kern == Kern::avx2_wino) tl::value_error("run_packed: avx2_wino runs through run_row_items only");
  const int mr = kern_mr(kern);
  const ssize_t NP = (N + NPW - 1) / NPW, MP = (M + mr - 1) / mr;
  const ssize_t want = 4 * ssize_t(max_threads());
  // at most 48 rows per item: its int32 tile (12 KB) stays in L1 next to the 16 KB B block
  const ssize_t maxb = 48 / mr;
  const ssize_t chunks =
      std::max<ssize_t>({ssize_t(1), std::min<ssize_t>(MP, (want + NP - 1) / NP), (MP + maxb - 1) / maxb});
  const ssize_t per = (MP + chunks - 1) / chunks;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (ssize_t p = 0; p < NP; ++p)
    for (ssize_t ch = 0; ch < chunks; ++ch) {
      const ssize_t ib0 = ch * per, ib1 = std::min(MP, ib0 + per);
      if (ib0 >= ib1) continue;
      const i8* bp = P + p * K4 * NPW * 4;
      std::vector<i32> tile(size_t(ib1 - ib0) * mr * NPW, 0);
      // madd16: each K block of B is sign-extended to int16 once per work item
      const bool wide = std::is_same_v<AT, int16_t>;
      const ssize_t kcb = KCB;  // madd16: the int16 block is 32 KB (L1-sized; its 8-column strips stream)
      std::vector<int16_t> bw(wide ? size_t(kcb) * NPW * 4 : 0);
      for (ssize_t k0 = 0; k0 < K4; k0 += kcb) {
        const ssize_t k1 = std::min(K4, k0 + kcb);
        if (wide) widen_block(bp, k0, k1, bw.data());
        for (ssize_t ib = ib0; ib < ib1; ++ib) {
          const int rows = int(std::min<ssize_t>(mr, M - ib * mr));
          micro<AT>(kern, rows, A + ib * mr * lda, lda, bp, bw.data(), k0, k1, tile.data() + (ib - ib0) * mr * NPW);
        }
      }
      const ssize_t j0 = p * NPW, nj = std::min<ssize_t>(NPW, N - j0);
      for (ssize_t ib = ib0; ib < ib1; ++ib)
        for (int r = 0; r < mr; ++r) {
          const ssize_t i = ib * mr + r;
          if (i >= M) break;
          ep(i, j0, nj, tile.data() + ((ib - ib0) * mr + r) * NPW);
        }
    }
}

bool kern_supported(Kern k) {
  if (k == Kern::vnni) return has("avx512vnni");
  if (k == Kern::avx2_madd16 || k == Kern::avx2_u7 || k == Kern::avx2_wino) return has("avx2");
  return true;
}

const char* kern_name(Kern k) {
  switch (k) {
    case Kern::vnni: return "avx512vnni";
    case Kern::avx2_madd16: return "avx2_madd16";
    case Kern::avx2_u7: return "avx2_u7";
    case Kern::avx2_wino: return "avx2_wino";
    default: return "scalar";
  }
}

// AVX2 without VNNI: which kernel family suits this core, measured once per process. madd16 and u7 issue one
// vpmaddwd (or vpmaddubsw) per 16 MACs, Winograd one per 32 MACs plus two vpaddw: the same instruction count,
// so Winograd only wins where the integer multiplier is the bottleneck, i.e. where a stream of vpmaddwd + vpaddd
// runs at < 1.5x the MAC rate of a stream of fp32 FMAs (Zen 2: 1.0x, one multiply pipe next to two FMA pipes;
// cores with two multiply pipes: ~2x). The probe is machine.cpp's mac_rate (~1 ms once per process).
struct Avx2Choice {
  bool wino = false;
  double madd16_over_fma = 0.0;  // the measured MAC-rate ratio (0: not measured, e.g. no FMA)
};
const Avx2Choice& avx2_choice() {
  static const Avx2Choice c = [] {
    Avx2Choice r;
    try {
      // a warm-up of each (the core leaves its idle clock; short probes read it low: one process measured 1.45
      // instead of 1.0 with 3 x 4000 trips and no warm-up), then the best of 3 x 20000 trips (~0.1 ms each)
      tl::mac_rate_raw("int8_madd16_ymm", 20000);
      tl::mac_rate_raw("fp32_fma_ymm", 20000);
      double m = 0.0, f = 0.0;
      for (int t = 0; t < 3; ++t) {
        m = std::max(m, tl::mac_rate_raw("int8_madd16_ymm", 20000));
        f = std::max(f, tl::mac_rate_raw("fp32_fma_ymm", 20000));
      }
      r.madd16_over_fma = m / f;
      r.wino = r.madd16_over_fma < 1.5;
    } catch (const std::invalid_argument&) {  // a CPU without FMA (or not x86-64): keep the direct kernels
    }
    return r;
  }();
  return c;
}

// Below this many rows of A, "auto" keeps avx2_u7 for 7-bit codes even where Winograd wins at size: Winograd (like
// madd16) widens B to int16 once per call, u7 reads the packed bytes as they are, and at few rows that per-call
// pass is the larger cost (Zen 2, dynamic Linear 1024->1024: u7 0.37x / 0.87x torch's time at batch 1 / 32,
// Winograd 1.5x / 1.3x; even at 128, Winograd ahead from 512)
constexpr ssize_t WINO_MIN_ROWS = 128;

// version string -> kernel. "auto": vnni, else on AVX2 avx2_wino where the multiplier is the bottleneck
// (avx2_choice) unless M < WINO_MIN_ROWS and the codes are 7-bit, else avx2_u7 when every A code is <= 127 (u7_ok),
// else avx2_madd16; else scalar. An explicit version the CPU (or TINYLEARN_CPU_FEATURES) lacks is a ValueError.
Kern pick_kern(const std::string& version, bool u7_ok, ssize_t M, const char* fn) {
  if (version == "auto") {
    if (has("avx512vnni")) return Kern::vnni;
    if (has("avx2")) {
      if (avx2_choice().wino && !(u7_ok && M < WINO_MIN_ROWS)) return Kern::avx2_wino;
      return u7_ok ? Kern::avx2_u7 : Kern::avx2_madd16;
    }
    return Kern::scalar;
  }
  Kern k;
  if (version == "avx512vnni") k = Kern::vnni;
  else if (version == "avx2_madd16") k = Kern::avx2_madd16;
  else if (version == "avx2_u7") k = Kern::avx2_u7;
  else if (version == "avx2_wino") k = Kern::avx2_wino;
  else if (version == "scalar") k = Kern::scalar;
  else
    tl::value_error(std::string(fn) + ": version: unknown '" + version +
                    "' (auto, avx512vnni, avx2_madd16, avx2_u7, avx2_wino, scalar)");
  if (!kern_supported(k))
    tl::value_error(std::string(fn) + ": version: '" + version + "' is not supported by this CPU");
  if (k == Kern::avx2_u7 && !u7_ok)
    tl::value_error(std::string(fn) + ": version: 'avx2_u7' needs activation codes in 0..127 (vpmaddubsw would "
                    "saturate its int16 pair sums); use avx2_madd16, or 7-bit (reduce_range) activations");
  return k;
}

std::vector<std::string> packed_versions() {
  std::vector<std::string> out;
  if (has("avx512vnni")) out.push_back("avx512vnni");
  if (has("avx2")) {
    const bool w = avx2_choice().wino;  // best first: Winograd where the multiplier is the bottleneck
    if (w) out.push_back("avx2_wino");
    out.push_back("avx2_madd16");
    out.push_back("avx2_u7");
    if (!w) out.push_back("avx2_wino");
  }
  out.push_back("scalar");
  return out;
}

// Row stride (elements) of the A operand: K padded to 4, plus one cache line when the row length in bytes is a
// multiple of 512 (K = 1024, 4096 ...): the 4 rows a micro-kernel reads would otherwise sit a multiple of 4 KB
// apart (or 2 of them would), sharing L1 sets and 4K-aliasing the tile stores -- that halved the rate at K = 4096.
ssize_t a_stride(ssize_t K4, int elem_bytes) {
  const ssize_t row = K4 * 4;
  return (row * elem_bytes) % 512 == 0 ? row + 64 / elem_bytes : row;
}

// the Winograd operand's stride: room for the row term (an int32 after the K4 * 4 values), 32-byte multiple
ssize_t wino_lda(ssize_t K4) { return a_stride(K4, 2) + 16; }

// A rows -> kernel operand: u8 codes (int8 A offset by 128) or int16 values for madd16; rows padded to MR.
struct PreparedA {
  std::vector<uint8_t> u8;
  std::vector<int16_t> s16;
  ssize_t lda = 0;
  int offset = 0;  // what was added to A's values: S - offset * colsum = A @ B
};

template <typename T>  // T = int8_t or uint8_t source codes, row-major [M, K]
PreparedA prepare_a(const T* A, ssize_t M, ssize_t K, Kern kern) {
  PreparedA pa;
  const ssize_t K4 = (K + 3) / 4;
  pa.lda = a_stride(K4, kern == Kern::avx2_madd16 ? 2 : 1);
  const size_t n = size_t(padded_rows(M)) * pa.lda;
  if (kern == Kern::avx2_madd16) {
    pa.s16.assign(n, 0);
#pragma omp parallel for schedule(static) if (M * K > 65536)
    for (ssize_t i = 0; i < M; ++i)
      for (ssize_t k = 0; k < K; ++k) pa.s16[i * pa.lda + k] = int16_t(A[i * K + k]);
  } else {
    pa.u8.assign(n, 0);
    const bool s = std::is_signed_v<T>;
    pa.offset = s ? 128 : 0;
#pragma omp parallel for schedule(static) if (M * K > 65536)
    for (ssize_t i = 0; i < M; ++i)
      for (ssize_t k = 0; k < K; ++k) pa.u8[i * pa.lda + k] = s ? uint8_t(A[i * K + k]) ^ 0x80 : uint8_t(A[i * K + k]);
  }
  return pa;
}

template <typename EP>
void run_prepared(Kern kern, const PreparedA& pa, ssize_t M, ssize_t K4, const i8* P, ssize_t N, EP ep) {
  if (kern == Kern::avx2_madd16)
    run_packed<int16_t>(kern, pa.s16.data(), pa.lda, M, K4, P, N, ep);
  else
    run_packed<uint8_t>(kern, pa.u8.data(), pa.lda, M, K4, P, N, ep);
}

struct Packed {
  py::array_t<i8, py::array::c_style> P;
  py::array_t<i32, py::array::c_style> cs;
  ssize_t K4, N;
};

Packed check_packed(const py::array& P_in, const py::array& cs_in, ssize_t K, ssize_t N, const char* fn) {
  auto P = py::array_t<i8, py::array::c_style>::ensure(P_in);
  auto cs = py::array_t<i32, py::array::c_style>::ensure(cs_in);
  const ssize_t K4 = (K + 3) / 4, NP = (N + NPW - 1) / NPW;
  if (!P || !cs || N < 1 || P.size() != NP * K4 * NPW * 4 || cs.size() != NP * NPW)
    tl::value_error(std::string(fn) + ": packed weights do not match K=" + std::to_string(K) +
                    " and n=" + std::to_string(N) + " (pack them with int8_pack)");
  return {P, cs, K4, N};
}

// portable pack (any CPU): same bytes as int8_pack_b
py::tuple pack_any(const py::array& b_in) {
  auto b = as_int8(b_in, "b");
  const ssize_t K = b.shape(0), N = b.shape(1), K4 = (K + 3) / 4, NP = (N + NPW - 1) / NPW;
  if (N < 1) tl::value_error("int8_pack: b must have at least one column, got shape (" + std::to_string(K) + ", 0)");
  py::array_t<i8> P(NP * K4 * NPW * 4);
  py::array_t<i32> cs(NP * NPW);
  {
    py::gil_scoped_release release;
    pack_b_vnni(b.data(), P.mutable_data(), cs.mutable_data(), K, N);
  }
  return py::make_tuple(P, cs);
}

// madd16's int16 copy of the packed B, shared by the threads of one call: each (panel, K block) piece is
// sign-extended once per call by the first thread that needs it (it claims the piece with a CAS, widens it into
// the shared buffer and publishes it), not once per work item -- with 48-row items B was widened 11-12 times per
// call at 512x1024x1024, ~7% of the time. A thread that finds a piece being widened by another does not wait (on a
// loaded 2-core box the other may be descheduled): it widens the piece into its own scratch. No barrier anywhere.
// The buffer is the calling thread's, kept between calls up to 16 MB (a fresh 2 MB allocation per call went back to
// the kernel and came back as page faults: ~20% of the time at 512x1024x1024); larger B get a per-call buffer.
// n int16, 64-byte aligned, for a unique_ptr with std::free (throws std::bad_alloc)
inline int16_t* aligned_i16(size_t n) {
  void* p = std::aligned_alloc(64, (n * sizeof(int16_t) + 63) / 64 * 64);
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<int16_t*>(p);
}
using AlignedI16 = std::unique_ptr<int16_t[], void (*)(void*)>;
// n int16, 64-byte aligned: while n <= keep, the calling thread's buffer for call site Tag, kept between calls and
// grown as needed (a fresh mmap'd block per call pays its page faults every time); above keep, a fresh one in `own`
template <typename Tag>
int16_t* kept_i16(size_t n, size_t keep, AlignedI16& own) {
  thread_local AlignedI16 kept{nullptr, std::free};
  thread_local size_t kept_n = 0;
  if (n > keep) {
    own.reset(aligned_i16(n));
    return own.get();
  }
  if (n > kept_n) {
    kept.reset(aligned_i16(n));
    kept_n = n;
  }
  return kept.get();
}

struct WideB {
  static constexpr size_t kKeep = size_t(8) << 20;  // int16 elements kept per calling thread (16 MB)
  ssize_t K4 = 0, nkb = 0;
  bool wino = false;                              // Winograd layout (widen_block_wino) instead of madd16's
  AlignedI16 own{nullptr, std::free};  // per-call buffer when B exceeds kKeep
  int16_t* buf = nullptr;                         // [panel][kq][NPW x 4], per K block grouped as widen_block writes
  std::unique_ptr<std::atomic<uint8_t>[]> state;  // per (panel, K block): 0 free, 1 being widened, 2 ready
  std::vector<i32> terms;                         // Winograd: per (panel, K block) the NPW column terms
  WideB(ssize_t NP, ssize_t K4_, ssize_t kcb, bool wino_)
      : K4(K4_), nkb((K4_ + kcb - 1) / kcb), wino(wino_), state(new std::atomic<uint8_t>[size_t(NP) * nkb]),
        terms(wino_ ? size_t(NP * nkb * NPW) : 0) {
    const size_t n = size_t(NP) * K4_ * NPW * 4;
    // 64-byte aligned (new[] of a large block returns 16 mod 4096: every other 32-byte load of it split a line)
    buf = kept_i16<WideB>(n, kKeep, own);
    for (ssize_t t = 0; t < NP * nkb; ++t) state[t].store(0, std::memory_order_relaxed);
  }
  // int16 rows [k0, k1) of panel p (bp: its bytes): the shared copy, or the caller's scratch `own`; Winograd:
  // *cc = the block's column terms (shared, or own_cc)
  const int16_t* get(ssize_t p, ssize_t kb, const i8* bp, ssize_t k0, ssize_t k1, int16_t* own, i32* own_cc,
                     const i32** cc) {
    std::atomic<uint8_t>& st = state[p * nkb + kb];
    int16_t* dst = buf + (p * K4 + k0) * NPW * 4;
    i32* tdst = wino ? terms.data() + (p * nkb + kb) * NPW : nullptr;
    uint8_t s = st.load(std::memory_order_acquire);
    if (s == 2) {
      *cc = tdst;
      return dst;
    }
    if (s == 0 && st.compare_exchange_strong(s, 1, std::memory_order_acq_rel)) {
      widen(bp, k0, k1, dst, tdst);
      st.store(2, std::memory_order_release);
      *cc = tdst;
      return dst;
    }
    widen(bp, k0, k1, own, own_cc);
    *cc = own_cc;
    return own;
  }
  void widen(const i8* bp, ssize_t k0, ssize_t k1, int16_t* dst, i32* tdst) const {
    if (wino) {
      widen_block_wino(bp, k0, k1, dst);
      wino_col_terms(dst, k1 - k0, tdst);  // once per call and block, not once per row chunk
    } else {
      widen_block(bp, k0, k1, dst);
    }
  }
};

// K block (4-byte k steps) of the madd16 path: 128 x 64 columns of int16 = 64 KB (L2; the kernel streams one
// 8-column strip, 8 KB, per row block), half the per-block accumulator reductions (hadd) of the 64 used before
constexpr ssize_t KCBW = 128;
// the Winograd kernel's K block: 64 kq of a panel are 32 KB of int16, two contiguous 16 KB halves (one per 32-column
// step of mk_wino); on Zen 2 blocks of 32 and 128 kq were slower
constexpr ssize_t KCB_WINO = 64;
inline ssize_t wide_kcb(Kern k) { return k == Kern::avx2_wino ? KCB_WINO : KCBW; }

// GEMM of rows [r0, r1) of the prepared A against column panels [p0, p1): chunks of at most 48 rows (the chunk's
// int32 tile, 12 KB, stays in L1 next to the 16 KB B block), K blocked by KCB (wide_kcb for madd16 / avx2_wino),
// ep(i, j0, nj, s_row) per row and panel. tile (48 x NPW int32) and bw (madd16: KCBW x NPW x 4 int16) are the calling thread's scratch;
// wb: the shared int16 B of madd16 / avx2_wino (null otherwise).
template <typename AT, typename EP>
void gemm_rows(Kern kern, const AT* A, ssize_t lda, ssize_t r0, ssize_t r1, ssize_t K4, const i8* P, ssize_t N,
               ssize_t p0, ssize_t p1, i32* tile, int16_t* bw, WideB* wb, const EP& ep, ssize_t rot = 0) {
  const int mr = kern_mr(kern);
  const ssize_t maxrows = 48 / mr * mr;
  constexpr bool wide = std::is_same_v<AT, int16_t>;
  const ssize_t kcb = wide ? wide_kcb(kern) : KCB;
  const bool wino = kern == Kern::avx2_wino;
  i32 cc[NPW];      // Winograd: the panel's column terms, summed over the K blocks
  i32 own_cc[NPW];  // ... of a block this thread widened into its own scratch
  for (ssize_t q = 0; q < p1 - p0; ++q) {
    const ssize_t p = p0 + (q + rot) % (p1 - p0);  // panels from p0 + rot on, wrapping
    const i8* bp = P + p * K4 * NPW * 4;
    const ssize_t j0 = p * NPW, nj = std::min<ssize_t>(NPW, N - j0);
    if constexpr (wide) {
      if (wino) {  // the panel's column terms first (widening its blocks now rather than in the K loop below)
        std::memset(cc, 0, sizeof(cc));
        for (ssize_t k0 = 0; k0 < K4; k0 += kcb) {
          const i32* bcc = nullptr;
          wb->get(p, k0 / kcb, bp, k0, std::min(K4, k0 + kcb), bw, own_cc, &bcc);
          for (int c = 0; c < NPW; ++c) cc[c] = i32(uint32_t(cc[c]) + uint32_t(bcc[c]));
        }
      }
    }
    for (ssize_t c0 = r0; c0 < r1; c0 += maxrows) {
      const ssize_t c1 = std::min(r1, c0 + maxrows);
      bool started = false;
      if constexpr (wide) {
        if (wino) {  // S = W - row term - column term (mod 2^32): the tile starts at -(row term + column term)
          for (ssize_t i = c0; i < c1; ++i) {
            const uint32_t rt = uint32_t(wino_row_term(A + i * lda, K4));
            i32* t = tile + (i - c0) * NPW;
            for (int c = 0; c < NPW; ++c) t[c] = i32(0u - rt - uint32_t(cc[c]));
          }
          started = true;
        }
      }
      if (!started) std::memset(tile, 0, size_t(c1 - c0) * NPW * sizeof(i32));
      for (ssize_t k0 = 0; k0 < K4; k0 += kcb) {
        const ssize_t k1 = std::min(K4, k0 + kcb);
        const int16_t* bwk = nullptr;
        if constexpr (wide) {
          const i32* bcc = nullptr;
          bwk = wb->get(p, k0 / kcb, bp, k0, k1, bw, own_cc, &bcc);
        }
        if (wino) {  // one 32-column half (16 KB of B, L1) against every row block, then the other
          if constexpr (wide) {
            for (int h = 0; h < NPW / 32; ++h)
              for (ssize_t i = c0; i < c1; i += mr) {
                const int rows = int(std::min<ssize_t>(mr, c1 - i));
                const int16_t* ai = A + i * lda;
                i32* ti = tile + (i - c0) * NPW;
                if (rows == 3) mk_wino<3>(ai, lda, bwk, k0, k1, ti, h, h + 1);
                else if (rows == 2) mk_wino<2>(ai, lda, bwk, k0, k1, ti, h, h + 1);
                else mk_wino<1>(ai, lda, bwk, k0, k1, ti, h, h + 1);
              }
          }
          continue;
        }
        for (ssize_t i = c0; i < c1; i += mr)
          micro<AT>(kern, int(std::min<ssize_t>(mr, c1 - i)), A + i * lda, lda, bp, bwk, k0, k1, tile + (i - c0) * NPW);
      }
      for (ssize_t i = c0; i < c1; ++i) ep(i, j0, nj, tile + (i - c0) * NPW);
    }
  }
}

// One OpenMP region with no barrier inside, for A operands made row by row (the dynamic Linear's quantize, the
// packed GEMM's offset / int16 widening): work items are chunks of rows, each item makes its own rows with
// prep(i0, i1, A, lda, tmp) and runs them against every panel, handed out dynamically (a preempted thread holds up
// one item, not half the work). Below 2 row blocks per thread the items are column panels and prep runs on every
// row before the region. Fewer sync points is most of the speed on a loaded 2-core machine: each barrier waits for
// a descheduled thread's next time slice (4-8 ms against a 0.4-1.5 ms call). prep returns false to stop (the
// runner then returns false). tmp: a K-byte scratch row per thread.
template <typename AT, typename PREP, typename EP>
bool run_row_items(Kern kern, ssize_t M, ssize_t K, const i8* P, ssize_t N, const PREP& prep, const EP& ep) {
  const int mr = kern_mr(kern);
  const ssize_t K4 = (K + 3) / 4, MP = (M + mr - 1) / mr, NP = (N + NPW - 1) / NPW;
  const ssize_t lda = kern == Kern::avx2_wino ? wino_lda(K4) : a_stride(K4, int(sizeof(AT)));
  const int T = max_threads();
  const bool by_rows = MP >= 2 * ssize_t(T);
  // row items: the same number per thread, at most 8 blocks (48 rows) each
  const ssize_t maxb = 48 / mr;
  const ssize_t nitems = by_rows ? ssize_t(T) * std::max<ssize_t>(1, (MP + T * maxb - 1) / (T * maxb)) : NP;
  // 64-byte aligned, like the widened B: the alignment of a plain new[] varies from process to process (glibc
  // serves it from the heap once a freed mmap chunk raised its mmap threshold)
  const size_t abytes = (size_t(padded_rows(M)) * lda * sizeof(AT) + 63) / 64 * 64;
  std::unique_ptr<AT[], void (*)(void*)> A(static_cast<AT*>(std::aligned_alloc(64, abytes)), std::free);
  if (!A) throw std::bad_alloc();
  std::atomic<bool> ok{true};
  const bool wide = std::is_same_v<AT, int16_t>;
  std::unique_ptr<WideB> wb(wide ? new WideB(NP, K4, wide_kcb(kern), kern == Kern::avx2_wino) : nullptr);
  if (!by_rows) {
    std::vector<uint8_t> tmp(static_cast<size_t>(K));
    if (!prep(ssize_t(0), M, A.get(), lda, tmp.data())) return false;
  }
#pragma omp parallel num_threads(T)
  {
    std::vector<i32> tile(size_t(48) * NPW);
    std::vector<int16_t> bw(wide ? size_t(KCBW) * NPW * 4 : 0);
    std::vector<uint8_t> tmp(by_rows ? static_cast<size_t>(K) : 0);
#pragma omp for schedule(dynamic, 1) nowait
    for (ssize_t it = 0; it < nitems; ++it) {
      if (by_rows) {
        const ssize_t i0 = std::min(M, MP * it / nitems * mr), i1 = std::min(M, MP * (it + 1) / nitems * mr);
        if (!prep(i0, i1, A.get(), lda, tmp.data())) ok = false;
        // each thread starts at its own panel (madd16: the threads then widen different pieces of B first
        // instead of racing for the same ones and each widening its own copy)
        const ssize_t rot = NP * ssize_t(thread_num()) / T;
        if (ok) gemm_rows<AT>(kern, A.get(), lda, i0, i1, K4, P, N, 0, NP, tile.data(), bw.data(), wb.get(), ep, rot);
      } else {
        gemm_rows<AT>(kern, A.get(), lda, 0, M, K4, P, N, it, it + 1, tile.data(), bw.data(), wb.get(), ep);
      }
    }
  }
  return ok;
}

// C = (A - zero_point) @ B for int8 / uint8 A [M, K] through run_row_items: each item converts its own rows (int8
// offset by 128 to u8 codes, or int16 for madd16; K padding zeroed) and the epilogue removes the offset
template <typename T>
void packed_run(Kern kern, const T* A, ssize_t M, ssize_t K, const i8* P, ssize_t N, i32 zero_point,
                const i32* colsum, i32* pc) {
  const bool s = std::is_signed_v<T>;
  const i32 off = (s && !kern_wide(kern) ? 128 : 0) + zero_point;
  auto ep = [&](ssize_t i, ssize_t j0, ssize_t nj, const i32* acc) {
    for (ssize_t c_ = 0; c_ < nj; ++c_) pc[i * N + j0 + c_] = unoffset(acc[c_], off, colsum[j0 + c_]);
  };
  if (kern == Kern::avx2_wino) {
    auto prep = [&](ssize_t i0, ssize_t i1, int16_t* Ap, ssize_t lda, uint8_t*) {
      for (ssize_t i = i0; i < i1; ++i) wino_row(A + i * K, K, Ap + i * lda, lda);
      return true;
    };
    run_row_items<int16_t>(kern, M, K, P, N, prep, ep);
  } else if (kern == Kern::avx2_madd16) {
    auto prep = [&](ssize_t i0, ssize_t i1, int16_t* Ap, ssize_t lda, uint8_t*) {
      for (ssize_t i = i0; i < i1; ++i) {
        for (ssize_t k = 0; k < K; ++k) Ap[i * lda + k] = int16_t(A[i * K + k]);
        for (ssize_t k = K; k < lda; ++k) Ap[i * lda + k] = 0;
      }
      return true;
    };
    run_row_items<int16_t>(kern, M, K, P, N, prep, ep);
  } else {
    auto prep = [&](ssize_t i0, ssize_t i1, uint8_t* Ap, ssize_t lda, uint8_t*) {
      for (ssize_t i = i0; i < i1; ++i) {
        for (ssize_t k = 0; k < K; ++k) Ap[i * lda + k] = s ? uint8_t(A[i * K + k]) ^ 0x80 : uint8_t(A[i * K + k]);
        for (ssize_t k = K; k < lda; ++k) Ap[i * lda + k] = 0;
      }
      return true;
    };
    run_row_items<uint8_t>(kern, M, K, P, N, prep, ep);
  }
}

// C = A @ B (exact int32) with B packed by int8_pack. A int8 [M, K], or uint8 [M, K] minus zero_point:
// C = (A - zero_point) @ B. version: auto | avx512vnni | avx2_madd16 | avx2_u7 | scalar.
py::array_t<i32> gemm_packed(const py::array& a_in, const py::array& P_in, const py::array& cs_in, ssize_t N,
                             const std::string& version, int zero_point) {
  const bool u8 = a_in.dtype().is(py::dtype::of<uint8_t>());
  if (!u8 && !a_in.dtype().is(py::dtype::of<i8>()))
    throw py::type_error("int8_gemm_packed: a must have dtype int8 or uint8, got " + std::string(py::str(a_in.dtype())));
  if (a_in.ndim() != 2) tl::value_error("int8_gemm_packed: a must be 2-D, got ndim " + std::to_string(a_in.ndim()));
  if (!u8 && zero_point != 0) tl::value_error("int8_gemm_packed: zero_point applies to uint8 a only");
  const ssize_t M = a_in.shape(0), K = a_in.shape(1);
  // |C| <= K * 128 * 128 (int8 A) or K * 255 * 128 (uint8 A minus its zero point) must fit int32
  const ssize_t kmax = u8 ? 65536 : (ssize_t(1) << 17) - 1;
  if (K > kmax)
    tl::value_error("int8_gemm_packed: K=" + std::to_string(K) + " > " + std::to_string(kmax) +
                    " could overflow the int32 result");
  Packed pk = check_packed(P_in, cs_in, K, N, "int8_gemm_packed");
  py::array_t<i32> c({M, N});
  if (M == 0) return c;
  i32* pc = c.mutable_data();
  const i32* colsum = pk.cs.data();
  const i8* P = pk.P.data();
  if (u8) {
    auto a = py::array_t<uint8_t, py::array::c_style>::ensure(a_in);
    const uint8_t* pa_ = a.data();
    // OR of the top bits, no early exit: the loop vectorises (the early-exit form ran a byte per cycle)
    uint8_t top = 0;
    for (ssize_t t = 0; t < M * K; ++t) top |= pa_[t];
    const bool u7 = (top & 0x80) == 0;
    const Kern kern = pick_kern(version, u7, M, "int8_gemm_packed");
    py::gil_scoped_release release;
    packed_run(kern, pa_, M, K, P, N, i32(zero_point), colsum, pc);
  } else {
    auto a = as_int8(a_in, "a");
    // int8 A is offset to 0..255: not 7-bit, so the u7 kernel cannot take it
    const Kern kern = pick_kern(version, false, M, "int8_gemm_packed");
    py::gil_scoped_release release;
    packed_run(kern, a.data(), M, K, P, N, 0, colsum, pc);
  }
  return c;
}

// Teaching rung: u8 A x s8 B through vpmaddubsw with NO 7-bit check -- returns what the instruction sequence
// computes (int16-saturated adjacent-pair sums, then exact int32 sums), which differs from A @ B whenever a pair
// a[2t] b[2t] + a[2t+1] b[2t+1] leaves [-32768, 32767]. Needs AVX2.
py::array_t<i32> gemm_maddubs_saturating(const py::array& a_in, const py::array& b_in) {
  if (!a_in.dtype().is(py::dtype::of<uint8_t>()))
    throw py::type_error("int8_gemm_maddubs_saturating: a must have dtype uint8, got " +
                         std::string(py::str(a_in.dtype())));
  if (!has("avx2")) tl::value_error("int8_gemm_maddubs_saturating: needs AVX2, which this CPU (or level) lacks");
  auto a = py::array_t<uint8_t, py::array::c_style>::ensure(a_in);
  auto b = as_int8(b_in, "b");
  if (a.ndim() != 2 || a.shape(1) != b.shape(0))
    tl::value_error("int8_gemm_maddubs_saturating: a must be 2-D [M, K] matching b [K, N]");
  const ssize_t M = a.shape(0), K = a.shape(1), N = b.shape(1), K4 = (K + 3) / 4, NP = (N + NPW - 1) / NPW;
  py::array_t<i32> c({M, N});
  if (M == 0 || N == 0) return c;
  i32* pc = c.mutable_data();
  py::gil_scoped_release release;
  std::vector<i8> P(size_t(NP) * K4 * NPW * 4);
  std::vector<i32> cs(size_t(NP) * NPW);
  pack_b_vnni(b.data(), P.data(), cs.data(), K, N);
  PreparedA pa = prepare_a(a.data(), M, K, Kern::avx2_u7);
  run_prepared(Kern::avx2_u7, pa, M, K4, P.data(), N, [&](ssize_t i, ssize_t j0, ssize_t nj, const i32* s) {
    std::memcpy(pc + i * N + j0, s, size_t(nj) * sizeof(i32));
  });
  return c;
}

// ---------------------------------------------------------------- fused dynamic int8 Linear
// torch's dynamic quantization parameters (fbgemm ChooseQuantizationParams, preserve_sparsity off):
// the range is widened to include 0, scale = (max - min) / (qmax - qmin), and the zero point is the nudged
// (rounded, clamped) one of the two candidates with the smaller error.
void choose_qparams(float mn, float mx, int qmax, float& scale, int& zp) {
  mn = std::min(mn, 0.f);
  mx = std::max(mx, 0.f);
  double s = (double(mx) - double(mn)) / qmax;
  if (float(s) == 0.f || std::isinf(1.f / float(s))) s = 0.1;
  scale = float(s);
  const double zmin = 0 - mn / double(scale), zmax = qmax - mx / double(scale);
  const double emin = std::abs(mn / double(scale)), emax = std::abs(double(qmax)) + std::abs(mx / double(scale));
  const double z0 = emin < emax ? zmin : zmax;
  zp = int(std::min<double>(qmax, std::max<double>(0, std::nearbyint(z0))));
}

// 32 floats per step straight to 32 bytes: cvtps (round to nearest even, the MXCSR default, = nearbyint),
// saturating packs to int16, + zero point (saturating), packus to u8 (clamps at 0 and 255), min with qmax; the
// two packs interleave 128-bit lanes, one dword permute puts the bytes back in order. |x * inv| <= qmax + 1 here
// (the scale comes from this data's range), so cvtps never meets its out-of-range value.
__attribute__((target("avx2,fma"))) void quantize_row_avx2(const float* x, uint8_t* q, ssize_t K, float inv,
                                                          int zp, int qmax) {
  const __m256 vi = _mm256_set1_ps(inv);
  const __m256i vz = _mm256_set1_epi16(int16_t(zp)), vmax = _mm256_set1_epi8(char(uint8_t(qmax)));
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  ssize_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m256i v0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), vi));
    const __m256i v1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), vi));
    const __m256i v2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 16), vi));
    const __m256i v3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 24), vi));
    const __m256i p01 = _mm256_adds_epi16(_mm256_packs_epi32(v0, v1), vz);
    const __m256i p23 = _mm256_adds_epi16(_mm256_packs_epi32(v2, v3), vz);
    const __m256i u = _mm256_min_epu8(_mm256_permutevar8x32_epi32(_mm256_packus_epi16(p01, p23), perm), vmax);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), u);
  }
  for (; k < K; ++k) q[k] = uint8_t(std::min(qmax, std::max(0, int(std::nearbyint(x[k] * inv)) + zp)));
}

void quantize_row(const float* x, uint8_t* q, ssize_t K, float inv, int zp, int qmax, bool avx2) {
  if (avx2) return quantize_row_avx2(x, q, K, inv, zp, qmax);
  for (ssize_t k = 0; k < K; ++k) q[k] = uint8_t(std::min(qmax, std::max(0, int(std::nearbyint(x[k] * inv)) + zp)));
}

// min and max of x[0..n); false when x holds NaN or +-Inf (x * 0 is NaN exactly for those). Four independent
// accumulator sets: one set is a min/max/fma latency chain per 8 floats (a third of the loop's rate).
__attribute__((target("avx2,fma"))) bool min_max_avx2(const float* x, ssize_t n, float& mn, float& mx) {
  const __m256 first = _mm256_set1_ps(n ? x[0] : 0.f), zero = _mm256_setzero_ps();
  __m256 mn0 = first, mn1 = first, mn2 = first, mn3 = first, mx0 = first, mx1 = first, mx2 = first, mx3 = first;
  __m256 bd0 = zero, bd1 = zero, bd2 = zero, bd3 = zero;
  ssize_t t = 0;
  for (; t + 32 <= n; t += 32) {
    const __m256 v0 = _mm256_loadu_ps(x + t), v1 = _mm256_loadu_ps(x + t + 8), v2 = _mm256_loadu_ps(x + t + 16),
                 v3 = _mm256_loadu_ps(x + t + 24);
    mn0 = _mm256_min_ps(mn0, v0);
    mn1 = _mm256_min_ps(mn1, v1);
    mn2 = _mm256_min_ps(mn2, v2);
    mn3 = _mm256_min_ps(mn3, v3);
    mx0 = _mm256_max_ps(mx0, v0);
    mx1 = _mm256_max_ps(mx1, v1);
    mx2 = _mm256_max_ps(mx2, v2);
    mx3 = _mm256_max_ps(mx3, v3);
    bd0 = _mm256_fmadd_ps(v0, zero, bd0);
    bd1 = _mm256_fmadd_ps(v1, zero, bd1);
    bd2 = _mm256_fmadd_ps(v2, zero, bd2);
    bd3 = _mm256_fmadd_ps(v3, zero, bd3);
  }
  for (; t + 8 <= n; t += 8) {
    const __m256 v = _mm256_loadu_ps(x + t);
    mn0 = _mm256_min_ps(mn0, v);
    mx0 = _mm256_max_ps(mx0, v);
    bd0 = _mm256_fmadd_ps(v, zero, bd0);
  }
  const __m256 vmn = _mm256_min_ps(_mm256_min_ps(mn0, mn1), _mm256_min_ps(mn2, mn3));
  const __m256 vmx = _mm256_max_ps(_mm256_max_ps(mx0, mx1), _mm256_max_ps(mx2, mx3));
  const __m256 bad = _mm256_add_ps(_mm256_add_ps(bd0, bd1), _mm256_add_ps(bd2, bd3));
  alignas(32) float a[8], b[8], c[8];
  _mm256_store_ps(a, vmn);
  _mm256_store_ps(b, vmx);
  _mm256_store_ps(c, bad);
  float lo = a[0], hi = b[0], z = 0.f;
  for (int u = 0; u < 8; ++u) {
    lo = std::min(lo, a[u]);
    hi = std::max(hi, b[u]);
    z += c[u];
  }
  for (; t < n; ++t) {
    lo = std::min(lo, x[t]);
    hi = std::max(hi, x[t]);
    z += x[t] * 0.f;
  }
  mn = lo;
  mx = hi;
  return z == 0.f;
}

bool min_max(const float* x, ssize_t n, float& mn, float& mx, bool avx2) {
  if (avx2) return min_max_avx2(x, n, mn, mx);
  float lo = n ? x[0] : 0.f, hi = lo, z = 0.f;
  for (ssize_t t = 0; t < n; ++t) {
    lo = std::min(lo, x[t]);
    hi = std::max(hi, x[t]);
    z += x[t] * 0.f;
  }
  mn = lo;
  mx = hi;
  return z == 0.f;
}

// x row -> kernel operand row: u8 codes, or (madd16) the codes widened to int16 through a u8 scratch row; the K
// padding up to lda is zeroed (it meets zero B entries, but stays defined)
template <typename AT>
void quantize_operand_row(const float* x, AT* dst, uint8_t* tmp, ssize_t K, ssize_t lda, float inv, int zp, int qmax,
                          bool avx2, bool wino) {
  if constexpr (std::is_same_v<AT, int16_t>) {
    quantize_row(x, tmp, K, inv, zp, qmax, avx2);
    if (wino) return wino_row(tmp, K, dst, lda);  // reordered quads + row term (its own padding)
    for (ssize_t k = 0; k < K; ++k) dst[k] = int16_t(tmp[k]);
  } else {
    (void)tmp;
    (void)wino;
    quantize_row(x, dst, K, inv, zp, qmax, avx2);
  }
  for (ssize_t k = K; k < lda; ++k) dst[k] = 0;
}

// The dynamic Linear: serial per-tensor min/max (a parallel one needs a barrier before anything can be
// quantized; fbgemm's path also finds the range serially), then quantize + GEMM + epilogue in run_row_items' one
// region with no barrier inside (this used three regions: min/max, quantize, GEMM). Measured under load (load
// average 6-10 on the 2 cores): three regions ran 2.7-3x torch's time at batch 512, one region with an in-region
// parallel min/max (one barrier) 1.1-1.5x, this form 0.9-1.0x. Returns false for NaN / Inf in x.
template <typename AT, typename EP>
bool dynamic_linear_run(Kern kern, const float* px, ssize_t M, ssize_t K, const i8* P, ssize_t N, bool per_row,
                        int qmax, bool avx2, float* psx, i32* pzx, const EP& ep) {
  float s0 = 0.f;
  int z0 = 0;
  if (!per_row) {
    float mn, mx;
    if (!min_max(px, M * K, mn, mx, avx2)) return false;
    choose_qparams(mn, mx, qmax, s0, z0);
    psx[0] = s0;
    pzx[0] = z0;
  }
  // rows [i0, i1) -> operand rows, with the tensor's qparams or (per row) each row's own, written out
  auto quantize_rows = [&](ssize_t i0, ssize_t i1, AT* A, ssize_t lda, uint8_t* tmp) {
    for (ssize_t i = i0; i < i1; ++i) {
      float s = s0;
      int z = z0;
      if (per_row) {
        float mn, mx;
        if (!min_max(px + i * K, K, mn, mx, avx2)) return false;
        choose_qparams(mn, mx, qmax, s, z);
        psx[i] = s;
        pzx[i] = z;
      }
      quantize_operand_row<AT>(px + i * K, A + i * lda, tmp, K, lda, 1.f / s, z, qmax, avx2,
                               kern == Kern::avx2_wino);
    }
    return true;
  };
  return run_row_items<AT>(kern, M, K, P, N, quantize_rows, ep);
}

// y = dequant((quant(x) - zp) @ Wq^T) + bias, what torch's quantize_dynamic Linear computes:
// activations quantized per call to uint8 (0..255, or 0..127 with reduce_range) with per-tensor (or per-row)
// scale/zero point from their min/max; weights prepacked int8 [K, N] with per-tensor or per-channel scales;
// int32 accumulation exact; y[i,j] = float(acc) * (s_x[i] * s_w[j]) + b[j].
// Returns (y, codes' qparams (scales [R], zero points [R]), kernel name).
py::tuple dynamic_linear(const py::array& x_in, const py::array& P_in, const py::array& cs_in, ssize_t N,
                         const py::array& wscale_in, const py::object& bias_in, bool reduce_range, bool per_row,
                         const std::string& version) {
  auto x = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(x_in);
  if (!x || x.ndim() != 2) tl::value_error("int8_dynamic_linear: x must be a 2-D float32 array");
  const ssize_t M = x.shape(0), K = x.shape(1);
  if (K > 65536) tl::value_error("int8_dynamic_linear: K=" + std::to_string(K) + " > 65536 could overflow int32");
  Packed pk = check_packed(P_in, cs_in, K, N, "int8_dynamic_linear");
  auto ws = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(wscale_in);
  if (!ws || (ws.size() != 1 && ws.size() != N))
    tl::value_error("int8_dynamic_linear: w_scale must have 1 or n=" + std::to_string(N) + " entries");
  py::array_t<float, py::array::c_style | py::array::forcecast> bias;
  if (!bias_in.is_none()) {
    bias = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(bias_in);
    if (!bias || bias.size() != N)
      tl::value_error("int8_dynamic_linear: bias must have n=" + std::to_string(N) + " entries");
  }
  const int qmax = reduce_range ? 127 : 255;
  const ssize_t R = per_row ? M : 1;
  py::array_t<float> y({M, N});
  py::array_t<float> sx(R);
  py::array_t<i32> zx(R);
  // kernel: the u7 AVX2 kernel is exact for 7-bit codes, so reduce_range decides the AVX2 variant up front
  const Kern kern = pick_kern(version, reduce_range, M, "int8_dynamic_linear");
  if (M == 0) return py::make_tuple(y, sx, zx, kern_name(kern));
  const float* px = x.data();
  float* py_ = y.mutable_data();
  float* psx = sx.mutable_data();
  i32* pzx = zx.mutable_data();
  const float* pws = ws.data();
  const bool ws_per = ws.size() == N;
  const float* pb = bias_in.is_none() ? nullptr : bias.data();
  const i32* colsum = pk.cs.data();
  // getenv + string compares: once per call, not per row
  const bool avx2 = has("avx2");
  // bias or zeros: one fused multiply-add pass in the epilogue either way
  std::vector<float> zero_bias(pb ? 0 : size_t(N), 0.f);
  const float* bias_p = pb ? pb : zero_bias.data();
  // epilogue, per row and 64-column panel: zero-point correction, scales, bias, in one pass over y (a separate
  // "+= bias" loop re-read y and cost ~5% at batch 512); branch-free inner loops the compiler vectorises
  auto ep = [&](ssize_t i, ssize_t j0, ssize_t nj, const i32* s) {
    const ssize_t r = per_row ? i : 0;  // per row: written by the item that quantized row i, before its GEMM
    const i32 z = pzx[r];
    const float sxr = psx[r];
    float* yo = py_ + i * N + j0;
    const i32* cs = colsum + j0;
    const float* bb = bias_p + j0;
    if (ws_per) {
      const float* w = pws + j0;
      for (ssize_t c_ = 0; c_ < nj; ++c_) yo[c_] = float(unoffset(s[c_], z, cs[c_])) * (sxr * w[c_]) + bb[c_];
    } else {
      const float m = sxr * pws[0];
      for (ssize_t c_ = 0; c_ < nj; ++c_) yo[c_] = float(unoffset(s[c_], z, cs[c_])) * m + bb[c_];
    }
  };
  bool finite;
  {
    py::gil_scoped_release release;
    if (kern_wide(kern))
      finite = dynamic_linear_run<int16_t>(kern, px, M, K, pk.P.data(), N, per_row, qmax, avx2, psx, pzx, ep);
    else
      finite = dynamic_linear_run<uint8_t>(kern, px, M, K, pk.P.data(), N, per_row, qmax, avx2, psx, pzx, ep);
  }
  if (!finite) tl::value_error("int8_dynamic_linear: x contains NaN or Inf (no finite quantization range)");
  return py::make_tuple(y, sx, zx, kern_name(kern));
}

#include "quant_int8_strassen.inc"

}  // namespace

TL_REGISTER(quant) {
  m.def("int8_pack_b", &pack_b, py::arg("b"), "pack int8 B [K,N] for int8_gemm_prepacked (avx512vnni)");
  m.def("int8_gemm_prepacked", &gemm_prepacked, py::arg("a"), py::arg("packed"), py::arg("colsum"), py::arg("n"),
        "C = A @ B with B from int8_pack_b; exact int32");
  m.doc() = "quantization kernels: exact int8 x int8 -> int32 GEMM with AVX-512 VNNI / AVX2 / scalar paths";
  m.def("int8_gemm", &int8_gemm, py::arg("a"), py::arg("b"), py::arg("path") = "auto",
        "C = A @ B for int8 A [M,K], B [K,N]; int32 result, exact. path: auto | avx512vnni | avx2 | scalar");
  m.def("int8_gemm_paths", &paths, "SIMD paths this CPU can run, best first");
  m.def("int8_pack", &pack_any, py::arg("b"),
        "pack int8 B [K,N] once for int8_gemm_packed / int8_dynamic_linear (any CPU): (bytes, colsum)");
  m.def("int8_gemm_packed", &gemm_packed, py::arg("a"), py::arg("packed"), py::arg("colsum"), py::arg("n"),
        py::arg("version") = "auto", py::arg("zero_point") = 0,
        "C = (A - zero_point) @ B, int8 or uint8 A, B from int8_pack; exact int32. version: auto | avx512vnni | "
        "avx2_madd16 | avx2_u7 (uint8 codes <= 127 only) | scalar");
  register_strassen(m);
  m.def("int8_packed_versions", &packed_versions, "packed-B kernel versions this CPU runs, best first");
  m.def(
      "int8_avx2_choice",
      []() {
        const Avx2Choice& c = avx2_choice();
        py::dict d;
        d["kernel"] = c.wino ? "avx2_wino" : "avx2_madd16 / avx2_u7";
        d["madd16_over_fma"] = c.madd16_over_fma;
        d["wino_min_rows_7bit"] = int(WINO_MIN_ROWS);
        return d;
      },
      "what 'auto' runs on AVX2 without VNNI, and why: {kernel, madd16_over_fma (measured MAC-rate ratio of "
      "vpmaddwd + vpaddd to fp32 FMA; Winograd below 1.5)}");
  m.def("int8_gemm_maddubs_saturating", &gemm_maddubs_saturating, py::arg("a"), py::arg("b"),
        "u8 A x s8 B through vpmaddubsw without the 7-bit check: int16-saturated pair sums (teaching rung)");
  m.def("int8_dynamic_linear", &dynamic_linear, py::arg("x"), py::arg("packed"), py::arg("colsum"), py::arg("n"),
        py::arg("w_scale"), py::arg("bias"), py::arg("reduce_range") = true, py::arg("per_row") = false,
        py::arg("version") = "auto",
        "fused dynamic int8 Linear: quantize x (uint8, per tensor or per row), exact int32 GEMM on packed int8 "
        "weights, dequantize with bias; returns (y, x_scales, x_zero_points, kernel)");
}
