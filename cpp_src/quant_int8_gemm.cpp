// quant_int8_gemm.cpp — exact int8 x int8 -> int32 GEMM, C[M,N] = A[M,K] @ B[K,N], for tinylearn.quant: the per-call
// ladder (int8_gemm, int8_gemm_paths, int8_pack_b / int8_gemm_prepacked). The packed-B ladder is
// quant_int8_packed.cpp, the fused dynamic Linear quant_int8_dynamic.cpp, Strassen quant_int8_strassen.cpp;
// what they share is in quant_int8_ukr.h and quant_int8_packed.h.
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

#include "quant_int8_ukr.h"

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using namespace tl::q8;

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

std::vector<std::string> paths() {
  std::vector<std::string> out;
  if (has("avx512vnni")) out.push_back("avx512vnni");
  if (has("avx2")) out.push_back("avx2");
  out.push_back("scalar");
  return out;
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

}  // namespace

TL_REGISTER(quant) {
  m.def("int8_pack_b", &pack_b, py::arg("b"), "pack int8 B [K,N] for int8_gemm_prepacked (avx512vnni)");
  m.def("int8_gemm_prepacked", &gemm_prepacked, py::arg("a"), py::arg("packed"), py::arg("colsum"), py::arg("n"),
        "C = A @ B with B from int8_pack_b; exact int32");
  m.doc() = "quantization kernels: exact int8 x int8 -> int32 GEMM with AVX-512 VNNI / AVX2 / scalar paths";
  m.def("int8_gemm", &int8_gemm, py::arg("a"), py::arg("b"), py::arg("path") = "auto",
        "C = A @ B for int8 A [M,K], B [K,N]; int32 result, exact. path: auto | avx512vnni | avx2 | scalar");
  m.def("int8_gemm_paths", &paths, "SIMD paths this CPU can run, best first");
}
