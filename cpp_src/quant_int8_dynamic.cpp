// quant_int8_dynamic.cpp — the fused dynamic int8 Linear of tinylearn.quant (int8_dynamic_linear): x quantized per
// call to uint8 (per tensor or per row, torch's qparams), the exact int32 GEMM on int8_pack'd weights through the
// packed-B ladder's kernels (quant_int8_packed.h), dequantize + bias in the epilogue, all in one OpenMP region.
#include "quant_int8_packed.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using namespace tl::q8;

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

// the scalar loop of min_max over x[t0, n), folded into lo, hi and z (z stays 0 unless some x is NaN or +-Inf)
inline void min_max_scalar(const float* x, ssize_t t0, ssize_t n, float& lo, float& hi, float& z) {
  for (ssize_t t = t0; t < n; ++t) {
    lo = std::min(lo, x[t]);
    hi = std::max(hi, x[t]);
    z += x[t] * 0.f;
  }
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
  min_max_scalar(x, t, n, lo, hi, z);
  mn = lo;
  mx = hi;
  return z == 0.f;
}

bool min_max(const float* x, ssize_t n, float& mn, float& mx, bool avx2) {
  if (avx2) return min_max_avx2(x, n, mn, mx);
  float lo = n ? x[0] : 0.f, hi = lo, z = 0.f;
  min_max_scalar(x, 0, n, lo, hi, z);
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

}  // namespace

TL_REGISTER(quant) {
  m.def("int8_dynamic_linear", &dynamic_linear, py::arg("x"), py::arg("packed"), py::arg("colsum"), py::arg("n"),
        py::arg("w_scale"), py::arg("bias"), py::arg("reduce_range") = true, py::arg("per_row") = false,
        py::arg("version") = "auto",
        "fused dynamic int8 Linear: quantize x (uint8, per tensor or per row), exact int32 GEMM on packed int8 "
        "weights, dequantize with bias; returns (y, x_scales, x_zero_points, kernel)");
}
