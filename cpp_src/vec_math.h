// vec_math.h — a small float32 vector math layer: exp, erf, tanh, log with a scalar, an AVX2+FMA (8 lanes) and an
// AVX-512F (16 lanes) variant, chosen at run time through tl::cpu_has (so TINYLEARN_CPU_FEATURES forces it).
// Why one file (> 500 lines): the three variants of each function must execute the same operations in the same
// order (bit-identical results), which is checked by reading them side by side.
//
// The three variants execute the same operations in the same order (every multiply-add is an explicit fused
// multiply-add, std::fma in the scalar code), so scalar, AVX2 and AVX-512 give bit-identical results per element;
// tests/test_vec_math.py checks that and the max ulp error against float64 numpy/scipy over the float range.
//
//   exp(x)  Cody-Waite: n = round(x log2 e), r = x - n ln2_hi - n ln2_lo (|r| <= ln2/2, ln2_hi has 9 bits so n ln2_hi
//           is exact), e^r = 1 + r + r^2 P(r) (cephes expf polynomial, degree 5), 2^n assembled from exponent bits
//           in two halves 2^(n>>1) 2^(n-(n>>1)) so that one rounding gives std::exp's overflow (x > 88.72 -> inf)
//           and gradual underflow (denormal results down to x ~ -103.97, then 0); x clamped to [-104, 89] first.
//   erf(x)  |x| < 1: x P(x^2) (degree 6, least-squares fit of erf(x)/x, rel. err 1.4e-9);
//           1 <= |x| < 4: 1 - e^{-x^2} Q(|x| - 2.5) (Q: degree-11 fit of erfcx = e^{x^2} erfc(x), rel. 1.5e-7;
//           erfc <= 0.16 there so its error shrinks in 1 - erfc; e^{-x^2} by exp_mid: exp without the clamps and
//           the split scale, valid for -x^2 in [-16, -1]); |x| >= 4: clamped to 4, where the same formula rounds
//           to exactly +-1 (erf(4) = 1 - 1.5e-8). No division (an earlier fit in 1/|x| needed one: vdivps is the
//           slowest instruction of the 8-lane GELU); erf_core skips the NaN rule for callers that do not need it.
//   gelu_erf(u) = u Phi(u) = u/2 (1 + erf(u/sqrt2)) for the bias+GELU kernel, without erf: one erfc-type
//           evaluation Phi(-|u|) = e^{-u^2/2} S(|u|/(|u|+4)) (S a degree-7 fit of erfcx, no blend of two
//           polynomials), then max(u, 0) - |u| Phi(-|u|) for either sign: relative accuracy also in the negative tail,
//           where u/2 (1 + erf) cancels (6.6 ulp max for u >= -5, measured on every 3rd float; h + h erf_core:
//           6.5e5 ulp at -5). |u| is clamped to 6: abs. error <= 6e-9 below -5. 20 FMA-port operations + 1 division
//           per vector against 34 for h + h erf_core (tests/test_kernels_cpu.py checks the ulp bound per path).
//   tanh(x) |x| < 0.625: x + x^3 P(x^2) (degree 5 fit); else 1 - 2 / (e^{2|x|} + 1) with the sign copied back.
//   log(x)  x = 2^e m with m in [sqrt(1/2), sqrt(2)) (denormals scaled by 2^23 first), s = (m-1)/(m+1),
//           log m = 2 atanh(s) = 2s + 2s s^2 (1/3 + s^2/5 + ... + s^8/11) (|s| <= 0.172: series error 5e-11),
//           log x = e ln2_hi + (e ln2_lo + log m).
// Special values follow std::: nan -> nan, exp(-inf) = 0, exp(inf) = inf, erf(+-inf) = +-1, tanh(+-inf) = +-1,
// erf/tanh(-0) = -0, log(0) = -inf, log(x < 0) = nan, log(inf) = inf.
//
// Kernels use the vector functions directly (vm::avx2::exp, vm::avx512::exp) inside their own target-attributed
// row loops; the array entry points (exp_array ...) serve the accuracy tests (_C.kernels.vec_exp ...).
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cpu_features.h"

namespace tl {
namespace vm {

enum class Isa { scalar = 0, avx2 = 1, avx512 = 2 };

inline bool isa_available(Isa i) {
  switch (i) {
    case Isa::scalar:
      return true;
    case Isa::avx2:
      return cpu_has("avx2") && cpu_has("fma");
    case Isa::avx512:
      return cpu_has("avx512f");
  }
  return false;
}

// The best path after TINYLEARN_CPU_FEATURES (read on every call).
inline Isa best_isa() {
  if (isa_available(Isa::avx512)) return Isa::avx512;
  if (isa_available(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}

inline const char* isa_name(Isa i) { return i == Isa::avx512 ? "avx512" : i == Isa::avx2 ? "avx2" : "scalar"; }

// "auto" -> best_isa(); "scalar" | "avx2" | "avx512" -> that path, std::invalid_argument if it cannot run here.
inline Isa parse_isa(const std::string& path, const std::string& fn) {
  if (path == "auto") return best_isa();
  Isa i;
  if (path == "scalar")
    i = Isa::scalar;
  else if (path == "avx2")
    i = Isa::avx2;
  else if (path == "avx512")
    i = Isa::avx512;
  else
    throw std::invalid_argument(fn + ": path must be 'auto', 'scalar', 'avx2' or 'avx512', got '" + path + "'");
  if (!isa_available(i)) {
    const std::string forced = cpu_features_forced();
    throw std::invalid_argument(fn + ": path '" + path + "' is not available on this CPU" +
                                (forced.empty() ? std::string() : " (TINYLEARN_CPU_FEATURES=" + forced + ")"));
  }
  return i;
}

// ---- constants (shared by every variant so that they stay bit-identical) ---------------------------------------
namespace k {
constexpr float kExpLo = -104.0f, kExpHi = 89.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: x + magic - magic rounds x to the nearest integer (|x| < 2^22)
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
constexpr float kErfP[7] = {7.898202140e-05f,  -8.024351373e-04f, 5.190053212e-03f, -2.685480830e-02f,
                            1.128361242e-01f,  -3.761262884e-01f, 1.128379167e+00f};
// erfcx(a) = e^{a^2} erfc(a) on [1, 4] as a degree-11 polynomial in a - 2.5 (relative-weighted least squares on
// Chebyshev nodes; rel. err 1.5e-7 with float32 Horner): no division, unlike a fit in 1/a
constexpr float kErfcxQ[12] = {-3.8357987e-07f, 1.6588418e-06f, -4.0093432e-06f, 1.4425777e-05f,
                               -5.8942707e-05f, 2.1283205e-04f, -7.3371300e-04f, 2.4660928e-03f,
                               -8.0014750e-03f, 2.4938174e-02f, -7.4347360e-02f, 2.1080635e-01f};
constexpr float kErfcxMid = 2.5f;
constexpr float kTanhP[6] = {2.307981356e-03f,  -8.359916095e-03f, 2.177493312e-02f,
                             -5.396022793e-02f, 1.333330959e-01f,  -3.333333326e-01f};
constexpr float kLogP[5] = {1.0f / 11, 1.0f / 9, 1.0f / 7, 1.0f / 5, 1.0f / 3};
constexpr float kErfBig = 4.0f, kErfSmall = 1.0f, kTanhSmall = 0.625f;
constexpr float kSqrtHalf = 0.70710678118654752f, kSqrt2 = 1.41421356237309505f;
constexpr float kFltMin = 1.17549435e-38f, kTwo23 = 8388608.0f;
// gelu_erf (GELU-specific, see the header comment): Phi(-v) = e^{-v^2/2} S(y), y = v / (v + 4) in [0, 0.6]
// (v <= 6), S = erfcx(v/sqrt2)/2 as a degree-7 polynomial in y - kGeluYc (relative-weighted fit on Chebyshev
// nodes, coefficients rounded to float one at a time from the constant term: rel. err 5.1e-8)
constexpr float kGeluVmax = 6.0f, kGeluYc = 0.30000001192092896f;
constexpr float kGeluS[8] = {9.908393770e-02f,  -1.083405241e-01f, -2.270032912e-01f, 7.578768730e-01f,
                             -1.077350974e+00f, 9.821346402e-01f,  -6.266396642e-01f, 1.879376918e-01f};
// e^{r/2} for |r| <= ln2 as a degree-6 polynomial in r (constant 1 and linear 1/2 exact; rel. err 3.2e-9)
constexpr float kGeluExp[7] = {2.159982796e-05f, 2.615257399e-04f, 2.604264533e-03f, 2.083314955e-02f,
                               1.249999851e-01f, 5.000000000e-01f, 1.000000000e+00f};
constexpr float kGeluNHalfLog2e = -0.72134752044448170f;                  // -log2(e)/2
constexpr float kGelu2Ln2Hi = 2.0f * kLn2Hi, kGelu2Ln2Lo = 2.0f * kLn2Lo;  // exact doublings
}  // namespace k

// ---- scalar ----------------------------------------------------------------------------------------------------
namespace scalar {
inline float from_bits(int32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
inline int32_t to_bits(float f) {
  int32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
// bits of 2^n for a float32 exponent n (n + 127 in [1, 254] gives a normal power of two); the shift is done on
// uint32 so an out-of-range (negative) n + 127 is well defined (same bits as two's complement) rather than UB
inline int32_t pow2_bits(int32_t n) {
  return static_cast<int32_t>(static_cast<uint32_t>(n + 127) << 23);
}
template <int N>
inline float horner(const float (&c)[N], float t) {
  float p = c[0];
  for (int i = 1; i < N; ++i) p = std::fma(p, t, c[i]);
  return p;
}
// MAXPS / MINPS semantics (the second operand when either is NaN), so the clamps match the SIMD code
inline float max_ps(float a, float b) { return a > b ? a : b; }
inline float min_ps(float a, float b) { return a < b ? a : b; }

inline float exp(float x) {
  if (x != x) return x + x;
  const float xc = min_ps(max_ps(x, k::kExpLo), k::kExpHi);
  const float n = std::fma(xc, k::kLog2e, k::kMagic) - k::kMagic;
  float r = std::fma(n, -k::kLn2Hi, xc);
  r = std::fma(n, -k::kLn2Lo, r);
  const float p = horner(k::kExpP, r);
  const float r2 = r * r;
  const float y = std::fma(p, r2, r) + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  // shift as uint32: a left shift of a negative int32 is UB before C++20 (n1 + 127 >= 52 here, but keep it defined)
  const float s1 = from_bits(pow2_bits(n1)), s2 = from_bits(pow2_bits(n2));
  return (y * s1) * s2;
}

// exp for x in [-87, 88] (no NaN, no clamp, one scale 2^n): the erf path, where -x^2 lies in [-16, -1]
inline float exp_mid(float x) {
  const float n = std::fma(x, k::kLog2e, k::kMagic) - k::kMagic;
  float r = std::fma(n, -k::kLn2Hi, x);
  r = std::fma(n, -k::kLn2Lo, r);
  const float p = horner(k::kExpP, r);
  const float r2 = r * r;
  const float y = std::fma(p, r2, r) + 1.0f;
  return y * from_bits(pow2_bits(static_cast<int32_t>(n)));  // n + 127 < 0 only outside the documented range
}

// erf without the NaN rule (a NaN x gives +-1): for callers whose result is NaN anyway (GELU: u/2 + u/2 erf).
// |x| is clamped to 4 first, where the big-branch formula rounds to exactly 1 (erfc(4) = 1.5e-8 < 2^-25).
inline float erf_core(float x) {
  const float ax = min_ps(std::fabs(x), k::kErfBig);
  const float t = ax * ax;
  if (ax < k::kErfSmall) return x * horner(k::kErfP, t);
  const float q = horner(k::kErfcxQ, ax - k::kErfcxMid);
  const float e = exp_mid(-t);
  return std::copysign(std::fma(-e, q, 1.0f), x);
}
inline float erf(float x) { return x != x ? x + x : erf_core(x); }

inline float tanh(float x) {
  if (x != x) return x + x;
  const float ax = std::fabs(x);
  if (ax < k::kTanhSmall) {
    const float t = x * x;
    const float p = horner(k::kTanhP, t);
    return std::copysign(std::fma(x * t, p, x), x);  // copysign: tanh(-0) = -0 (x + (+0) would give +0)
  }
  const float e = exp(ax + ax);
  const float q = 2.0f / (e + 1.0f);
  return std::copysign(1.0f - q, x);
}

inline float log(float x) {
  if (x != x) return x + x;
  if (x < 0.0f) return std::numeric_limits<float>::quiet_NaN();
  if (x == 0.0f) return -std::numeric_limits<float>::infinity();
  if (x == std::numeric_limits<float>::infinity()) return x;
  float eadj = 0.0f;
  if (x < k::kFltMin) x *= k::kTwo23, eadj = -23.0f;
  const int32_t b = to_bits(x);
  float e = static_cast<float>((b >> 23) - 127) + eadj;
  float m = from_bits((b & 0x007fffff) | 0x3f800000);  // [1, 2)
  if (m > k::kSqrt2) m *= 0.5f, e += 1.0f;
  const float f = m - 1.0f;
  const float s = f / (f + 2.0f);
  const float s2 = s * s;
  const float R = s2 * horner(k::kLogP, s2);
  const float two_s = s + s;
  const float lm = std::fma(two_s, R, two_s);
  return std::fma(e, k::kLn2Hi, std::fma(e, k::kLn2Lo, lm));
}

// gelu_erf(u) = u Phi(u) (exact-erf GELU) without erf: with v = min(|u|, 6) and P = Phi(-v) = e^{-v^2/2} S(y),
// u Phi(u) = max(u, 0) - v P for both signs (u < 0: u P; u > 0: u - u P). e^{-v^2/2} = 2^n e^{r/2} with
// n = round(-v^2/2 log2 e), r = -w - 2n ln2 - lo where w + lo = v^2 exactly (FMA), so v^2's rounding does not
// reach the tail; 2^n goes into v's exponent bits (v >= 0.83 where n != 0: exact). NaN -> NaN, -0 -> -0, +inf -> inf.
inline float gelu_erf(float u) {
  const float vc = min_ps(std::fabs(u), k::kGeluVmax);
  const float y = vc / (vc + 4.0f);
  const float S = horner(k::kGeluS, y - k::kGeluYc);
  const float w = vc * vc;
  const float lo = std::fma(vc, vc, -w);
  const float nm = std::fma(w, k::kGeluNHalfLog2e, k::kMagic);
  const float n = nm - k::kMagic;
  float r = std::fma(-n, k::kGelu2Ln2Hi, -w);
  r = std::fma(-n, k::kGelu2Ln2Lo, r);
  r = r - lo;
  const float q = horner(k::kGeluExp, r) * S;
  // the low bits of nm hold n: shifted by 23 they are n's exponent increment (uint32 arithmetic wraps like paddd)
  const float vs = from_bits(static_cast<int32_t>(static_cast<uint32_t>(to_bits(vc)) +
                                                  (static_cast<uint32_t>(to_bits(nm)) << 23)));
  return std::fma(-vs, q, max_ps(0.0f, u));
}
}  // namespace scalar

// ---- AVX2 + FMA (8 lanes) -------------------------------------------------------------------------------------
#define TL_AVX2 __attribute__((target("avx2,fma")))
namespace avx2 {
template <int N>
TL_AVX2 inline __m256 horner(const float (&c)[N], __m256 t) {
  __m256 p = _mm256_set1_ps(c[0]);
  for (int i = 1; i < N; ++i) p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c[i]));
  return p;
}
TL_AVX2 inline __m256 abs(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }
TL_AVX2 inline __m256 copysign(__m256 mag, __m256 sgn) {
  const __m256 sm = _mm256_set1_ps(-0.0f);
  return _mm256_or_ps(_mm256_andnot_ps(sm, mag), _mm256_and_ps(sm, sgn));
}
TL_AVX2 inline __m256 nan_to_self(__m256 y, __m256 x) {
  return _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

TL_AVX2 inline __m256 exp(__m256 x) {
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(k::kExpLo)), _mm256_set1_ps(k::kExpHi));
  const __m256 magic = _mm256_set1_ps(k::kMagic);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(k::kLog2e), magic), magic);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-k::kLn2Hi), xc);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-k::kLn2Lo), r);
  const __m256 p = horner(k::kExpP, r);
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return nan_to_self(_mm256_mul_ps(_mm256_mul_ps(y, s1), s2), x);
}

TL_AVX2 inline __m256 exp_mid(__m256 x) {
  const __m256 magic = _mm256_set1_ps(k::kMagic);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(k::kLog2e), magic), magic);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-k::kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-k::kLn2Lo), r);
  const __m256 p = horner(k::kExpP, r);
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// erf_core: no NaN rule (see scalar::erf_core); min(|x|, 4) (MINPS: NaN -> 4) keeps every lane in exp_mid's range
TL_AVX2 inline __m256 erf_core(__m256 x) {
  const __m256 sm = _mm256_set1_ps(-0.0f);
  const __m256 ax = _mm256_min_ps(_mm256_andnot_ps(sm, x), _mm256_set1_ps(k::kErfBig));
  const __m256 t = _mm256_mul_ps(ax, ax);
  const __m256 small = _mm256_mul_ps(x, horner(k::kErfP, t));
  const __m256 q = horner(k::kErfcxQ, _mm256_sub_ps(ax, _mm256_set1_ps(k::kErfcxMid)));
  const __m256 e = exp_mid(_mm256_xor_ps(t, sm));  // e^{-t}; meaningless where |x| < 1: blended away
  const __m256 big = _mm256_or_ps(_mm256_fnmadd_ps(e, q, _mm256_set1_ps(1.0f)), _mm256_and_ps(sm, x));  // >= 0
  return _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(k::kErfSmall), _CMP_LT_OQ));
}
TL_AVX2 inline __m256 erf(__m256 x) { return nan_to_self(erf_core(x), x); }

TL_AVX2 inline __m256 tanh(__m256 x) {
  const __m256 ax = abs(x);
  const __m256 t = _mm256_mul_ps(x, x);
  const __m256 small = copysign(_mm256_fmadd_ps(_mm256_mul_ps(x, t), horner(k::kTanhP, t), x), x);
  const __m256 e = exp(_mm256_add_ps(ax, ax));
  const __m256 q = _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f)));
  const __m256 big = copysign(_mm256_sub_ps(_mm256_set1_ps(1.0f), q), x);
  const __m256 y = _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(k::kTanhSmall), _CMP_LT_OQ));
  return nan_to_self(y, x);
}

TL_AVX2 inline __m256 log(__m256 x) {
  const __m256 den = _mm256_cmp_ps(x, _mm256_set1_ps(k::kFltMin), _CMP_LT_OQ);
  const __m256 xs = _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(k::kTwo23)), den);
  const __m256i b = _mm256_castps_si256(xs);
  __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b, 23), _mm256_set1_epi32(127)));
  e = _mm256_add_ps(e, _mm256_and_ps(den, _mm256_set1_ps(-23.0f)));
  __m256 m = _mm256_castsi256_ps(
      _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f800000)));
  const __m256 big = _mm256_cmp_ps(m, _mm256_set1_ps(k::kSqrt2), _CMP_GT_OQ);
  m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), big);
  e = _mm256_add_ps(e, _mm256_and_ps(big, _mm256_set1_ps(1.0f)));
  const __m256 f = _mm256_sub_ps(m, _mm256_set1_ps(1.0f));
  const __m256 s = _mm256_div_ps(f, _mm256_add_ps(f, _mm256_set1_ps(2.0f)));
  const __m256 s2 = _mm256_mul_ps(s, s);
  const __m256 R = _mm256_mul_ps(s2, horner(k::kLogP, s2));
  const __m256 two_s = _mm256_add_ps(s, s);
  const __m256 lm = _mm256_fmadd_ps(two_s, R, two_s);
  __m256 y = _mm256_fmadd_ps(e, _mm256_set1_ps(k::kLn2Hi), _mm256_fmadd_ps(e, _mm256_set1_ps(k::kLn2Lo), lm));
  const __m256 zero = _mm256_setzero_ps();
  y = _mm256_blendv_ps(y, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                       _mm256_cmp_ps(x, _mm256_set1_ps(std::numeric_limits<float>::infinity()), _CMP_EQ_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(-std::numeric_limits<float>::infinity()), _mm256_cmp_ps(x, zero, _CMP_EQ_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), _mm256_cmp_ps(x, zero, _CMP_LT_OQ));
  return nan_to_self(y, x);
}

// tail masks: lanes [0, n) set, n in [0, 8]
TL_AVX2 inline __m256i tail_mask(int n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}
// sum of the 8 lanes in the order ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)); scalar code that emulates 8 lanes uses
// the same order (hsum8 below) so that the results are bit-identical
TL_AVX2 inline float hsum(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}
TL_AVX2 inline float hmax(__m256 v) {
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  a = _mm_max_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}
TL_AVX2 inline double hsum(__m256d v) {
  __m128d a = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  a = _mm_add_sd(a, _mm_unpackhi_pd(a, a));
  return _mm_cvtsd_f64(a);
}

template <__m256 (*F)(__m256)>
TL_AVX2 void apply(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, F(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = tail_mask(static_cast<int>(n - i));
    _mm256_maskstore_ps(y + i, m, F(_mm256_maskload_ps(x + i, m)));
  }
}

// gelu_erf: see scalar::gelu_erf (same operations in the same order)
TL_AVX2 inline __m256 gelu_erf(__m256 u) {
  const __m256 vc = _mm256_min_ps(abs(u), _mm256_set1_ps(k::kGeluVmax));
  const __m256 y = _mm256_div_ps(vc, _mm256_add_ps(vc, _mm256_set1_ps(4.0f)));
  const __m256 S = horner(k::kGeluS, _mm256_sub_ps(y, _mm256_set1_ps(k::kGeluYc)));
  const __m256 w = _mm256_mul_ps(vc, vc);
  const __m256 lo = _mm256_fmsub_ps(vc, vc, w);
  const __m256 magic = _mm256_set1_ps(k::kMagic);
  const __m256 nm = _mm256_fmadd_ps(w, _mm256_set1_ps(k::kGeluNHalfLog2e), magic);
  const __m256 n = _mm256_sub_ps(nm, magic);
  __m256 r = _mm256_fnmsub_ps(n, _mm256_set1_ps(k::kGelu2Ln2Hi), w);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(k::kGelu2Ln2Lo), r);
  r = _mm256_sub_ps(r, lo);
  const __m256 q = _mm256_mul_ps(horner(k::kGeluExp, r), S);
  const __m256 vs = _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_castps_si256(vc), _mm256_slli_epi32(_mm256_castps_si256(nm), 23)));
  return _mm256_fnmadd_ps(vs, q, _mm256_max_ps(_mm256_setzero_ps(), u));
}
}  // namespace avx2

// ---- AVX-512F (16 lanes) --------------------------------------------------------------------------------------
#define TL_AVX512 __attribute__((target("avx512f")))
namespace avx512 {
template <int N>
TL_AVX512 inline __m512 horner(const float (&c)[N], __m512 t) {
  __m512 p = _mm512_set1_ps(c[0]);
  for (int i = 1; i < N; ++i) p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(c[i]));
  return p;
}
TL_AVX512 inline __m512 as_ps(__m512i v) { return _mm512_castsi512_ps(v); }
TL_AVX512 inline __m512i as_si(__m512 v) { return _mm512_castps_si512(v); }
TL_AVX512 inline __m512 abs(__m512 x) { return as_ps(_mm512_and_epi32(as_si(x), _mm512_set1_epi32(0x7fffffff))); }
TL_AVX512 inline __m512 copysign(__m512 mag, __m512 sgn) {
  const __m512i sm = _mm512_set1_epi32(int32_t(0x80000000u));
  return as_ps(_mm512_or_epi32(_mm512_andnot_epi32(sm, as_si(mag)), _mm512_and_epi32(sm, as_si(sgn))));
}
TL_AVX512 inline __m512 nan_to_self(__m512 y, __m512 x) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, _mm512_add_ps(x, x));
}

TL_AVX512 inline __m512 exp(__m512 x) {
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(k::kExpLo)), _mm512_set1_ps(k::kExpHi));
  const __m512 magic = _mm512_set1_ps(k::kMagic);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(k::kLog2e), magic), magic);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-k::kLn2Hi), xc);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-k::kLn2Lo), r);
  const __m512 p = horner(k::kExpP, r);
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i n1 = _mm512_srai_epi32(ni, 1), n2 = _mm512_sub_epi32(ni, n1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = as_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
  const __m512 s2 = as_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
  return nan_to_self(_mm512_mul_ps(_mm512_mul_ps(y, s1), s2), x);
}

TL_AVX512 inline __m512 exp_mid(__m512 x) {
  const __m512 magic = _mm512_set1_ps(k::kMagic);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(k::kLog2e), magic), magic);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-k::kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-k::kLn2Lo), r);
  const __m512 p = horner(k::kExpP, r);
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, as_ps(e));
}

TL_AVX512 inline __m512 erf_core(__m512 x) {
  const __m512i sm = _mm512_set1_epi32(int32_t(0x80000000u));
  const __m512 ax = _mm512_min_ps(abs(x), _mm512_set1_ps(k::kErfBig));
  const __m512 t = _mm512_mul_ps(ax, ax);
  const __m512 small = _mm512_mul_ps(x, horner(k::kErfP, t));
  const __m512 q = horner(k::kErfcxQ, _mm512_sub_ps(ax, _mm512_set1_ps(k::kErfcxMid)));
  const __m512 e = exp_mid(as_ps(_mm512_xor_epi32(as_si(t), sm)));
  const __m512 big = _mm512_fnmadd_ps(e, q, _mm512_set1_ps(1.0f));  // >= 0: or in the sign of x
  const __m512 sbig = as_ps(_mm512_or_epi32(as_si(big), _mm512_and_epi32(sm, as_si(x))));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(k::kErfSmall), _CMP_LT_OQ), sbig, small);
}
TL_AVX512 inline __m512 erf(__m512 x) { return nan_to_self(erf_core(x), x); }

TL_AVX512 inline __m512 tanh(__m512 x) {
  const __m512 ax = abs(x);
  const __m512 t = _mm512_mul_ps(x, x);
  const __m512 small = copysign(_mm512_fmadd_ps(_mm512_mul_ps(x, t), horner(k::kTanhP, t), x), x);
  const __m512 e = exp(_mm512_add_ps(ax, ax));
  const __m512 q = _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
  const __m512 big = copysign(_mm512_sub_ps(_mm512_set1_ps(1.0f), q), x);
  const __m512 y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(k::kTanhSmall), _CMP_LT_OQ), big, small);
  return nan_to_self(y, x);
}

TL_AVX512 inline __m512 log(__m512 x) {
  const __mmask16 den = _mm512_cmp_ps_mask(x, _mm512_set1_ps(k::kFltMin), _CMP_LT_OQ);
  const __m512 xs = _mm512_mask_blend_ps(den, x, _mm512_mul_ps(x, _mm512_set1_ps(k::kTwo23)));
  const __m512i b = as_si(xs);
  __m512 e = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(b, 23), _mm512_set1_epi32(127)));
  e = _mm512_mask_add_ps(e, den, e, _mm512_set1_ps(-23.0f));
  __m512 m = as_ps(_mm512_or_epi32(_mm512_and_epi32(b, _mm512_set1_epi32(0x007fffff)), _mm512_set1_epi32(0x3f800000)));
  const __mmask16 big = _mm512_cmp_ps_mask(m, _mm512_set1_ps(k::kSqrt2), _CMP_GT_OQ);
  m = _mm512_mask_mul_ps(m, big, m, _mm512_set1_ps(0.5f));
  e = _mm512_mask_add_ps(e, big, e, _mm512_set1_ps(1.0f));
  const __m512 f = _mm512_sub_ps(m, _mm512_set1_ps(1.0f));
  const __m512 s = _mm512_div_ps(f, _mm512_add_ps(f, _mm512_set1_ps(2.0f)));
  const __m512 s2 = _mm512_mul_ps(s, s);
  const __m512 R = _mm512_mul_ps(s2, horner(k::kLogP, s2));
  const __m512 two_s = _mm512_add_ps(s, s);
  const __m512 lm = _mm512_fmadd_ps(two_s, R, two_s);
  __m512 y = _mm512_fmadd_ps(e, _mm512_set1_ps(k::kLn2Hi), _mm512_fmadd_ps(e, _mm512_set1_ps(k::kLn2Lo), lm));
  const __m512 zero = _mm512_setzero_ps();
  const float inf = std::numeric_limits<float>::infinity();
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(inf), _CMP_EQ_OQ), y, _mm512_set1_ps(inf));
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_EQ_OQ), y, _mm512_set1_ps(-inf));
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), y,
                           _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
  return nan_to_self(y, x);
}

TL_AVX512 inline __mmask16 tail_mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }

template <__m512 (*F)(__m512)>
TL_AVX512 void apply(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, F(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(static_cast<int>(n - i));
    _mm512_mask_storeu_ps(y + i, m, F(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// gelu_erf: see scalar::gelu_erf (same operations in the same order)
TL_AVX512 inline __m512 gelu_erf(__m512 u) {
  const __m512 vc = _mm512_min_ps(abs(u), _mm512_set1_ps(k::kGeluVmax));
  const __m512 y = _mm512_div_ps(vc, _mm512_add_ps(vc, _mm512_set1_ps(4.0f)));
  const __m512 S = horner(k::kGeluS, _mm512_sub_ps(y, _mm512_set1_ps(k::kGeluYc)));
  const __m512 w = _mm512_mul_ps(vc, vc);
  const __m512 lo = _mm512_fmsub_ps(vc, vc, w);
  const __m512 magic = _mm512_set1_ps(k::kMagic);
  const __m512 nm = _mm512_fmadd_ps(w, _mm512_set1_ps(k::kGeluNHalfLog2e), magic);
  const __m512 n = _mm512_sub_ps(nm, magic);
  __m512 r = _mm512_fnmsub_ps(n, _mm512_set1_ps(k::kGelu2Ln2Hi), w);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(k::kGelu2Ln2Lo), r);
  r = _mm512_sub_ps(r, lo);
  const __m512 q = _mm512_mul_ps(horner(k::kGeluExp, r), S);
  const __m512 vs = as_ps(_mm512_add_epi32(as_si(vc), _mm512_slli_epi32(as_si(nm), 23)));
  return _mm512_fnmadd_ps(vs, q, _mm512_max_ps(_mm512_setzero_ps(), u));
}
}  // namespace avx512

// ---- array entry points (accuracy tests, and any caller without its own SIMD loop) ------------------------------
enum class Fn { exp, erf, tanh, log };

inline void apply(Fn f, const float* x, float* y, int64_t n, Isa isa) {
  if (isa == Isa::avx512) {
    switch (f) {
      case Fn::exp:
        return avx512::apply<avx512::exp>(x, y, n);
      case Fn::erf:
        return avx512::apply<avx512::erf>(x, y, n);
      case Fn::tanh:
        return avx512::apply<avx512::tanh>(x, y, n);
      case Fn::log:
        return avx512::apply<avx512::log>(x, y, n);
    }
  }
  if (isa == Isa::avx2) {
    switch (f) {
      case Fn::exp:
        return avx2::apply<avx2::exp>(x, y, n);
      case Fn::erf:
        return avx2::apply<avx2::erf>(x, y, n);
      case Fn::tanh:
        return avx2::apply<avx2::tanh>(x, y, n);
      case Fn::log:
        return avx2::apply<avx2::log>(x, y, n);
    }
  }
  float (*g)(float) = f == Fn::exp ? scalar::exp : f == Fn::erf ? scalar::erf : f == Fn::tanh ? scalar::tanh : scalar::log;
  for (int64_t i = 0; i < n; ++i) y[i] = g(x[i]);
}

}  // namespace vm
}  // namespace tl
