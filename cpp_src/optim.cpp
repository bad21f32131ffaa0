// optim.cpp — tinylearn._C.optim: fused optimizer updates for tinylearn.optim (one pass over memory instead of 4-8
// numpy passes).
//
// Versions (each checked against torch.optim and the numpy path in tests/test_optim.py):
//   sgd_step   torch.optim.SGD: g += wd*w; b = mu*b + (1-dampening)*g (b = g on the first step);
//              g = nesterov ? g + mu*b : b; w -= lr*g                                  float32 / float64
//   adam_step  torch.optim.Adam / AdamW (decoupled=True: w *= 1 - lr*wd first): m = b1 m + (1-b1) g;
//              v = b2 v + (1-b2) g^2; (amsgrad: vmax = max(vmax, v)); w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) +
//              eps)
// The optimizer update is memory-bound (~3-5 arrays streamed per element), so fusing the passes is the whole win;
// OpenMP splits only very large arrays (>= parallel_min elements, default 4M = 16 MB of float32; the argument
// exists so a benchmark can select the old 256k threshold as a rung).
//
// Why not from 256k elements (the threshold until issue 18): in a training step the optimizer runs between numpy
// GEMMs, and numpy's OpenBLAS keeps its worker thread spinning for a while after each GEMM. At 2 threads on 2
// cores an OpenMP region here then has to preempt that spinning worker (a scheduler time slice, ~ms) and its own
// worker spins afterwards into the next forward GEMM. Measured on the 2-core dev box, MLP 784-512-512-10 SGD
// step: the update took ~3 ms at 2 threads against ~0.3 ms on one thread. One thread streams a 400k-element
// momentum update (~8 MB of traffic) in ~0.3 ms, already below torch's foreach SGD.
#include <cmath>
#include <string>

#include "registry.h"

namespace py = pybind11;

namespace {

constexpr ssize_t kOptimParallelMin = ssize_t(1) << 22;

template <typename T>
using Arr = py::array_t<T, py::array::c_style>;

template <typename T>
void check_same(const char* fn, const char* name, const Arr<T>& a, ssize_t n) {
  if (a.size() != n)
    tl::value_error(std::string(fn) + ": " + name + " has " + std::to_string(a.size()) + " elements, expected " +
                    std::to_string(n));
}

// Branch-free inner loop per configuration (compile-time flags) with restrict pointers so it vectorises.
template <typename T, bool kWd, bool kMom, bool kNesterov, bool kFirst>
void sgd_loop(T* __restrict pw, const T* __restrict pg, T* __restrict pb, ssize_t n, T lr, T mu, T damp, T wd, T sign,
              ssize_t par_min) {
#pragma omp parallel for simd schedule(static) if (n >= par_min)
  for (ssize_t i = 0; i < n; ++i) {
    T gi = sign * pg[i];
    if constexpr (kWd) gi += wd * pw[i];
    if constexpr (kMom) {
      T b;
      if constexpr (kFirst)
        b = gi;
      else
        b = mu * pb[i] + damp * gi;
      pb[i] = b;
      if constexpr (kNesterov)
        gi = gi + mu * b;
      else
        gi = b;
    }
    pw[i] -= lr * gi;
  }
}

template <typename T>
void sgd_step(Arr<T> w, Arr<T> g, Arr<T> buf, double lr, double momentum, double dampening, double weight_decay,
              bool nesterov, bool maximize, bool first, ssize_t parallel_min) {
  const ssize_t n = w.size();
  check_same("sgd_step", "g", g, n);
  if (momentum != 0.0) check_same("sgd_step", "buf", buf, n);
  T* pw = w.mutable_data();
  const T* pg = g.data();
  T* pb = momentum != 0.0 ? buf.mutable_data() : nullptr;
  const T tlr = static_cast<T>(lr), mu = static_cast<T>(momentum), damp = static_cast<T>(1.0 - dampening),
          wd = static_cast<T>(weight_decay), sign = maximize ? T(-1) : T(1);
  const bool has_wd = weight_decay != 0.0;
  py::gil_scoped_release release;
  if (!pb) {
    if (has_wd)
      sgd_loop<T, true, false, false, false>(pw, pg, pb, n, tlr, mu, damp, wd, sign, parallel_min);
    else
      sgd_loop<T, false, false, false, false>(pw, pg, pb, n, tlr, mu, damp, wd, sign, parallel_min);
    return;
  }
#define TL_SGD(WD, NES, FIRST) \
  sgd_loop<T, WD, true, NES, FIRST>(pw, pg, pb, n, tlr, mu, damp, wd, sign, parallel_min)
  if (has_wd) {
    if (nesterov) {
      if (first)
        TL_SGD(true, true, true);
      else
        TL_SGD(true, true, false);
    } else {
      if (first)
        TL_SGD(true, false, true);
      else
        TL_SGD(true, false, false);
    }
  } else {
    if (nesterov) {
      if (first)
        TL_SGD(false, true, true);
      else
        TL_SGD(false, true, false);
    } else {
      if (first)
        TL_SGD(false, false, true);
      else
        TL_SGD(false, false, false);
    }
  }
#undef TL_SGD
}

template <typename T>
void adam_step(Arr<T> w, Arr<T> g, Arr<T> m, Arr<T> v, Arr<T> vmax, double lr, double beta1, double beta2, double eps,
               double weight_decay, long step, bool decoupled, bool amsgrad, bool maximize, ssize_t parallel_min) {
  const ssize_t n = w.size();
  check_same("adam_step", "g", g, n);
  check_same("adam_step", "exp_avg", m, n);
  check_same("adam_step", "exp_avg_sq", v, n);
  if (amsgrad) check_same("adam_step", "max_exp_avg_sq", vmax, n);
  if (step < 1) tl::value_error("adam_step: step must be >= 1, got " + std::to_string(step));
  T* __restrict pw = w.mutable_data();
  const T* __restrict pg = g.data();
  T* __restrict pm = m.mutable_data();
  T* __restrict pv = v.mutable_data();
  T* px = amsgrad ? vmax.mutable_data() : nullptr;
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2s = std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step)));
  const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2), ob1 = static_cast<T>(1.0 - beta1),
          ob2 = static_cast<T>(1.0 - beta2), teps = static_cast<T>(eps), step_size = static_cast<T>(lr / bc1),
          tbc2s = static_cast<T>(bc2s), wd = static_cast<T>(weight_decay),
          decay = static_cast<T>(1.0 - lr * weight_decay);
  py::gil_scoped_release release;
#pragma omp parallel for schedule(static) if (n >= parallel_min)
  for (ssize_t i = 0; i < n; ++i) {
    T gi = maximize ? -pg[i] : pg[i];
    T wi = pw[i];
    if (weight_decay != 0.0) {
      if (decoupled)
        wi *= decay;
      else
        gi += wd * wi;
    }
    const T mi = b1 * pm[i] + ob1 * gi;
    T vi = b2 * pv[i] + ob2 * (gi * gi);
    pm[i] = mi;
    pv[i] = vi;
    if (px) {
      vi = px[i] > vi ? px[i] : vi;
      px[i] = vi;
    }
    const T denom = std::sqrt(vi) / tbc2s + teps;
    pw[i] = wi - step_size * (mi / denom);
  }
}

}  // namespace

TL_REGISTER(optim) {
  m.doc() = "Fused optimizer updates for tinylearn.optim (in place on C-contiguous float32/float64 arrays)";
  m.def("sgd_step", &sgd_step<float>, py::arg("w").noconvert(), py::arg("g").noconvert(), py::arg("buf").noconvert(),
        py::arg("lr"), py::arg("momentum"), py::arg("dampening"), py::arg("weight_decay"), py::arg("nesterov"),
        py::arg("maximize"), py::arg("first"), py::arg("parallel_min") = kOptimParallelMin);
  m.def("sgd_step", &sgd_step<double>, py::arg("w").noconvert(), py::arg("g").noconvert(), py::arg("buf").noconvert(),
        py::arg("lr"), py::arg("momentum"), py::arg("dampening"), py::arg("weight_decay"), py::arg("nesterov"),
        py::arg("maximize"), py::arg("first"), py::arg("parallel_min") = kOptimParallelMin);
  m.def("adam_step", &adam_step<float>, py::arg("w").noconvert(), py::arg("g").noconvert(),
        py::arg("exp_avg").noconvert(), py::arg("exp_avg_sq").noconvert(), py::arg("max_exp_avg_sq").noconvert(),
        py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("step"),
        py::arg("decoupled"), py::arg("amsgrad"), py::arg("maximize"), py::arg("parallel_min") = kOptimParallelMin);
  m.def("adam_step", &adam_step<double>, py::arg("w").noconvert(), py::arg("g").noconvert(),
        py::arg("exp_avg").noconvert(), py::arg("exp_avg_sq").noconvert(), py::arg("max_exp_avg_sq").noconvert(),
        py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("step"),
        py::arg("decoupled"), py::arg("amsgrad"), py::arg("maximize"), py::arg("parallel_min") = kOptimParallelMin);
}
