// quant_fp8.cpp — FP8 E4M3 ("fn": finite + NaN) and E5M2 encode / decode for tinylearn.quant.fp8, bit-exact with
// torch's x.to(torch.float8_e4m3fn / torch.float8_e5m2) and .float() (checked in tests/test_quant_fp8.py on a dense
// sample of all float32 bit patterns by default, on all 2^32 with TINYLEARN_EXHAUSTIVE=1).
//
// Encode (float32 bits u, a = u & 0x7FFFFFFF, M mantissa bits, exponent bias B, shift = 23 - M):
//   normal range  r = a - ((127 - B) << 23)                   (rebias the exponent in place)
//                 code = (r + 2^(shift-1) - 1 + ((r >> shift) & 1)) >> shift     round half to even on the
//                 dropped bits; a carry out of the mantissa runs into the exponent field by integer addition
//   subnormal     a < bits(2^(1-B)):  code = rint(|x| * 2^(B - 1 + M))  (exact power-of-two scaling, then RNE)
//   overflow      code > max code, or |x| = inf:  E4M3 -> max (0x7E = 448, torch saturates; there is no inf)
//                 E5M2 -> inf (0x7C) like torch, or max (0x7B = 57344) with saturate=true
//   NaN           0x7F | sign (both formats, like torch);  the sign bit is OR-ed in last (-0 -> 0x80)
// Decode: E5M2 is the upper byte of an IEEE fp16; E4M3 magnitude << 7 is an fp16 with the exponent 8 too small,
// so the SIMD paths convert through fp16 (F16C vcvtph2ps: exact, NaN payloads like torch) and the scalar path
// reads a 256-entry table built with the same bit rules. E4M3 NaN (0x7F / 0xFF) decodes to 0x7FF00000 | sign,
// E5M2 NaNs to the fp16->fp32 quieted pattern (0x7FE00000, 0x7FC00000, 0x7FE00000), as torch does.
//
// Versions ladder (version=, every rung bit-identical): v0_scalar | v1_simd (AVX-512 or AVX2, chosen at run time
// through cpu_features.h; TINYLEARN_CPU_FEATURES forces a level) | v2_threads (v1 over OpenMP threads, chunks of
// >= kFp8Grain elements; smaller inputs stay on the calling thread). fp8_isa() names the level v1/v2 take now.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "common.h"
#include "cpu_features.h"
#include "registry.h"

namespace py = pybind11;

namespace {

enum class F8Isa { scalar, avx2, avx512 };

constexpr int64_t kFp8Grain = 1 << 16;

F8Isa fp8_isa() {
  if (tl::cpu_has("avx512f") && tl::cpu_has("avx512bw") && tl::cpu_has("avx512vl")) return F8Isa::avx512;
  if (tl::cpu_has("avx2") && tl::cpu_has("f16c")) return F8Isa::avx2;
  return F8Isa::scalar;
}

const char* fp8_isa_name(F8Isa i) { return i == F8Isa::avx512 ? "avx512" : i == F8Isa::avx2 ? "avx2" : "scalar"; }

// Format constants.
struct F8Fmt {
  uint32_t min_normal;  // float32 bits of the smallest normal FP8 magnitude 2^(1-B)
  uint32_t rebias;      // (127 - B) << 23
  int shift;            // 23 - M
  float sub_scale;      // 2^(B - 1 + M)
  uint32_t max_code;    // largest finite magnitude code
  uint32_t over_code;   // what overflow / inf becomes
  bool e4m3;
};

F8Fmt make_fmt(const std::string& fmt, bool saturate) {
  if (fmt == "e4m3") return {uint32_t(127 + 1 - 7) << 23, uint32_t(127 - 7) << 23, 20, 512.0f, 0x7E, 0x7E, true};
  if (fmt == "e5m2")
    return {uint32_t(127 + 1 - 15) << 23, uint32_t(127 - 15) << 23, 21, 65536.0f, 0x7B, saturate ? 0x7Bu : 0x7Cu,
            false};
  tl::value_error("fmt: unknown FP8 format '" + fmt + "' (choose 'e4m3' or 'e5m2')");
}

#if defined(__clang__)
#define TL_F8_NO_VECTORIZE
#define TL_F8_LOOP_SCALAR _Pragma("clang loop vectorize(disable) interleave(disable)")
#elif defined(__GNUC__)
#define TL_F8_NO_VECTORIZE __attribute__((optimize("no-tree-vectorize")))
#define TL_F8_LOOP_SCALAR
#else
#define TL_F8_NO_VECTORIZE
#define TL_F8_LOOP_SCALAR
#endif

// ------------------------------------------------------------------------------------------------- scalar
inline uint8_t encode_one(uint32_t u, const F8Fmt& f) {
  const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
  uint32_t code;
  if (a < f.min_normal) {
    float fa;
    std::memcpy(&fa, &a, 4);
    code = uint32_t(std::nearbyint(fa * f.sub_scale));
  } else {
    const uint32_t r = a - f.rebias;
    code = (r + (1u << (f.shift - 1)) - 1u + ((r >> f.shift) & 1u)) >> f.shift;
  }
  if (code > f.max_code || a >= 0x7F800000u) code = f.over_code;
  if (a > 0x7F800000u) code = 0x7F;
  return uint8_t(code | sign);
}

TL_F8_NO_VECTORIZE void encode_scalar(const float* x, uint8_t* c, int64_t n, const F8Fmt& f) {
  TL_F8_LOOP_SCALAR
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    c[i] = encode_one(u, f);
  }
}

uint32_t decode_bits(uint32_t c, bool e4m3) {
  const uint32_t sign = (c & 0x80u) << 24, mag = c & 0x7Fu;
  if (e4m3) {
    if (mag == 0x7F) return sign | 0x7FF00000u;
    const uint32_t e = mag >> 3, m = mag & 7u;
    if (e == 0) {  // subnormal m * 2^-9 (exact in float32)
      const float v = float(m) * (1.0f / 512.0f);
      uint32_t b;
      std::memcpy(&b, &v, 4);
      return sign | b;
    }
    return sign | ((e + 120u) << 23) | (m << 20);
  }
  const uint32_t e = mag >> 2, m = mag & 3u;
  if (e == 31) return sign | 0x7F800000u | (m << 21) | (m ? 0x400000u : 0u);  // inf, quieted NaNs
  if (e == 0) {
    const float v = float(m) * (1.0f / 65536.0f);
    uint32_t b;
    std::memcpy(&b, &v, 4);
    return sign | b;
  }
  return sign | ((e + 112u) << 23) | (m << 21);
}

struct F8Table {
  float v[2][256];
  F8Table() {
    for (int k = 0; k < 2; ++k)
      for (uint32_t c = 0; c < 256; ++c) {
        const uint32_t b = decode_bits(c, k == 0);
        std::memcpy(&v[k][c], &b, 4);
      }
  }
};
const F8Table& fp8_lut() {
  static const F8Table t;
  return t;
}

TL_F8_NO_VECTORIZE void decode_scalar(const uint8_t* c, float* x, int64_t n, bool e4m3) {
  const float* t = fp8_lut().v[e4m3 ? 0 : 1];
  TL_F8_LOOP_SCALAR
  for (int64_t i = 0; i < n; ++i) x[i] = t[c[i]];
}

// ------------------------------------------------------------------------------------------------- AVX2
__attribute__((target("avx2,f16c"))) inline __m256i enc8_avx2(const float* p, const F8Fmt& f) {
  const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i minn = _mm256_set1_epi32(int(f.min_normal));
  __m256i r = _mm256_sub_epi32(_mm256_max_epu32(a, minn), _mm256_set1_epi32(int(f.rebias)));
  const __m128i sh = _mm_cvtsi32_si128(f.shift);
  const __m256i lsb = _mm256_and_si256(_mm256_srl_epi32(r, sh), _mm256_set1_epi32(1));
  r = _mm256_add_epi32(r, _mm256_add_epi32(_mm256_set1_epi32((1 << (f.shift - 1)) - 1), lsb));
  r = _mm256_srl_epi32(r, sh);
  const __m256 fs = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(f.sub_scale));
  const __m256i sub = _mm256_cvttps_epi32(_mm256_round_ps(fs, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  // a < 2^31 in every lane, so signed compares are exact
  __m256i code = _mm256_blendv_epi8(r, sub, _mm256_cmpgt_epi32(minn, a));
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  const __m256i over = _mm256_or_si256(_mm256_cmpgt_epi32(code, _mm256_set1_epi32(int(f.max_code))),
                                       _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F7FFFFF)));
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(int(f.over_code)), over);
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7F), _mm256_cmpgt_epi32(a, inf));
  return _mm256_or_si256(code, sign);
}

__attribute__((target("avx2,f16c"))) void encode_avx2(const float* x, uint8_t* c, int64_t n, const F8Fmt& f) {
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = enc8_avx2(x + i, f), b = enc8_avx2(x + i + 8, f);
    const __m256i cc = enc8_avx2(x + i + 16, f), d = enc8_avx2(x + i + 24, f);
    __m256i r = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(cc, d));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + i), _mm256_permutevar8x32_epi32(r, perm));
  }
  encode_scalar(x + i, c + i, n - i, f);
}

// 8 codes -> 8 float32 through fp16
__attribute__((target("avx2,f16c"))) inline __m256 dec8_avx2(__m128i c16, bool e4m3) {
  if (!e4m3) return _mm256_cvtph_ps(_mm_slli_epi16(c16, 8));
  const __m128i mag = _mm_and_si128(c16, _mm_set1_epi16(0x7F));
  const __m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7), _mm_slli_epi16(_mm_and_si128(c16, _mm_set1_epi16(0x80)), 8));
  __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
  const __m128i nan16 = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7F));
  const __m256i nan = _mm256_cvtepi16_epi32(nan16);
  const __m256i sgn = _mm256_slli_epi32(_mm256_and_si256(_mm256_cvtepu16_epi32(c16), _mm256_set1_epi32(0x80)), 24);
  const __m256 nanv = _mm256_castsi256_ps(_mm256_or_si256(sgn, _mm256_set1_epi32(0x7FF00000)));
  return _mm256_blendv_ps(v, nanv, _mm256_castsi256_ps(nan));
}

__attribute__((target("avx2,f16c"))) void decode_avx2(const uint8_t* c, float* x, int64_t n, bool e4m3) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i c16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + i)));
    _mm256_storeu_ps(x + i, dec8_avx2(c16, e4m3));
  }
  decode_scalar(c + i, x + i, n - i, e4m3);
}

// ------------------------------------------------------------------------------------------------- AVX-512
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i enc16_avx512(__m512i u, const F8Fmt& f) {
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i minn = _mm512_set1_epi32(int(f.min_normal));
  __m512i r = _mm512_sub_epi32(_mm512_max_epu32(a, minn), _mm512_set1_epi32(int(f.rebias)));
  const __m128i sh = _mm_cvtsi32_si128(f.shift);
  const __m512i lsb = _mm512_and_si512(_mm512_srl_epi32(r, sh), _mm512_set1_epi32(1));
  r = _mm512_srl_epi32(_mm512_add_epi32(r, _mm512_add_epi32(_mm512_set1_epi32((1 << (f.shift - 1)) - 1), lsb)), sh);
  const __m512 fs = _mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(f.sub_scale));
  const __m512i sub = _mm512_cvt_roundps_epi32(fs, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512i code = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(a, minn), r, sub);
  const __mmask16 over = _mm512_cmpgt_epu32_mask(code, _mm512_set1_epi32(int(f.max_code))) |
                         _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
  code = _mm512_mask_blend_epi32(over, code, _mm512_set1_epi32(int(f.over_code)));
  code = _mm512_mask_blend_epi32(_mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000)), code,
                                 _mm512_set1_epi32(0x7F));
  return _mm512_or_si512(code, sign);
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void encode_avx512(const float* x, uint8_t* c, int64_t n,
                                                                         const F8Fmt& f) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i a = enc16_avx512(_mm512_loadu_si512(x + i), f);
    const __m512i b = enc16_avx512(_mm512_loadu_si512(x + i + 16), f);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(c + i), _mm512_cvtepi32_epi8(a));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(c + i + 16), _mm512_cvtepi32_epi8(b));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    _mm512_mask_cvtepi32_storeu_epi8(c + i, m, enc16_avx512(_mm512_maskz_loadu_epi32(m, x + i), f));
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 dec16_avx512(__m128i b, bool e4m3) {
  const __m256i c16 = _mm256_cvtepu8_epi16(b);
  if (!e4m3) return _mm512_cvtph_ps(_mm256_slli_epi16(c16, 8));
  const __m256i mag = _mm256_and_si256(c16, _mm256_set1_epi16(0x7F));
  const __m256i h =
      _mm256_or_si256(_mm256_slli_epi16(mag, 7), _mm256_slli_epi16(_mm256_and_si256(c16, _mm256_set1_epi16(0x80)), 8));
  const __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F));
  const __m512i sgn = _mm512_slli_epi32(_mm512_and_si512(_mm512_cvtepu8_epi32(b), _mm512_set1_epi32(0x80)), 24);
  return _mm512_mask_blend_ps(nan, v, _mm512_castsi512_ps(_mm512_or_si512(sgn, _mm512_set1_epi32(0x7FF00000))));
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void decode_avx512(const uint8_t* c, float* x, int64_t n,
                                                                         bool e4m3) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm512_storeu_ps(x + i, dec16_avx512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i)), e4m3));
    _mm512_storeu_ps(x + i + 16, dec16_avx512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i + 16)), e4m3));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, m, dec16_avx512(_mm_maskz_loadu_epi8(m, c + i), e4m3));
  }
}

// ------------------------------------------------------------------------------------------------- drivers
// One pass of an encode or decode row function over n elements: chunks of kFp8Grain on threads for v2, the
// function of the chosen ISA on each chunk.
template <class In, class Out, class Arg, class Fn>
void fp8_run_paths(const In* in, Out* out, int64_t n, tl::Rung ver, F8Isa isa, const Arg& arg, Fn scalar_fn,
                   Fn avx2_fn, Fn avx512_fn) {
  tl::run_chunks(n, kFp8Grain, ver == tl::Rung::threads, [&](int64_t b, int64_t e) {
    if (isa == F8Isa::avx512)
      avx512_fn(in + b, out + b, e - b, arg);
    else if (isa == F8Isa::avx2)
      avx2_fn(in + b, out + b, e - b, arg);
    else
      scalar_fn(in + b, out + b, e - b, arg);
  });
}

py::array_t<uint8_t> fp8_encode(py::array_t<float, py::array::c_style> x, const std::string& fmt, bool saturate,
                                const std::string& version) {
  const tl::Rung ver = tl::parse_rung(version, "fp8_encode");
  const F8Fmt f = make_fmt(fmt, saturate);
  py::array_t<uint8_t> out(std::vector<ssize_t>(x.shape(), x.shape() + x.ndim()));
  const float* px = x.data();
  uint8_t* po = out.mutable_data();
  const int64_t n = x.size();
  const F8Isa isa = ver == tl::Rung::scalar ? F8Isa::scalar : fp8_isa();
  py::gil_scoped_release release;
  fp8_run_paths(px, po, n, ver, isa, f, encode_scalar, encode_avx2, encode_avx512);
  return out;
}

py::array_t<float> fp8_decode(py::array_t<uint8_t, py::array::c_style> c, const std::string& fmt,
                              const std::string& version) {
  const tl::Rung ver = tl::parse_rung(version, "fp8_decode");
  const bool e4m3 = make_fmt(fmt, false).e4m3;
  py::array_t<float> out(std::vector<ssize_t>(c.shape(), c.shape() + c.ndim()));
  const uint8_t* pc = c.data();
  float* po = out.mutable_data();
  const int64_t n = c.size();
  const F8Isa isa = ver == tl::Rung::scalar ? F8Isa::scalar : fp8_isa();
  fp8_lut();  // build the table before threads start
  py::gil_scoped_release release;
  fp8_run_paths(pc, po, n, ver, isa, e4m3, decode_scalar, decode_avx2, decode_avx512);
  return out;
}

}  // namespace

TL_REGISTER(quant_fp8) {
  m.doc() = "FP8 E4M3 / E5M2 encode (RNE, torch's overflow rules) and decode: v0_scalar / v1_simd / v2_threads";
  m.def("fp8_encode", &fp8_encode, py::arg("x"), py::arg("fmt") = "e4m3", py::arg("saturate") = false,
        py::arg("version") = "auto",
        "uint8 FP8 codes of float32 x, bit-exact with torch's float8 casts (saturate: E5M2 overflow -> +-57344)");
  m.def("fp8_decode", &fp8_decode, py::arg("codes"), py::arg("fmt") = "e4m3", py::arg("version") = "auto",
        "float32 values of uint8 FP8 codes (NaN bit patterns as torch's .float())");
  m.def(
      "fp8_isa", []() { return std::string(fp8_isa_name(fp8_isa())); },
      "SIMD level v1_simd / v2_threads take now: 'scalar' | 'avx2' | 'avx512' (after TINYLEARN_CPU_FEATURES)");
}
