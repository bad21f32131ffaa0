// kernels_layernorm.cpp — fused CPU LayerNorm behind tinylearn.kernels(backend="cpp"). OpenMP over rows,
// `#pragma omp simd` inner loops, one pass
// over memory where the row fits in cache. Works on C-contiguous float32 or float64 arrays that the Python
// dispatcher (tinylearn/kernels/cpu.py) has already reshaped to [rows, cols] (or [batch*heads, seq, dim] for
// attention). Part of _C.kernels (several files register into it, see registry.h); shared math in kernels_math.h.
//
// Versions (llm.c dev/cuda style; each is checked against the numpy reference in tests/test_kernels_cpu.py):
//   layer_norm_forward v1 two_pass  mean pass, centred sum-of-squares pass (exact two-pass variance), write pass
//                      v2 welford   lane-wise Welford (mean, M2) merged with Chan's formula, then write pass
//                      v3 simd      one pass for the statistics with shifted sums (K = x[0]: S1 = sum(x - K),
//                                   S2 = sum((x - K)^2), var = S2/C - (S1/C)^2), the float32 row converted to float64
//                                   lanes (AVX-512 / AVX2 / scalar by tl::cpu_has) so the subtraction is exact and
//                                   the cancellation harmless; then the write pass y = ((x - mean) rstd) w + b with
//                                   FMA. One thread. The scalar path emulates the 8 lanes: scalar and avx2 agree bit
//                                   for bit (AVX-512: to rounding of the sums)
//                      v4 simd_omp  v3 + OpenMP over rows, threads_for(R*C, grain) threads (small inputs: one thread);
//                                   v3/v4 write an output above 4 MiB with non-temporal stores (common.h
//                                   stream_output: no read-for-ownership of y, x stays in cache; 1024x4096 fp32,
//                                   1 thread, loaded box: 2.1 -> 1.4 ms AVX-512, 2.4 -> 1.4 ms AVX2)
//                      float64 runs v1's code for v3/v4
//   layer_norm_backward            dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w;
//                                  dw = sum_rows dy * xhat, db = sum_rows dy (per-thread partials, then reduced)
#include <type_traits>

#include "kernels_math.h"

namespace py = pybind11;

namespace {
using namespace tl;
using namespace tl::kern;
namespace vm = tl::vm;

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

// ---- float32 v3/v4 rows ---------------------------------------------------------------------------------------
// statistics from 8 lanes of (S1, S2) partial sums (lane = c % 8): shared by every path
inline void ln_finish(const double* s1, const double* s2, double K, ssize_t C, double eps, float& mean, float& rstd) {
  const double m1 = reduce8(s1) / double(C);
  double var = reduce8(s2) / double(C) - m1 * m1;
  var = var > 0 ? var : 0;
  mean = static_cast<float>(K + m1);
  rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
}
inline void ln_tail(const float* x, ssize_t c0, ssize_t C, double K, double* s1, double* s2) {
  for (ssize_t c = c0; c < C; ++c) {
    const double d = double(x[c]) - K;
    s1[c & 7] += d;
    s2[c & 7] = std::fma(d, d, s2[c & 7]);
  }
}

void ln_row_scalar(const float* x, const float* w, const float* b, float* y, ssize_t C, double eps, float& mean,
                   float& rstd, bool /*stream*/) {
  const double K = x[0];
  double s1[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  ln_tail(x, 0, C, K, s1, s2);
  ln_finish(s1, s2, K, C, eps, mean, rstd);
  const float mu = mean, rs = rstd;
  for (ssize_t c = 0; c < C; ++c) y[c] = std::fma((x[c] - mu) * rs, w[c], b[c]);
}

// One 8-float step of the AVX2 statistics: x[c..c+8) - K in double, its sum into (s_lo, s_hi) and squares into
// (q_lo, q_hi) (lanes 0-3: elements c..c+3, lanes 4-7: c+4..c+7)
struct LnAcc8 {
  __m256d s_lo, s_hi, q_lo, q_hi;
};
TL_AVX2 inline void ln_acc8(LnAcc8& a, const float* x, __m256d Kv) {
  const __m256 v = _mm256_loadu_ps(x);
  const __m256d lo = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), Kv);
  const __m256d hi = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), Kv);
  a.s_lo = _mm256_add_pd(a.s_lo, lo);
  a.s_hi = _mm256_add_pd(a.s_hi, hi);
  a.q_lo = _mm256_fmadd_pd(lo, lo, a.q_lo);
  a.q_hi = _mm256_fmadd_pd(hi, hi, a.q_hi);
}

TL_AVX2 void ln_row_avx2(const float* x, const float* w, const float* b, float* y, ssize_t C, double eps,
                         float& mean, float& rstd, bool stream) {
  const double K = x[0];
  const __m256d Kv = _mm256_set1_pd(K), z = _mm256_setzero_pd();
  // 16 per step into two sets of accumulators: 8 add/FMA chains instead of 4 (the add latency, 3-4 cycles, held one
  // 8-float step to ~2 floats per cycle, under the L2/L3 read rate); element c + 8 + l belongs to lane l as well
  LnAcc8 a{z, z, z, z}, e{z, z, z, z};
  ssize_t c = 0;
  for (; c + 16 <= C; c += 16) {
    ln_acc8(a, x + c, Kv);
    ln_acc8(e, x + c + 8, Kv);
  }
  for (; c + 8 <= C; c += 8) ln_acc8(a, x + c, Kv);
  const __m256d a1 = _mm256_add_pd(a.s_lo, e.s_lo), b1 = _mm256_add_pd(a.s_hi, e.s_hi);
  const __m256d a2 = _mm256_add_pd(a.q_lo, e.q_lo), b2 = _mm256_add_pd(a.q_hi, e.q_hi);
  alignas(32) double s1[8], s2[8];
  _mm256_store_pd(s1, a1);
  _mm256_store_pd(s1 + 4, b1);
  _mm256_store_pd(s2, a2);
  _mm256_store_pd(s2 + 4, b2);
  ln_tail(x, c, C, K, s1, s2);
  ln_finish(s1, s2, K, C, eps, mean, rstd);
  const __m256 mu = _mm256_set1_ps(mean), rs = _mm256_set1_ps(rstd);
  c = 0;
  if (stream) {  // scalar head up to a 32-byte boundary of y, then non-temporal stores
    for (const ssize_t h = std::min(C, head_to(y, 32)); c < h; ++c) y[c] = std::fma((x[c] - mean) * rstd, w[c], b[c]);
    for (; c + 8 <= C; c += 8) {
      const __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mu), rs);
      _mm256_stream_ps(y + c, _mm256_fmadd_ps(xh, _mm256_loadu_ps(w + c), _mm256_loadu_ps(b + c)));
    }
  }
  for (; c + 8 <= C; c += 8) {
    const __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mu), rs);
    _mm256_storeu_ps(y + c, _mm256_fmadd_ps(xh, _mm256_loadu_ps(w + c), _mm256_loadu_ps(b + c)));
  }
  for (; c < C; ++c) y[c] = std::fma((x[c] - mean) * rstd, w[c], b[c]);
}

TL_AVX512 void ln_row_avx512(const float* x, const float* w, const float* b, float* y, ssize_t C, double eps,
                             float& mean, float& rstd, bool stream) {
  const double K = x[0];
  const __m512d Kv = _mm512_set1_pd(K);
  __m512d a1 = _mm512_setzero_pd(), b1 = _mm512_setzero_pd(), a2 = _mm512_setzero_pd(), b2 = _mm512_setzero_pd();
  ssize_t c = 0;
  for (; c + 16 <= C; c += 16) {
    const __m512d lo = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + c)), Kv);
    const __m512d hi = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + c + 8)), Kv);
    a1 = _mm512_add_pd(a1, lo);
    b1 = _mm512_add_pd(b1, hi);
    a2 = _mm512_fmadd_pd(lo, lo, a2);
    b2 = _mm512_fmadd_pd(hi, hi, b2);
  }
  alignas(64) double s1[8], s2[8], t1[8], t2[8];
  _mm512_store_pd(s1, a1);
  _mm512_store_pd(t1, b1);
  _mm512_store_pd(s2, a2);
  _mm512_store_pd(t2, b2);
  for (int l = 0; l < 8; ++l) s1[l] += t1[l], s2[l] += t2[l];  // element c+8+l belongs to lane l as well
  ln_tail(x, c, C, K, s1, s2);
  ln_finish(s1, s2, K, C, eps, mean, rstd);
  const __m512 mu = _mm512_set1_ps(mean), rs = _mm512_set1_ps(rstd);
  c = 0;
  if (stream) {
    for (const ssize_t h = std::min(C, head_to(y, 64)); c < h; ++c) y[c] = std::fma((x[c] - mean) * rstd, w[c], b[c]);
    for (; c + 16 <= C; c += 16) {
      const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + c), mu), rs);
      _mm512_stream_ps(y + c, _mm512_fmadd_ps(xh, _mm512_loadu_ps(w + c), _mm512_loadu_ps(b + c)));
    }
  }
  for (; c + 16 <= C; c += 16) {
    const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + c), mu), rs);
    _mm512_storeu_ps(y + c, _mm512_fmadd_ps(xh, _mm512_loadu_ps(w + c), _mm512_loadu_ps(b + c)));
  }
  for (; c < C; ++c) y[c] = std::fma((x[c] - mean) * rstd, w[c], b[c]);
}

using LnRowFn = void (*)(const float*, const float*, const float*, float*, ssize_t, double, float&, float&, bool);
LnRowFn pick_ln_row(vm::Isa isa) {
  return isa == vm::Isa::avx512 ? ln_row_avx512 : isa == vm::Isa::avx2 ? ln_row_avx2 : ln_row_scalar;
}

template <typename T>
py::tuple layer_norm_forward(carr<T> x, carr<T> w, carr<T> b, double eps, const std::string& version, ssize_t grain) {
  need_ndim(x, 2, "layer_norm_forward", "x");
  need_ndim(w, 1, "layer_norm_forward", "weight");
  need_ndim(b, 1, "layer_norm_forward", "bias");
  const ssize_t R = x.shape(0), C = x.shape(1);
  if (w.shape(0) != C || b.shape(0) != C)
    tl::value_error("layer_norm_forward: weight/bias length " + std::to_string(w.shape(0)) + "/" +
                    std::to_string(b.shape(0)) + " must equal the normalised size " + std::to_string(C));
  const bool v_simd = version == "simd" || version == "simd_omp";
  if (version != "two_pass" && version != "welford" && !v_simd)
    tl::value_error("layer_norm_forward: version must be 'two_pass', 'welford', 'simd' or 'simd_omp', got '" +
                    version + "'");
  if (!(eps >= 0)) tl::value_error("layer_norm_forward: eps must be >= 0, got " + std::to_string(eps));
  if (grain < 0)
    tl::value_error("layer_norm_forward: grain must be >= 0 (0 = the default), got " + std::to_string(grain));
  const bool welford = version == "welford";
  carr<T> y({R, C});
  carr<T> mean(R), rstd(R);
  const T *px = x.data(), *pw = w.data(), *pb = b.data();
  T *py = y.mutable_data(), *pm = mean.mutable_data(), *pr = rstd.mutable_data();
  if (v_simd && std::is_same<T, float>::value && C > 0) {
    const LnRowFn row = pick_ln_row(vm::best_isa());
    const int nt = version == "simd" ? 1 : threads_for(R * C, grain);
    const float *fx = reinterpret_cast<const float*>(px), *fw = reinterpret_cast<const float*>(pw),
                *fb = reinterpret_cast<const float*>(pb);
    float *fy = reinterpret_cast<float*>(py), *fm = reinterpret_cast<float*>(pm), *fr = reinterpret_cast<float*>(pr);
    {
      py::gil_scoped_release release;
      const bool stream = stream_output(R * C * ssize_t(sizeof(float)));
#pragma omp parallel num_threads(nt) if (nt > 1)
      {
#pragma omp for schedule(static)
        for (ssize_t r = 0; r < R; ++r) row(fx + r * C, fw, fb, fy + r * C, C, eps, fm[r], fr[r], stream);
        if (stream) _mm_sfence();  // order this thread's non-temporal stores before the region ends
      }
    }
    return py::make_tuple(y, mean, rstd);
  }
  {
    py::gil_scoped_release release;
#pragma omp parallel for schedule(static) if (R * C > kParallelMin && version != "simd")
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
        py::arg("eps") = 1e-5, py::arg("version") = "two_pass", py::arg("grain") = 0,
        "versions: two_pass, welford, simd, simd_omp (see cpp_src/kernels_layernorm.cpp); grain: elements per "
        "thread at least for simd_omp (0 = kGrain)");
  m.def("layer_norm_backward", &layer_norm_backward<T>, py::arg("dy"), py::arg("x"), py::arg("weight"), py::arg("mean"),
        py::arg("rstd"));
}

}  // namespace

TL_REGISTER(kernels) {
  def_layernorm<float>(m);
  def_layernorm<double>(m);
  m.def(
      "stream_output", [](int64_t nbytes) { return tl::stream_output(nbytes); }, py::arg("nbytes"),
      "whether the simd_omp LayerNorm / bias+GELU rungs write an output of nbytes with non-temporal stores "
      "(above 4 MiB; TINYLEARN_STREAM_MIN_BYTES overrides, see cpp_src/common.h)");
}
