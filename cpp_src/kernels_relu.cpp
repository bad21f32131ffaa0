// kernels_relu.cpp — ReLU forward and backward for the autograd ReLU Function (tinylearn/autograd/ops_elementwise.py).
// Part of _C.kernels (several files register into it, see registry.h).
//
//   relu_forward(x, out)        out = 0 where x < 0, else x       (torch.relu: relu(NaN) = NaN, relu(-0.0) = -0.0)
//   relu_backward(g, y, out)    out = 0 where y <= 0, else g      (torch's threshold_backward(g, y, 0) on the saved
//                               output y: a select, not a product, so g = NaN/inf where y <= 0 gives 0, and y = NaN
//                               passes g through)
//   relu_isa()                  the path the next call takes: "avx512", "avx2" or "scalar" (TINYLEARN_CPU_FEATURES)
//
// Operands: float32 or float64, one dtype, one shape, any number of dimensions. Both return True when they ran,
// False (nothing written) when the layout is neither of these two:
//   flat   every operand has the same strides and out is dense (C, F or any axis order; the usual case: out comes
//          from np.empty_like of the input, so a column-major input gives a column-major output) -> one pass
//   2-D    any strides per operand (transposed views, slices); the inner loop runs along out's unit-stride axis and
//          every operand must be unit-stride there (each row is one SIMD row call)
// The Python caller takes numpy's path on False. Shape/dtype mismatches raise ValueError.
// Paths (cpu_features.h switch): AVX-512 (compare to a mask, masked move, masked tail), AVX2 (compare, and),
// scalar (plain loop). Every path gives the same bits: the op is a select. One thread below relu_kGrain elements per
// thread (an OpenMP team costs several us, more than the whole [128, 512] op); the GIL is released from there.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <cstdlib>
#include <vector>
#include <string>

#include "common.h"
#include "cpu_features.h"

namespace py = pybind11;

namespace {
using namespace tl;

constexpr int64_t relu_kGrain = int64_t(1) << 18;  // elements per OpenMP thread (1 MiB of float32 input)

enum class Isa { scalar, avx2, avx512 };
Isa isa() {
  if (cpu_has("avx512f")) return Isa::avx512;
  if (cpu_has("avx2")) return Isa::avx2;
  return Isa::scalar;
}

// ---- scalar -----------------------------------------------------------------------------------------------------
template <typename T>
void fwd_scalar(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];
}
template <typename T>
void bwd_scalar(const T* g, const T* y, T* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = y[i] <= T(0) ? T(0) : g[i];
}

// ---- AVX2 -------------------------------------------------------------------------------------------------------
// _CMP_NLT_UQ: true where !(x < 0), NaN included -> keep x.  _CMP_NLE_UQ: true where !(y <= 0), NaN included -> keep g.
__attribute__((target("avx2"))) void fwd_avx2(const float* x, float* y, int64_t n) {
  const __m256 z = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, _mm256_and_ps(_mm256_cmp_ps(v, z, _CMP_NLT_UQ), v));
  }
  fwd_scalar(x + i, y + i, n - i);
}
__attribute__((target("avx2"))) void fwd_avx2(const double* x, double* y, int64_t n) {
  const __m256d z = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d v = _mm256_loadu_pd(x + i);
    _mm256_storeu_pd(y + i, _mm256_and_pd(_mm256_cmp_pd(v, z, _CMP_NLT_UQ), v));
  }
  fwd_scalar(x + i, y + i, n - i);
}
__attribute__((target("avx2"))) void bwd_avx2(const float* g, const float* y, float* o, int64_t n) {
  const __m256 z = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 m = _mm256_cmp_ps(_mm256_loadu_ps(y + i), z, _CMP_NLE_UQ);
    _mm256_storeu_ps(o + i, _mm256_and_ps(m, _mm256_loadu_ps(g + i)));
  }
  bwd_scalar(g + i, y + i, o + i, n - i);
}
__attribute__((target("avx2"))) void bwd_avx2(const double* g, const double* y, double* o, int64_t n) {
  const __m256d z = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d m = _mm256_cmp_pd(_mm256_loadu_pd(y + i), z, _CMP_NLE_UQ);
    _mm256_storeu_pd(o + i, _mm256_and_pd(m, _mm256_loadu_pd(g + i)));
  }
  bwd_scalar(g + i, y + i, o + i, n - i);
}

// ---- AVX-512 ----------------------------------------------------------------------------------------------------
__attribute__((target("avx512f"))) void fwd_avx512(const float* x, float* y, int64_t n) {
  const __m512 z = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(y + i, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, z, _CMP_NLT_UQ), v));
  }
  if (i < n) {
    const __mmask16 t = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 v = _mm512_maskz_loadu_ps(t, x + i);
    _mm512_mask_storeu_ps(y + i, t, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, z, _CMP_NLT_UQ), v));
  }
}
__attribute__((target("avx512f"))) void fwd_avx512(const double* x, double* y, int64_t n) {
  const __m512d z = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d v = _mm512_loadu_pd(x + i);
    _mm512_storeu_pd(y + i, _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(v, z, _CMP_NLT_UQ), v));
  }
  if (i < n) {
    const __mmask8 t = static_cast<__mmask8>((1u << (n - i)) - 1u);
    const __m512d v = _mm512_maskz_loadu_pd(t, x + i);
    _mm512_mask_storeu_pd(y + i, t, _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(v, z, _CMP_NLT_UQ), v));
  }
}
__attribute__((target("avx512f"))) void bwd_avx512(const float* g, const float* y, float* o, int64_t n) {
  const __m512 z = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(y + i), z, _CMP_NLE_UQ);
    _mm512_storeu_ps(o + i, _mm512_maskz_loadu_ps(m, g + i));
  }
  if (i < n) {
    const __mmask16 t = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __mmask16 m = _mm512_mask_cmp_ps_mask(t, _mm512_maskz_loadu_ps(t, y + i), z, _CMP_NLE_UQ);
    _mm512_mask_storeu_ps(o + i, t, _mm512_maskz_loadu_ps(m, g + i));
  }
}
__attribute__((target("avx512f"))) void bwd_avx512(const double* g, const double* y, double* o, int64_t n) {
  const __m512d z = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __mmask8 m = _mm512_cmp_pd_mask(_mm512_loadu_pd(y + i), z, _CMP_NLE_UQ);
    _mm512_storeu_pd(o + i, _mm512_maskz_loadu_pd(m, g + i));
  }
  if (i < n) {
    const __mmask8 t = static_cast<__mmask8>((1u << (n - i)) - 1u);
    const __mmask8 m = _mm512_mask_cmp_pd_mask(t, _mm512_maskz_loadu_pd(t, y + i), z, _CMP_NLE_UQ);
    _mm512_mask_storeu_pd(o + i, t, _mm512_maskz_loadu_pd(m, g + i));
  }
}

template <typename T>
void fwd_row(Isa s, const T* x, T* y, int64_t n) {
  if (s == Isa::avx512)
    fwd_avx512(x, y, n);
  else if (s == Isa::avx2)
    fwd_avx2(x, y, n);
  else
    fwd_scalar(x, y, n);
}
template <typename T>
void bwd_row(Isa s, const T* g, const T* y, T* o, int64_t n) {
  if (s == Isa::avx512)
    bwd_avx512(g, y, o, n);
  else if (s == Isa::avx2)
    bwd_avx2(g, y, o, n);
  else
    bwd_scalar(g, y, o, n);
}

// ---- layouts ----------------------------------------------------------------------------------------------------
bool same_strides(const py::array& a, const py::array& b) {
  for (ssize_t d = 0; d < a.ndim(); ++d)
    if (a.shape(d) > 1 && a.strides(d) != b.strides(d)) return false;
  return true;
}

// Dense in some axis order (C, F or any permutation, positive strides): the elements fill one block of memory.
bool dense(const py::array& a) {
  const int f = a.flags();
  if ((f & py::array::c_style) || (f & py::array::f_style)) return true;
  std::vector<std::pair<ssize_t, ssize_t>> d;  // (stride, extent) of the axes longer than 1
  for (ssize_t k = 0; k < a.ndim(); ++k)
    if (a.shape(k) > 1) d.emplace_back(a.strides(k), a.shape(k));
  std::sort(d.begin(), d.end());
  ssize_t want = a.itemsize();
  for (const auto& [st, ex] : d) {
    if (st != want) return false;
    want *= ex;
  }
  return true;
}

// A 2-D view of one operand in elements: p[i * s0 + j * s1], with (i, j) ordered so that j is out's fast axis.
template <typename T>
struct View2 {
  T* p;
  int64_t s0, s1;
};
template <typename T>
View2<T> view2(const py::array& a, bool swap) {
  const int64_t e = static_cast<int64_t>(sizeof(T));
  T* p = static_cast<T*>(const_cast<void*>(a.data()));
  const int64_t s0 = a.strides(0) / e, s1 = a.strides(1) / e;
  return swap ? View2<T>{p, s1, s0} : View2<T>{p, s0, s1};
}

void check(const py::array& a, const py::array& out, const char* fn, const char* na) {
  need_same(a, out, fn, na, "out");
  if (!a.dtype().is(out.dtype()))
    value_error(std::string(fn) + ": " + na + " dtype " + std::string(py::str(a.dtype())) + " does not match out dtype " +
                std::string(py::str(out.dtype())));
  if (!out.writeable()) value_error(std::string(fn) + ": out is read-only");
  for (ssize_t d = 0; d < a.ndim(); ++d)
    if (a.strides(d) % static_cast<ssize_t>(a.itemsize()) != 0 || out.strides(d) % static_cast<ssize_t>(a.itemsize()))
      value_error(std::string(fn) + ": strides must be multiples of the item size");
}

// Runs row(in, out, begin, n) over the flat buffer or over the 2-D rows of the operands (ops[0] is out). Returns
// false, touching nothing, when the layout is neither (the caller then takes numpy's path).
template <typename T, typename RowFn>
bool run(const std::vector<py::array>& ops, RowFn row) {
  const py::array& out = ops[0];
  const int64_t n = static_cast<int64_t>(out.size());
  if (n == 0) return true;
  bool flat = dense(out);
  for (size_t k = 1; flat && k < ops.size(); ++k) flat = same_strides(ops[k], out);
  const bool big = n >= 2 * relu_kGrain;
  if (flat) {
    std::vector<const T*> in;
    for (size_t k = 1; k < ops.size(); ++k) in.push_back(static_cast<const T*>(ops[k].data()));
    T* o = static_cast<T*>(const_cast<void*>(out.data()));  // writeable checked
    auto body = [&](int64_t b, int64_t e) { row(in, o, b, e - b); };
    if (big) {
      py::gil_scoped_release nogil;
      run_chunks(n, relu_kGrain, true, body);
    } else {
      body(0, n);
    }
    return true;
  }
  if (out.ndim() != 2) return false;
  const bool swap = std::abs(out.strides(0)) < std::abs(out.strides(1));  // j = out's fast axis
  const int64_t R = swap ? out.shape(1) : out.shape(0), C = swap ? out.shape(0) : out.shape(1);
  std::vector<View2<T>> v;
  for (const auto& a : ops) v.push_back(view2<T>(a, swap));
  for (const auto& w : v)
    if (w.s1 != 1 && C != 1) return false;
  auto body = [&](int64_t rb, int64_t re) {
    std::vector<const T*> in(v.size() - 1);
    for (int64_t r = rb; r < re; ++r) {
      for (size_t k = 1; k < v.size(); ++k) in[k - 1] = v[k].p + r * v[k].s0;
      row(in, v[0].p + r * v[0].s0, 0, C);
    }
  };
  if (big) {
    py::gil_scoped_release nogil;
    run_chunks(R, std::max<int64_t>(1, relu_kGrain / std::max<int64_t>(C, 1)), true, body);
  } else {
    body(0, R);
  }
  return true;
}

template <typename T>
bool relu_forward_t(const py::array& x, const py::array& out) {
  const Isa s = isa();
  return run<T>({out, x}, [s](const std::vector<const T*>& in, T* o, int64_t b, int64_t n) {
    fwd_row(s, in[0] + b, o + b, n);
  });
}

template <typename T>
bool relu_backward_t(const py::array& g, const py::array& y, const py::array& out) {
  const Isa s = isa();
  return run<T>({out, g, y}, [s](const std::vector<const T*>& in, T* o, int64_t b, int64_t n) {
    bwd_row(s, in[0] + b, in[1] + b, o + b, n);
  });
}

bool is_f32(const py::array& a) { return a.dtype().is(py::dtype::of<float>()); }
bool is_f64(const py::array& a) { return a.dtype().is(py::dtype::of<double>()); }

bool relu_forward(const py::array& x, const py::array& out) {
  check(x, out, "relu_forward", "x");
  if (is_f32(x)) return relu_forward_t<float>(x, out);
  if (is_f64(x)) return relu_forward_t<double>(x, out);
    value_error("relu_forward: x dtype must be float32 or float64, got " + std::string(py::str(x.dtype())));
}

bool relu_backward(const py::array& g, const py::array& y, const py::array& out) {
  check(g, out, "relu_backward", "g");
  check(y, out, "relu_backward", "y");
  if (is_f32(g)) return relu_backward_t<float>(g, y, out);
  if (is_f64(g)) return relu_backward_t<double>(g, y, out);
    value_error("relu_backward: g dtype must be float32 or float64, got " + std::string(py::str(g.dtype())));
}

}  // namespace

TL_REGISTER(kernels) {
  m.def("relu_forward", &relu_forward, py::arg("x"), py::arg("out"),
        "out = 0 where x < 0 else x (torch.relu semantics: NaN and -0.0 pass through); float32/float64, same shape. "
        "False (nothing written) when the layout is neither flat (same strides, out contiguous) nor 2-D row-wise.");
  m.def("relu_backward", &relu_backward, py::arg("g"), py::arg("y"), py::arg("out"),
        "out = 0 where y <= 0 else g (torch threshold_backward(g, y, 0) on the saved ReLU output y); "
        "False when the layout is unsupported, as relu_forward.");
  m.def("relu_isa", []() -> std::string {
    switch (isa()) {
      case Isa::avx512:
        return "avx512";
      case Isa::avx2:
        return "avx2";
      default:
        return "scalar";
    }
  });
}
