// kernels_bias_gelu.cpp — fused CPU bias + GELU behind tinylearn.kernels(backend="cpp"). OpenMP over rows,
// `#pragma omp simd` inner loops, one pass
// over memory where the row fits in cache. Works on C-contiguous float32 or float64 arrays that the Python
// dispatcher (tinylearn/kernels/cpu.py) has already reshaped to [rows, cols] (or [batch*heads, seq, dim] for
// attention). Part of _C.kernels (several files register into it, see registry.h); shared math in kernels_math.h.
//
// Versions (llm.c dev/cuda style; each is checked against the numpy reference in tests/test_kernels_cpu.py):
//   bias_gelu_forward / backward   u = x + b; erf form  gelu(u) = u Phi(u),      gelu'(u) = Phi(u) + u phi(u)
//                                             tanh form gelu(u) = u/2 (1 + t),   t = tanh(k (u + c u^3)),
//                                             gelu'(u) = (1 + t)/2 + u/2 (1 - t^2) k (1 + 3 c u^2)
#include "kernels_math.h"

namespace py = pybind11;

namespace {
using namespace tl;
using namespace tl::kern;

// ---- bias + GELU -----------------------------------------------------------------------------------------------
template <typename T>
inline T gelu_erf(T u) {
  return T(0.5) * u * (T(1) + erf_approx(u * T(0.70710678118654752440)));
}
template <typename T>
inline T gelu_tanh(T u) {
  const T k = T(0.79788456080286535588), c = T(0.044715);
  return T(0.5) * u * (T(1) + tanh_approx(k * (u + c * u * u * u)));
}
template <typename T>
inline T dgelu_erf(T u) {  // Phi(u) + u phi(u)
  const T Phi = T(0.5) * (T(1) + erf_approx(u * T(0.70710678118654752440)));
  const T phi = T(0.39894228040143267794) * exp_approx(T(-0.5) * u * u);
  return Phi + u * phi;
}
template <typename T>
inline T dgelu_tanh(T u) {
  const T k = T(0.79788456080286535588), c = T(0.044715);
  const T t = tanh_approx(k * (u + c * u * u * u));
  return T(0.5) * (T(1) + t) + T(0.5) * u * (T(1) - t * t) * k * (T(1) + T(3) * c * u * u);
}

template <typename T>
void check_bias(const carr<T>& x, const carr<T>& b, const char* fn) {
  need_ndim(x, 2, fn, "x");
  if (b.ndim() != 1 || b.shape(0) != x.shape(1))
    tl::value_error(std::string(fn) + ": bias shape " + shape_str(b) + " must be (" + std::to_string(x.shape(1)) +
                    ",) to match x's last dimension");
}

template <typename T>
carr<T> bias_gelu_forward(carr<T> x, carr<T> b, bool tanh_form) {
  check_bias(x, b, "bias_gelu_forward");
  const ssize_t R = x.shape(0), C = x.shape(1);
  carr<T> y({R, C});
  const T *px = x.data(), *pb = b.data();
  T* py = y.mutable_data();
  py::gil_scoped_release release;
#pragma omp parallel for schedule(static) if (R * C > kParallelMin)
  for (ssize_t r = 0; r < R; ++r) {
    const T* xr = px + r * C;
    T* yr = py + r * C;
    if (tanh_form) {
#pragma omp simd
      for (ssize_t c = 0; c < C; ++c) yr[c] = gelu_tanh(xr[c] + pb[c]);
    } else {
#pragma omp simd
      for (ssize_t c = 0; c < C; ++c) yr[c] = gelu_erf(xr[c] + pb[c]);
    }
  }
  return y;
}

template <typename T>
py::tuple bias_gelu_backward(carr<T> dy, carr<T> x, carr<T> b, bool tanh_form) {
  check_bias(x, b, "bias_gelu_backward");
  need_same(dy, x, "bias_gelu_backward", "dy", "x");
  const ssize_t R = x.shape(0), C = x.shape(1);
  carr<T> dx({R, C});
  carr<T> db(C);
  const T *px = x.data(), *pb = b.data(), *pg = dy.data();
  T *pdx = dx.mutable_data(), *pdb = db.mutable_data();
  {
    py::gil_scoped_release release;
    const int nt = n_threads();
    std::vector<T> part(static_cast<size_t>(nt) * C, T(0));
#pragma omp parallel if (R * C > kParallelMin)
    {
      T* mine = part.data() + static_cast<size_t>(thread_id()) * C;
#pragma omp for schedule(static)
      for (ssize_t r = 0; r < R; ++r) {
        const T *xr = px + r * C, *gr = pg + r * C;
        T* dr = pdx + r * C;
        if (tanh_form) {
#pragma omp simd
          for (ssize_t c = 0; c < C; ++c) {
            const T d = gr[c] * dgelu_tanh(xr[c] + pb[c]);
            dr[c] = d;
            mine[c] += d;
          }
        } else {
#pragma omp simd
          for (ssize_t c = 0; c < C; ++c) {
            const T d = gr[c] * dgelu_erf(xr[c] + pb[c]);
            dr[c] = d;
            mine[c] += d;
          }
        }
      }
    }
    for (ssize_t c = 0; c < C; ++c) {
      T s = 0;
      for (int t = 0; t < nt; ++t) s += part[static_cast<size_t>(t) * C + c];
      pdb[c] = s;
    }
  }
  return py::make_tuple(dx, db);
}

template <typename T>
void def_bias_gelu(py::module_& m) {
  m.def("bias_gelu_forward", &bias_gelu_forward<T>, py::arg("x"), py::arg("bias"), py::arg("tanh_form") = false);
  m.def("bias_gelu_backward", &bias_gelu_backward<T>, py::arg("dy"), py::arg("x"), py::arg("bias"),
        py::arg("tanh_form") = false);
}

}  // namespace

TL_REGISTER(kernels) {
  def_bias_gelu<float>(m);
  def_bias_gelu<double>(m);
  m.def(
      "erf_approx",
      [](carr<float> x) {
        carr<float> y(x.size());
        const float* px = x.data();
        float* py = y.mutable_data();
        for (ssize_t i = 0; i < x.size(); ++i) py[i] = erf_approx(px[i]);
        return y;
      },
      py::arg("x"), "the vectorisable float32 erf used by the kernels (for accuracy tests)");
}
