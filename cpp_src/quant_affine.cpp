// quant_affine.cpp — per-tensor affine quantization kernels for tinylearn.quant (bit-exact with torch).
//
// Arithmetic (torch's, checked bit-exactly in tests/test_quant.py):
//   quantize_per_tensor   q = clamp(rint(fma(x, 1/scale, zero_point)), qmin, qmax)   float32 -> int8/uint8
//                         (one rounding in the fused multiply-add, zero point added before rounding, rint = round
//                         half to even; NaN -> qmax, +-inf -> qmax/qmin, like torch)
//   dequantize_per_tensor x = (q - zero_point) * scale                                int8/uint8 -> float32
//
// Versions ladder (argument version=, every rung bit-identical):
//   v0_scalar   one element at a time (auto-vectorisation disabled, so this is the honest scalar baseline)
//   v1_simd     AVX-512 (16 lanes) or AVX2+FMA (8 lanes, 32 per iteration), picked at run time through
//               cpu_features.h (TINYLEARN_CPU_FEATURES=scalar|avx2|avx512 forces a level); scalar where neither.
//               dequantize writes its first few floats one at a time so its vector stores are 64-byte aligned
//               (numpy's 16-byte-aligned buffers split every 64-byte store over two cache lines: 1M codes, one
//               thread, loaded box: AVX-512 70 -> 58 us, AVX2 72 -> 65 us)
//   v2_threads  v1_simd split over OpenMP threads in chunks of >= qa_kGrain elements (inputs below 2 * qa_kGrain run on
//               the calling thread: a thread wake-up costs more than a small kernel)
// quant_affine_isa() names the SIMD level v1/v2 take now.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common.h"
#include "cpu_features.h"
#include "registry.h"

namespace py = pybind11;

namespace {

enum class AffIsa { scalar, avx2, avx512 };

constexpr int64_t qa_kGrain = 1 << 16;  // elements per thread at least (~20 us of work on one core)

AffIsa affine_isa() {
  if (tl::cpu_has("avx512f") && tl::cpu_has("avx512bw") && tl::cpu_has("avx512vl")) return AffIsa::avx512;
  if (tl::cpu_has("avx2") && tl::cpu_has("fma")) return AffIsa::avx2;
  return AffIsa::scalar;
}

const char* affine_isa_name(AffIsa i) { return i == AffIsa::avx512 ? "avx512" : i == AffIsa::avx2 ? "avx2" : "scalar"; }

#if defined(__clang__)
#define TL_NO_VECTORIZE
#define TL_LOOP_SCALAR _Pragma("clang loop vectorize(disable) interleave(disable)")
#elif defined(__GNUC__)
#define TL_NO_VECTORIZE __attribute__((optimize("no-tree-vectorize")))
#define TL_LOOP_SCALAR
#else
#define TL_NO_VECTORIZE
#define TL_LOOP_SCALAR
#endif

// ------------------------------------------------------------------------------------------------- scalar
template <typename T>
TL_NO_VECTORIZE void quantize_scalar(const float* x, T* q, int64_t n, float inv, float zp, float lo, float hi) {
  TL_LOOP_SCALAR
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::nearbyint(std::fma(x[i], inv, zp));
    q[i] = std::isnan(v) ? T(hi) : T(v < lo ? lo : (v > hi ? hi : v));
  }
}

template <typename T>
TL_NO_VECTORIZE void dequantize_scalar(const T* q, float* x, int64_t n, float zp, float scale) {
  TL_LOOP_SCALAR
  for (int64_t i = 0; i < n; ++i) x[i] = (float(q[i]) - zp) * scale;
}

// Elements to write one at a time before x + i is 64-byte aligned. numpy's allocator (malloc) gives 16-byte
// alignment, so without this head every 64-byte AVX-512 store, and half of the 32-byte AVX2 ones, straddles two cache
// lines (torch allocates 64-byte aligned). The loads from q stay unaligned: a split load is cheap, a split store not.
inline int64_t out_align_head(const float* x, int64_t n) {
  const int64_t h = int64_t((64 - (reinterpret_cast<uintptr_t>(x) & 63)) & 63) / int64_t(sizeof(float));
  return std::min(h, n);
}

// ------------------------------------------------------------------------------------------------- AVX2
// 8 codes as int32: clamp before rounding is the same as after (the bounds are integers), and sends NaN to qmax
// (min returns its second operand when either is NaN). cvtps_epi32 rounds in the current MXCSR mode, round to
// nearest even unless someone changed it (like std::nearbyint in the scalar rung), so no separate round_ps: 4 of
// the 29 instructions per 32 codes, and this loop is instruction-bound at 2 threads.
__attribute__((target("avx2,fma"))) inline __m256i q8_avx2(const float* p, __m256 vinv, __m256 vzp, __m256 vlo,
                                                           __m256 vhi) {
  __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(p), vinv, vzp);
  v = _mm256_max_ps(_mm256_min_ps(v, vhi), vlo);
  return _mm256_cvtps_epi32(v);
}

template <typename T>
__attribute__((target("avx2,fma"))) void quantize_avx2(const float* x, T* q, int64_t n, float inv, float zp,
                                                        float lo, float hi) {
  const __m256 vinv = _mm256_set1_ps(inv), vzp = _mm256_set1_ps(zp), vlo = _mm256_set1_ps(lo),
               vhi = _mm256_set1_ps(hi);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = q8_avx2(x + i, vinv, vzp, vlo, vhi), b = q8_avx2(x + i + 8, vinv, vzp, vlo, vhi);
    const __m256i c = q8_avx2(x + i + 16, vinv, vzp, vlo, vhi), d = q8_avx2(x + i + 24, vinv, vzp, vlo, vhi);
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);  // values already in range
    __m256i r = std::is_signed<T>::value ? _mm256_packs_epi16(ab, cd) : _mm256_packus_epi16(ab, cd);
    r = _mm256_permutevar8x32_epi32(r, perm);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), r);
  }
  quantize_scalar<T>(x + i, q + i, n - i, inv, zp, lo, hi);
}

template <typename T>
__attribute__((target("avx2,fma"))) void dequantize_avx2(const T* q, float* x, int64_t n, float zp, float scale) {
  const __m256 vzp = _mm256_set1_ps(zp), vs = _mm256_set1_ps(scale);
  int64_t i = out_align_head(x, n);
  dequantize_scalar<T>(q, x, i, zp, scale);
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
    const __m256i w = std::is_signed<T>::value ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(w), vzp), vs));
  }
  dequantize_scalar<T>(q + i, x + i, n - i, zp, scale);
}

// ------------------------------------------------------------------------------------------------- AVX-512
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i q16_avx512(__m512 xv, __m512 vinv, __m512 vzp,
                                                                               __m512 vlo, __m512 vhi) {
  const __m512 v = _mm512_max_ps(_mm512_min_ps(_mm512_fmadd_ps(xv, vinv, vzp), vhi), vlo);  // NaN -> qmax
  return _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

template <bool Signed>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 dq16_avx512(__m128i b, __m512 vzp, __m512 vs) {
  const __m512i w = Signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
  return _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(w), vzp), vs);
}

template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void quantize_avx512(const float* x, T* q, int64_t n, float inv,
                                                                            float zp, float lo, float hi) {
  const __m512 vinv = _mm512_set1_ps(inv), vzp = _mm512_set1_ps(zp), vlo = _mm512_set1_ps(lo),
               vhi = _mm512_set1_ps(hi);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i a = q16_avx512(_mm512_loadu_ps(x + i), vinv, vzp, vlo, vhi);
    const __m512i b = q16_avx512(_mm512_loadu_ps(x + i + 16), vinv, vzp, vlo, vhi);
    const __m512i c = q16_avx512(_mm512_loadu_ps(x + i + 32), vinv, vzp, vlo, vhi);
    const __m512i d = q16_avx512(_mm512_loadu_ps(x + i + 48), vinv, vzp, vlo, vhi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(a));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i + 16), _mm512_cvtepi32_epi8(b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i + 32), _mm512_cvtepi32_epi8(c));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i + 48), _mm512_cvtepi32_epi8(d));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    _mm512_mask_cvtepi32_storeu_epi8(q + i, m, q16_avx512(_mm512_maskz_loadu_ps(m, x + i), vinv, vzp, vlo, vhi));
  }
}

template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void dequantize_avx512(const T* q, float* x, int64_t n, float zp,
                                                                              float scale) {
  const __m512 vzp = _mm512_set1_ps(zp), vs = _mm512_set1_ps(scale);
  constexpr bool S = std::is_signed<T>::value;
  int64_t i = out_align_head(x, n);
  dequantize_scalar<T>(q, x, i, zp, scale);
  for (; i + 32 <= n; i += 32) {
    _mm512_storeu_ps(x + i, dq16_avx512<S>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)), vzp, vs));
    _mm512_storeu_ps(x + i + 16, dq16_avx512<S>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i + 16)), vzp, vs));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, m, dq16_avx512<S>(_mm_maskz_loadu_epi8(m, q + i), vzp, vs));
  }
}

// ------------------------------------------------------------------------------------------------- drivers
template <typename T>
py::array_t<T> quantize_impl(py::array_t<float, py::array::c_style> x, float scale, int zp, int qmin, int qmax,
                             tl::Rung ver) {
  py::array_t<T> out(std::vector<ssize_t>(x.shape(), x.shape() + x.ndim()));
  const float* px = x.data();
  T* po = out.mutable_data();
  const int64_t n = x.size();
  const float inv = 1.0f / scale, fz = float(zp), lo = float(qmin), hi = float(qmax);
  const AffIsa isa = ver == tl::Rung::scalar ? AffIsa::scalar : affine_isa();
  py::gil_scoped_release release;
  tl::run_chunks(n, qa_kGrain, ver == tl::Rung::threads, [&](int64_t b, int64_t e) {
    if (isa == AffIsa::avx512)
      quantize_avx512<T>(px + b, po + b, e - b, inv, fz, lo, hi);
    else if (isa == AffIsa::avx2)
      quantize_avx2<T>(px + b, po + b, e - b, inv, fz, lo, hi);
    else
      quantize_scalar<T>(px + b, po + b, e - b, inv, fz, lo, hi);
  });
  return out;
}

py::array quantize_per_tensor(py::array_t<float, py::array::c_style> x, float scale, int zero_point, int qmin,
                              int qmax, const std::string& version) {
  const tl::Rung ver = tl::parse_rung(version, "quantize_per_tensor");
  if (!(scale > 0.0f) || !std::isfinite(scale))
    tl::value_error("quantize_per_tensor: scale must be finite and > 0, got " + std::to_string(scale));
  if (qmin > qmax) tl::value_error("quantize_per_tensor: qmin > qmax");
  if (zero_point < qmin || zero_point > qmax)
    tl::value_error("quantize_per_tensor: zero_point " + std::to_string(zero_point) + " outside [qmin, qmax] = [" +
                    std::to_string(qmin) + ", " + std::to_string(qmax) + "]");
  if (qmin >= 0 && qmax <= 255) return quantize_impl<uint8_t>(x, scale, zero_point, qmin, qmax, ver);
  if (qmin >= -128 && qmax <= 127) return quantize_impl<int8_t>(x, scale, zero_point, qmin, qmax, ver);
  tl::value_error("quantize_per_tensor: [qmin, qmax] must fit int8 or uint8");
}

template <typename T>
py::array_t<float> dequantize_impl(py::array_t<T, py::array::c_style> q, float scale, int zp,
                                   const std::string& version) {
  const tl::Rung ver = tl::parse_rung(version, "dequantize_per_tensor");
  if (!(scale > 0.0f) || !std::isfinite(scale))
    tl::value_error("dequantize_per_tensor: scale must be finite and > 0, got " + std::to_string(scale));
  py::array_t<float> out(std::vector<ssize_t>(q.shape(), q.shape() + q.ndim()));
  const T* pq = q.data();
  float* po = out.mutable_data();
  const int64_t n = q.size();
  const float fz = float(zp);
  const AffIsa isa = ver == tl::Rung::scalar ? AffIsa::scalar : affine_isa();
  py::gil_scoped_release release;
  tl::run_chunks(n, qa_kGrain, ver == tl::Rung::threads, [&](int64_t b, int64_t e) {
    if (isa == AffIsa::avx512)
      dequantize_avx512<T>(pq + b, po + b, e - b, fz, scale);
    else if (isa == AffIsa::avx2)
      dequantize_avx2<T>(pq + b, po + b, e - b, fz, scale);
    else
      dequantize_scalar<T>(pq + b, po + b, e - b, fz, scale);
  });
  return out;
}

}  // namespace

TL_REGISTER(quant_affine) {
  m.doc() = "per-tensor affine quantize/dequantize (torch's arithmetic): v0_scalar / v1_simd / v2_threads";
  m.def("quantize_per_tensor", &quantize_per_tensor, py::arg("x"), py::arg("scale"), py::arg("zero_point"),
        py::arg("qmin"), py::arg("qmax"), py::arg("version") = "auto",
        "clamp(rint(fma(x, 1/scale, zp)), qmin, qmax) as int8 (signed range) or uint8; version "
        "'v0_scalar' | 'v1_simd' | 'v2_threads' (= 'auto')");
  m.def("dequantize_per_tensor_int8", &dequantize_impl<int8_t>, py::arg("q"), py::arg("scale"), py::arg("zero_point"),
        py::arg("version") = "auto", "(q - zero_point) * scale for int8 codes");
  m.def("dequantize_per_tensor_uint8", &dequantize_impl<uint8_t>, py::arg("q"), py::arg("scale"),
        py::arg("zero_point"), py::arg("version") = "auto", "(q - zero_point) * scale for uint8 codes");
  m.def(
      "quant_affine_isa", []() { return std::string(affine_isa_name(affine_isa())); },
      "SIMD level v1_simd / v2_threads take now: 'scalar' | 'avx2' | 'avx512' (after TINYLEARN_CPU_FEATURES)");
}
