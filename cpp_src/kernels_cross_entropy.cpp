// kernels_cross_entropy.cpp — cross_entropy of logits rows x [R, C] against integer targets t [R] (torch's
// F.cross_entropy with class indices, ignore_index and label_smoothing eps; no class weights), fused: the forward
// reads a row twice (max, sum of exp: softmax_rows.h) and writes nothing of size C; the backward reads it once and
// writes the gradient. tl.nn.functional.cross_entropy (CrossEntropyFn, tinylearn/nn/functional_loss.py) runs it for
// float32/float64 through the registry (ops kernels.cross_entropy / cross_entropy_backward); the numpy reference is
// tinylearn/kernels/reference.py's, and tests/kernels/test_cross_entropy.py checks both against torch.
//
//   forward   m = max x, ls = log sum e^(x - m)                    (the log_softmax statistics, 8-lane sums)
//             logp_t = (x_t - m) - ls                              (two subtractions: exact for logits of 1e4)
//             loss = -(1 - eps) logp_t - eps mean_c logp_c,  mean_c logp_c = sum_c x_c / C - m - ls
//             -> loss [R], stats [R, 2] = (m, ls), the number of rows whose target is not ignore_index
//   backward  dx_c = s e^((x_c - m) - ls) - s eps / C,  dx_t -= s (1 - eps)   (s: the row's scale = dloss_r,
//             already divided by the valid count for reduction='mean'); a row whose target is ignore_index is 0
//
// Every target is checked before any work (out of [0, C) and not ignore_index -> ValueError naming the label and
// its row). A row with a NaN or +inf logit, or all -inf, gives NaN (as torch). float32 rows: scalar / AVX2 /
// AVX-512 copies chosen by vm::best_isa() (TINYLEARN_CPU_FEATURES forces one; scalar and AVX2 agree bit for bit);
// float64 on libm. OpenMP over rows with threads_for(R * C) threads (a row is one thread's: same bits at any count).
//
// [256, 100] fp32, one thread, AVX-512 (2-core Zen 5 dev box, best of 5): forward 10.1 us, backward 7.9 us (the tail
// of each row in one masked vector: 11.6 / 9.4 us with a scalar tail); tl.nn.functional.cross_entropy fwd+bwd in the
// Tensor API (autodiff bench's breadth row: loss = sum(ce * g)) 0.059 ms vs torch 0.049 ms (1.20x; the
// numpy fused node it replaces, 5 reductions and 4 temporaries of [N, C], read 1.8-2.8x in bench runs).
#include <cstdint>
#include <string>

#include "kernels_math.h"
#include "softmax_rows.h"

namespace py = pybind11;

namespace {
using namespace tl;
using namespace tl::kern;
namespace vm = tl::vm;

using idx_arr = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// ---- backward rows: dx_c = s e^((x_c - m) - ls) - k with k = s eps / C (one FMA) -------------------------------
void ce_bwd_row_scalar(const float* x, float m, float ls, float s, float k, float* dx, ssize_t C) {
  for (ssize_t c = 0; c < C; ++c) dx[c] = std::fma(vm::scalar::exp((x[c] - m) - ls), s, -k);
}

TL_AVX2 void ce_bwd_row_avx2(const float* x, float m, float ls, float s, float k, float* dx, ssize_t C) {
  const __m256 mb = _mm256_set1_ps(m), lb = _mm256_set1_ps(ls), sb = _mm256_set1_ps(s), kb = _mm256_set1_ps(-k);
  ssize_t c = 0;
  for (; c + 8 <= C; c += 8) {
    const __m256 e = vm::avx2::exp(_mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mb), lb));
    _mm256_storeu_ps(dx + c, _mm256_fmadd_ps(e, sb, kb));
  }
  if (c < C) {  // the tail in one masked vector (masked-off lanes are neither read nor written)
    const __m256i tm = tail_mask_avx2(C - c);
    const __m256 e = vm::avx2::exp(_mm256_sub_ps(_mm256_sub_ps(_mm256_maskload_ps(x + c, tm), mb), lb));
    _mm256_maskstore_ps(dx + c, tm, _mm256_fmadd_ps(e, sb, kb));
  }
}

TL_AVX512 void ce_bwd_row_avx512(const float* x, float m, float ls, float s, float k, float* dx, ssize_t C) {
  const __m512 mb = _mm512_set1_ps(m), lb = _mm512_set1_ps(ls), sb = _mm512_set1_ps(s), kb = _mm512_set1_ps(-k);
  ssize_t c = 0;
  for (; c + 16 <= C; c += 16) {
    const __m512 e = vm::avx512::exp(_mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + c), mb), lb));
    _mm512_storeu_ps(dx + c, _mm512_fmadd_ps(e, sb, kb));
  }
  if (c < C) {
    const __mmask16 tm = __mmask16((1u << (C - c)) - 1u);
    const __m512 e = vm::avx512::exp(_mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, x + c), mb), lb));
    _mm512_mask_storeu_ps(dx + c, tm, _mm512_fmadd_ps(e, sb, kb));
  }
}

// ---- per dtype: the row statistics and the backward row -------------------------------------------------------
template <typename T>
struct Rows;

template <>
struct Rows<float> {
  using Bwd = void (*)(const float*, float, float, float, float, float*, ssize_t);
  RowLseFn lse = pick_row_lse();
  Bwd bwd;
  Rows() {
    const vm::Isa isa = vm::best_isa();
    bwd = isa == vm::Isa::avx512 ? ce_bwd_row_avx512 : isa == vm::Isa::avx2 ? ce_bwd_row_avx2 : ce_bwd_row_scalar;
  }
  void stats(const float* x, ssize_t C, float& m, float& ls) const {
    const RowLse st = lse(x, C);
    m = st.m, ls = st.ls;
  }
};

template <>
struct Rows<double> {  // gradcheck's dtype: libm, sequential sums
  void stats(const double* x, ssize_t C, double& m, double& ls) const {
    m = -std::numeric_limits<double>::infinity();
    for (ssize_t c = 0; c < C; ++c) m = x[c] > m ? x[c] : m;
    double s = 0;
    for (ssize_t c = 0; c < C; ++c) s += std::exp(x[c] - m);
    ls = std::log(s);
  }
  void bwd(const double* x, double m, double ls, double s, double k, double* dx, ssize_t C) const {
    for (ssize_t c = 0; c < C; ++c) dx[c] = std::exp((x[c] - m) - ls) * s - k;
  }
};

// x [R, C] and target [R]; every target in [0, C) or ignore_index, else ValueError; -> the number of valid rows
template <typename T>
int64_t check_rows(const carr<T>& x, const idx_arr& target, int64_t ignore_index, double eps, const char* fn) {
  need_ndim(x, 2, fn, "x");
  const ssize_t R = x.shape(0), C = x.shape(1);
  if (target.ndim() != 1 || target.shape(0) != R)
    tl::value_error(std::string(fn) + ": target must be 1-D with one class index per row of x (" + std::to_string(R) +
                    "), got ndim " + std::to_string(target.ndim()) + " size " + std::to_string(target.size()));
  if (!(eps >= 0.0 && eps <= 1.0))
    tl::value_error(std::string(fn) + ": label_smoothing must be in [0, 1], got " + std::to_string(eps));
  const int64_t* pt = target.data();
  int64_t nvalid = 0;
  for (ssize_t r = 0; r < R; ++r) {
    if (pt[r] == ignore_index) continue;
    if (pt[r] < 0 || pt[r] >= C)
      tl::value_error(std::string(fn) + ": target label " + std::to_string(pt[r]) + " is out of range [0, " +
                      std::to_string(C) + ") (row " + std::to_string(r) + ", ignore_index " +
                      std::to_string(ignore_index) + ")");
    ++nvalid;
  }
  return nvalid;
}

template <typename T>
py::tuple cross_entropy_forward(carr<T> x, idx_arr target, int64_t ignore_index, double eps) {
  const int64_t nvalid = check_rows(x, target, ignore_index, eps, "cross_entropy_forward");
  const ssize_t R = x.shape(0), C = x.shape(1);
  carr<T> loss(R);
  carr<T> stats({R, ssize_t(2)});
  const T* px = x.data();
  const int64_t* pt = target.data();
  T* pl = loss.mutable_data();
  T* ps = stats.mutable_data();
  const Rows<T> rows;
  const int nt = threads_for(R * C);
  {
    py::gil_scoped_release release;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (ssize_t r = 0; r < R; ++r) {
      const T* xr = px + r * C;
      const int64_t t = pt[r];
      if (t == ignore_index) {
        pl[r] = ps[2 * r] = ps[2 * r + 1] = T(0);
        continue;
      }
      T m, ls;
      rows.stats(xr, C, m, ls);
      ps[2 * r] = m, ps[2 * r + 1] = ls;
      const T logp_t = (xr[t] - m) - ls;
      if (eps == 0.0) {
        pl[r] = -logp_t;
      } else {
        double sx = 0;
        for (ssize_t c = 0; c < C; ++c) sx += double(xr[c]);
        const double mean_logp = (sx / double(C) - double(m)) - double(ls);
        pl[r] = T(-(1.0 - eps) * double(logp_t) - eps * mean_logp);
      }
    }
  }
  return py::make_tuple(loss, stats, nvalid);
}

template <typename T>
carr<T> cross_entropy_backward(carr<T> x, carr<T> stats, idx_arr target, carr<T> scale, int64_t ignore_index,
                               double eps) {
  check_rows(x, target, ignore_index, eps, "cross_entropy_backward");
  const ssize_t R = x.shape(0), C = x.shape(1);
  if (stats.ndim() != 2 || stats.shape(0) != R || stats.shape(1) != 2)
    tl::value_error("cross_entropy_backward: stats must be [" + std::to_string(R) + ", 2] (the forward's (m, ls))");
  if (scale.ndim() != 1 || (scale.shape(0) != 1 && scale.shape(0) != R))
    tl::value_error("cross_entropy_backward: scale must be 1-D of size 1 or " + std::to_string(R) + ", got size " +
                    std::to_string(scale.size()));
  carr<T> dx({R, C});
  const T* px = x.data();
  const T* ps = stats.data();
  const T* psc = scale.data();
  const ssize_t sstep = scale.shape(0) == 1 ? 0 : 1;
  const int64_t* pt = target.data();
  T* pd = dx.mutable_data();
  const Rows<T> rows;
  const int nt = threads_for(R * C);
  py::gil_scoped_release release;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (ssize_t r = 0; r < R; ++r) {
    T* dr = pd + r * C;
    const int64_t t = pt[r];
    if (t == ignore_index) {
      std::fill(dr, dr + C, T(0));
      continue;
    }
    const T s = psc[r * sstep];
    rows.bwd(px + r * C, ps[2 * r], ps[2 * r + 1], s, T(s * T(eps / double(C))), dr, C);
    dr[t] -= s * T(1.0 - eps);
  }
  return dx;
}

template <typename T>
void def_cross_entropy(py::module_& m) {
  m.def("cross_entropy_forward", &cross_entropy_forward<T>, py::arg("x"), py::arg("target"), py::arg("ignore_index"),
        py::arg("label_smoothing"),
        "x [R, C], target int [R] -> (loss [R], stats [R, 2] = (max, log sum exp(x - max)), valid row count); "
        "cpp_src/kernels_cross_entropy.cpp");
  m.def("cross_entropy_backward", &cross_entropy_backward<T>, py::arg("x"), py::arg("stats"), py::arg("target"),
        py::arg("scale"), py::arg("ignore_index"), py::arg("label_smoothing"),
        "dx = scale * (softmax(x) - (1 - eps) onehot(target) - eps / C) per row (0 where target == ignore_index); "
        "scale [R] or [1]");
}

}  // namespace

TL_REGISTER(kernels) {
  def_cross_entropy<float>(m);
  def_cross_entropy<double>(m);
}
