// quant_int8_packed.cpp — the packed-B int8 ladder of tinylearn.quant: B packed once (int8_pack, any CPU), then
// C = (A - zero_point) @ B exactly for int8 or uint8 A through any kernel (int8_gemm_packed, version auto |
// avx512vnni | avx2_wino | avx2_madd16 | avx2_u7 | scalar; int8_packed_versions; int8_avx2_choice), and the
// saturating vpmaddubsw teaching rung (int8_gemm_maddubs_saturating). Kernels: quant_int8_ukr.h; the driver
// (pick_kern, run_row_items): quant_int8_packed.h.
#include "quant_int8_packed.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace py = pybind11;

namespace {

using namespace tl::q8;

// S = A' @ B for the packed B, A' rows of stride lda (rows padded to MRP); ep(i, j0, nj, s_row) writes row i's
// columns [j0, j0 + nj) from the int32 sums s_row. Work items: (64-column panel, chunk of mr-row blocks), each with
// its own int32 tile, K blocked by KCB (a 16 KB B block stays in L1 while the chunk's rows stream past it).
template <typename AT, typename EP>
void run_packed(Kern kern, const AT* A, ssize_t lda, ssize_t M, ssize_t K4, const i8* P, ssize_t N, EP ep) {
  if (kern == Kern::avx2_wino) tl::value_error("run_packed: avx2_wino runs through run_row_items only");
  const int mr = kern_mr(kern);
  const ssize_t NP = (N + NPW - 1) / NPW, MP = (M + mr - 1) / mr;
  const ssize_t want = 4 * ssize_t(tl::n_threads());
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

}  // namespace

TL_REGISTER(quant) {
  m.def("int8_pack", &pack_any, py::arg("b"),
        "pack int8 B [K,N] once for int8_gemm_packed / int8_dynamic_linear (any CPU): (bytes, colsum)");
  m.def("int8_gemm_packed", &gemm_packed, py::arg("a"), py::arg("packed"), py::arg("colsum"), py::arg("n"),
        py::arg("version") = "auto", py::arg("zero_point") = 0,
        "C = (A - zero_point) @ B, int8 or uint8 A, B from int8_pack; exact int32. version: auto | avx512vnni | "
        "avx2_madd16 | avx2_u7 (uint8 codes <= 127 only) | scalar");
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
}
