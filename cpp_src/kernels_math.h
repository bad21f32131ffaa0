// kernels_math.h — what the fused CPU kernels (cpp_src/kernels_*.cpp, one file per op) share: the C-contiguous
// array type, the parallel threshold, and branch-free float32 exp/erf/tanh that let `#pragma omp simd` loops
// vectorise (libm calls do not without -ffast-math); float64 uses libm (it exists for gradcheck, not speed).
// _C.kernels.exp_approx / erf_approx expose the float32 versions for the accuracy tests. The `simd*` kernel versions
// use the explicit vector math of vec_math.h instead (AVX2 / AVX-512 / scalar chosen at run time).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common.h"
#include "vec_math.h"

namespace tl {
namespace kern {

template <typename T>
using carr = py::array_t<T, py::array::c_style>;

// Below this many elements a row-wise kernel runs on one thread: waking the OpenMP team costs more than it saves.
constexpr ssize_t kParallelMin = 1 << 15;

// The *_omp versions (vector math from vec_math.h + OpenMP over rows) give each thread at least kGrain elements:
// threads_for(R * C) = min(omp_get_max_threads(), R * C / kGrain), at least 1, so a small input stays on the
// calling thread (no team wake-up) and a medium one wakes only as many threads as it can keep busy.
// `grain` overrides kGrain per call (the row-chunking knob topic 17 tunes; 0 = kGrain): a larger grain keeps
// medium inputs on fewer threads, a smaller one splits them across the team sooner.
constexpr ssize_t kGrain = 1 << 15;
inline int threads_for(ssize_t elems, ssize_t grain = 0) {
  const ssize_t want = elems / (grain > 0 ? grain : kGrain);
  const int nt = n_threads();
  return want < 1 ? 1 : (want < nt ? static_cast<int>(want) : nt);
}

// One always_inline per-item body compiled three times -- the build's baseline, avx2+fma, avx512f (the body has no
// target attribute of its own, so each wrapper inlines it under its own) -- and chosen per call by vm::best_isa()
// (TINYLEARN_CPU_FEATURES forces one): the GroupNorm and BatchNorm kernels' loops are plain C++ with
// `#pragma omp simd`, so the three copies differ only in the vector width the compiler uses.
template <class A, void (*Body)(const A&, ssize_t)>
void isa_copy_base(const A& a, ssize_t k) {
  Body(a, k);
}
template <class A, void (*Body)(const A&, ssize_t)>
TL_AVX2 void isa_copy_avx2(const A& a, ssize_t k) {
  Body(a, k);
}
template <class A, void (*Body)(const A&, ssize_t)>
TL_AVX512 void isa_copy_avx512(const A& a, ssize_t k) {
  Body(a, k);
}
template <class A>
using IsaCopy = void (*)(const A&, ssize_t);
template <class A, void (*Body)(const A&, ssize_t)>
IsaCopy<A> pick_isa_copy() {
  const vm::Isa isa = vm::best_isa();
  return isa == vm::Isa::avx512 ? isa_copy_avx512<A, Body> : isa == vm::Isa::avx2 ? isa_copy_avx2<A, Body>
                                                                                    : isa_copy_base<A, Body>;
}

// Lane-wise partial sums (8 lanes, lane = index % 8) reduced in one fixed order, ((l0+l4)+(l2+l6)) +
// ((l1+l5)+(l3+l7)): the SIMD and the scalar paths of a kernel both end in this, so they agree bit for bit.
template <typename T>
inline T reduce8(const T* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// ---- vectorisable math -----------------------------------------------------------------------------------
// exp(x) = 2^n e^r with n = round(x log2 e), r = x - n ln 2 (Cody-Waite split), e^r by the cephes expf
// polynomial (~1 ulp on [-ln2/2, ln2/2]); out of range -> 0 / inf, NaN -> NaN. Branch-free so loops vectorise.
inline float exp_approx(float x) {
  const float lo = -87.33654475f, hi = 88.37626266f;
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  xc = x != x ? 0.0f : xc;  // NaN: a finite stand-in, so n below is a small integer (int cast of NaN is UB)
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
  // n is in [-126, 128] here, so the biased exponent n + 127 is in [1, 255]; shift it as unsigned
  const uint32_t e = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
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

}  // namespace kern
}  // namespace tl
