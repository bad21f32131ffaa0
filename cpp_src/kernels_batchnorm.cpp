// kernels_batchnorm.cpp — fused CPU BatchNorm (training and eval) behind tl.nn.functional.batch_norm (BatchNormFn,
// tinylearn/nn/functional_norm.py) through the registry ops kernels.batch_norm / batch_norm_backward (numpy
// reference: tinylearn/kernels/reference.py). Works on C-contiguous float32/float64 x [N, C, L] (L = the product of
// the spatial dims, 1 for [N, C]); weight/bias [C] or None. Part of _C.kernels (several files register into it).
//
//   batch_norm_forward   per channel c (one item; OpenMP over channels above kBnGrain elements per thread): with
//                        no mean/var given (training) two-pass statistics over the N * L values of c, both sums in
//                        double (mean, then the centred sum of squares: no cancellation), var biased; given mean/var
//                        (eval: the running statistics) they are used as they are. invstd = 1/sqrt(var + eps); one
//                        write pass y = (x - mean) * (invstd * w[c]) + b[c]. -> (y, mean [C], invstd [C], var [C]);
//                        the caller updates the running statistics (var * m / (m - 1), torch's unbiased update).
//   batch_norm_backward  per channel: sg = sum dy, sgx = sum dy (x - mean) (double); training: dx = k1 dy +
//                        c2 (x - mean) + c3 with k1 = invstd w, c2 = -w invstd^3 sgx / m, c3 = -w invstd sg / m
//                        (the statistics' VJP, the form GroupNorm's kernel uses); eval: dx = invstd w dy.
//                        dweight = invstd sgx, dbias = sg. -> (dx, dweight [C], dbias [C]).
// SIMD: plain loops with `#pragma omp simd`, compiled three times by kernels_math.h's pick_isa_copy (avx512f,
// avx2+fma, the build's baseline), chosen per call by tl::vm::best_isa() (TINYLEARN_CPU_FEATURES forces one). The
// paths differ only in summation order.
//
// [128, 16, 8, 8] fp32 (the amp bench CNN's first BatchNorm), one thread, 2-core Zen 5 dev box, best of 5: forward
// 66 us, backward 70 us (the numpy reference: 208 / 204 us; torch's batch_norm forward 164 us, fwd+bwd 218 us). The
// amp bench's CNN training step (2 BatchNorms) at 2 threads: 2.61 -> 1.82 ms with this kernel (torch 1.71 ms).
#include <optional>

#include "kernels_math.h"

namespace py = pybind11;

namespace {

template <typename T>
struct BnArgs {
  const T* x;
  const T* dy;  // backward only
  const T* w;   // nullptr: weight 1
  const T* b;   // nullptr: bias 0
  T* y;         // forward: y; backward: dx
  T* mean;      // [C]: computed (training forward) or given
  T* invstd;    // [C]
  T* var;       // [C]: forward only
  T* dw;        // [C]: backward only
  T* db;        // [C]: backward only
  ssize_t N, C, L;
  double eps;
  bool stats;     // forward: compute the statistics (training)
  bool training;  // backward: the statistics' VJP too
};

template <typename T>
__attribute__((always_inline)) inline void bn_fwd_item(const BnArgs<T>& a, ssize_t c) {
  const ssize_t L = a.L, stride = a.C * L;
  const T* x0 = a.x + c * L;
  double mu, var;
  if (a.stats) {
    double s = 0;
    for (ssize_t n = 0; n < a.N; ++n) {
      const T* x = x0 + n * stride;
#pragma omp simd reduction(+ : s)
      for (ssize_t i = 0; i < L; ++i) s += double(x[i]);
    }
    const double m = double(a.N * L);
    mu = s / m;
    double v = 0;
    for (ssize_t n = 0; n < a.N; ++n) {
      const T* x = x0 + n * stride;
#pragma omp simd reduction(+ : v)
      for (ssize_t i = 0; i < L; ++i) {
        const double d = double(x[i]) - mu;
        v += d * d;
      }
    }
    var = v / m;
    a.mean[c] = T(mu);
    a.var[c] = T(var);
  } else {
    mu = double(a.mean[c]);
    var = double(a.var[c]);
  }
  const double is = 1.0 / std::sqrt(var + a.eps);
  a.invstd[c] = T(is);
  const T mt = T(mu), sc = T(a.w ? is * double(a.w[c]) : is), sh = a.b ? a.b[c] : T(0);
  for (ssize_t n = 0; n < a.N; ++n) {
    const T* x = x0 + n * stride;
    T* y = a.y + c * L + n * stride;
#pragma omp simd
    for (ssize_t i = 0; i < L; ++i) y[i] = (x[i] - mt) * sc + sh;
  }
}

template <typename T>
__attribute__((always_inline)) inline void bn_bwd_item(const BnArgs<T>& a, ssize_t c) {
  const ssize_t L = a.L, stride = a.C * L;
  const T mt = a.mean[c];
  const double mu = double(mt), is = double(a.invstd[c]), w = a.w ? double(a.w[c]) : 1.0, m = double(a.N * L);
  double sg = 0, sgx = 0;
  for (ssize_t n = 0; n < a.N; ++n) {
    const T *x = a.x + c * L + n * stride, *g = a.dy + c * L + n * stride;
#pragma omp simd reduction(+ : sg, sgx)
    for (ssize_t i = 0; i < L; ++i) {
      const double gi = double(g[i]);
      sg += gi;
      sgx += gi * (double(x[i]) - mu);
    }
  }
  a.dw[c] = T(is * sgx);
  a.db[c] = T(sg);
  if (!a.y) return;  // no input gradient wanted
  const T k1 = T(w * is);
  const T c2 = T(-w * is * is * is * sgx / m), c3 = T(-w * is * sg / m);
  for (ssize_t n = 0; n < a.N; ++n) {
    const T *x = a.x + c * L + n * stride, *g = a.dy + c * L + n * stride;
    T* dx = a.y + c * L + n * stride;
    if (a.training) {
#pragma omp simd
      for (ssize_t i = 0; i < L; ++i) dx[i] = k1 * g[i] + (c2 * (x[i] - mt) + c3);
    } else {
#pragma omp simd
      for (ssize_t i = 0; i < L; ++i) dx[i] = k1 * g[i];
    }
  }
}

template <typename T>
using bn_arr = py::array_t<T, py::array::c_style>;

// a [C] argument, read only (a read-only array is fine: data(), never mutable_data())
template <typename T>
const T* bn_vec(const std::optional<bn_arr<T>>& p, ssize_t C, const char* fn, const char* name) {
  if (!p) return nullptr;
  if (p->ndim() != 1 || p->shape(0) != C)
    tl::value_error(std::string(fn) + ": " + name + " shape " + tl::shape_str(*p) + " must be (" + std::to_string(C) +
                    ",)");
  return p->data();
}

// OpenMP threads: >= kBnGrain elements and one channel each (the GroupNorm kernel's rule and reason: a team whose
// second thread is not running stalls the call for a scheduler slice on a busy box)
constexpr ssize_t kBnGrain = ssize_t(1) << 17;
int bn_threads(ssize_t elems, ssize_t items) {
  const ssize_t want = std::min<ssize_t>({ssize_t(tl::n_threads()), elems / kBnGrain, items});
  return want < 1 ? 1 : int(want);
}

template <typename T>
void bn_run(const BnArgs<T>& a, bool backward) {
  const auto item = backward ? tl::kern::pick_isa_copy<BnArgs<T>, bn_bwd_item<T>>()
                             : tl::kern::pick_isa_copy<BnArgs<T>, bn_fwd_item<T>>();
  py::gil_scoped_release release;
  const int nt = bn_threads(a.N * a.C * a.L, a.C);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (ssize_t c = 0; c < a.C; ++c) item(a, c);
}

template <typename T>
py::tuple batch_norm_forward(bn_arr<T> x, std::optional<bn_arr<T>> weight, std::optional<bn_arr<T>> bias,
                             std::optional<bn_arr<T>> mean, std::optional<bn_arr<T>> var, double eps) {
  const char* fn = "batch_norm_forward";
  tl::need_ndim(x, 3, fn, "x");
  const ssize_t N = x.shape(0), C = x.shape(1), L = x.shape(2);
  if (!(eps >= 0)) tl::value_error(std::string(fn) + ": eps must be >= 0, got " + std::to_string(eps));
  if (bool(mean) != bool(var)) tl::value_error(std::string(fn) + ": give both mean and var (eval) or neither");
  const bool stats = !mean;
  if (stats && N * L < 2)
    tl::value_error(std::string(fn) + ": expected more than 1 value per channel when training, got N * L = " +
                    std::to_string(N * L));
  bn_arr<T> y({N, C, L}), invstd(C);
  bn_arr<T> m_out = stats ? bn_arr<T>(C) : *mean, v_out = stats ? bn_arr<T>(C) : *var;
  BnArgs<T> a{x.data(), nullptr, bn_vec(weight, C, fn, "weight"), bn_vec(bias, C, fn, "bias"), y.mutable_data(),
              nullptr, invstd.mutable_data(), nullptr, nullptr, nullptr, N, C, L, eps, stats, true};
  if (stats) {  // computed here: fresh arrays
    a.mean = m_out.mutable_data();
    a.var = v_out.mutable_data();
  } else {  // given (eval): checked and only read by bn_fwd_item (stats false), so a read-only array is fine
    a.mean = const_cast<T*>(bn_vec(mean, C, fn, "mean"));
    a.var = const_cast<T*>(bn_vec(var, C, fn, "var"));
  }
  bn_run(a, false);
  return py::make_tuple(y, m_out, invstd, v_out);
}

template <typename T>
py::tuple batch_norm_backward(bn_arr<T> dy, bn_arr<T> x, std::optional<bn_arr<T>> weight, bn_arr<T> mean,
                              bn_arr<T> invstd, bool training, bool need_dx) {
  const char* fn = "batch_norm_backward";
  tl::need_ndim(x, 3, fn, "x");
  tl::need_same(dy, x, fn, "dy", "x");
  const ssize_t N = x.shape(0), C = x.shape(1), L = x.shape(2);
  const T* pm = bn_vec(std::optional<bn_arr<T>>(mean), C, fn, "mean");  // read only
  const T* pi = bn_vec(std::optional<bn_arr<T>>(invstd), C, fn, "invstd");
  bn_arr<T> dx(need_dx ? std::vector<ssize_t>{N, C, L} : std::vector<ssize_t>{0}), dw(C), db(C);
  BnArgs<T> a{x.data(),
              dy.data(),
              bn_vec(weight, C, fn, "weight"),
              nullptr,
              need_dx ? dx.mutable_data() : nullptr,
              const_cast<T*>(pm),  // only read by bn_bwd_item
              const_cast<T*>(pi),
              nullptr,
              dw.mutable_data(),
              db.mutable_data(),
              N,
              C,
              L,
              0.0,
              false,
              training};
  bn_run(a, true);
  return py::make_tuple(need_dx ? py::object(dx) : py::object(py::none()), dw, db);
}

template <typename T>
void def_batchnorm(py::module_& m) {
  m.def("batch_norm_forward", &batch_norm_forward<T>, py::arg("x"), py::arg("weight"), py::arg("bias"),
        py::arg("mean"), py::arg("var"), py::arg("eps") = 1e-5,
        "x [N, C, L] -> (y, mean [C], invstd [C], var [C] biased); mean/var None: computed (training), else used "
        "(eval); weight/bias [C] or None (cpp_src/kernels_batchnorm.cpp)");
  m.def("batch_norm_backward", &batch_norm_backward<T>, py::arg("dy"), py::arg("x"), py::arg("weight"),
        py::arg("mean"), py::arg("invstd"), py::arg("training"), py::arg("need_dx") = true,
        "(dx [N, C, L] or None, dweight [C], dbias [C]) from the forward's mean/invstd; weight [C] or None");
}

}  // namespace

TL_REGISTER(kernels) {
  def_batchnorm<float>(m);
  def_batchnorm<double>(m);
}
