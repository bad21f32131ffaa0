// amp_bf16.cpp — bfloat16 element-wise kernels for tl.autocast (tinylearn._C.amp).
//
// bfloat16 is the upper half of a float32; arrays arrive as their uint16 bit patterns (x.view(numpy.uint16) of an
// ml_dtypes.bfloat16 array) so nothing here depends on ml_dtypes' C API.
//   to_bf16(x, out)               float32 -> bf16 bits, round to nearest even (torch's c10::round_to_nearest_even;
//                                 NaN -> the quiet NaN 0x7FC0; overflow carries into the exponent: Inf)
//   from_bf16(x, out)             bf16 bits -> float32 (exact: append 16 zero bits)
//   round_bf16(x, out)            float32 -> float32 holding x rounded to bf16 (to_bf16 then from_bf16 in one pass:
//                                 autocast's rounding of an emulated op's fp32 inputs and of their gradients)
//   sum_rows(x, out)              out[j] = bf16 of the fp32 sum over i of x[i, j] (a bf16 Linear's bias gradient:
//                                 fp32 accumulation of the rows in order, one rounding), x 2-D
//   relu(x, out)                  0 where x < 0, else x (NaN and -0.0 pass, as torch.relu)
//   relu_backward(g, y, out)      0 where y <= 0, else g (torch's threshold_backward on the saved output)
//   isa()                         the path the next call takes: "avx2" or "scalar" (TINYLEARN_CPU_FEATURES)
// Operands: C-contiguous, one shape (the Python caller makes them so or takes numpy's path). Every path gives the
// same bits. Versions:
//   scalar  plain loops with auto-vectorisation switched off (the baseline)
//   avx2    8 floats / 16 bf16 values per step: the rounding as integer adds on 8 lanes, then a saturating pack
//           (vpackusdw) of the two halves of 16 results; the selects as 16-bit compares on the bit patterns
// Big arrays split over OpenMP threads (kGrain elements each); the GIL is released.
// Checked against numpy (tinylearn.amp.bf16.bf16_bits, np.where on the float values) in tests/amp/test_amp_bf16.py.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "bf16.h"
#include "common.h"
#include "cpu_features.h"
#include "registry.h"

namespace py = pybind11;

namespace {

constexpr int64_t kAmpGrain = int64_t(1) << 18;

bool amp_avx2() { return tl::cpu_has("avx2"); }

// ---- the select rules (the rounding rule is bf16.h's) ----------------------------------------------------------
// x < 0 as a float: the sign bit set, not -0.0 (0x8000), not NaN (above 0xFF80 = -Inf)
inline bool amp_neg(uint16_t x) { return x > 0x8000u && x <= 0xFF80u; }
// y <= 0: +0.0, -0.0 or a negative non-NaN
inline bool amp_nonpos(uint16_t y) { return y == 0 || (y >= 0x8000u && y <= 0xFF80u); }

// ---- scalar ----------------------------------------------------------------------------------------------------
__attribute__((optimize("no-tree-vectorize"))) void bf16k_to_bf16_scalar(const float* x, uint16_t* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    o[i] = tl::bf16_round_bits(u);
  }
}
__attribute__((optimize("no-tree-vectorize"))) void bf16k_from_bf16_scalar(const uint16_t* x, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = tl::bf16_to_float(x[i]);
}
__attribute__((optimize("no-tree-vectorize"))) void bf16k_round_scalar(const float* x, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    o[i] = tl::bf16_to_float(tl::bf16_round_bits(u));
  }
}
__attribute__((optimize("no-tree-vectorize"))) void bf16k_relu_scalar(const uint16_t* x, uint16_t* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = amp_neg(x[i]) ? uint16_t(0) : x[i];
}
__attribute__((optimize("no-tree-vectorize"))) void bf16k_relu_bwd_scalar(const uint16_t* g, const uint16_t* y,
                                                                     uint16_t* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = amp_nonpos(y[i]) ? uint16_t(0) : g[i];
}

// ---- AVX2 ------------------------------------------------------------------------------------------------------
// 8 lanes of bf16.h's rounding: bias = 0x7FFF + lsb, NaN lanes replaced by 0x7FC0 after the shift.
__attribute__((target("avx2"))) inline __m256i bf16k_round8(__m256i u) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7F800000));  // mag < 2^31: signed compare ok
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
}
__attribute__((target("avx2"))) void bf16k_to_bf16_avx2(const float* x, uint16_t* o, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = bf16k_round8(_mm256_castps_si256(_mm256_loadu_ps(x + i)));
    const __m256i hi = bf16k_round8(_mm256_castps_si256(_mm256_loadu_ps(x + i + 8)));
    // packus works within 128-bit lanes: [lo0 hi0 lo1 hi1] -> permute the 64-bit quarters back into order
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), p);
  }
  bf16k_to_bf16_scalar(x + i, o + i, n - i);
}
__attribute__((target("avx2"))) void bf16k_from_bf16_avx2(const uint16_t* x, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), _mm256_slli_epi32(w, 16));
  }
  bf16k_from_bf16_scalar(x + i, o + i, n - i);
}
__attribute__((target("avx2"))) void bf16k_round_avx2(const float* x, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i r = bf16k_round8(_mm256_castps_si256(_mm256_loadu_ps(x + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), _mm256_slli_epi32(r, 16));
  }
  bf16k_round_scalar(x + i, o + i, n - i);
}
__attribute__((optimize("no-tree-vectorize"))) void bf16k_sum_rows_scalar(const uint16_t* x, int64_t m, int64_t n,
                                                                      int64_t j0, int64_t j1, uint16_t* o) {
  for (int64_t j = j0; j < j1; ++j) {
    float acc = 0.0f;
    for (int64_t i = 0; i < m; ++i) acc += tl::bf16_to_float(x[i * n + j]);
    o[j] = tl::bf16_round(acc);
  }
}
// 32 columns at a time (one 64-byte line per row): four 8-lane fp32 accumulators, rows added in order (the scalar
// loop's sums, bit for bit)
__attribute__((target("avx2"))) void bf16k_sum_rows_avx2(const uint16_t* x, int64_t m, int64_t n, int64_t j0,
                                                         int64_t j1, uint16_t* o) {
  int64_t j = j0;
  for (; j + 32 <= j1; j += 32) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < m; ++i)
      for (int q = 0; q < 4; ++q) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i * n + j + 8 * q));
        acc[q] = _mm256_add_ps(acc[q], _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
      }
    for (int q = 0; q < 2; ++q) {
      const __m256i lo = bf16k_round8(_mm256_castps_si256(acc[2 * q])), hi = bf16k_round8(_mm256_castps_si256(acc[2 * q + 1]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + j + 16 * q),
                          _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8));
    }
  }
  bf16k_sum_rows_scalar(x, m, n, j, j1, o);
}
// unsigned 16-bit a > b as max(a, b) != b; a <= b as min(a, b) == a
__attribute__((target("avx2"))) inline __m256i bf16k_le16(__m256i a, __m256i b) {
  return _mm256_cmpeq_epi16(_mm256_min_epu16(a, b), a);
}
__attribute__((target("avx2"))) void bf16k_relu_avx2(const uint16_t* x, uint16_t* o, int64_t n) {
  const __m256i k8001 = _mm256_set1_epi16(int16_t(0x8001)), kff80 = _mm256_set1_epi16(int16_t(0xFF80));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i neg = _mm256_and_si256(bf16k_le16(k8001, v), bf16k_le16(v, kff80));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), _mm256_andnot_si256(neg, v));
  }
  bf16k_relu_scalar(x + i, o + i, n - i);
}
__attribute__((target("avx2"))) void bf16k_relu_bwd_avx2(const uint16_t* g, const uint16_t* y, uint16_t* o, int64_t n) {
  const __m256i k8000 = _mm256_set1_epi16(int16_t(0x8000)), kff80 = _mm256_set1_epi16(int16_t(0xFF80)),
                zero = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + i));
    const __m256i nonpos =
        _mm256_or_si256(_mm256_cmpeq_epi16(v, zero), _mm256_and_si256(bf16k_le16(k8000, v), bf16k_le16(v, kff80)));
    const __m256i gv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), _mm256_andnot_si256(nonpos, gv));
  }
  bf16k_relu_bwd_scalar(g + i, y + i, o + i, n - i);
}

// ---- the Python functions --------------------------------------------------------------------------------------
void amp_need(const py::array& a, const py::dtype& dt, const char* fn, const char* name) {
  if (!a.dtype().is(dt))
    throw py::type_error(std::string("amp.") + fn + ": " + name + " must have dtype " + std::string(py::str(dt)) +
                         ", got " + std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style))
    tl::value_error(std::string("amp.") + fn + ": " + name + " must be C-contiguous");
}

void amp_same_shape(const py::array& a, const py::array& b, const char* fn, const char* na, const char* nb) {
  bool same = a.ndim() == b.ndim();
  for (ssize_t d = 0; same && d < a.ndim(); ++d) same = a.shape(d) == b.shape(d);
  if (!same)
    tl::value_error(std::string("amp.") + fn + ": " + nb + " has shape " + tl::shape_str(b) + " but " + na +
                    " has " + tl::shape_str(a));
}

// Runs body(begin, end) over [0, n) in kAmpGrain chunks on OpenMP threads (one thread for small n).
template <class F>
void amp_split(int64_t n, F body) {
  const int64_t chunks = (n + kAmpGrain - 1) / kAmpGrain;
  if (chunks <= 1) return body(int64_t(0), n);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) body(c * kAmpGrain, std::min(n, (c + 1) * kAmpGrain));
}

// out = kernel(x) element-wise: dtypes In -> Out, one shape, C-contiguous; the AVX2 or scalar kernel (the path
// TINYLEARN_CPU_FEATURES allows), big arrays split over threads, the GIL released.
template <class In, class Out>
void amp_unary(const py::array& x, py::array& out, const char* fn, void (*avx2)(const In*, Out*, int64_t),
               void (*scalar)(const In*, Out*, int64_t)) {
  amp_need(x, py::dtype::of<In>(), fn, "x");
  amp_need(out, py::dtype::of<Out>(), fn, "out");
  amp_same_shape(x, out, fn, "x", "out");
  const In* xp = static_cast<const In*>(x.data());
  Out* op = static_cast<Out*>(out.mutable_data());
  const auto kernel = amp_avx2() ? avx2 : scalar;
  py::gil_scoped_release release;
  amp_split(x.size(), [&](int64_t b, int64_t e) { kernel(xp + b, op + b, e - b); });
}

void amp_to_bf16(const py::array& x, py::array& out) {
  amp_unary<float, uint16_t>(x, out, "to_bf16", bf16k_to_bf16_avx2, bf16k_to_bf16_scalar);
}
void amp_from_bf16(const py::array& x, py::array& out) {
  amp_unary<uint16_t, float>(x, out, "from_bf16", bf16k_from_bf16_avx2, bf16k_from_bf16_scalar);
}
void amp_round_bf16(const py::array& x, py::array& out) {
  amp_unary<float, float>(x, out, "round_bf16", bf16k_round_avx2, bf16k_round_scalar);
}

void amp_sum_rows(const py::array& x, py::array& out) {
  amp_need(x, py::dtype::of<uint16_t>(), "sum_rows", "x");
  amp_need(out, py::dtype::of<uint16_t>(), "sum_rows", "out");
  if (x.ndim() != 2) tl::value_error("amp.sum_rows: x must be 2-D, got shape " + tl::shape_str(x));
  if (out.ndim() != 1 || out.shape(0) != x.shape(1))
    tl::value_error("amp.sum_rows: out must have shape (" + std::to_string(x.shape(1)) + ",), got " +
                    tl::shape_str(out));
  const uint16_t* xp = static_cast<const uint16_t*>(x.data());
  uint16_t* op = static_cast<uint16_t*>(out.mutable_data());
  const int64_t m = x.shape(0), n = x.shape(1);
  const bool v = amp_avx2();
  py::gil_scoped_release release;
  // column blocks over threads only when big (each thread's columns are summed exactly as on one)
  const int64_t blocks = m * n >= 4 * kAmpGrain ? (n + 255) / 256 : 1;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t j0 = b * n / blocks, j1 = (b + 1) * n / blocks;
    (v ? bf16k_sum_rows_avx2 : bf16k_sum_rows_scalar)(xp, m, n, j0, j1, op);
  }
}

void amp_relu(const py::array& x, py::array& out) {
  amp_unary<uint16_t, uint16_t>(x, out, "relu", bf16k_relu_avx2, bf16k_relu_scalar);
}

void amp_relu_backward(const py::array& g, const py::array& y, py::array& out) {
  amp_need(g, py::dtype::of<uint16_t>(), "relu_backward", "g");
  amp_need(y, py::dtype::of<uint16_t>(), "relu_backward", "y");
  amp_need(out, py::dtype::of<uint16_t>(), "relu_backward", "out");
  amp_same_shape(y, g, "relu_backward", "y", "g");
  amp_same_shape(y, out, "relu_backward", "y", "out");
  const uint16_t* gp = static_cast<const uint16_t*>(g.data());
  const uint16_t* yp = static_cast<const uint16_t*>(y.data());
  uint16_t* op = static_cast<uint16_t*>(out.mutable_data());
  const bool v = amp_avx2();
  py::gil_scoped_release release;
  amp_split(y.size(),
            [&](int64_t b, int64_t e) { (v ? bf16k_relu_bwd_avx2 : bf16k_relu_bwd_scalar)(gp + b, yp + b, op + b, e - b); });
}

}  // namespace

TL_REGISTER(amp) {
  m.doc() = "bfloat16 element-wise kernels for tl.autocast (operands as uint16 bit patterns)";
  m.def("to_bf16", &amp_to_bf16, py::arg("x"), py::arg("out"),
        "out[...] = bf16 bits of float32 x, round to nearest even (NaN -> 0x7FC0); C-contiguous, same shape");
  m.def("from_bf16", &amp_from_bf16, py::arg("x"), py::arg("out"), "out[...] = float32 values of the bf16 bits x (exact)");
  m.def("round_bf16", &amp_round_bf16, py::arg("x"), py::arg("out"),
        "out[...] = float32 x rounded to the nearest bf16 (ties to even; NaN -> quiet NaN), kept in float32");
  m.def("sum_rows", &amp_sum_rows, py::arg("x"), py::arg("out"),
        "out[j] = bf16 bits of the fp32 sum of the bf16 column x[:, j] (rows in order), x 2-D C-contiguous");
  m.def("relu", &amp_relu, py::arg("x"), py::arg("out"), "out = 0 where x < 0 else x, on bf16 bits (torch.relu)");
  m.def("relu_backward", &amp_relu_backward, py::arg("g"), py::arg("y"), py::arg("out"),
        "out = 0 where y <= 0 else g, on bf16 bits (torch's threshold_backward on the saved output)");
  m.def("isa", []() { return std::string(amp_avx2() ? "avx2" : "scalar"); },
        "the path the next call takes: avx2 or scalar (TINYLEARN_CPU_FEATURES)");
}
