// inference_paged_decode.cpp — paged-attention decode for tinylearn.inference.paged_attention(_batch)(backend="cpp"):
// one query token per sequence of a ragged batch attends over that sequence's cached K/V, read in place from the
// PagedKVCache arena through its block table (vLLM's PagedAttention decode kernel, on the CPU).
//
//   paged_decode(q [B, Hq, D] f32, data [NB, L, 2, bs, H, D] f32|i8|u8 (any byte strides, D contiguous),
//                scales [NB, L, 2, bs, H] f32 or None (int8 / fp8 only), block_tables [B, MB] i32, lens [B] i32,
//                layer, path="auto") -> out [B, Hq, D] f32
//
// One work item per (sequence, KV head): its G = Hq / H query heads (GQA) share every K/V row it reads, so each
// block is read once per group. One pass over the sequence's blocks, up to pd_kChunk tokens at a time (a chunk never
// crosses a block: its rows are one strided run), with the online softmax (running max m, normaliser l, unnormalised
// accumulator acc per query head; FlashAttention / vLLM):
//   s_t = (q / sqrt(D)) . k_t    m' = max(m, max_t s_t)    p_t = e^(s_t - m')    l = l e^(m - m') + sum p_t
//   acc = acc e^(m - m') + sum_t p_t v_t    ...    out = acc / l
// int8 caches are dequantized inside the loops (x = code * scale per (token, head)): the scale multiplies the dot
// product (s_t = scale_t (q . code_t)) and the softmax weight (p_t scale_t), fp32 accumulation throughout. uint8
// data holds FP8 E4M3 codes (PagedKVCache dtype "fp8_e4m3": the OCP "fn" format, bias 7, no infinities, S.1111.111
// NaN) with the same per-(token, head) scales; a code is widened through a 256-entry table (x = table[code] * scale),
// a gather of 8 codes per AVX2 load.
// Paths: AVX2+FMA (8 lanes; four query heads per pass over a K/V row) or portable scalar, chosen per call by
// tl::cpu_has (TINYLEARN_CPU_FEATURES=scalar forces scalar; path="scalar"/"avx2" names one, ValueError if it
// cannot run). OpenMP over the (sequence, KV head) items when there is enough work (pd_kGrain).
// Measured (B=1, Hq 8, Hkv 2, D 64, one thread, 2-core AMD EPYC, busy): S=128 15 us, S=1024 90 us for the kernel,
// +8 us through paged_attention_batch; torch SDPA on contiguous K/V 30-50 / 160-250 us, the numpy loop 0.43 / 3.3 ms.
#include <array>

#include "kernels_math.h"

namespace py = pybind11;

namespace {
using namespace tl;
namespace vm = tl::vm;

constexpr int64_t pd_kChunk = 32;  // tokens per online-softmax step (a block is split into chunks of at most this)
// OpenMP threads only with >= pd_kGrain (query head x key x head_dim) products each (~170 us on one AVX2 core): a
// decode step of one sequence (S=1024, Hq=8, D=64: 2^19 products, ~90 us) stays on the calling thread. Waking a
// team costs microseconds on an idle machine but a whole time slice on a busy one (8 ms measured on 2 loaded cores).
constexpr int64_t pd_kGrain = int64_t(1) << 20;
constexpr float pd_kNegInf = -std::numeric_limits<float>::infinity();

// Where one (sequence, KV head) item reads: byte strides of data [NB, L, 2, bs, H, D] and scales [NB, L, 2, bs, H].
struct PdGeom {
  const char* data;
  const char* scale;  // nullptr for a float32 cache
  int64_t ds[5], ss[5];
  int64_t layer, bs, D, G;
};

struct PdItem {
  const float* q;          // [G, D] pre-scaled by 1 / sqrt(D)
  const int32_t* table;    // the sequence's block table
  int64_t len, h;          // tokens, KV head
  float* out;              // [G, D]
  float *s, *m, *l, *acc;  // scratch: scores [G, kChunk], m [G], l [G], acc [G, D]
};

template <typename T>
inline const T* pd_row(const PdGeom& g, int64_t blk, int kv, int64_t slot, int64_t h) {
  return reinterpret_cast<const T*>(g.data + blk * g.ds[0] + g.layer * g.ds[1] + kv * g.ds[2] + slot * g.ds[3] +
                                    h * g.ds[4]);
}
inline float pd_scale(const PdGeom& g, int64_t blk, int kv, int64_t slot, int64_t h) {
  if (!g.scale) return 1.0f;
  return *reinterpret_cast<const float*>(g.scale + blk * g.ss[0] + g.layer * g.ss[1] + kv * g.ss[2] + slot * g.ss[3] +
                                         h * g.ss[4]);
}

// Online softmax, one query head and one chunk: s [c] holds the scores. pd_max gives m' = max(m, max_t s_t); the
// path then overwrites s with p = e^(s - m') and sums it; pd_update rescales l and acc by e^(m - m') and turns p into
// the weights of V (p times the V scales, for int8).
inline float pd_max(float m, const float* s, int64_t c) {
  for (int64_t t = 0; t < c; ++t) m = s[t] > m ? s[t] : m;
  return m;
}

inline void pd_update(const PdItem& it, int64_t g, int64_t D, float mb, float psum, int64_t c, const float* vsc) {
  const float alpha = it.m[g] == pd_kNegInf ? 0.0f : vm::scalar::exp(it.m[g] - mb);
  it.l[g] = it.l[g] * alpha + psum;
  it.m[g] = mb;
  float* a = it.acc + g * D;
  if (alpha != 1.0f)
    for (int64_t d = 0; d < D; ++d) a[d] *= alpha;
  if (vsc)
    for (int64_t t = 0; t < c; ++t) it.s[g * pd_kChunk + t] *= vsc[t];
}

inline void pd_finish(const PdItem& it, int64_t G, int64_t D) {
  for (int64_t g = 0; g < G; ++g) {
    const float inv = 1.0f / it.l[g];
    for (int64_t d = 0; d < D; ++d) it.out[g * D + d] = it.acc[g * D + d] * inv;
  }
}

// Element types of the cache: float, int8_t, and PdFp8 (an E4M3 code); pd_f widens one element to float.
struct PdFp8 {
  uint8_t code;
};
inline const float* pd_fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) {
      const int e = (c >> 3) & 15, m = c & 7;  // 4 exponent bits (bias 7), 3 mantissa bits
      float mag = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + float(m) / 8.0f, e - 7);  // subnormal: m 2^-9
      if (e == 15 && m == 7) mag = std::numeric_limits<float>::quiet_NaN();
      t[size_t(c)] = (c & 0x80) ? -mag : mag;
    }
    return t;
  }();
  return table.data();
}
inline float pd_f(float x) { return x; }
inline float pd_f(int8_t x) { return float(x); }
inline float pd_f(PdFp8 x) { return pd_fp8_table()[x.code]; }

inline void pd_start(const PdItem& it, int64_t G, int64_t D) {
  for (int64_t g = 0; g < G; ++g) it.m[g] = pd_kNegInf, it.l[g] = 0.0f;
  std::fill(it.acc, it.acc + G * D, 0.0f);
}

// ---- scalar path -------------------------------------------------------------------------------------------------
template <typename T>
void pd_item_scalar(const PdGeom& geo, const PdItem& it) {
  const int64_t G = geo.G, D = geo.D, bs = geo.bs;
  pd_start(it, G, D);
  float ksc[pd_kChunk], vsc[pd_kChunk];
  int64_t c = 0;
  for (int64_t t0 = 0; t0 < it.len; t0 += c) {  // a chunk ends at a block boundary at the latest
    const int64_t blk = it.table[t0 / bs], slot0 = t0 % bs;
    c = std::min({pd_kChunk, it.len - t0, bs - slot0});
    for (int64_t t = 0; t < c; ++t) {
      ksc[t] = pd_scale(geo, blk, 0, slot0 + t, it.h);
      vsc[t] = pd_scale(geo, blk, 1, slot0 + t, it.h);
      const T* k = pd_row<T>(geo, blk, 0, slot0 + t, it.h);
      for (int64_t g = 0; g < G; ++g) {
        const float* q = it.q + g * D;
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += q[d] * pd_f(k[d]);
        it.s[g * pd_kChunk + t] = dot * ksc[t];
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      float* s = it.s + g * pd_kChunk;
      const float mb = pd_max(it.m[g], s, c);
      float psum = 0.0f;
      for (int64_t t = 0; t < c; ++t) psum += (s[t] = vm::scalar::exp(s[t] - mb));
      pd_update(it, g, D, mb, psum, c, geo.scale ? vsc : nullptr);
    }
    for (int64_t t = 0; t < c; ++t) {
      const T* v = pd_row<T>(geo, blk, 1, slot0 + t, it.h);
      for (int64_t g = 0; g < G; ++g) {
        const float w = it.s[g * pd_kChunk + t];
        float* a = it.acc + g * D;
        for (int64_t d = 0; d < D; ++d) a[d] += w * pd_f(v[d]);
      }
    }
  }
  pd_finish(it, G, D);
}

// ---- AVX2 + FMA path ---------------------------------------------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx2,fma")
inline __m256 pd_load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 pd_load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 pd_load8(const PdFp8* p) {
  const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_i32gather_ps(pd_fp8_table(), idx, 4);
}

template <typename T>
void pd_item_avx2(const PdGeom& geo, const PdItem& it) {
  const int64_t G = geo.G, D = geo.D, bs = geo.bs, D8 = D & ~int64_t(7);
  pd_start(it, G, D);
  float ksc[pd_kChunk], vsc[pd_kChunk];
  int64_t c = 0;
  for (int64_t t0 = 0; t0 < it.len; t0 += c) {
    const int64_t blk = it.table[t0 / bs], slot0 = t0 % bs;
    c = std::min({pd_kChunk, it.len - t0, bs - slot0});
    const T* k0 = pd_row<T>(geo, blk, 0, slot0, it.h);
    const T* v0 = pd_row<T>(geo, blk, 1, slot0, it.h);
    const int64_t rs = geo.ds[3] / int64_t(sizeof(T));  // elements from one token's row to the next
    for (int64_t t = 0; t < c; ++t) {
      ksc[t] = pd_scale(geo, blk, 0, slot0 + t, it.h);
      vsc[t] = pd_scale(geo, blk, 1, slot0 + t, it.h);
    }
    // scores: four query heads per pass over a K row (a group of < 4 repeats its last head and drops the copies)
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
      const float* q[4];
      for (int j = 0; j < 4; ++j) q[j] = it.q + std::min(g0 + j, G - 1) * D;
      for (int64_t t = 0; t < c; ++t) {
        const T* k = k0 + t * rs;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t d = 0; d < D8; d += 8) {
          const __m256 kv = pd_load8(k + d);
          a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q[0] + d), kv, a0);
          a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q[1] + d), kv, a1);
          a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q[2] + d), kv, a2);
          a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q[3] + d), kv, a3);
        }
        float dot[4] = {vm::avx2::hsum(a0), vm::avx2::hsum(a1), vm::avx2::hsum(a2), vm::avx2::hsum(a3)};
        for (int64_t d = D8; d < D; ++d)
          for (int j = 0; j < 4; ++j) dot[j] += q[j][d] * pd_f(k[d]);
        for (int j = 0; j < 4 && g0 + j < G; ++j) it.s[(g0 + j) * pd_kChunk + t] = dot[j] * ksc[t];
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      float* s = it.s + g * pd_kChunk;
      const float mb = pd_max(it.m[g], s, c);
      const __m256 mv = _mm256_set1_ps(mb);
      __m256 ev = _mm256_setzero_ps();
      int64_t t = 0;
      for (; t + 8 <= c; t += 8) {
        const __m256 e = vm::avx2::exp(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
        _mm256_storeu_ps(s + t, e);
        ev = _mm256_add_ps(ev, e);
      }
      float psum = vm::avx2::hsum(ev);
      for (; t < c; ++t) psum += (s[t] = vm::scalar::exp(s[t] - mb));
      pd_update(it, g, D, mb, psum, c, geo.scale ? vsc : nullptr);
    }
    // acc[g] += sum_t p[g, t] v_t: per 8 columns, four heads' accumulators stay in registers over the chunk
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
      const int ng = int(std::min<int64_t>(4, G - g0));
      const float* w[4];
      for (int j = 0; j < 4; ++j) w[j] = it.s + std::min<int64_t>(g0 + j, G - 1) * pd_kChunk;
      for (int64_t d = 0; d < D8; d += 8) {
        float* a[4];
        for (int j = 0; j < 4; ++j) a[j] = it.acc + std::min<int64_t>(g0 + j, G - 1) * D + d;
        __m256 a0 = _mm256_loadu_ps(a[0]), a1 = _mm256_loadu_ps(a[1]);
        __m256 a2 = _mm256_loadu_ps(a[2]), a3 = _mm256_loadu_ps(a[3]);
        for (int64_t t = 0; t < c; ++t) {
          const __m256 vv = pd_load8(v0 + t * rs + d);
          a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w[0] + t), vv, a0);
          a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(w[1] + t), vv, a1);
          a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(w[2] + t), vv, a2);
          a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(w[3] + t), vv, a3);
        }
        // store the copies first: the real head's value (a[0..ng)) is the one that stays
        const __m256 r[4] = {a0, a1, a2, a3};
        for (int j = 3; j >= 0; --j)
          if (j < ng) _mm256_storeu_ps(a[j], r[j]);
      }
      for (int64_t d = D8; d < D; ++d)
        for (int j = 0; j < ng; ++j) {
          float sum = it.acc[(g0 + j) * D + d];
          for (int64_t t = 0; t < c; ++t) sum += w[j][t] * pd_f(v0[t * rs + d]);
          it.acc[(g0 + j) * D + d] = sum;
        }
    }
  }
  pd_finish(it, G, D);
}
#pragma GCC pop_options

// ---- argument checks and the batch loop --------------------------------------------------------------------------
const char* const pd_kFn = "paged_decode";

[[noreturn]] void pd_fail(const std::string& msg) { tl::value_error(std::string(pd_kFn) + ": " + msg); }

void pd_strides(const py::array& a, int64_t* out, int n, int64_t elem, const char* name) {
  for (int i = 0; i < n; ++i) {
    out[i] = a.strides(i);
    if (out[i] % elem) pd_fail(std::string(name) + ": strides must be multiples of the element size");
  }
  if (a.strides(n) != elem && a.shape(n) > 1)
    pd_fail(std::string(name) + ": the last axis must be contiguous, got strides " + std::to_string(a.strides(n)));
}

py::array_t<float> paged_decode(py::array_t<float, py::array::c_style | py::array::forcecast> q, py::array data,
                                py::object scales, py::array_t<int32_t, py::array::c_style> block_tables,
                                py::array_t<int32_t, py::array::c_style> lens, int64_t layer, const std::string& path) {
  need_ndim(q, 3, pd_kFn, "q");
  need_ndim(data, 6, pd_kFn, "data");
  need_ndim(block_tables, 2, pd_kFn, "block_tables");
  need_ndim(lens, 1, pd_kFn, "lens");
  const bool is_i8 = data.dtype().is(py::dtype::of<int8_t>());
  const bool is_fp8 = data.dtype().is(py::dtype::of<uint8_t>());  // E4M3 codes
  const bool quantized = is_i8 || is_fp8;
  if (!quantized && !data.dtype().is(py::dtype::of<float>()))
    pd_fail("data: expected float32, int8 or uint8 (FP8 E4M3 codes), got dtype " + std::string(py::str(data.dtype())));
  const int64_t B = q.shape(0), Hq = q.shape(1), D = q.shape(2);
  const int64_t NB = data.shape(0), L = data.shape(1), bs = data.shape(3), H = data.shape(4);
  if (data.shape(2) != 2 || data.shape(5) != D || H < 1 || bs < 1)
    pd_fail("data: expected [num_blocks, n_layers, 2, block_size, n_kv_heads, head_dim=" + std::to_string(D) +
            "], got " + shape_str(data));
  if (Hq < 1 || Hq % H)
    pd_fail("q: Hq must be a positive multiple of n_kv_heads=" + std::to_string(H) + ", got q " + shape_str(q));
  if (block_tables.shape(0) != B || lens.shape(0) != B)
    pd_fail("block_tables, lens: expected " + std::to_string(B) + " rows (one per query), got " +
            shape_str(block_tables) + " and " + shape_str(lens));
  if (layer < 0 || layer >= L)
    pd_fail("layer: must be in [0, " + std::to_string(L) + "), got " + std::to_string(layer));
  PdGeom geo{static_cast<const char*>(data.data()), nullptr, {}, {}, layer, bs, D, Hq / H};
  pd_strides(data, geo.ds, 5, quantized ? 1 : 4, "data");
  py::array_t<float> sc_arr;
  if (quantized) {
    if (scales.is_none())
      pd_fail(std::string("scales: an ") + (is_i8 ? "int8" : "fp8") + " cache needs its float32 scales, got None");
    sc_arr = py::array_t<float>::ensure(scales);
    if (!sc_arr || sc_arr.ndim() != 5 || sc_arr.shape(0) != NB || sc_arr.shape(1) != L || sc_arr.shape(2) != 2 ||
        sc_arr.shape(3) != bs || sc_arr.shape(4) != H)
      pd_fail("scales: expected float32 [num_blocks, n_layers, 2, block_size, n_kv_heads] matching data " +
              shape_str(data));
    geo.scale = reinterpret_cast<const char*>(sc_arr.data());
    pd_strides(sc_arr, geo.ss, 4, 4, "scales");
    geo.ss[4] = 4;
  } else if (!scales.is_none()) {
    pd_fail("scales: a float32 cache has no scales, pass None");
  }
  const int64_t MB = block_tables.shape(1);
  const int32_t* tab = block_tables.data();
  const int32_t* ln = lens.data();
  int64_t work = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (ln[b] < 1 || ln[b] > MB * bs)
      pd_fail("lens: lens[" + std::to_string(b) + "] = " + std::to_string(ln[b]) + " outside [1, " +
              std::to_string(MB * bs) + "] (block_tables holds " + std::to_string(MB) + " blocks of " +
              std::to_string(bs) + " tokens)");
    for (int64_t i = 0; i < (ln[b] + bs - 1) / bs; ++i)
      if (tab[b * MB + i] < 0 || tab[b * MB + i] >= NB)
        pd_fail("block_tables: block id " + std::to_string(tab[b * MB + i]) + " at [" + std::to_string(b) + ", " +
                std::to_string(i) + "] outside [0, num_blocks=" + std::to_string(NB) + ")");
    work += ln[b];
  }
  const vm::Isa isa = vm::parse_isa(path, pd_kFn);
  const bool simd = isa != vm::Isa::scalar;
  auto item_fn = is_i8    ? (simd ? &pd_item_avx2<int8_t> : &pd_item_scalar<int8_t>)
                 : is_fp8 ? (simd ? &pd_item_avx2<PdFp8> : &pd_item_scalar<PdFp8>)
                          : (simd ? &pd_item_avx2<float> : &pd_item_scalar<float>);

  py::array_t<float> out({B, Hq, D});
  std::vector<float> qs(static_cast<size_t>(B * Hq * D));
  const float* pq = q.data();
  const float sm = 1.0f / std::sqrt(float(D));
  for (size_t i = 0; i < qs.size(); ++i) qs[i] = pq[i] * sm;
  const int64_t G = geo.G, items = B * H;
  const int nt = int(std::max<int64_t>(1, std::min<int64_t>({n_threads(), work * Hq * D / pd_kGrain, items})));
  const size_t per = static_cast<size_t>(G * (pd_kChunk + 2 + D));  // scratch floats per thread
  std::vector<float> scratch(per * size_t(std::max(nt, 1)));
  float* po = out.mutable_data();
  {
    py::gil_scoped_release release;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int64_t i = 0; i < items; ++i) {
      const int64_t b = i / H, h = i % H;
      float* s = scratch.data() + per * size_t(nt > 1 ? thread_id() : 0);
      const PdItem it{qs.data() + (b * Hq + h * G) * D,
                      tab + b * MB,
                      ln[b],
                      h,
                      po + (b * Hq + h * G) * D,
                      s,
                      s + G * pd_kChunk,
                      s + G * (pd_kChunk + 1),
                      s + G * (pd_kChunk + 2)};
      item_fn(geo, it);
    }
  }
  return out;
}

}  // namespace

TL_REGISTER(inference) {
  m.doc() = "inference kernels: paged-attention decode over a PagedKVCache arena (cpp_src/inference_paged_decode.cpp)";
  m.def("paged_decode", &paged_decode, py::arg("q"), py::arg("data"), py::arg("scales"), py::arg("block_tables"),
        py::arg("lens"), py::arg("layer"), py::arg("path") = "auto",
        "ragged-batch decode attention through block tables; path: auto, scalar, avx2 (avx512 runs the avx2 code)");
}
