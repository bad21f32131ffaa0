// kernels_groupnorm.cpp — fused CPU GroupNorm behind tinylearn.kernels' group_norm (backend="cpp") and
// tl.nn.functional.group_norm (GroupNormFn, tinylearn/nn/functional_norm.py). Works on C-contiguous float32 or float64
// arrays that the Python side (tinylearn/kernels/ops_group_norm.py, GroupNormFn) has reshaped to [N, C, HW] (HW = the
// product of the spatial dims, 1 for a 2-D input); weight/bias are [C] or None (no affine). Part of _C.kernels
// (several files register into it, see registry.h). Statistics are biased (torch's), eps inside the square root.
//
// Versions (one each; checked against the numpy reference tinylearn/kernels/reference.py and against
// torch.nn.functional.group_norm + torch autograd in tests/kernels/test_group_norm.py, fp32 and fp64):
//   group_norm_forward   per (n, g) item (OpenMP over N*G, one thread per 128 Ki elements, so one thread below
//                        2 x 128 Ki: gn_threads): two-pass statistics over the group's contiguous m = C/G * HW
//                        values, both sums in double (mean, then the centred sum of squares: no cancellation); rstd =
//                        1/sqrt(var + eps); then one write pass per channel y = (x - mean) * (rstd * gamma[c]) +
//                        beta[c] (one sub + one FMA). Returns y, mean [N, G], rstd [N, G] (in the input's dtype).
//   group_norm_backward  torch's plan, per (n, g) item: per channel ds[c] = sum_hw dy (x - mean) and db[c] =
//                        sum_hw dy (double accumulators; centred x instead of torch's ds - mean * db, so no
//                        cancellation for inputs far from zero); the group's A = sum_c gamma db, B = sum_c gamma ds
//                        give dx = (rstd gamma[c]) dy + c2 (x - mean) + c3 with c2 = -rstd^3 B / m,
//                        c3 = -rstd A / m, in one pass (the group is still in cache). dgamma[c] = sum_n ds[n, c]
//                        rstd[n, g], dbeta[c] = sum_n db[n, c] from the [N, C] partials (no full-size temporary
//                        besides dx). Returns dx, dweight [C], dbias [C] (computed also without affine: ones).
// SIMD: the loops are plain C++ with `#pragma omp simd` reductions, compiled three times (one always_inline body per
// group, wrapped under __attribute__((target)) for avx512f, avx2+fma and the build's baseline by kernels_math.h's
// pick_isa_copy, which BatchNorm's kernel shares) and chosen per call by
// tl::vm::best_isa(), so TINYLEARN_CPU_FEATURES=scalar|avx2|avx512 forces a path (group_norm_path() reports it). The
// "scalar" path is the build-flags one: scalar code on baseline x86-64 (TINYLEARN_NATIVE=OFF, SSE2 auto-vectorised),
// what -march=native allows otherwise (cpu_features.h's note). The paths differ only in summation order.
// [8, 32, 16, 16] fp32, 8 groups, kernel alone, one thread (AVX-512, 2-core AMD EPYC dev box, median): forward
// 0.020 ms, backward 0.021 ms; tl.nn.functional.group_norm fwd+bwd (tinylearn.autograd.bench's group_norm row)
// 0.30 -> 0.13-0.14 ms, torch 0.12-0.13 ms.
#include <optional>

#include "kernels_math.h"

namespace py = pybind11;

namespace {

template <typename T>
struct GnFwd {
  const T* x;
  const T* w;  // nullptr: gamma = 1
  const T* b;  // nullptr: beta = 0
  T* y;
  T* mean;
  T* rstd;
  ssize_t C, HW, G;
  double eps;
};

template <typename T>
struct GnBwd {
  const T* dy;
  const T* x;
  const T* w;
  const T* mean;
  const T* rstd;
  T* dx;
  double* ds;  // [N, C] sum_hw dy (x - mean)
  double* db;  // [N, C] sum_hw dy
  ssize_t C, HW, G;
};

// ---- one (n, g) item, forward ----------------------------------------------------------------------------------
template <typename T>
__attribute__((always_inline)) inline void gn_fwd_item(const GnFwd<T>& a, ssize_t k) {
  const ssize_t g = k % a.G, Cg = a.C / a.G, m = Cg * a.HW, c0 = g * Cg;
  const T* x = a.x + k * m;  // item k = n * G + g starts at (n * C + g * Cg) * HW = k * m
  T* y = a.y + k * m;
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (ssize_t i = 0; i < m; ++i) s += double(x[i]);
  const double mu = s / double(m);
  double v = 0;
#pragma omp simd reduction(+ : v)
  for (ssize_t i = 0; i < m; ++i) {
    const double d = double(x[i]) - mu;
    v += d * d;
  }
  const double rs = 1.0 / std::sqrt(v / double(m) + a.eps);
  a.mean[k] = T(mu);
  a.rstd[k] = T(rs);
  const T mt = T(mu);
  for (ssize_t c = 0; c < Cg; ++c) {
    const T sc = a.w ? T(rs * double(a.w[c0 + c])) : T(rs);
    const T sh = a.b ? a.b[c0 + c] : T(0);
    const T* xc = x + c * a.HW;
    T* yc = y + c * a.HW;
#pragma omp simd
    for (ssize_t i = 0; i < a.HW; ++i) yc[i] = (xc[i] - mt) * sc + sh;
  }
}

// ---- one (n, g) item, backward ---------------------------------------------------------------------------------
template <typename T>
__attribute__((always_inline)) inline void gn_bwd_item(const GnBwd<T>& a, ssize_t k) {
  const ssize_t g = k % a.G, n = k / a.G, Cg = a.C / a.G, m = Cg * a.HW, c0 = g * Cg;
  const T *x = a.x + k * m, *dy = a.dy + k * m;
  T* dx = a.dx + k * m;
  double* ds = a.ds + n * a.C + c0;
  double* db = a.db + n * a.C + c0;
  const T mt = a.mean[k];
  const double mu = double(mt), r = double(a.rstd[k]);
  double A = 0, B = 0;
  for (ssize_t c = 0; c < Cg; ++c) {
    const T *xc = x + c * a.HW, *gc = dy + c * a.HW;
    double s = 0, t = 0;
#pragma omp simd reduction(+ : s, t)
    for (ssize_t i = 0; i < a.HW; ++i) {
      const double gi = double(gc[i]);
      s += gi * (double(xc[i]) - mu);
      t += gi;
    }
    ds[c] = s;
    db[c] = t;
    const double gam = a.w ? double(a.w[c0 + c]) : 1.0;
    A += gam * t;
    B += gam * s;
  }
  const T c2 = T(-r * r * r * B / double(m)), c3 = T(-r * A / double(m));
  for (ssize_t c = 0; c < Cg; ++c) {
    const T k1 = T(a.w ? r * double(a.w[c0 + c]) : r);
    const T *xc = x + c * a.HW, *gc = dy + c * a.HW;
    T* dc = dx + c * a.HW;
#pragma omp simd
    for (ssize_t i = 0; i < a.HW; ++i) dc[i] = k1 * gc[i] + (c2 * (xc[i] - mt) + c3);
  }
}

// ---- argument checks -------------------------------------------------------------------------------------------
template <typename T>
using gn_arr = py::array_t<T, py::array::c_style>;

void gn_check_groups(ssize_t C, int64_t G, const char* fn) {
  if (G < 1) tl::value_error(std::string(fn) + ": num_groups must be >= 1, got " + std::to_string(G));
  if (C % G)
    tl::value_error(std::string(fn) + ": " + std::to_string(C) + " channels not divisible by num_groups " +
                    std::to_string(G));
}

template <typename T>
const T* gn_param(const std::optional<gn_arr<T>>& p, ssize_t C, const char* fn, const char* name) {
  if (!p) return nullptr;
  if (p->ndim() != 1 || p->shape(0) != C)
    tl::value_error(std::string(fn) + ": " + name + " shape " + tl::shape_str(*p) + " must be (" + std::to_string(C) +
                    ",)");
  return p->data();
}

template <typename T>
void gn_check_stats(const gn_arr<T>& s, ssize_t N, ssize_t G, const char* name) {
  if (s.ndim() != 2 || s.shape(0) != N || s.shape(1) != G)
    tl::value_error(std::string("group_norm_backward: ") + name + " shape " + tl::shape_str(s) + " must be (" +
                    std::to_string(N) + ", " + std::to_string(G) + ")");
}

// OpenMP threads for a call: each thread gets >= kGnGrain elements (4x the kGrain of threads_for, kernels_math.h) and
// at least one (n, g) item. One thread streams ~3 G elements/s here, so below 2 x 128 Ki elements a second thread
// saves < 40 us, while a team whose second thread is not running stalls the whole call for a scheduler slice:
// [8, 32, 16, 16] fwd+bwd at 2 threads on the shared 2-core dev box measured 0.136 ms when quiet but 16 ms (median)
// while other jobs ran, against 0.13-0.14 ms on one thread either way (torch: 0.12 ms quiet, 48 ms loaded).
constexpr ssize_t kGnGrain = ssize_t(1) << 17;
int gn_threads(ssize_t elems, ssize_t items) {
  const ssize_t want = std::min<ssize_t>({ssize_t(tl::n_threads()), elems / kGnGrain, items});
  return want < 1 ? 1 : int(want);
}

// ---- entry points ----------------------------------------------------------------------------------------------
template <typename T>
py::tuple group_norm_forward(gn_arr<T> x, std::optional<gn_arr<T>> weight, std::optional<gn_arr<T>> bias,
                             int64_t num_groups, double eps) {
  tl::need_ndim(x, 3, "group_norm_forward", "x");
  const ssize_t N = x.shape(0), C = x.shape(1), HW = x.shape(2);
  gn_check_groups(C, num_groups, "group_norm_forward");
  if (!(eps >= 0)) tl::value_error("group_norm_forward: eps must be >= 0, got " + std::to_string(eps));
  const ssize_t G = num_groups;
  GnFwd<T> a{x.data(),
             gn_param(weight, C, "group_norm_forward", "weight"),
             gn_param(bias, C, "group_norm_forward", "bias"),
             nullptr,
             nullptr,
             nullptr,
             C,
             HW,
             G,
             eps};
  gn_arr<T> y({N, C, HW}), mean({N, G}), rstd({N, G});
  a.y = y.mutable_data();
  a.mean = mean.mutable_data();
  a.rstd = rstd.mutable_data();
  const auto item = tl::kern::pick_isa_copy<GnFwd<T>, gn_fwd_item<T>>();  // the header's three compiled copies
  const ssize_t items = HW > 0 ? N * G : 0;  // HW = 0: nothing to normalise (mean/rstd stay NaN, as torch's)
  if (items == 0) {
    for (ssize_t k = 0; k < N * G; ++k) a.mean[k] = a.rstd[k] = std::numeric_limits<T>::quiet_NaN();
    return py::make_tuple(y, mean, rstd);
  }
  {
    py::gil_scoped_release release;
    const int nt = gn_threads(N * C * HW, items);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (ssize_t k = 0; k < items; ++k) item(a, k);
  }
  return py::make_tuple(y, mean, rstd);
}

template <typename T>
py::tuple group_norm_backward(gn_arr<T> dy, gn_arr<T> x, std::optional<gn_arr<T>> weight, gn_arr<T> mean,
                              gn_arr<T> rstd, int64_t num_groups) {
  tl::need_ndim(x, 3, "group_norm_backward", "x");
  tl::need_same(dy, x, "group_norm_backward", "dy", "x");
  const ssize_t N = x.shape(0), C = x.shape(1), HW = x.shape(2);
  gn_check_groups(C, num_groups, "group_norm_backward");
  const ssize_t G = num_groups;
  gn_check_stats(mean, N, G, "mean");
  gn_check_stats(rstd, N, G, "rstd");
  std::vector<double> ds(static_cast<size_t>(N * C), 0.0), db(static_cast<size_t>(N * C), 0.0);
  gn_arr<T> dx({N, C, HW}), dw(C), dbias(C);
  GnBwd<T> a{dy.data(),
             x.data(),
             gn_param(weight, C, "group_norm_backward", "weight"),
             mean.data(),
             rstd.data(),
             dx.mutable_data(),
             ds.data(),
             db.data(),
             C,
             HW,
             G};
  const auto item = tl::kern::pick_isa_copy<GnBwd<T>, gn_bwd_item<T>>();
  T *pdw = dw.mutable_data(), *pdb = dbias.mutable_data();
  const T* pr = rstd.data();
  {
    py::gil_scoped_release release;
    const ssize_t items = HW > 0 ? N * G : 0;
    const int nt = gn_threads(N * C * HW, items);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (ssize_t k = 0; k < items; ++k) item(a, k);
    const ssize_t Cg = C / G;
    for (ssize_t c = 0; c < C; ++c) {
      double sw = 0, sb = 0;
      for (ssize_t n = 0; n < N; ++n) {
        sw += ds[n * C + c] * double(pr[n * G + c / Cg]);
        sb += db[n * C + c];
      }
      pdw[c] = T(sw);
      pdb[c] = T(sb);
    }
  }
  return py::make_tuple(dx, dw, dbias);
}

template <typename T>
void def_groupnorm(py::module_& m) {
  m.def("group_norm_forward", &group_norm_forward<T>, py::arg("x"), py::arg("weight"), py::arg("bias"),
        py::arg("num_groups"), py::arg("eps") = 1e-5,
        "x [N, C, HW] -> (y, mean [N, G], rstd [N, G]); weight/bias [C] or None (cpp_src/kernels_groupnorm.cpp)");
  m.def("group_norm_backward", &group_norm_backward<T>, py::arg("dy"), py::arg("x"), py::arg("weight"), py::arg("mean"),
        py::arg("rstd"), py::arg("num_groups"),
        "(dx [N, C, HW], dweight [C], dbias [C]) from the forward's mean/rstd; weight [C] or None");
}

}  // namespace

TL_REGISTER(kernels) {
  def_groupnorm<float>(m);
  def_groupnorm<double>(m);
  m.def(
      "group_norm_path", [] { return std::string(tl::vm::isa_name(tl::vm::best_isa())); },
      "the compiled copy group_norm_forward/backward run now: 'avx512' | 'avx2' | 'scalar' (TINYLEARN_CPU_FEATURES)");
}
