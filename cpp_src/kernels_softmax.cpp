// kernels_softmax.cpp — fused CPU softmax and log_softmax behind tinylearn.kernels(backend="cpp"). OpenMP over rows,
// `#pragma omp simd` inner loops, one pass
// over memory where the row fits in cache. Works on C-contiguous float32 or float64 arrays that the Python
// dispatcher (tinylearn/kernels/cpu.py) has already reshaped to [rows, cols] (or [batch*heads, seq, dim] for
// attention). Part of _C.kernels (several files register into it, see registry.h); shared math in kernels_math.h.
// Why one file (> 500 lines): softmax and log_softmax are one row algorithm (max, sum of exp, write) whose scalar,
// AVX2 and AVX-512 copies follow the same 8-lane summation rule (reduce8) so that scalar and AVX2 agree bit for bit;
// the two ops' copies are checked against each other by reading them side by side.
//
// Versions (llm.c dev/cuda style; each is checked against the numpy reference in tests/test_kernels_cpu.py):
//   softmax_forward  v1 three_pass  max pass, exp+sum pass (writes e^(x-m) to y), scale pass: 1 read of x from
//                                   memory, the later passes hit L1/L2 (a row of 4096 fp32 is 16 KiB)
//                    v2 online      lane-wise online max/sum (Milakov & Gimelshein 2018): m' = max(m, x),
//                                   d' = d e^(m-m') + e^(x-m'); then one write pass. 2 exps per element in pass 1
//                    v3 simd        three passes like v1 with the explicit vector exp of vec_math.h (AVX-512 / AVX2 /
//                                   scalar by tl::cpu_has), 1 exp per element, lane-wise sums, one thread
//                    v4 simd_omp    v3 + OpenMP over rows, threads_for(R*C, grain) threads (grain = kGrain
//                                   elements each at least unless the caller passes one: small inputs stay on the
//                                   calling thread; topic 17 tunes grain)
//                    v5 online_simd one read for the statistics: per 8-lane block of 4 vectors, block max m', rescale
//                                   d by e^(m-m') once per block, add e^(x-m'); then the write pass e^(x-M)/D.
//                                   2.25 exps per element, threaded like v4: it saves a read of the row, which only
//                                   pays when the row does not fit in cache
//                    float64 runs v1's code for v3/v4/v5 (float64 exists for gradcheck, not speed); the scalar
//                    path of v3-v5 emulates the 8 lanes so that TINYLEARN_CPU_FEATURES=scalar and avx2 agree bit for
//                    bit (AVX-512 folds 16 lanes into 8 first: equal to rounding)
//   softmax_backward               dx = y * (dy - sum(dy * y))
//   log_softmax_forward  (one version; tl.nn.functional.log_softmax / cross_entropy run it for float32/float64 through
//                        tinylearn.kernels' registry, checked against torch.log_softmax in
//                        tests/kernels/test_log_softmax.py) per row: m = max x, s = sum e^(x-m) (lane-wise, nothing
//                        stored), y = (x - m) - log s (two subtractions: exact x - m for large magnitudes). Three
//                        passes over a row that stays in L1/L2, no temporary besides y. float32 on vec_math.h's exp
//                        (AVX-512 / AVX2 / scalar by tl::vm::best_isa(), so TINYLEARN_CPU_FEATURES forces a path; the
//                        scalar path emulates AVX2's 8 lanes: bit-identical), float64 on std::exp. No special case:
//                        a fully -inf row gives x - m = NaN, hence a NaN row, and a -inf entry gives -inf, as torch.
//                        OpenMP over rows with threads_for(R*C) threads (a row is one thread's: any count, same bits).
//   log_softmax_backward dx = dy - e^y sum(dy): one pass for sum(dy) (8 lanes), one for dx (one exp + one FMA)
//                        [256, 1000] fp32, one thread, AVX-512 (2-core dev box, best of 7): kernel forward 0.12 ms,
//                        backward 0.12 ms; tl.nn.functional.log_softmax fwd+bwd 0.73 ms (numpy: 4 + 4 passes) ->
//                        0.43-0.46 ms, torch 0.37-0.39 ms (1.15x; cross_entropy 1.26x -> 1.16-1.18x); AVX2 forced on
//                        both (TINYLEARN_CPU_FEATURES, ATEN_CPU_CAPABILITY): 0.51 ms, torch 0.53 ms.
#include <type_traits>

#include "kernels_math.h"
#include "softmax_rows.h"

namespace py = pybind11;

namespace {
using namespace tl;
using namespace tl::kern;
namespace vm = tl::vm;

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

// ---- float32 rows on the vector math of vec_math.h ----------------------------------------------------------
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kLowest = -std::numeric_limits<float>::max();

inline void nan_row(float* y, ssize_t C) {
  for (ssize_t c = 0; c < C; ++c) y[c] = nan_v<float>();
}

// v3, scalar path: 8 emulated lanes (lane = c % 8), the same operations as the AVX2 path
void softmax_row_simd_scalar(const float* x, float* y, ssize_t C) {
  float m = -kInf;
  for (ssize_t c = 0; c < C; ++c) m = x[c] > m ? x[c] : m;
  if (m == -kInf) return nan_row(y, C);  // fully masked row: NaN like torch; a NaN input propagates via the sum
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (ssize_t c = 0; c < C; ++c) {
    const float e = vm::scalar::exp(x[c] - m);
    y[c] = e;
    lanes[c & 7] += e;
  }
  const float inv = 1.0f / reduce8(lanes);
  for (ssize_t c = 0; c < C; ++c) y[c] *= inv;
}

TL_AVX2 void softmax_row_simd_avx2(const float* x, float* y, ssize_t C) {
  __m256 mv = _mm256_set1_ps(-kInf);
  ssize_t c = 0;
  for (; c + 8 <= C; c += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + c));
  float m = vm::avx2::hmax(mv);
  for (; c < C; ++c) m = x[c] > m ? x[c] : m;
  if (m == -kInf) return nan_row(y, C);
  const __m256 mb = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  for (c = 0; c + 8 <= C; c += 8) {
    const __m256 e = vm::avx2::exp(_mm256_sub_ps(_mm256_loadu_ps(x + c), mb));
    _mm256_storeu_ps(y + c, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (; c < C; ++c) {
    const float e = vm::scalar::exp(x[c] - m);
    y[c] = e;
    lanes[c & 7] += e;
  }
  const float inv = 1.0f / reduce8(lanes);
  const __m256 iv = _mm256_set1_ps(inv);
  for (c = 0; c + 8 <= C; c += 8) _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_loadu_ps(y + c), iv));
  for (; c < C; ++c) y[c] *= inv;
}

TL_AVX512 void softmax_row_simd_avx512(const float* x, float* y, ssize_t C) {
  __m512 mv = _mm512_set1_ps(-kInf);
  ssize_t c = 0;
  for (; c + 16 <= C; c += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + c));
  float m = _mm512_reduce_max_ps(mv);
  for (; c < C; ++c) m = x[c] > m ? x[c] : m;
  if (m == -kInf) return nan_row(y, C);
  const __m512 mb = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  for (c = 0; c + 16 <= C; c += 16) {
    const __m512 e = vm::avx512::exp(_mm512_sub_ps(_mm512_loadu_ps(x + c), mb));
    _mm512_storeu_ps(y + c, e);
    acc = _mm512_add_ps(acc, e);
  }
  alignas(64) float l16[16];
  _mm512_store_ps(l16, acc);
  float lanes[8];
  for (int l = 0; l < 8; ++l) lanes[l] = l16[l] + l16[l + 8];
  for (; c < C; ++c) {
    const float e = vm::scalar::exp(x[c] - m);
    y[c] = e;
    lanes[c & 7] += e;
  }
  const float inv = 1.0f / reduce8(lanes);
  const __m512 iv = _mm512_set1_ps(inv);
  for (c = 0; c + 16 <= C; c += 16) _mm512_storeu_ps(y + c, _mm512_mul_ps(_mm512_loadu_ps(y + c), iv));
  for (; c < C; ++c) y[c] *= inv;
}

// v5: lane-wise online statistics. A lane's running max is floored at -FLT_MAX so that a lane that has seen only
// -inf computes e^(-inf - (-FLT_MAX)) = 0 instead of e^(-inf + inf) = NaN; D = 0 then flags a fully masked row.
// Shared by every path: the elements after the last full block (lane c % 8, one at a time) and the merge.
inline void online_tail(const float* x, ssize_t c0, ssize_t C, float* m, float* d) {
  for (ssize_t c = c0; c < C; ++c) {
    const int l = c & 7;
    const float xi = x[c];
    float mn = xi > m[l] ? xi : m[l];
    mn = mn > kLowest ? mn : kLowest;
    d[l] = std::fma(d[l], vm::scalar::exp(m[l] - mn), vm::scalar::exp(xi - mn));
    m[l] = mn;
  }
}
// returns false for a row that must be NaN (fully masked, or a NaN / +inf input made D NaN)
inline bool online_merge(const float* m, const float* d, float& M, float& D) {
  M = kLowest;
  for (int l = 0; l < 8; ++l) M = m[l] > M ? m[l] : M;
  float t[8];
  for (int l = 0; l < 8; ++l) t[l] = d[l] * vm::scalar::exp(m[l] - M);
  D = reduce8(t);
  return D > 0;  // false for 0 and NaN
}

constexpr ssize_t kOnlineBlock = 32;  // 4 vectors of 8 lanes per rescale

void softmax_row_online_scalar(const float* x, float* y, ssize_t C) {
  float m[8], d[8];
  for (int l = 0; l < 8; ++l) m[l] = kLowest, d[l] = 0;
  ssize_t c = 0;
  for (; c + kOnlineBlock <= C; c += kOnlineBlock) {
    for (int l = 0; l < 8; ++l) {
      const float x0 = x[c + l], x1 = x[c + 8 + l], x2 = x[c + 16 + l], x3 = x[c + 24 + l];
      float bm = m[l];
      bm = x0 > bm ? x0 : bm;
      bm = x1 > bm ? x1 : bm;
      bm = x2 > bm ? x2 : bm;
      bm = x3 > bm ? x3 : bm;
      const float e0 = vm::scalar::exp(x0 - bm), e1 = vm::scalar::exp(x1 - bm);
      const float e2 = vm::scalar::exp(x2 - bm), e3 = vm::scalar::exp(x3 - bm);
      d[l] = std::fma(d[l], vm::scalar::exp(m[l] - bm), (e0 + e1) + (e2 + e3));
      m[l] = bm;
    }
  }
  online_tail(x, c, C, m, d);
  float M, D;
  if (!online_merge(m, d, M, D)) return nan_row(y, C);
  const float inv = 1.0f / D;
  for (c = 0; c < C; ++c) y[c] = vm::scalar::exp(x[c] - M) * inv;
}

TL_AVX2 void softmax_row_online_avx2(const float* x, float* y, ssize_t C) {
  __m256 mv = _mm256_set1_ps(kLowest), dv = _mm256_setzero_ps();
  ssize_t c = 0;
  for (; c + kOnlineBlock <= C; c += kOnlineBlock) {
    const __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
    const __m256 x2 = _mm256_loadu_ps(x + c + 16), x3 = _mm256_loadu_ps(x + c + 24);
    // same comparison order as the scalar code: bm = x_k > bm ? x_k : bm  ==  _mm256_max_ps(x_k, bm)
    __m256 bm = _mm256_max_ps(x0, mv);
    bm = _mm256_max_ps(x1, bm);
    bm = _mm256_max_ps(x2, bm);
    bm = _mm256_max_ps(x3, bm);
    const __m256 e0 = vm::avx2::exp(_mm256_sub_ps(x0, bm)), e1 = vm::avx2::exp(_mm256_sub_ps(x1, bm));
    const __m256 e2 = vm::avx2::exp(_mm256_sub_ps(x2, bm)), e3 = vm::avx2::exp(_mm256_sub_ps(x3, bm));
    dv = _mm256_fmadd_ps(dv, vm::avx2::exp(_mm256_sub_ps(mv, bm)), _mm256_add_ps(_mm256_add_ps(e0, e1), _mm256_add_ps(e2, e3)));
    mv = bm;
  }
  alignas(32) float m[8], d[8];
  _mm256_store_ps(m, mv);
  _mm256_store_ps(d, dv);
  online_tail(x, c, C, m, d);
  float M, D;
  if (!online_merge(m, d, M, D)) return nan_row(y, C);
  const float inv = 1.0f / D;
  const __m256 Mv = _mm256_set1_ps(M), iv = _mm256_set1_ps(inv);
  for (c = 0; c + 8 <= C; c += 8)
    _mm256_storeu_ps(y + c, _mm256_mul_ps(vm::avx2::exp(_mm256_sub_ps(_mm256_loadu_ps(x + c), Mv)), iv));
  for (; c < C; ++c) y[c] = vm::scalar::exp(x[c] - M) * inv;
}

TL_AVX512 void softmax_row_online_avx512(const float* x, float* y, ssize_t C) {
  // 16 lanes; blocks of 2 vectors (32 elements) so that the per-block rescale cost matches AVX2's
  __m512 mv = _mm512_set1_ps(kLowest), dv = _mm512_setzero_ps();
  ssize_t c = 0;
  for (; c + kOnlineBlock <= C; c += kOnlineBlock) {
    const __m512 x0 = _mm512_loadu_ps(x + c), x1 = _mm512_loadu_ps(x + c + 16);
    const __m512 bm = _mm512_max_ps(x1, _mm512_max_ps(x0, mv));
    const __m512 e0 = vm::avx512::exp(_mm512_sub_ps(x0, bm)), e1 = vm::avx512::exp(_mm512_sub_ps(x1, bm));
    dv = _mm512_fmadd_ps(dv, vm::avx512::exp(_mm512_sub_ps(mv, bm)), _mm512_add_ps(e0, e1));
    mv = bm;
  }
  alignas(64) float m16[16], d16[16];
  _mm512_store_ps(m16, mv);
  _mm512_store_ps(d16, dv);
  float m[8], d[8];
  for (int l = 0; l < 8; ++l) {  // merge lane l + 8 into lane l
    const float mn = m16[l] > m16[l + 8] ? m16[l] : m16[l + 8];
    d[l] = d16[l] * vm::scalar::exp(m16[l] - mn) + d16[l + 8] * vm::scalar::exp(m16[l + 8] - mn);
    m[l] = mn;
  }
  online_tail(x, c, C, m, d);
  float M, D;
  if (!online_merge(m, d, M, D)) return nan_row(y, C);
  const float inv = 1.0f / D;
  const __m512 Mv = _mm512_set1_ps(M), iv = _mm512_set1_ps(inv);
  for (c = 0; c + 16 <= C; c += 16)
    _mm512_storeu_ps(y + c, _mm512_mul_ps(vm::avx512::exp(_mm512_sub_ps(_mm512_loadu_ps(x + c), Mv)), iv));
  for (; c < C; ++c) y[c] = vm::scalar::exp(x[c] - M) * inv;
}

using RowFn = void (*)(const float*, float*, ssize_t);
RowFn pick_row(bool online, vm::Isa isa) {
  if (isa == vm::Isa::avx512) return online ? softmax_row_online_avx512 : softmax_row_simd_avx512;
  if (isa == vm::Isa::avx2) return online ? softmax_row_online_avx2 : softmax_row_simd_avx2;
  return online ? softmax_row_online_scalar : softmax_row_simd_scalar;
}

const char* const kSoftmaxVersions = "'three_pass', 'online', 'simd', 'simd_omp' or 'online_simd'";

template <typename T>
carr<T> softmax_forward(carr<T> x, const std::string& version, ssize_t grain) {
  need_ndim(x, 2, "softmax_forward", "x");
  if (grain < 0) tl::value_error("softmax_forward: grain must be >= 0 (0 = the default), got " + std::to_string(grain));
  const ssize_t R = x.shape(0), C = x.shape(1);
  const bool v_simd = version == "simd" || version == "simd_omp" || version == "online_simd";
  if (version != "three_pass" && version != "online" && !v_simd)
    tl::value_error("softmax_forward: version must be " + std::string(kSoftmaxVersions) + ", got '" + version + "'");
  const bool online = version == "online";
  carr<T> y({R, C});
  const T* px = x.data();
  T* py = y.mutable_data();
  if (v_simd && std::is_same<T, float>::value) {
    const RowFn row = pick_row(version == "online_simd", vm::best_isa());
    const int nt = version == "simd" ? 1 : threads_for(R * C, grain);
    const float* fx = reinterpret_cast<const float*>(px);
    float* fy = reinterpret_cast<float*>(py);
    {
      py::gil_scoped_release release;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
      for (ssize_t r = 0; r < R; ++r) row(fx + r * C, fy + r * C, C);
    }
    return y;
  }
  py::gil_scoped_release release;
#pragma omp parallel for schedule(static) if (R * C > kParallelMin && version != "simd")
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

// ---- log_softmax: y = (x - max) - log sum e^(x - max);  dx = dy - e^y sum(dy) --------------------------------
// float32 rows: three copies (scalar emulating 8 lanes, AVX2, AVX-512) chosen per call by vm::best_isa(); the row
// statistics (m, log s) come from softmax_rows.h, shared with cross_entropy
void lsm_fwd_row_scalar(const float* x, float* y, ssize_t C) {
  const RowLse st = row_lse_scalar(x, C);
  for (ssize_t c = 0; c < C; ++c) y[c] = (x[c] - st.m) - st.ls;
}

TL_AVX2 void lsm_fwd_row_avx2(const float* x, float* y, ssize_t C) {
  const RowLse st = row_lse_avx2(x, C);
  const __m256 mb = _mm256_set1_ps(st.m), lb = _mm256_set1_ps(st.ls);
  ssize_t c = 0;
  for (; c + 8 <= C; c += 8)
    _mm256_storeu_ps(y + c, _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mb), lb));
  for (; c < C; ++c) y[c] = (x[c] - st.m) - st.ls;
}

TL_AVX512 void lsm_fwd_row_avx512(const float* x, float* y, ssize_t C) {
  const RowLse st = row_lse_avx512(x, C);
  const __m512 mb = _mm512_set1_ps(st.m), lb = _mm512_set1_ps(st.ls);
  ssize_t c = 0;
  for (; c + 16 <= C; c += 16)
    _mm512_storeu_ps(y + c, _mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + c), mb), lb));
  for (; c < C; ++c) y[c] = (x[c] - st.m) - st.ls;
}

void lsm_bwd_row_scalar(const float* y, const float* g, float* dx, ssize_t C) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (ssize_t c = 0; c < C; ++c) lanes[c & 7] += g[c];
  const float s = reduce8(lanes);
  for (ssize_t c = 0; c < C; ++c) dx[c] = std::fma(-vm::scalar::exp(y[c]), s, g[c]);
}

TL_AVX2 void lsm_bwd_row_avx2(const float* y, const float* g, float* dx, ssize_t C) {
  __m256 acc = _mm256_setzero_ps();
  ssize_t c = 0;
  for (; c + 8 <= C; c += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(g + c));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (; c < C; ++c) lanes[c & 7] += g[c];
  const float s = reduce8(lanes);
  const __m256 sb = _mm256_set1_ps(s);
  for (c = 0; c + 8 <= C; c += 8)
    _mm256_storeu_ps(dx + c, _mm256_fnmadd_ps(vm::avx2::exp(_mm256_loadu_ps(y + c)), sb, _mm256_loadu_ps(g + c)));
  for (; c < C; ++c) dx[c] = std::fma(-vm::scalar::exp(y[c]), s, g[c]);
}

TL_AVX512 void lsm_bwd_row_avx512(const float* y, const float* g, float* dx, ssize_t C) {
  __m512 acc = _mm512_setzero_ps();
  ssize_t c = 0;
  for (; c + 16 <= C; c += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(g + c));
  alignas(64) float l16[16];
  _mm512_store_ps(l16, acc);
  float lanes[8];
  for (int l = 0; l < 8; ++l) lanes[l] = l16[l] + l16[l + 8];
  for (; c < C; ++c) lanes[c & 7] += g[c];
  const float s = reduce8(lanes);
  const __m512 sb = _mm512_set1_ps(s);
  for (c = 0; c + 16 <= C; c += 16)
    _mm512_storeu_ps(dx + c, _mm512_fnmadd_ps(vm::avx512::exp(_mm512_loadu_ps(y + c)), sb, _mm512_loadu_ps(g + c)));
  for (; c < C; ++c) dx[c] = std::fma(-vm::scalar::exp(y[c]), s, g[c]);
}

// float64 rows (gradcheck's dtype): plain loops on libm
void lsm_fwd_row_f64(const double* x, double* y, ssize_t C) {
  double m = -std::numeric_limits<double>::infinity();
  for (ssize_t c = 0; c < C; ++c) m = x[c] > m ? x[c] : m;
  double s = 0;
  for (ssize_t c = 0; c < C; ++c) s += std::exp(x[c] - m);
  const double ls = std::log(s);
  for (ssize_t c = 0; c < C; ++c) y[c] = (x[c] - m) - ls;
}

void lsm_bwd_row_f64(const double* y, const double* g, double* dx, ssize_t C) {
  double s = 0;
  for (ssize_t c = 0; c < C; ++c) s += g[c];
  for (ssize_t c = 0; c < C; ++c) dx[c] = g[c] - std::exp(y[c]) * s;
}

template <typename T>
using LsmFwd = void (*)(const T*, T*, ssize_t);
template <typename T>
using LsmBwd = void (*)(const T*, const T*, T*, ssize_t);

LsmFwd<float> lsm_pick_fwd(float*) {
  const vm::Isa isa = vm::best_isa();
  return isa == vm::Isa::avx512 ? lsm_fwd_row_avx512 : isa == vm::Isa::avx2 ? lsm_fwd_row_avx2 : lsm_fwd_row_scalar;
}
LsmFwd<double> lsm_pick_fwd(double*) { return lsm_fwd_row_f64; }
LsmBwd<float> lsm_pick_bwd(float*) {
  const vm::Isa isa = vm::best_isa();
  return isa == vm::Isa::avx512 ? lsm_bwd_row_avx512 : isa == vm::Isa::avx2 ? lsm_bwd_row_avx2 : lsm_bwd_row_scalar;
}
LsmBwd<double> lsm_pick_bwd(double*) { return lsm_bwd_row_f64; }

template <typename T>
carr<T> log_softmax_forward(carr<T> x) {
  need_ndim(x, 2, "log_softmax_forward", "x");
  const ssize_t R = x.shape(0), C = x.shape(1);
  carr<T> y({R, C});
  const T* px = x.data();
  T* py = y.mutable_data();
  const LsmFwd<T> row = lsm_pick_fwd(static_cast<T*>(nullptr));
  const int nt = threads_for(R * C);
  py::gil_scoped_release release;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (ssize_t r = 0; r < R; ++r) row(px + r * C, py + r * C, C);
  return y;
}

template <typename T>
carr<T> log_softmax_backward(carr<T> y, carr<T> dy) {
  need_ndim(y, 2, "log_softmax_backward", "y");
  need_same(y, dy, "log_softmax_backward", "dy", "y");
  const ssize_t R = y.shape(0), C = y.shape(1);
  carr<T> dx({R, C});
  const T* py = y.data();
  const T* pg = dy.data();
  T* pd = dx.mutable_data();
  const LsmBwd<T> row = lsm_pick_bwd(static_cast<T*>(nullptr));
  const int nt = threads_for(R * C);
  py::gil_scoped_release release;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (ssize_t r = 0; r < R; ++r) row(py + r * C, pg + r * C, pd + r * C, C);
  return dx;
}

template <typename T>
void def_softmax(py::module_& m) {
  m.def("softmax_forward", &softmax_forward<T>, py::arg("x"), py::arg("version") = "three_pass", py::arg("grain") = 0,
        "versions: three_pass, online, simd, simd_omp, online_simd (see cpp_src/kernels_softmax.cpp); grain: elements "
        "per thread at least for simd_omp/online_simd (0 = kGrain)");
  m.def("softmax_backward", &softmax_backward<T>, py::arg("y"), py::arg("dy"));
  m.def("log_softmax_forward", &log_softmax_forward<T>, py::arg("x"),
        "x [R, C] -> y = x - max - log sum exp(x - max) per row (cpp_src/kernels_softmax.cpp)");
  m.def("log_softmax_backward", &log_softmax_backward<T>, py::arg("y"), py::arg("dy"),
        "dx = dy - exp(y) * sum(dy) per row, from the forward's output y [R, C]");
}

}  // namespace

TL_REGISTER(kernels) {
  m.doc() =
      "fused CPU kernels (float32 / float64, C-contiguous): softmax, log_softmax, layer_norm, bias_gelu, "
      "flash_attention";
  def_softmax<float>(m);
  def_softmax<double>(m);
  m.def(
      "log_softmax_path", [] { return std::string(tl::vm::isa_name(tl::vm::best_isa())); },
      "the float32 row copy log_softmax_forward/backward run: 'avx512' | 'avx2' | 'scalar' (TINYLEARN_CPU_FEATURES)");
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
