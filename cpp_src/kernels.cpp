// kernels.cpp — fused CPU kernels behind tinylearn.kernels(backend="cpu"): softmax, LayerNorm, bias+GELU,
// flash attention. OpenMP over rows (or over heads x query blocks), `#pragma omp simd` inner loops, one pass
// over memory where the row fits in cache. Every function works on C-contiguous float32 or float64 arrays that
// the Python dispatcher has already reshaped to [rows, cols] (or [batch*heads, seq, dim] for attention).
//
// Versions (llm.c dev/cuda style; each is checked against the numpy reference in tests/test_kernels_cpu.py):
//   softmax_forward  v1 three_pass  max pass, exp+sum pass (writes e^(x-m) to y), scale pass: 1 read of x from
//                                   memory, the later passes hit L1/L2 (a row of 4096 fp32 is 16 KiB)
//                    v2 online      lane-wise online max/sum (Milakov & Gimelshein 2018): m' = max(m, x),
//                                   d' = d e^(m-m') + e^(x-m'); then one write pass. 2 exps per element in pass 1
//   softmax_backward               dx = y * (dy - sum(dy * y))
//   layer_norm_forward v1 two_pass  mean pass, centred sum-of-squares pass (exact two-pass variance), write pass
//                      v2 welford   lane-wise Welford (mean, M2) merged with Chan's formula, then write pass
//   layer_norm_backward            dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w;
//                                  dw = sum_rows dy * xhat, db = sum_rows dy (per-thread partials, then reduced)
//   bias_gelu_forward / backward   u = x + b; erf form  gelu(u) = u Phi(u),      gelu'(u) = Phi(u) + u phi(u)
//                                             tanh form gelu(u) = u/2 (1 + t),   t = tanh(k (u + c u^3)),
//                                             gelu'(u) = (1 + t)/2 + u/2 (1 - t^2) k (1 + 3 c u^2)
//   flash_attention_forward        tiled online softmax (Dao et al. 2022): per (head, query block) keep running
//                                  max m, sum l and unnormalised O; O(block^2) scratch, never the N x N matrix;
//                                  also returns lse = m + log(l) for the backward. S = Q K^T and acc += P V are
//                                  register-blocked 4 x 32 micro-GEMMs (small_gemm) over the tile
//   flash_attention_backward       recompute P = exp(S - lse) tile by tile: pass A over (head, key block) -> dK, dV;
//                                  pass B over (head, query block) -> dQ (no atomics, S recomputed twice)
// float32 uses the polynomial exp/erf below so that the loops vectorise (libm calls do not without -ffast-math);
// float64 uses libm (it exists for gradcheck, not speed).
#include "registry.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#ifdef TINYLEARN_OPENMP
#include <omp.h>
#endif

namespace py = pybind11;

namespace {

template <typename T>
using carr = py::array_t<T, py::array::c_style>;

// Below this many elements a row-wise kernel runs on one thread: waking the OpenMP team costs more than it saves.
constexpr ssize_t kParallelMin = 1 << 15;

inline int n_threads() {
#ifdef TINYLEARN_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
inline int thread_id() {
#ifdef TINYLEARN_OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// ---- vectorisable math -----------------------------------------------------------------------------------
// exp(x) = 2^n e^r with n = round(x log2 e), r = x - n ln 2 (Cody-Waite split), e^r by the cephes expf
// polynomial (~1 ulp on [-ln2/2, ln2/2]); out of range -> 0 / inf, NaN -> NaN. Branch-free so loops vectorise.
inline float exp_approx(float x) {
  const float lo = -87.33654475f, hi = 88.37626266f;
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  // round to nearest by the 1.5 * 2^23 trick (std::floor becomes a libm call that blocks vectorisation)
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof(scale));
  float y = p * scale;
  y = x < lo ? 0.0f : y;
  y = x > hi ? std::numeric_limits<float>::infinity() : y;
  return x != x ? x : y;
}
inline double exp_approx(double x) { return std::exp(x); }

// erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, below fp32 resolution of 1 + erf).
inline float erf_approx(float x) {
  const float ax = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.3275911f * ax);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const float y = 1.0f - p * t * exp_approx(-ax * ax);
  return x < 0 ? -y : y;
}
inline double erf_approx(double x) { return std::erf(x); }

// tanh(y) = 1 - 2 / (e^{2y} + 1): exact limits +-1, absolute error ~1e-7 near 0 (GELU multiplies by u/2).
inline float tanh_approx(float y) { return 1.0f - 2.0f / (exp_approx(2.0f * y) + 1.0f); }
inline double tanh_approx(double y) { return std::tanh(y); }

template <typename T>
inline T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}
template <typename T>
inline T nan_v() {
  return std::numeric_limits<T>::quiet_NaN();
}

// ---- argument checks ---------------------------------------------------------------------------------------
template <typename T>
void need_ndim(const carr<T>& a, int nd, const char* fn, const char* name) {
  if (a.ndim() != nd)
    tl::value_error(std::string(fn) + ": " + name + " must be " + std::to_string(nd) + "-D, got ndim " +
                    std::to_string(a.ndim()));
}
std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}
void need_same(const py::array& a, const py::array& b, const char* fn, const char* na, const char* nb) {
  bool ok = a.ndim() == b.ndim();
  for (ssize_t i = 0; ok && i < a.ndim(); ++i) ok = a.shape(i) == b.shape(i);
  if (!ok)
    tl::value_error(std::string(fn) + ": " + na + " shape " + shape_str(a) + " does not match " + nb + " shape " +
                    shape_str(b));
}

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
    tl::value_error("layer_norm_backward: mean/rstd shapes " + shape_str(mean) + "/" + shape_str(rstd) +
                    " must be (" + std::to_string(R) + ",)");
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

// ---- flash attention -----------------------------------------------------------------------------------------
struct AttnDims {
  ssize_t BH, Nq, Nk, D, Dv;
};

template <typename T>
AttnDims check_attn(const carr<T>& q, const carr<T>& k, const carr<T>& v, const char* fn) {
  need_ndim(q, 3, fn, "q");
  need_ndim(k, 3, fn, "k");
  need_ndim(v, 3, fn, "v");
  if (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0) || k.shape(2) != q.shape(2) || v.shape(1) != k.shape(1))
    tl::value_error(std::string(fn) + ": incompatible shapes q " + shape_str(q) + ", k " + shape_str(k) + ", v " +
                    shape_str(v) + " (need q [BH,Nq,D], k [BH,Nk,D], v [BH,Nk,Dv])");
  if (k.shape(1) < 1) tl::value_error(std::string(fn) + ": k must have at least one key, got shape " + shape_str(k));
  return {q.shape(0), q.shape(1), k.shape(1), q.shape(2), v.shape(2)};
}

// Register-blocked micro-kernels: a 4-row x 32-column block of the output lives in local arrays the compiler keeps
// in vector registers across the whole k loop (each loaded vector of the streamed operand feeds 4 FMAs).
constexpr int kMR = 4, kNR = 32;

// C[i][c] (+)= sum_k A[i][k] * B[k][c] for i < M, c < N, k < Kd; row strides lda, ldb, ldc. accumulate=false
// overwrites C. Tails (M % 4, N % 32) take the plain loops.
template <typename T>
void small_gemm(const T* A, ssize_t lda, const T* B, ssize_t ldb, T* C, ssize_t ldc, ssize_t M, ssize_t N,
                ssize_t Kd, bool accumulate) {
  ssize_t i = 0;
  for (; i + kMR <= M; i += kMR) {
    ssize_t c0 = 0;
    for (; c0 + kNR <= N; c0 += kNR) {
      T acc[kMR][kNR];
      for (int r = 0; r < kMR; ++r)
        for (int w = 0; w < kNR; ++w) acc[r][w] = accumulate ? C[(i + r) * ldc + c0 + w] : T(0);
      for (ssize_t k = 0; k < Kd; ++k) {
        const T* b = B + k * ldb + c0;
        const T a0 = A[i * lda + k], a1 = A[(i + 1) * lda + k], a2 = A[(i + 2) * lda + k], a3 = A[(i + 3) * lda + k];
#pragma omp simd
        for (int w = 0; w < kNR; ++w) {
          acc[0][w] += a0 * b[w];
          acc[1][w] += a1 * b[w];
          acc[2][w] += a2 * b[w];
          acc[3][w] += a3 * b[w];
        }
      }
      for (int r = 0; r < kMR; ++r)
        for (int w = 0; w < kNR; ++w) C[(i + r) * ldc + c0 + w] = acc[r][w];
    }
    for (ssize_t r = i; r < i + kMR; ++r)
      for (ssize_t c = c0; c < N; ++c) {
        T sum = accumulate ? C[r * ldc + c] : T(0);
        for (ssize_t k = 0; k < Kd; ++k) sum += A[r * lda + k] * B[k * ldb + c];
        C[r * ldc + c] = sum;
      }
  }
  for (; i < M; ++i) {
    T* ci = C + i * ldc;
    if (!accumulate)
      for (ssize_t c = 0; c < N; ++c) ci[c] = 0;
    for (ssize_t k = 0; k < Kd; ++k) {
      const T a = A[i * lda + k];
      const T* b = B + k * ldb;
#pragma omp simd
      for (ssize_t c = 0; c < N; ++c) ci[c] += a * b[c];
    }
  }
}

// S[i][j] = scale * q_i . k_j for a Br x Bc tile; masked entries (causal: j > i) get -inf.
// The K tile is first transposed into kt [D][Bc] so that S = Q_tile kt is a small GEMM with unit-stride rows.
template <typename T>
void score_tile(const T* q, const T* k, T* S, T* kt, ssize_t i0, ssize_t br, ssize_t j0, ssize_t bc, ssize_t D,
                T scale, bool causal, ssize_t Bc) {
  for (ssize_t j = 0; j < bc; ++j)
    for (ssize_t d = 0; d < D; ++d) kt[d * Bc + j] = k[(j0 + j) * D + d];
  small_gemm(q + i0 * D, D, kt, Bc, S, Bc, br, bc, D, false);
  for (ssize_t i = 0; i < br; ++i) {
    T* si = S + i * Bc;
    const ssize_t lim = causal ? i0 + i - j0 : bc;  // keys j0 + j with j > lim are masked
#pragma omp simd
    for (ssize_t j = 0; j < bc; ++j) si[j] = j > lim ? neg_inf<T>() : si[j] * scale;
  }
}

template <typename T>
py::tuple flash_attention_forward(carr<T> q, carr<T> k, carr<T> v, bool causal, ssize_t block) {
  const AttnDims a = check_attn(q, k, v, "flash_attention_forward");
  if (block < 1) tl::value_error("flash_attention_forward: block_size must be >= 1, got " + std::to_string(block));
  const ssize_t BH = a.BH, Nq = a.Nq, Nk = a.Nk, D = a.D, Dv = a.Dv;
  carr<T> o({BH, Nq, Dv});
  carr<T> lse({BH, Nq});
  const T *pq = q.data(), *pk = k.data(), *pv = v.data();
  T *po = o.mutable_data(), *pl = lse.mutable_data();
  const T scale = T(1) / std::sqrt(T(D));
  const ssize_t nqb = (Nq + block - 1) / block;
  {
    py::gil_scoped_release release;
#pragma omp parallel
    {
      std::vector<T> S(block * block), m(block), l(block), acc(block * Dv), kt(block * D);
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (ssize_t bh = 0; bh < BH; ++bh) {
        for (ssize_t qb = 0; qb < nqb; ++qb) {
          const T* qh = pq + bh * Nq * D;
          const T* kh = pk + bh * Nk * D;
          const T* vh = pv + bh * Nk * Dv;
          const ssize_t i0 = qb * block, br = std::min(block, Nq - i0);
          std::fill(m.begin(), m.end(), neg_inf<T>());
          std::fill(l.begin(), l.end(), T(0));
          std::fill(acc.begin(), acc.end(), T(0));
          for (ssize_t j0 = 0; j0 < Nk; j0 += block) {
            if (causal && j0 > i0 + br - 1) break;  // every later key is masked for this whole query block
            const ssize_t bc = std::min(block, Nk - j0);
            score_tile(qh, kh, S.data(), kt.data(), i0, br, j0, bc, D, scale, causal, block);
            for (ssize_t i = 0; i < br; ++i) {
              T* Si = S.data() + i * block;
              T mx = m[i];
#pragma omp simd reduction(max : mx)
              for (ssize_t j = 0; j < bc; ++j) mx = Si[j] > mx ? Si[j] : mx;
              if (mx == neg_inf<T>()) {  // the whole tile row is masked: P = 0, state unchanged
                for (ssize_t j = 0; j < bc; ++j) Si[j] = 0;
                continue;
              }
              const T alpha = m[i] == neg_inf<T>() ? T(0) : exp_approx(m[i] - mx);
              T s = 0;
#pragma omp simd reduction(+ : s)
              for (ssize_t j = 0; j < bc; ++j) {
                const T p = exp_approx(Si[j] - mx);  // exp(-inf) = 0 for masked keys
                Si[j] = p;
                s += p;
              }
              l[i] = l[i] * alpha + s;
              m[i] = mx;
              T* ai = acc.data() + i * Dv;
#pragma omp simd
              for (ssize_t d = 0; d < Dv; ++d) ai[d] *= alpha;
            }
            // acc += P V_tile: one register-blocked GEMM for the whole tile
            small_gemm(S.data(), block, vh + j0 * Dv, Dv, acc.data(), Dv, br, Dv, bc, true);
          }
          for (ssize_t i = 0; i < br; ++i) {
            T* oi = po + (bh * Nq + i0 + i) * Dv;
            const T inv = l[i] > 0 ? T(1) / l[i] : nan_v<T>();  // l == 0 only for a fully masked row
            for (ssize_t d = 0; d < Dv; ++d) oi[d] = acc[i * Dv + d] * inv;
            pl[bh * Nq + i0 + i] = l[i] > 0 ? m[i] + std::log(l[i]) : neg_inf<T>();
          }
        }
      }
    }
  }
  return py::make_tuple(o, lse);
}

template <typename T>
py::tuple flash_attention_backward(carr<T> q, carr<T> k, carr<T> v, carr<T> o, carr<T> lse, carr<T> dout,
                                   bool causal, ssize_t block) {
  const AttnDims a = check_attn(q, k, v, "flash_attention_backward");
  if (block < 1) tl::value_error("flash_attention_backward: block_size must be >= 1, got " + std::to_string(block));
  const ssize_t BH = a.BH, Nq = a.Nq, Nk = a.Nk, D = a.D, Dv = a.Dv;
  need_same(dout, o, "flash_attention_backward", "dout", "o");
  if (o.ndim() != 3 || o.shape(0) != BH || o.shape(1) != Nq || o.shape(2) != Dv)
    tl::value_error("flash_attention_backward: o shape " + shape_str(o) + " does not match q/v");
  if (lse.ndim() != 2 || lse.shape(0) != BH || lse.shape(1) != Nq)
    tl::value_error("flash_attention_backward: lse shape " + shape_str(lse) + " must be (BH, Nq)");
  carr<T> dq({BH, Nq, D}), dk({BH, Nk, D}), dv({BH, Nk, Dv});
  const T *pq = q.data(), *pk = k.data(), *pv = v.data(), *po = o.data(), *pl = lse.data(), *pg = dout.data();
  T *pdq = dq.mutable_data(), *pdk = dk.mutable_data(), *pdv = dv.mutable_data();
  const T scale = T(1) / std::sqrt(T(D));
  const ssize_t nqb = (Nq + block - 1) / block, nkb = (Nk + block - 1) / block;
  {
    py::gil_scoped_release release;
    std::vector<T> Dsum(BH * Nq);  // D_i = dO_i . O_i
#pragma omp parallel for schedule(static)
    for (ssize_t r = 0; r < BH * Nq; ++r) {
      T s = 0;
      for (ssize_t d = 0; d < Dv; ++d) s += pg[r * Dv + d] * po[r * Dv + d];
      Dsum[r] = s;
    }
    // P_ij and dS_ij = P_ij (dO_i . V_j - D_i) for one (query block, key block) tile, into P and dS
    auto tile = [&](ssize_t bh, ssize_t i0, ssize_t br, ssize_t j0, ssize_t bc, T* P, T* dS, T* kt) {
      const T* qh = pq + bh * Nq * D;
      const T* kh = pk + bh * Nk * D;
      const T* vh = pv + bh * Nk * Dv;
      score_tile(qh, kh, P, kt, i0, br, j0, bc, D, scale, causal, block);
      for (ssize_t i = 0; i < br; ++i) {
        const T li = pl[bh * Nq + i0 + i];
        const T Di = Dsum[bh * Nq + i0 + i];
        const T* gi = pg + (bh * Nq + i0 + i) * Dv;
        for (ssize_t j = 0; j < bc; ++j) {
          const T p = li == neg_inf<T>() ? T(0) : exp_approx(P[i * block + j] - li);
          P[i * block + j] = p;
          if (p == T(0)) {
            dS[i * block + j] = 0;
            continue;
          }
          const T* vj = vh + (j0 + j) * Dv;
          T dp = 0;
#pragma omp simd reduction(+ : dp)
          for (ssize_t d = 0; d < Dv; ++d) dp += gi[d] * vj[d];
          dS[i * block + j] = p * (dp - Di);
        }
      }
    };
    // pass A: dK_j = scale sum_i dS_ij q_i, dV_j = sum_i P_ij dO_i   (each key block owned by one thread)
#pragma omp parallel
    {
      std::vector<T> P(block * block), dS(block * block), kt(block * D);
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (ssize_t bh = 0; bh < BH; ++bh) {
        for (ssize_t kb = 0; kb < nkb; ++kb) {
          const ssize_t j0 = kb * block, bc = std::min(block, Nk - j0);
          T* dkh = pdk + (bh * Nk + j0) * D;
          T* dvh = pdv + (bh * Nk + j0) * Dv;
          std::fill(dkh, dkh + bc * D, T(0));
          std::fill(dvh, dvh + bc * Dv, T(0));
          for (ssize_t i0 = causal ? (j0 / block) * block : 0; i0 < Nq; i0 += block) {
            const ssize_t br = std::min(block, Nq - i0);
            if (causal && j0 > i0 + br - 1) continue;
            tile(bh, i0, br, j0, bc, P.data(), dS.data(), kt.data());
            for (ssize_t i = 0; i < br; ++i) {
              const T* qi = pq + (bh * Nq + i0 + i) * D;
              const T* gi = pg + (bh * Nq + i0 + i) * Dv;
              for (ssize_t j = 0; j < bc; ++j) {
                const T p = P[i * block + j], ds = dS[i * block + j] * scale;
                if (p == T(0)) continue;
                T* dkj = dkh + j * D;
                T* dvj = dvh + j * Dv;
#pragma omp simd
                for (ssize_t d = 0; d < D; ++d) dkj[d] += ds * qi[d];
#pragma omp simd
                for (ssize_t d = 0; d < Dv; ++d) dvj[d] += p * gi[d];
              }
            }
          }
        }
      }
    }
    // pass B: dQ_i = scale sum_j dS_ij k_j   (each query block owned by one thread)
#pragma omp parallel
    {
      std::vector<T> P(block * block), dS(block * block), kt(block * D);
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (ssize_t bh = 0; bh < BH; ++bh) {
        for (ssize_t qb = 0; qb < nqb; ++qb) {
          const ssize_t i0 = qb * block, br = std::min(block, Nq - i0);
          T* dqh = pdq + (bh * Nq + i0) * D;
          std::fill(dqh, dqh + br * D, T(0));
          for (ssize_t j0 = 0; j0 < Nk; j0 += block) {
            if (causal && j0 > i0 + br - 1) break;
            const ssize_t bc = std::min(block, Nk - j0);
            tile(bh, i0, br, j0, bc, P.data(), dS.data(), kt.data());
            for (ssize_t i = 0; i < br; ++i) {
              T* dqi = dqh + i * D;
              for (ssize_t j = 0; j < bc; ++j) {
                const T ds = dS[i * block + j] * scale;
                if (ds == T(0)) continue;
                const T* kj = pk + (bh * Nk + j0 + j) * D;
#pragma omp simd
                for (ssize_t d = 0; d < D; ++d) dqi[d] += ds * kj[d];
              }
            }
          }
        }
      }
    }
  }
  return py::make_tuple(dq, dk, dv);
}

template <typename T>
void def_all(py::module_& m) {
  m.def("softmax_forward", &softmax_forward<T>, py::arg("x"), py::arg("version") = "three_pass");
  m.def("softmax_backward", &softmax_backward<T>, py::arg("y"), py::arg("dy"));
  m.def("layer_norm_forward", &layer_norm_forward<T>, py::arg("x"), py::arg("weight"), py::arg("bias"),
        py::arg("eps") = 1e-5, py::arg("version") = "two_pass");
  m.def("layer_norm_backward", &layer_norm_backward<T>, py::arg("dy"), py::arg("x"), py::arg("weight"),
        py::arg("mean"), py::arg("rstd"));
  m.def("bias_gelu_forward", &bias_gelu_forward<T>, py::arg("x"), py::arg("bias"), py::arg("tanh_form") = false);
  m.def("bias_gelu_backward", &bias_gelu_backward<T>, py::arg("dy"), py::arg("x"), py::arg("bias"),
        py::arg("tanh_form") = false);
  m.def("flash_attention_forward", &flash_attention_forward<T>, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("causal") = false, py::arg("block_size") = 64);
  m.def("flash_attention_backward", &flash_attention_backward<T>, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("o"), py::arg("lse"), py::arg("dout"), py::arg("causal") = false, py::arg("block_size") = 64);
}

}  // namespace

TL_REGISTER(kernels) {
  m.doc() = "fused CPU kernels (float32 / float64, C-contiguous): softmax, layer_norm, bias_gelu, flash_attention";
  def_all<float>(m);
  def_all<double>(m);
  m.def("exp_approx", [](carr<float> x) {
    carr<float> y(x.size());
    const float* px = x.data();
    float* py = y.mutable_data();
    for (ssize_t i = 0; i < x.size(); ++i) py[i] = exp_approx(px[i]);
    return y;
  }, py::arg("x"), "the vectorisable float32 exp used by the kernels (for accuracy tests)");
  m.def("erf_approx", [](carr<float> x) {
    carr<float> y(x.size());
    const float* px = x.data();
    float* py = y.mutable_data();
    for (ssize_t i = 0; i < x.size(); ++i) py[i] = erf_approx(px[i]);
    return y;
  }, py::arg("x"), "the vectorisable float32 erf used by the kernels (for accuracy tests)");
}
