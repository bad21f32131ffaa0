// compress_nf4.cpp — QLoRA's dequantize-on-the-fly matmul (tinylearn.compress.nf4_matmul): y = x · dequant(W)ᵀ for
// x [M, K] fp32 and an NF4 weight W [N, K] stored as flat row-major 4-bit codes (two per byte, the first element of
// each pair in the high nibble), one absmax scale per block of `block_size` consecutive flat elements (blocks may
// straddle rows), the scales either fp32 or double-quantized (int8 codes q, one fp32 step per `dq_block` scales and
// the subtracted mean: s = q * step + mean, resolved to fp32 once per call).
//
// Versions (each checked against the numpy reference "dequantize then matmul" in tests/compress/test_nf4.py,
// llm.c dev/cuda style; all reach the same sums up to fp32 reassociation):
//   scalar   portable loops: decode a panel of 4 weight rows to fp32 (codebook[code] * scale), then 4 dot
//            products per x row.
//   avx2     the same panel; 32 codes per step from 16 bytes (nibbles split with shift/and, interleaved back into
//            order with unpacklo/hi), looked up in the 16-entry codebook by two _mm256_permutevar8x32_ps (entries
//            0-7 and 8-15) blended on code bit 3; dot products with FMA, 4 rows x 8 lanes of accumulators.
//   avx512   16-entry codebook in one zmm: _mm512_permutexvar_ps looks up 16 codes at once; dots with 512-bit FMA.
//   (avx2 and avx512 both run 4 x rows x 4 weight rows per register tile where M allows: 16 accumulators.)
// "simd" (the default) is the best of avx512 > avx2 > scalar that tl::cpu_has allows (TINYLEARN_CPU_FEATURES forces
// a level). OpenMP over panels of N (each thread decodes its own rows into a private buffer: the weight is read
// once per call, x is re-read per panel from cache).
#include "common.h"
#include "cpu_features.h"
#include "registry.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int kNf4Panel = 4;  // weight rows decoded and dotted together

enum class Nf4Path { scalar, avx2, avx512 };

const char* nf4_path_name(Nf4Path p) {
  return p == Nf4Path::avx512 ? "avx512" : p == Nf4Path::avx2 ? "avx2" : "scalar";
}

Nf4Path nf4_pick(const std::string& version) {
  const bool a512 = tl::cpu_has("avx512f") && tl::cpu_has("avx512bw");
  const bool a2 = tl::cpu_has("avx2") && tl::cpu_has("fma");
  if (version == "scalar") return Nf4Path::scalar;
  if (version == "avx2") {
    if (!a2) tl::value_error("nf4_matmul: version 'avx2' needs AVX2+FMA, which this CPU (or TINYLEARN_CPU_FEATURES) lacks");
    return Nf4Path::avx2;
  }
  if (version == "avx512") {
    if (!a512) tl::value_error("nf4_matmul: version 'avx512' needs AVX-512F/BW, unavailable here");
    return Nf4Path::avx512;
  }
  if (version == "simd" || version == "auto") return a512 ? Nf4Path::avx512 : a2 ? Nf4Path::avx2 : Nf4Path::scalar;
  tl::value_error("nf4_matmul: version must be 'simd', 'auto', 'avx512', 'avx2' or 'scalar', got '" + version + "'");
  return Nf4Path::scalar;
}

// ---------------------------------------------------------------- decoding one row's codes (unscaled) into out
// f0: flat index of the row's first element; the row spans codes f0 .. f0 + K - 1
inline void nf4_decode_scalar(const uint8_t* codes, int64_t f0, int64_t K, const float* lut, float* out) {
  for (int64_t k = 0; k < K; ++k) {
    const int64_t f = f0 + k;
    const uint8_t b = codes[f >> 1];
    out[k] = lut[(f & 1) ? (b & 15) : (b >> 4)];
  }
}

__attribute__((target("avx2,fma"))) void nf4_decode_avx2(const uint8_t* codes, int64_t f0, int64_t K,
                                                         const float* lut, float* out) {
  int64_t k = 0;
  if (f0 & 1) {  // odd start: the first element is a low nibble
    out[0] = lut[codes[f0 >> 1] & 15];
    k = 1;
  }
  const __m256 lo_t = _mm256_loadu_ps(lut), hi_t = _mm256_loadu_ps(lut + 8);
  const __m128i m15 = _mm_set1_epi8(15);
  for (; k + 32 <= K; k += 32) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + ((f0 + k) >> 1)));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m15), lo = _mm_and_si128(b, m15);
    const __m128i c0 = _mm_unpacklo_epi8(hi, lo), c1 = _mm_unpackhi_epi8(hi, lo);  // codes 0-15, 16-31 in order
    const __m128i parts[2] = {c0, c1};
    for (int h = 0; h < 2; ++h) {
      const __m128i c = parts[h];
      const __m256i i0 = _mm256_cvtepu8_epi32(c), i1 = _mm256_cvtepu8_epi32(_mm_srli_si128(c, 8));
      const __m256 v0 = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo_t, i0), _mm256_permutevar8x32_ps(hi_t, i0),
                                         _mm256_castsi256_ps(_mm256_slli_epi32(i0, 28)));
      const __m256 v1 = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo_t, i1), _mm256_permutevar8x32_ps(hi_t, i1),
                                         _mm256_castsi256_ps(_mm256_slli_epi32(i1, 28)));
      _mm256_storeu_ps(out + k + 16 * h, v0);
      _mm256_storeu_ps(out + k + 16 * h + 8, v1);
    }
  }
  for (; k < K; ++k) {
    const int64_t f = f0 + k;
    const uint8_t b = codes[f >> 1];
    out[k] = lut[(f & 1) ? (b & 15) : (b >> 4)];
  }
}

__attribute__((target("avx512f,avx512bw"))) void nf4_decode_avx512(const uint8_t* codes, int64_t f0, int64_t K,
                                                                   const float* lut, float* out) {
  int64_t k = 0;
  if (f0 & 1) {
    out[0] = lut[codes[f0 >> 1] & 15];
    k = 1;
  }
  const __m512 t = _mm512_loadu_ps(lut);
  const __m128i m15 = _mm_set1_epi8(15);
  for (; k + 32 <= K; k += 32) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + ((f0 + k) >> 1)));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m15), lo = _mm_and_si128(b, m15);
    const __m128i c0 = _mm_unpacklo_epi8(hi, lo), c1 = _mm_unpackhi_epi8(hi, lo);
    _mm512_storeu_ps(out + k, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(c0), t));
    _mm512_storeu_ps(out + k + 16, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(c1), t));
  }
  for (; k < K; ++k) {
    const int64_t f = f0 + k;
    const uint8_t b = codes[f >> 1];
    out[k] = lut[(f & 1) ? (b & 15) : (b >> 4)];
  }
}

// multiply a decoded row (flat start f0) by its blocks' scales
inline void nf4_scale_row(float* w, int64_t f0, int64_t K, int64_t bs, const float* scales) {
  int64_t k = 0;
  while (k < K) {
    const int64_t f = f0 + k, blk = f / bs, end = std::min<int64_t>(K, (blk + 1) * bs - f0);
    const float s = scales[blk];
    for (int64_t j = k; j < end; ++j) w[j] *= s;
    k = end;
  }
}

// ---------------------------------------------------------------- dots of one x row with a panel of rows
inline void nf4_dots_scalar(const float* x, const float* w, int64_t K, int64_t ldw, int nr, float* y) {
  for (int r = 0; r < nr; ++r) {
    const float* wr = w + r * ldw;
    float acc = 0.f;
    for (int64_t k = 0; k < K; ++k) acc += x[k] * wr[k];
    y[r] = acc;
  }
}

__attribute__((target("avx2,fma"))) inline float nf4_hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) void nf4_dots_avx2(const float* x, const float* w, int64_t K, int64_t ldw,
                                                       int nr, float* y) {
  if (nr != kNf4Panel) return nf4_dots_scalar(x, w, K, ldw, nr, y);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 xv = _mm256_loadu_ps(x + k);
    a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + k), a0);
    a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + ldw + k), a1);
    a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + 2 * ldw + k), a2);
    a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + 3 * ldw + k), a3);
  }
  float s[4] = {nf4_hsum256(a0), nf4_hsum256(a1), nf4_hsum256(a2), nf4_hsum256(a3)};
  for (; k < K; ++k)
    for (int r = 0; r < 4; ++r) s[r] += x[k] * w[r * ldw + k];
  for (int r = 0; r < 4; ++r) y[r] = s[r];
}

__attribute__((target("avx512f,avx512bw"))) void nf4_dots_avx512(const float* x, const float* w, int64_t K,
                                                                 int64_t ldw, int nr, float* y) {
  if (nr != kNf4Panel) return nf4_dots_scalar(x, w, K, ldw, nr, y);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m512 xv = _mm512_loadu_ps(x + k);
    a0 = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w + k), a0);
    a1 = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w + ldw + k), a1);
    a2 = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w + 2 * ldw + k), a2);
    a3 = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w + 3 * ldw + k), a3);
  }
  float s[4] = {_mm512_reduce_add_ps(a0), _mm512_reduce_add_ps(a1), _mm512_reduce_add_ps(a2),
                _mm512_reduce_add_ps(a3)};
  for (; k < K; ++k)
    for (int r = 0; r < 4; ++r) s[r] += x[k] * w[r * ldw + k];
  for (int r = 0; r < 4; ++r) y[r] = s[r];
}

// 4 x rows against the 4-row panel: 16 accumulators, 8 loads per 16 FMAs (twice the 1-row kernel's intensity)
__attribute__((target("avx2,fma"))) void nf4_tile4_avx2(const float* x, int64_t ldx, const float* w, int64_t K,
                                                        float* y, int64_t ldy) {
  __m256 acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 4; ++r) acc[i][r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + K + k), w2 = _mm256_loadu_ps(w + 2 * K + k),
                 w3 = _mm256_loadu_ps(w + 3 * K + k);
    for (int i = 0; i < 4; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
      acc[i][0] = _mm256_fmadd_ps(xv, w0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(xv, w1, acc[i][1]);
      acc[i][2] = _mm256_fmadd_ps(xv, w2, acc[i][2]);
      acc[i][3] = _mm256_fmadd_ps(xv, w3, acc[i][3]);
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 4; ++r) {
      float s = nf4_hsum256(acc[i][r]);
      for (int64_t j = k; j < K; ++j) s += x[i * ldx + j] * w[r * K + j];
      y[i * ldy + r] = s;
    }
}

__attribute__((target("avx512f,avx512bw"))) void nf4_tile4_avx512(const float* x, int64_t ldx, const float* w,
                                                                  int64_t K, float* y, int64_t ldy) {
  __m512 acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 4; ++r) acc[i][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m512 w0 = _mm512_loadu_ps(w + k), w1 = _mm512_loadu_ps(w + K + k), w2 = _mm512_loadu_ps(w + 2 * K + k),
                 w3 = _mm512_loadu_ps(w + 3 * K + k);
    for (int i = 0; i < 4; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
      acc[i][0] = _mm512_fmadd_ps(xv, w0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(xv, w1, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(xv, w2, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(xv, w3, acc[i][3]);
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 4; ++r) {
      float s = _mm512_reduce_add_ps(acc[i][r]);
      for (int64_t j = k; j < K; ++j) s += x[i * ldx + j] * w[r * K + j];
      y[i * ldy + r] = s;
    }
}

py::array_t<float> nf4_matmul_cpp(py::array_t<float, py::array::c_style | py::array::forcecast> x,
                                  py::array_t<uint8_t, py::array::c_style> codes, int64_t N, int64_t block_size,
                                  py::array_t<float, py::array::c_style | py::array::forcecast> codebook,
                                  py::array scales, py::object dq_step, double dq_mean, int64_t dq_block,
                                  const std::string& version) {
  tl::need_ndim(x, 2, "nf4_matmul", "x");
  const int64_t M = x.shape(0), K = x.shape(1);
  if (N < 0) tl::value_error("nf4_matmul: bad shape N=" + std::to_string(N));
  if (block_size < 2) tl::value_error("nf4_matmul: block_size must be >= 2, got " + std::to_string(block_size));
  if (codebook.size() != 16) tl::value_error("nf4_matmul: codebook must have 16 entries");
  const int64_t numel = N * K, nblocks = (numel + block_size - 1) / block_size;
  if (codes.ndim() != 1 || codes.shape(0) != (numel + 1) / 2)
    tl::value_error("nf4_matmul: codes must be 1-D with " + std::to_string((numel + 1) / 2) + " bytes for W [" +
                    std::to_string(N) + ", " + std::to_string(K) + "], got " + tl::shape_str(codes));
  if (scales.ndim() != 1 || scales.shape(0) != nblocks)
    tl::value_error("nf4_matmul: scales must be 1-D with " + std::to_string(nblocks) + " entries, got " +
                    tl::shape_str(scales));
  // resolve the (maybe double-quantized) scales to fp32 once per call
  std::vector<float> sc(static_cast<size_t>(nblocks));
  if (dq_step.is_none()) {
    if (!py::isinstance<py::array_t<float>>(scales))
      tl::value_error("nf4_matmul: scales must be float32 when dq_step is None (int8 scales need dq_step)");
    auto s = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(scales);
    std::copy(s.data(), s.data() + nblocks, sc.begin());
  } else {
    if (!py::isinstance<py::array_t<int8_t>>(scales))
      tl::value_error("nf4_matmul: double-quantized scales must be int8");
    auto q = py::array_t<int8_t, py::array::c_style | py::array::forcecast>::ensure(scales);
    auto st = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(dq_step);
    if (dq_block < 1) tl::value_error("nf4_matmul: dq_block must be >= 1");
    if (st.ndim() != 1 || st.shape(0) != (nblocks + dq_block - 1) / dq_block)
      tl::value_error("nf4_matmul: dq_step must have ceil(nblocks / dq_block) entries, got " + tl::shape_str(st));
    const float mean = float(dq_mean);
    for (int64_t b = 0; b < nblocks; ++b) sc[size_t(b)] = float(q.data()[b]) * st.data()[b / dq_block] + mean;
  }
  const Nf4Path path = nf4_pick(version);
  py::array_t<float> y({M, N});
  if (M == 0 || N == 0) return y;
  const float* px = x.data();
  const uint8_t* pc = codes.data();
  const float* lut = codebook.data();
  float* py_ = y.mutable_data();
  const float* psc = sc.data();
  {
    py::gil_scoped_release release;
    const int64_t npanels = (N + kNf4Panel - 1) / kNf4Panel;
    // a team only for >= 2^20 multiply-adds (~0.1-0.2 ms on one core): waking OpenMP workers costs microseconds on
    // an idle machine but a time slice on a busy one (a 0.16 ms call took ~10 ms at 2 threads after torch's pool ran)
#pragma omp parallel if (M * N * K >= (int64_t(1) << 20))
    {
      std::vector<float> wbuf(size_t(kNf4Panel * K));
      float out[kNf4Panel];
#pragma omp for schedule(static)
      for (int64_t p = 0; p < npanels; ++p) {
        const int64_t n0 = p * kNf4Panel;
        const int nr = int(std::min<int64_t>(kNf4Panel, N - n0));
        for (int r = 0; r < nr; ++r) {
          float* w = wbuf.data() + r * K;
          const int64_t f0 = (n0 + r) * K;
          if (path == Nf4Path::avx512)
            nf4_decode_avx512(pc, f0, K, lut, w);
          else if (path == Nf4Path::avx2)
            nf4_decode_avx2(pc, f0, K, lut, w);
          else
            nf4_decode_scalar(pc, f0, K, lut, w);
          nf4_scale_row(w, f0, K, block_size, psc);
        }
        int64_t m = 0;
        if (nr == kNf4Panel && path != Nf4Path::scalar) {
          for (; m + 4 <= M; m += 4) {
            if (path == Nf4Path::avx512)
              nf4_tile4_avx512(px + m * K, K, wbuf.data(), K, py_ + m * N + n0, N);
            else
              nf4_tile4_avx2(px + m * K, K, wbuf.data(), K, py_ + m * N + n0, N);
          }
        }
        for (; m < M; ++m) {
          const float* xr = px + m * K;
          if (path == Nf4Path::avx512)
            nf4_dots_avx512(xr, wbuf.data(), K, K, nr, out);
          else if (path == Nf4Path::avx2)
            nf4_dots_avx2(xr, wbuf.data(), K, K, nr, out);
          else
            nf4_dots_scalar(xr, wbuf.data(), K, K, nr, out);
          for (int r = 0; r < nr; ++r) py_[m * N + n0 + r] = out[r];
        }
      }
    }
  }
  return y;
}

}  // namespace

TL_REGISTER(compress) {
  m.def("nf4_matmul", &nf4_matmul_cpp, py::arg("x"), py::arg("codes"), py::arg("n"), py::arg("block_size"),
        py::arg("codebook"), py::arg("scales"), py::arg("dq_step") = py::none(), py::arg("dq_mean") = 0.0,
        py::arg("dq_block") = 256, py::arg("version") = "simd",
        "y = x @ dequant(W).T for x [M, K] fp32 and NF4 W [n, K] (flat packed codes, per-block scales: fp32, or "
        "int8 with dq_step per dq_block scales and dq_mean); versions simd (best here), avx512, avx2, scalar");
  m.def("nf4_matmul_path", [](const std::string& v) { return std::string(nf4_path_name(nf4_pick(v))); },
        py::arg("version") = "simd", "the code path nf4_matmul runs for this version on this CPU");
}
