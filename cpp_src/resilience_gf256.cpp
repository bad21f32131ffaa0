// resilience_gf256.cpp — GF(2^8) region arithmetic for erasure coding (tinylearn.resilience.erasure, op
// resilience.gf256_matmul): out[i] = XOR_j c[i, j] * src_j, byte-wise in GF(2^8) with polynomial 0x11d, for an
// m x k coefficient matrix (uint8) and k equal-length byte regions. One parity row of a Reed-Solomon stripe is one
// output row (k sources read in one pass); decoding is the same product with the inverted sub-matrix's rows.
// gf256_mul_add(dst, src, c) is the single-source form dst ^= c * src, in place.
//
// Versions (each checked bit-exactly against the numpy reference -- a 256 x 256 product table indexed by
// [c, byte] -- in tests/resilience/test_erasure.py, on lengths that are not multiples of 64 and on misaligned views):
//   scalar   one 256-entry product row per coefficient (built from the log/exp tables): out ^= row[src[t]].
//   avx2     split-nibble shuffle: c*x = c*(x & 15) ^ c*(x >> 4 << 4), two 16-entry tables per coefficient (each
//            broadcast to both 128-bit lanes) looked up by _mm256_shuffle_epi8, 32 bytes per step.
//   avx512   the same with AVX-512BW _mm512_shuffle_epi8, 64 bytes per step (tables broadcast to 4 lanes).
//   Tails shorter than a vector use the scalar row tables; loads/stores are unaligned (any view works).
// "simd" (the default) is the best of avx512 > avx2 > scalar that tl::cpu_has allows (TINYLEARN_CPU_FEATURES forces
// a level). OpenMP splits the length into 64 KiB blocks when the work is large (each block is independent).
#include "common.h"
#include "cpu_features.h"
#include "registry.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

enum class Gf256Path { scalar, avx2, avx512 };

const char* gf256_path_name(Gf256Path p) {
  return p == Gf256Path::avx512 ? "avx512" : p == Gf256Path::avx2 ? "avx2" : "scalar";
}

Gf256Path gf256_pick(const std::string& version) {
  const bool a512 = tl::cpu_has("avx512f") && tl::cpu_has("avx512bw");
  const bool a2 = tl::cpu_has("avx2");
  if (version == "scalar") return Gf256Path::scalar;
  if (version == "avx2") {
    if (!a2) tl::value_error("gf256: version 'avx2' needs AVX2, which this CPU (or TINYLEARN_CPU_FEATURES) lacks");
    return Gf256Path::avx2;
  }
  if (version == "avx512") {
    if (!a512) tl::value_error("gf256: version 'avx512' needs AVX-512F/BW, unavailable here");
    return Gf256Path::avx512;
  }
  if (version == "simd" || version == "auto")
    return a512 ? Gf256Path::avx512 : a2 ? Gf256Path::avx2 : Gf256Path::scalar;
  tl::value_error("gf256: version must be 'simd', 'auto', 'avx512', 'avx2' or 'scalar', got '" + version + "'");
  return Gf256Path::scalar;
}

struct Gf256Tables {
  uint8_t exp[512];
  int log[256];
  Gf256Tables() {
    int x = 1;
    for (int i = 0; i < 255; ++i) {
      exp[i] = uint8_t(x);
      log[x] = i;
      x <<= 1;
      if (x & 0x100) x ^= 0x11d;
    }
    for (int i = 255; i < 512; ++i) exp[i] = exp[i - 255];
    log[0] = 0;
  }
  uint8_t mul(int a, int b) const { return (a == 0 || b == 0) ? 0 : exp[log[a] + log[b]]; }
};

const Gf256Tables& gf256_tables() {
  static const Gf256Tables t;
  return t;
}

// per coefficient: the 256-entry product row and the two 16-entry nibble tables
struct Gf256Coef {
  uint8_t row[256];
  alignas(16) uint8_t lo[16];
  alignas(16) uint8_t hi[16];
  uint8_t c;
};

void gf256_make_coef(uint8_t c, Gf256Coef& out) {
  const Gf256Tables& t = gf256_tables();
  out.c = c;
  for (int x = 0; x < 256; ++x) out.row[x] = t.mul(c, x);
  for (int n = 0; n < 16; ++n) {
    out.lo[n] = out.row[n];
    out.hi[n] = out.row[n << 4];
  }
}

// ---------------------------------------------------------------- one output row over bytes [t0, t1)
// first = true: the row is written (not accumulated), so out needs no zeroing pass
void gf256_row_scalar(uint8_t* out, const uint8_t* const* src, const Gf256Coef* co, int64_t k, int64_t t0,
                      int64_t t1, bool accumulate) {
  if (!accumulate) std::memset(out + t0, 0, size_t(t1 - t0));
  for (int64_t j = 0; j < k; ++j) {
    const uint8_t c = co[j].c;
    if (c == 0) continue;
    const uint8_t* s = src[j];
    if (c == 1) {
      for (int64_t t = t0; t < t1; ++t) out[t] ^= s[t];
    } else {
      const uint8_t* row = co[j].row;
      for (int64_t t = t0; t < t1; ++t) out[t] ^= row[s[t]];
    }
  }
}

__attribute__((target("avx2"))) void gf256_row_avx2(uint8_t* out, const uint8_t* const* src, const Gf256Coef* co,
                                                     int64_t k, int64_t t0, int64_t t1, bool accumulate) {
  const __m256i m15 = _mm256_set1_epi8(15);
  int64_t t = t0;
  for (; t + 32 <= t1; t += 32) {
    __m256i acc = accumulate ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(out + t)) : _mm256_setzero_si256();
    for (int64_t j = 0; j < k; ++j) {
      if (co[j].c == 0) continue;
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[j] + t));
      if (co[j].c == 1) {
        acc = _mm256_xor_si256(acc, x);
        continue;
      }
      const __m256i tl_ = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(co[j].lo)));
      const __m256i th = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(co[j].hi)));
      const __m256i lo = _mm256_and_si256(x, m15), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m15);
      acc = _mm256_xor_si256(acc, _mm256_xor_si256(_mm256_shuffle_epi8(tl_, lo), _mm256_shuffle_epi8(th, hi)));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t), acc);
  }
  if (t < t1) gf256_row_scalar(out, src, co, k, t, t1, accumulate);
}

__attribute__((target("avx512f,avx512bw"))) void gf256_row_avx512(uint8_t* out, const uint8_t* const* src,
                                                                   const Gf256Coef* co, int64_t k, int64_t t0,
                                                                   int64_t t1, bool accumulate) {
  const __m512i m15 = _mm512_set1_epi8(15);
  int64_t t = t0;
  for (; t + 64 <= t1; t += 64) {
    __m512i acc = accumulate ? _mm512_loadu_si512(out + t) : _mm512_setzero_si512();
    for (int64_t j = 0; j < k; ++j) {
      if (co[j].c == 0) continue;
      const __m512i x = _mm512_loadu_si512(src[j] + t);
      if (co[j].c == 1) {
        acc = _mm512_xor_si512(acc, x);
        continue;
      }
      const __m512i tl_ = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(co[j].lo)));
      const __m512i th = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(co[j].hi)));
      const __m512i lo = _mm512_and_si512(x, m15), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m15);
      acc = _mm512_xor_si512(acc, _mm512_xor_si512(_mm512_shuffle_epi8(tl_, lo), _mm512_shuffle_epi8(th, hi)));
    }
    _mm512_storeu_si512(out + t, acc);
  }
  if (t < t1) gf256_row_scalar(out, src, co, k, t, t1, accumulate);
}

void gf256_rows(Gf256Path path, uint8_t* out, int64_t ldo, const uint8_t* const* src, const Gf256Coef* co, int64_t m,
                int64_t k, int64_t L, bool accumulate) {
  constexpr int64_t kBlock = 64 * 1024;  // bytes per OpenMP work item (k sources x 64 KiB stay in L2)
  const int64_t nblocks = (L + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (m * k * L >= (int64_t(1) << 22))
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t t0 = b * kBlock, t1 = std::min(L, t0 + kBlock);
    for (int64_t i = 0; i < m; ++i) {
      uint8_t* o = out + i * ldo;
      const Gf256Coef* ci = co + i * k;
      if (path == Gf256Path::avx512)
        gf256_row_avx512(o, src, ci, k, t0, t1, accumulate);
      else if (path == Gf256Path::avx2)
        gf256_row_avx2(o, src, ci, k, t0, t1, accumulate);
      else
        gf256_row_scalar(o, src, ci, k, t0, t1, accumulate);
    }
  }
}

using Gf256Bytes = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

py::array_t<uint8_t> gf256_matmul_cpp(const Gf256Bytes& coeffs, const std::vector<Gf256Bytes>& sources,
                                      const std::string& version) {
  if (coeffs.ndim() != 2)
    tl::value_error("gf256_matmul: coeffs must be a 2-D uint8 matrix, got " + tl::shape_str(coeffs));
  const int64_t m = coeffs.shape(0), k = coeffs.shape(1);
  if (int64_t(sources.size()) != k)
    tl::value_error("gf256_matmul: coeffs has " + std::to_string(k) + " columns but " +
                    std::to_string(sources.size()) + " sources were given");
  int64_t L = k ? sources[0].size() : 0;
  std::vector<const uint8_t*> src(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    if (sources[size_t(j)].size() != L)
      tl::value_error("gf256_matmul: sources must have equal lengths: source 0 has " + std::to_string(L) +
                      " bytes, source " + std::to_string(j) + " has " + std::to_string(sources[size_t(j)].size()));
    src[size_t(j)] = sources[size_t(j)].data();
  }
  const Gf256Path path = gf256_pick(version);
  std::vector<Gf256Coef> co(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m * k; ++i) gf256_make_coef(coeffs.data()[i], co[size_t(i)]);
  py::array_t<uint8_t> out({m, L});
  if (m == 0 || L == 0) return out;
  uint8_t* po = out.mutable_data();
  {
    py::gil_scoped_release release;
    if (k == 0)
      std::memset(po, 0, size_t(m * L));
    else
      gf256_rows(path, po, L, src.data(), co.data(), m, k, L, false);
  }
  return out;
}

void gf256_mul_add_cpp(py::array dst, const Gf256Bytes& src, int c, const std::string& version) {
  if (c < 0 || c > 255) tl::value_error("gf256_mul_add: c must be in 0..255, got " + std::to_string(c));
  if (!py::isinstance<py::array_t<uint8_t>>(dst) || !(dst.flags() & py::array::c_style) || !dst.writeable())
    tl::value_error("gf256_mul_add: dst must be a writeable C-contiguous uint8 array");
  const int64_t L = dst.size();
  if (src.size() != L)
    tl::value_error("gf256_mul_add: dst has " + std::to_string(L) + " bytes, src has " + std::to_string(src.size()));
  const Gf256Path path = gf256_pick(version);
  Gf256Coef co;
  gf256_make_coef(uint8_t(c), co);
  uint8_t* pd = static_cast<uint8_t*>(dst.mutable_data());
  const uint8_t* ps = src.data();
  py::gil_scoped_release release;
  gf256_rows(path, pd, L, &ps, &co, 1, 1, L, true);
}

}  // namespace

TL_REGISTER(resilience) {
  m.def("gf256_matmul", &gf256_matmul_cpp, py::arg("coeffs"), py::arg("sources"), py::arg("version") = "simd",
        "out[i] = XOR_j coeffs[i, j] * sources[j] in GF(2^8) (poly 0x11d) for an m x k uint8 matrix and k equal-length "
        "byte arrays; returns uint8 [m, L]. Versions simd (best here), avx512, avx2, scalar");
  m.def("gf256_mul_add", &gf256_mul_add_cpp, py::arg("dst"), py::arg("src"), py::arg("c"), py::arg("version") = "simd",
        "dst ^= c * src in GF(2^8), in place (dst: writeable C-contiguous uint8)");
  m.def("gf256_path", [](const std::string& v) { return std::string(gf256_path_name(gf256_pick(v))); },
        py::arg("version") = "simd", "the code path gf256 kernels run for this version on this CPU");
}
