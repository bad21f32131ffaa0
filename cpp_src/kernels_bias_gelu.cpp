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
//   bias_gelu_forward versions     v1 autovec   the loops above under `#pragma omp simd`, erf by Abramowitz &
//                                               Stegun 7.1.26 (abs. error 1.5e-7: poor relative error near 0),
//                                               OpenMP over rows above kParallelMin elements
//                                  v2 simd      explicit vector GELU of vec_math.h (AVX-512 / AVX2 / scalar by
//                                               tl::cpu_has), one thread: erf form vm::gelu_erf (no erf:
//                                               max(u,0) - |u| Phi(-|u|), Phi(-v) = e^{-v^2/2} S(v/(v+4)), one
//                                               polynomial family, <= 8 ulp incl. the negative tail); tanh form
//                                               h + h tanh(k(u + c u^3)). Elementwise, so every path gives the same bits
//                                  v3 simd_omp  v2 + OpenMP over rows, threads_for(R*C) threads; v2/v3 write
//                                               an output above 4 MiB with non-temporal stores (common.h; neutral
//                                               here within noise: the 8-lane erf makes this op compute-bound)
//                                  float64 runs v1's code for v2/v3; the backward pass is v1 for every version
#include <type_traits>

#include "kernels_math.h"

namespace py = pybind11;

namespace {
// Elements per thread before bias+GELU wakes an OpenMP team (forward and backward): 2^20 (~0.25 ms of one core's
// work). The kernel is cheap (~0.13 ms for 2^19 elements on one Zen 4 core), and its team's idle threads spin after
// the region while the next op -- typically Linear's OpenBLAS GEMM, on OpenBLAS's own threads -- needs the cores:
// measured on 2 cores, Linear -> GELU -> Linear at [512, 256] -> 1024 took 4.0 ms with a 2-thread GELU and 3.3 ms
// with a 1-thread one (the GEMMs alone: 3.3 ms).
constexpr ssize_t kGeluGrain = ssize_t(1) << 20;

using namespace tl;
using namespace tl::kern;
namespace vm = tl::vm;

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

// ---- float32 v2/v3 rows (vec_math.h) --------------------------------------------------------------------------
constexpr float kK = 0.79788456080286535588f, kC = 0.044715f;

void gelu_row_scalar(const float* x, const float* b, float* y, ssize_t C, bool tanh_form, bool /*stream*/) {
  for (ssize_t c = 0; c < C; ++c) {
    const float u = x[c] + b[c];
    if (tanh_form) {
      const float h = 0.5f * u;
      const float inner = std::fma(kC * (u * u), u, u) * kK;
      y[c] = std::fma(h, vm::scalar::tanh(inner), h);
    } else {
      y[c] = vm::scalar::gelu_erf(u);
    }
  }
}

TL_AVX2 inline __m256 gelu8(__m256 u, bool tanh_form) {
  if (tanh_form) {
    const __m256 h = _mm256_mul_ps(_mm256_set1_ps(0.5f), u);
    const __m256 c3 = _mm256_mul_ps(_mm256_set1_ps(kC), _mm256_mul_ps(u, u));
    const __m256 inner = _mm256_mul_ps(_mm256_fmadd_ps(c3, u, u), _mm256_set1_ps(kK));
    return _mm256_fmadd_ps(h, vm::avx2::tanh(inner), h);
  }
  return vm::avx2::gelu_erf(u);
}
TL_AVX2 void gelu_row_avx2(const float* x, const float* b, float* y, ssize_t C, bool tanh_form, bool stream) {
  ssize_t c = 0;
  if (stream) {  // scalar-path head up to a 32-byte boundary of y, then non-temporal stores (kernels_math.h)
    gelu_row_scalar(x, b, y, std::min(C, head_to(y, 32)), tanh_form, false);
    for (c = std::min(C, head_to(y, 32)); c + 8 <= C; c += 8)
      _mm256_stream_ps(y + c, gelu8(_mm256_add_ps(_mm256_loadu_ps(x + c), _mm256_loadu_ps(b + c)), tanh_form));
  }
  for (; c + 8 <= C; c += 8)
    _mm256_storeu_ps(y + c, gelu8(_mm256_add_ps(_mm256_loadu_ps(x + c), _mm256_loadu_ps(b + c)), tanh_form));
  if (c < C) {
    const __m256i m = vm::avx2::tail_mask(static_cast<int>(C - c));
    const __m256 u = _mm256_add_ps(_mm256_maskload_ps(x + c, m), _mm256_maskload_ps(b + c, m));
    _mm256_maskstore_ps(y + c, m, gelu8(u, tanh_form));
  }
}

TL_AVX512 inline __m512 gelu16(__m512 u, bool tanh_form) {
  if (tanh_form) {
    const __m512 h = _mm512_mul_ps(_mm512_set1_ps(0.5f), u);
    const __m512 c3 = _mm512_mul_ps(_mm512_set1_ps(kC), _mm512_mul_ps(u, u));
    const __m512 inner = _mm512_mul_ps(_mm512_fmadd_ps(c3, u, u), _mm512_set1_ps(kK));
    return _mm512_fmadd_ps(h, vm::avx512::tanh(inner), h);
  }
  return vm::avx512::gelu_erf(u);
}
TL_AVX512 void gelu_row_avx512(const float* x, const float* b, float* y, ssize_t C, bool tanh_form, bool stream) {
  ssize_t c = 0;
  if (stream) {
    gelu_row_scalar(x, b, y, std::min(C, head_to(y, 64)), tanh_form, false);
    for (c = std::min(C, head_to(y, 64)); c + 16 <= C; c += 16)
      _mm512_stream_ps(y + c, gelu16(_mm512_add_ps(_mm512_loadu_ps(x + c), _mm512_loadu_ps(b + c)), tanh_form));
  }
  for (; c + 16 <= C; c += 16)
    _mm512_storeu_ps(y + c, gelu16(_mm512_add_ps(_mm512_loadu_ps(x + c), _mm512_loadu_ps(b + c)), tanh_form));
  if (c < C) {
    const __mmask16 m = vm::avx512::tail_mask(static_cast<int>(C - c));
    const __m512 u = _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + c), _mm512_maskz_loadu_ps(m, b + c));
    _mm512_mask_storeu_ps(y + c, m, gelu16(u, tanh_form));
  }
}

template <typename T>
carr<T> bias_gelu_forward(carr<T> x, carr<T> b, bool tanh_form, const std::string& version) {
  check_bias(x, b, "bias_gelu_forward");
  const bool v_simd = version == "simd" || version == "simd_omp";
  if (version != "autovec" && !v_simd)
    tl::value_error("bias_gelu_forward: version must be 'autovec', 'simd' or 'simd_omp', got '" + version + "'");
  const ssize_t R = x.shape(0), C = x.shape(1);
  carr<T> y({R, C});
  const T *px = x.data(), *pb = b.data();
  T* py = y.mutable_data();
  if (v_simd && std::is_same<T, float>::value) {
    const vm::Isa isa = vm::best_isa();
    const auto row = isa == vm::Isa::avx512 ? gelu_row_avx512 : isa == vm::Isa::avx2 ? gelu_row_avx2 : gelu_row_scalar;
    const int nt = version == "simd" ? 1 : threads_for(R * C, kGeluGrain);
    const float *fx = reinterpret_cast<const float*>(px), *fb = reinterpret_cast<const float*>(pb);
    float* fy = reinterpret_cast<float*>(py);
    {
      py::gil_scoped_release release;
      const bool stream = stream_output(R * C * ssize_t(sizeof(float)));
#pragma omp parallel num_threads(nt) if (nt > 1)
      {
#pragma omp for schedule(static)
        for (ssize_t r = 0; r < R; ++r) row(fx + r * C, fb, fy + r * C, C, tanh_form, stream);
        if (stream) _mm_sfence();  // order this thread's non-temporal stores before the region ends
      }
    }
    return y;
  }
  py::gil_scoped_release release;
#pragma omp parallel for schedule(static) if (R * C > kParallelMin && version != "simd")
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
    const int nt = threads_for(R * C, kGeluGrain);
    std::vector<T> part(static_cast<size_t>(nt) * C, T(0));
#pragma omp parallel num_threads(nt) if (nt > 1)
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
  m.def("bias_gelu_forward", &bias_gelu_forward<T>, py::arg("x"), py::arg("bias"), py::arg("tanh_form") = false,
        py::arg("version") = "autovec", "versions: autovec, simd, simd_omp (see cpp_src/kernels_bias_gelu.cpp)");
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
