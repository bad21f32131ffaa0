// kernels_layernorm.cpp — fused CPU LayerNorm behind tinylearn.kernels(backend="cpp"). OpenMP over rows,
// `#pragma omp simd` inner loops, one pass
// over memory where the row fits in cache. Works on C-contiguous float32 or float64 arrays that the Python
// dispatcher (tinylearn/kernels/cpu.py) has already reshaped to [rows, cols] (or [batch*heads, seq, dim] for
// attention). Part of _C.kernels (several files register into it, see registry.h); shared math in kernels_math.h.
//
// Versions (llm.c dev/cuda style; each is checked against the numpy reference in tests/test_kernels_cpu.py):
//   layer_norm_forward v1 two_pass  mean pass, centred sum-of-squares pass (exact two-pass variance), write pass
//                      v2 welford   lane-wise Welford (mean, M2) merged with Chan's formula, then write pass
//   layer_norm_backward            dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w;
//                                  dw = sum_rows dy * xhat, db = sum_rows dy (per-thread partials, then reduced)
#include "kernels_math.h"

namespace py = pybind11;

namespace {
using namespace tl;
using namespace tl::kern;

// ---- LayerNorm -----------------------------------------------------------------------------------------------
template <typename T>
void ln_stats_two_pass(const T* x, ssize_t C, double eps, T& mean, T& rstd) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (ssize_t c = 0; c < C; ++c) s += x[c];
  const T mu = s / T(C);
  T v = 0;
#pragma omp simd reduction(+ : v)
  for (ssize_t c = 0; c < C; ++c) v += (x[c] - mu) * (x[c] - mu);
  mean = mu;
  rstd = T(1) / std::sqrt(v / T(C) + T(eps));
}

template <typename T>
void ln_stats_welford(const T* x, ssize_t C, double eps, T& mean, T& rstd) {
  constexpr int L = 16;
  T mu[L], m2[L];
  for (int l = 0; l < L; ++l) mu[l] = 0, m2[l] = 0;
  ssize_t n = 0, c = 0;
  for (; c + L <= C; c += L) {
    ++n;
    const T inv = T(1) / T(n);
#pragma omp simd
    for (int l = 0; l < L; ++l) {
      const T xi = x[c + l];
      const T delta = xi - mu[l];
      mu[l] += delta * inv;
      m2[l] += delta * (xi - mu[l]);
    }
  }
  // Chan et al.: merge (n_a, mean_a, M2_a) with (n_b, mean_b, M2_b)
  T N = 0, MU = 0, M2 = 0;
  for (int l = 0; l < L && n > 0; ++l) {
    const T nb = T(n), tot = N + nb, delta = mu[l] - MU;
    MU += delta * nb / tot;
    M2 += m2[l] + delta * delta * N * nb / tot;
    N = tot;
  }
  for (; c < C; ++c) {
    N += 1;
    const T delta = x[c] - MU;
    MU += delta / N;
    M2 += delta * (x[c] - MU);
  }
  mean = MU;
  rstd = T(1) / std::sqrt(M2 / T(C) + T(eps));
}

template <typename T>
py::tuple layer_norm_forward(carr<T> x, carr<T> w, carr<T> b, double eps, const std::string& version) {
  need_ndim(x, 2, "layer_norm_forward", "x");
  need_ndim(w, 1, "layer_norm_forward", "weight");
  need_ndim(b, 1, "layer_norm_forward", "bias");
  const ssize_t R = x.shape(0), C = x.shape(1);
  if (w.shape(0) != C || b.shape(0) != C)
    tl::value_error("layer_norm_forward: weight/bias length " + std::to_string(w.shape(0)) + "/" +
                    std::to_string(b.shape(0)) + " must equal the normalised size " + std::to_string(C));
  if (version != "two_pass" && version != "welford")
    tl::value_error("layer_norm_forward: version must be 'two_pass' or 'welford', got '" + version + "'");
  if (!(eps >= 0)) tl::value_error("layer_norm_forward: eps must be >= 0, got " + std::to_string(eps));
  const bool welford = version == "welford";
  carr<T> y({R, C});
  carr<T> mean(R), rstd(R);
  const T *px = x.data(), *pw = w.data(), *pb = b.data();
  T *py = y.mutable_data(), *pm = mean.mutable_data(), *pr = rstd.mutable_data();
  {
    py::gil_scoped_release release;
#pragma omp parallel for schedule(static) if (R * C > kParallelMin)
    for (ssize_t r = 0; r < R; ++r) {
      const T* xr = px + r * C;
      T mu, rs;
      if (welford)
        ln_stats_welford(xr, C, eps, mu, rs);
      else
        ln_stats_two_pass(xr, C, eps, mu, rs);
      pm[r] = mu;
      pr[r] = rs;
      T* yr = py + r * C;
#pragma omp simd
      for (ssize_t c = 0; c < C; ++c) yr[c] = (xr[c] - mu) * rs * pw[c] + pb[c];
    }
  }
  return py::make_tuple(y, mean, rstd);
}

template <typename T>
py::tuple layer_norm_backward(carr<T> dy, carr<T> x, carr<T> w, carr<T> mean, carr<T> rstd) {
  need_ndim(x, 2, "layer_norm_backward", "x");
  need_same(dy, x, "layer_norm_backward", "dy", "x");
  const ssize_t R = x.shape(0), C = x.shape(1);
  if (w.ndim() != 1 || w.shape(0) != C)
    tl::value_error("layer_norm_backward: weight shape " + shape_str(w) + " must be (" + std::to_string(C) + ",)");
  if (mean.ndim() != 1 || mean.shape(0) != R || rstd.ndim() != 1 || rstd.shape(0) != R)
    tl::value_error("layer_norm_backward: mean/rstd shapes " + shape_str(mean) + "/" + shape_str(rstd) + " must be (" +
                    std::to_string(R) + ",)");
  carr<T> dx({R, C});
  carr<T> dw(C), db(C);
  const T *pdy = dy.data(), *px = x.data(), *pw = w.data(), *pm = mean.data(), *pr = rstd.data();
  T *pdx = dx.mutable_data(), *pdw = dw.mutable_data(), *pdb = db.mutable_data();
  {
    py::gil_scoped_release release;
    const int nt = n_threads();
    std::vector<T> part(static_cast<size_t>(nt) * 2 * C, T(0));
#pragma omp parallel if (R * C > kParallelMin)
    {
      T* mydw = part.data() + static_cast<size_t>(thread_id()) * 2 * C;
      T* mydb = mydw + C;
#pragma omp for schedule(static)
      for (ssize_t r = 0; r < R; ++r) {
        const T *xr = px + r * C, *gr = pdy + r * C;
        const T mu = pm[r], rs = pr[r];
        T a = 0, bsum = 0;
#pragma omp simd reduction(+ : a, bsum)
        for (ssize_t c = 0; c < C; ++c) {
          const T xh = (xr[c] - mu) * rs;
          const T g = gr[c] * pw[c];
          a += g;
          bsum += g * xh;
          mydw[c] += gr[c] * xh;
          mydb[c] += gr[c];
        }
        a /= T(C);
        bsum /= T(C);
        T* dr = pdx + r * C;
#pragma omp simd
        for (ssize_t c = 0; c < C; ++c) {
          const T xh = (xr[c] - mu) * rs;
          dr[c] = rs * (gr[c] * pw[c] - a - xh * bsum);
        }
      }
    }
    for (ssize_t c = 0; c < C; ++c) {
      T sw = 0, sb = 0;
      for (int t = 0; t < nt; ++t) {
        sw += part[static_cast<size_t>(t) * 2 * C + c];
        sb += part[static_cast<size_t>(t) * 2 * C + C + c];
      }
      pdw[c] = sw;
      pdb[c] = sb;
    }
  }
  return py::make_tuple(dx, dw, db);
}

template <typename T>
void def_layernorm(py::module_& m) {
  m.def("layer_norm_forward", &layer_norm_forward<T>, py::arg("x"), py::arg("weight"), py::arg("bias"),
        py::arg("eps") = 1e-5, py::arg("version") = "two_pass");
  m.def("layer_norm_backward", &layer_norm_backward<T>, py::arg("dy"), py::arg("x"), py::arg("weight"), py::arg("mean"),
        py::arg("rstd"));
}

}  // namespace

TL_REGISTER(kernels) {
  def_layernorm<float>(m);
  def_layernorm<double>(m);
}
