// kernels_softmax.cpp — fused CPU softmax behind tinylearn.kernels(backend="cpp"). OpenMP over rows,
// `#pragma omp simd` inner loops, one pass
// over memory where the row fits in cache. Works on C-contiguous float32 or float64 arrays that the Python
// dispatcher (tinylearn/kernels/cpu.py) has already reshaped to [rows, cols] (or [batch*heads, seq, dim] for
// attention). Part of _C.kernels (several files register into it, see registry.h); shared math in kernels_math.h.
//
// Versions (llm.c dev/cuda style; each is checked against the numpy reference in tests/test_kernels_cpu.py):
//   softmax_forward  v1 three_pass  max pass, exp+sum pass (writes e^(x-m) to y), scale pass: 1 read of x from
//                                   memory, the later passes hit L1/L2 (a row of 4096 fp32 is 16 KiB)
//                    v2 online      lane-wise online max/sum (Milakov & Gimelshein 2018): m' = max(m, x),
//                                   d' = d e^(m-m') + e^(x-m'); then one write pass. 2 exps per element in pass 1
//   softmax_backward               dx = y * (dy - sum(dy * y))
#include "kernels_math.h"

namespace py = pybind11;

namespace {
using namespace tl;
using namespace tl::kern;

// ---- softmax -----------------------------------------------------------------------------------------------
template <typename T>
void softmax_row_three_pass(const T* x, T* y, ssize_t C) {
  T m = neg_inf<T>();
#pragma omp simd reduction(max : m)
  for (ssize_t c = 0; c < C; ++c) m = x[c] > m ? x[c] : m;
  if (m == neg_inf<T>()) {  // fully masked row: NaN like torch (a NaN input propagates through the sum below)
    for (ssize_t c = 0; c < C; ++c) y[c] = nan_v<T>();
    return;
  }
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (ssize_t c = 0; c < C; ++c) {
    const T e = exp_approx(x[c] - m);
    y[c] = e;
    s += e;
  }
  const T inv = T(1) / s;
#pragma omp simd
  for (ssize_t c = 0; c < C; ++c) y[c] *= inv;
}

template <typename T>
void softmax_row_online(const T* x, T* y, ssize_t C) {
  constexpr int L = 16;  // independent (max, sum) lanes, merged at the end
  T m[L], d[L];
  for (int l = 0; l < L; ++l) m[l] = neg_inf<T>(), d[l] = 0;
  ssize_t c = 0;
  for (; c + L <= C; c += L) {
#pragma omp simd
    for (int l = 0; l < L; ++l) {
      const T xi = x[c + l];
      const T mn = xi > m[l] ? xi : m[l];
      // guard -inf - -inf: a lane that has only seen -inf keeps d = 0
      const T a = m[l] == neg_inf<T>() ? T(0) : exp_approx(m[l] - mn);
      const T b = xi == neg_inf<T>() ? T(0) : exp_approx(xi - mn);
      d[l] = d[l] * a + b;
      m[l] = mn;
    }
  }
  T M = neg_inf<T>(), D = 0;
  for (int l = 0; l < L; ++l) {
    if (m[l] == neg_inf<T>()) continue;
    const T mn = std::max(M, m[l]);
    D = (M == neg_inf<T>() ? T(0) : D * exp_approx(M - mn)) + d[l] * exp_approx(m[l] - mn);
    M = mn;
  }
  for (; c < C; ++c) {
    const T xi = x[c];
    if (xi == neg_inf<T>()) continue;
    const T mn = std::max(M, xi);
    D = (M == neg_inf<T>() ? T(0) : D * exp_approx(M - mn)) + exp_approx(xi - mn);
    M = mn;
  }
  if (M == neg_inf<T>() || D != D) {  // fully masked row, or a NaN input (it makes D NaN): NaN like torch
    for (ssize_t k = 0; k < C; ++k) y[k] = nan_v<T>();
    return;
  }
  const T inv = T(1) / D;
#pragma omp simd
  for (ssize_t k = 0; k < C; ++k) y[k] = exp_approx(x[k] - M) * inv;
}

template <typename T>
carr<T> softmax_forward(carr<T> x, const std::string& version) {
  need_ndim(x, 2, "softmax_forward", "x");
  const ssize_t R = x.shape(0), C = x.shape(1);
  if (version != "three_pass" && version != "online")
    tl::value_error("softmax_forward: version must be 'three_pass' or 'online', got '" + version + "'");
  const bool online = version == "online";
  carr<T> y({R, C});
  const T* px = x.data();
  T* py = y.mutable_data();
  py::gil_scoped_release release;
#pragma omp parallel for schedule(static) if (R * C > kParallelMin)
  for (ssize_t r = 0; r < R; ++r) {
    if (online)
      softmax_row_online(px + r * C, py + r * C, C);
    else
      softmax_row_three_pass(px + r * C, py + r * C, C);
  }
  return y;
}

template <typename T>
carr<T> softmax_backward(carr<T> y, carr<T> dy) {
  need_ndim(y, 2, "softmax_backward", "y");
  need_same(y, dy, "softmax_backward", "dy", "y");
  const ssize_t R = y.shape(0), C = y.shape(1);
  carr<T> dx({R, C});
  const T* py = y.data();
  const T* pg = dy.data();
  T* pd = dx.mutable_data();
  py::gil_scoped_release release;
#pragma omp parallel for schedule(static) if (R * C > kParallelMin)
  for (ssize_t r = 0; r < R; ++r) {
    const T* yr = py + r * C;
    const T* gr = pg + r * C;
    T* dr = pd + r * C;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (ssize_t c = 0; c < C; ++c) s += yr[c] * gr[c];
#pragma omp simd
    for (ssize_t c = 0; c < C; ++c) dr[c] = yr[c] * (gr[c] - s);
  }
  return dx;
}

template <typename T>
void def_softmax(py::module_& m) {
  m.def("softmax_forward", &softmax_forward<T>, py::arg("x"), py::arg("version") = "three_pass");
  m.def("softmax_backward", &softmax_backward<T>, py::arg("y"), py::arg("dy"));
}

}  // namespace

TL_REGISTER(kernels) {
  m.doc() = "fused CPU kernels (float32 / float64, C-contiguous): softmax, layer_norm, bias_gelu, flash_attention";
  def_softmax<float>(m);
  def_softmax<double>(m);
  m.def(
      "exp_approx",
      [](carr<float> x) {
        carr<float> y(x.size());
        const float* px = x.data();
        float* py = y.mutable_data();
        for (ssize_t i = 0; i < x.size(); ++i) py[i] = exp_approx(px[i]);
        return y;
      },
      py::arg("x"), "the vectorisable float32 exp used by the kernels (for accuracy tests)");
}
