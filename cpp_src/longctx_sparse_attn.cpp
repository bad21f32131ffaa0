// longctx_sparse_attn.cpp — block-sparse attention forward (tinylearn.nn.sparse_attention, op
// nn.block_sparse_attention): o = softmax(scale * q k^T + mask) v where the mask is a block layout given as CSR
// (row_ptr [nqb + 1], cols [nnz]: the key blocks each query block attends to, ascending) over blocks of
// `block_size` tokens, optionally intersected with the token-level causal mask (key j <= query i, top-left aligned
// as torch's is_causal). Inputs are C-contiguous float32 [BH, Nq, D], [BH, Nk, D], [BH, Nk, Dv] (the Python side
// flattens the leading dims); returns o [BH, Nq, Dv] and the row log-sum-exp lse [BH, Nq] (the backward needs it;
// a query row with no allowed key gets o = 0, lse = -inf).
//
// One work item per (head, query block): one pass over that block's key-block list with the online softmax (running
// max m, sum l and unnormalised O per row, Milakov & Gimelshein 2018 / FlashAttention): per key block, pack K^T
// (D x bk, zero-padded to whole vectors), S = scale * Q K^T as 4-row x 4-vector register tiles, mask the columns
// past the tile (and j > i on causal tiles) to -inf, m' = max(m, rowmax S), P = exp(S - m'), l = l e^(m-m') + sum P,
// O = O e^(m-m') + P V (4-row x 4-vector tiles, V read in place). Empty tiles are never visited: that is the speed-up
// over dense attention, work ~ nnz blocks.
//
// Versions (each checked against the numpy block-sparse reference and torch SDPA with the equivalent dense boolean
// mask in tests/longctx/test_sparse_attention.py, fp32 tolerance; all agree up to fp32 reassociation / exp ulps):
//   scalar   portable loops, std::exp.
//   avx2     8-lane tiles (AVX2 + FMA), exp from vec_math.h (vm::avx2::exp), tails by _mm256_maskload_ps.
//   avx512   16-lane tiles (AVX-512F), vm::avx512::exp, tails by masked loads.
// "simd" (the default) is the best of avx512 > avx2 > scalar that tl::cpu_has allows (TINYLEARN_CPU_FEATURES forces
// a level). OpenMP over (head, query block) items, dynamic schedule (query blocks differ in key-block count), a team
// only when the work (nnz blocks x heads x block^2 x D) is >= 2^20 multiply-adds.
// Extra memory per thread: K^T (D x bkp) + S (block x bkp) + O (block x Dvp) floats + m, l (block).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common.h"
#include "cpu_features.h"
#include "registry.h"
#include "vec_math.h"

namespace py = pybind11;

namespace {

enum class LcsaPath { scalar, avx2, avx512 };

const char* lcsa_path_name(LcsaPath p) {
  return p == LcsaPath::avx512 ? "avx512" : p == LcsaPath::avx2 ? "avx2" : "scalar";
}

LcsaPath lcsa_pick(const std::string& version) {
  const bool a512 = tl::cpu_has("avx512f");
  const bool a2 = tl::cpu_has("avx2") && tl::cpu_has("fma");
  if (version == "scalar") return LcsaPath::scalar;
  if (version == "avx2") {
    if (!a2)
      tl::value_error("block_sparse_attention: version 'avx2' needs AVX2+FMA, which this CPU (or "
                      "TINYLEARN_CPU_FEATURES) lacks");
    return LcsaPath::avx2;
  }
  if (version == "avx512") {
    if (!a512)
      tl::value_error("block_sparse_attention: version 'avx512' needs AVX-512F, which this CPU (or "
                      "TINYLEARN_CPU_FEATURES) lacks");
    return LcsaPath::avx512;
  }
  if (version == "simd" || version == "auto") return a512 ? LcsaPath::avx512 : a2 ? LcsaPath::avx2 : LcsaPath::scalar;
  tl::value_error("block_sparse_attention: version must be 'simd', 'auto', 'avx512', 'avx2' or 'scalar', got '" +
                  version + "'");
  return LcsaPath::scalar;
}

constexpr float kLcsaNegInf = -std::numeric_limits<float>::infinity();

// ------------------------------------------------------------------------------------------------ scalar pieces
// S[r][c] = scale * q_r . kt[:, c] for r < nr, c < ncol (kt is D x ldkt)
void lcsa_scores_scalar(const float* q, int64_t ldq, int nr, const float* kt, int64_t ldkt, int64_t D, int64_t ncol,
                        float scale, float* s, int64_t lds) {
  for (int r = 0; r < nr; ++r) {
    float* sr = s + r * lds;
    for (int64_t c = 0; c < ncol; ++c) sr[c] = 0.f;
    for (int64_t d = 0; d < D; ++d) {
      const float a = q[r * ldq + d];
      const float* kr = kt + d * ldkt;
      for (int64_t c = 0; c < ncol; ++c) sr[c] += a * kr[c];
    }
    for (int64_t c = 0; c < ncol; ++c) sr[c] *= scale;
  }
}

// o[r][:Dv] += sum_j p[r][j] v[j][:Dv]
void lcsa_pv_scalar(const float* p, int64_t ldp, int nr, const float* v, int64_t ldv, int64_t nk, int64_t Dv,
                    float* o, int64_t ldo) {
  for (int r = 0; r < nr; ++r)
    for (int64_t j = 0; j < nk; ++j) {
      const float a = p[r * ldp + j];
      if (a == 0.f) continue;
      const float* vr = v + j * ldv;
      float* orow = o + r * ldo;
      for (int64_t c = 0; c < Dv; ++c) orow[c] += a * vr[c];
    }
}

// ------------------------------------------------------------------------------------------------ AVX2 pieces
// NV vectors (8 lanes) of columns starting at kt, 4 rows; rows past nr repeat row 0 and are not stored
template <int NV>
__attribute__((target("avx2,fma"))) void lcsa_scores_tile_avx2(const float* q, int64_t ldq, int nr, const float* kt,
                                                               int64_t ldkt, int64_t D, float scale, float* s,
                                                               int64_t lds) {
  __m256 acc[4][NV];
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < NV; ++t) acc[r][t] = _mm256_setzero_ps();
  const float* qr[4];
  for (int r = 0; r < 4; ++r) qr[r] = q + (r < nr ? r : 0) * ldq;
  for (int64_t d = 0; d < D; ++d) {
    __m256 b[NV];
    for (int t = 0; t < NV; ++t) b[t] = _mm256_loadu_ps(kt + d * ldkt + 8 * t);
    for (int r = 0; r < 4; ++r) {
      const __m256 a = _mm256_broadcast_ss(qr[r] + d);
      for (int t = 0; t < NV; ++t) acc[r][t] = _mm256_fmadd_ps(a, b[t], acc[r][t]);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
  for (int r = 0; r < nr; ++r)
    for (int t = 0; t < NV; ++t) _mm256_storeu_ps(s + r * lds + 8 * t, _mm256_mul_ps(acc[r][t], sc));
}

// ncolp: a multiple of 8 (kt and s padded to it)
__attribute__((target("avx2,fma"))) void lcsa_scores_avx2(const float* q, int64_t ldq, int nr, const float* kt,
                                                          int64_t ldkt, int64_t D, int64_t ncolp, float scale,
                                                          float* s, int64_t lds) {
  int64_t c = 0;
  for (; c + 32 <= ncolp; c += 32) lcsa_scores_tile_avx2<4>(q, ldq, nr, kt + c, ldkt, D, scale, s + c, lds);
  for (; c + 16 <= ncolp; c += 16) lcsa_scores_tile_avx2<2>(q, ldq, nr, kt + c, ldkt, D, scale, s + c, lds);
  for (; c < ncolp; c += 8) lcsa_scores_tile_avx2<1>(q, ldq, nr, kt + c, ldkt, D, scale, s + c, lds);
}

// o (4 rows, ldo, padded to whole vectors) += P V over NV vectors of output columns from column c0; the last
// vector may be partial (mask: lanes < Dv - c0 - 8 (NV - 1) loaded from v, the rest 0)
template <int NV>
__attribute__((target("avx2,fma"))) void lcsa_pv_tile_avx2(const float* p, int64_t ldp, int nr, const float* v,
                                                           int64_t ldv, int64_t nk, int64_t nlast, float* o,
                                                           int64_t ldo) {
  __m256 acc[4][NV];
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < NV; ++t) acc[r][t] = r < nr ? _mm256_loadu_ps(o + r * ldo + 8 * t) : _mm256_setzero_ps();
  const float* pr[4];
  for (int r = 0; r < 4; ++r) pr[r] = p + (r < nr ? r : 0) * ldp;
  const __m256i tail = tl::vm::avx2::tail_mask(int(nlast));
  for (int64_t j = 0; j < nk; ++j) {
    __m256 b[NV];
    const float* vr = v + j * ldv;
    for (int t = 0; t < NV - 1; ++t) b[t] = _mm256_loadu_ps(vr + 8 * t);
    b[NV - 1] = nlast == 8 ? _mm256_loadu_ps(vr + 8 * (NV - 1)) : _mm256_maskload_ps(vr + 8 * (NV - 1), tail);
    for (int r = 0; r < 4; ++r) {
      const __m256 a = _mm256_broadcast_ss(pr[r] + j);
      for (int t = 0; t < NV; ++t) acc[r][t] = _mm256_fmadd_ps(a, b[t], acc[r][t]);
    }
  }
  for (int r = 0; r < nr; ++r)
    for (int t = 0; t < NV; ++t) _mm256_storeu_ps(o + r * ldo + 8 * t, acc[r][t]);
}

__attribute__((target("avx2,fma"))) void lcsa_pv_avx2(const float* p, int64_t ldp, int nr, const float* v,
                                                      int64_t ldv, int64_t nk, int64_t Dv, float* o, int64_t ldo) {
  int64_t c = 0;
  for (; c + 32 <= Dv; c += 32) lcsa_pv_tile_avx2<4>(p, ldp, nr, v + c, ldv, nk, 8, o + c, ldo);
  for (; c + 16 <= Dv; c += 16) lcsa_pv_tile_avx2<2>(p, ldp, nr, v + c, ldv, nk, 8, o + c, ldo);
  for (; c < Dv; c += 8) lcsa_pv_tile_avx2<1>(p, ldp, nr, v + c, ldv, nk, std::min<int64_t>(8, Dv - c), o + c, ldo);
}

// ------------------------------------------------------------------------------------------------ AVX-512 pieces
template <int NV>
__attribute__((target("avx512f"))) void lcsa_scores_tile_avx512(const float* q, int64_t ldq, int nr,
                                                                const float* kt, int64_t ldkt, int64_t D,
                                                                float scale, float* s, int64_t lds) {
  __m512 acc[4][NV];
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < NV; ++t) acc[r][t] = _mm512_setzero_ps();
  const float* qr[4];
  for (int r = 0; r < 4; ++r) qr[r] = q + (r < nr ? r : 0) * ldq;
  for (int64_t d = 0; d < D; ++d) {
    __m512 b[NV];
    for (int t = 0; t < NV; ++t) b[t] = _mm512_loadu_ps(kt + d * ldkt + 16 * t);
    for (int r = 0; r < 4; ++r) {
      const __m512 a = _mm512_set1_ps(qr[r][d]);
      for (int t = 0; t < NV; ++t) acc[r][t] = _mm512_fmadd_ps(a, b[t], acc[r][t]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < nr; ++r)
    for (int t = 0; t < NV; ++t) _mm512_storeu_ps(s + r * lds + 16 * t, _mm512_mul_ps(acc[r][t], sc));
}

// ncolp: a multiple of 16
__attribute__((target("avx512f"))) void lcsa_scores_avx512(const float* q, int64_t ldq, int nr, const float* kt,
                                                           int64_t ldkt, int64_t D, int64_t ncolp, float scale,
                                                           float* s, int64_t lds) {
  int64_t c = 0;
  for (; c + 64 <= ncolp; c += 64) lcsa_scores_tile_avx512<4>(q, ldq, nr, kt + c, ldkt, D, scale, s + c, lds);
  for (; c + 32 <= ncolp; c += 32) lcsa_scores_tile_avx512<2>(q, ldq, nr, kt + c, ldkt, D, scale, s + c, lds);
  for (; c < ncolp; c += 16) lcsa_scores_tile_avx512<1>(q, ldq, nr, kt + c, ldkt, D, scale, s + c, lds);
}

template <int NV>
__attribute__((target("avx512f"))) void lcsa_pv_tile_avx512(const float* p, int64_t ldp, int nr, const float* v,
                                                            int64_t ldv, int64_t nk, int64_t nlast, float* o,
                                                            int64_t ldo) {
  __m512 acc[4][NV];
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < NV; ++t) acc[r][t] = r < nr ? _mm512_loadu_ps(o + r * ldo + 16 * t) : _mm512_setzero_ps();
  const float* pr[4];
  for (int r = 0; r < 4; ++r) pr[r] = p + (r < nr ? r : 0) * ldp;
  const __mmask16 tail = static_cast<__mmask16>((1u << nlast) - 1u);
  for (int64_t j = 0; j < nk; ++j) {
    __m512 b[NV];
    const float* vr = v + j * ldv;
    for (int t = 0; t < NV - 1; ++t) b[t] = _mm512_loadu_ps(vr + 16 * t);
    b[NV - 1] = _mm512_maskz_loadu_ps(tail, vr + 16 * (NV - 1));
    for (int r = 0; r < 4; ++r) {
      const __m512 a = _mm512_set1_ps(pr[r][j]);
      for (int t = 0; t < NV; ++t) acc[r][t] = _mm512_fmadd_ps(a, b[t], acc[r][t]);
    }
  }
  for (int r = 0; r < nr; ++r)
    for (int t = 0; t < NV; ++t) _mm512_storeu_ps(o + r * ldo + 16 * t, acc[r][t]);
}

__attribute__((target("avx512f"))) void lcsa_pv_avx512(const float* p, int64_t ldp, int nr, const float* v,
                                                        int64_t ldv, int64_t nk, int64_t Dv, float* o, int64_t ldo) {
  int64_t c = 0;
  for (; c + 64 <= Dv; c += 64) lcsa_pv_tile_avx512<4>(p, ldp, nr, v + c, ldv, nk, 16, o + c, ldo);
  for (; c + 32 <= Dv; c += 32) lcsa_pv_tile_avx512<2>(p, ldp, nr, v + c, ldv, nk, 16, o + c, ldo);
  for (; c < Dv; c += 16)
    lcsa_pv_tile_avx512<1>(p, ldp, nr, v + c, ldv, nk, std::min<int64_t>(16, Dv - c), o + c, ldo);
}

// ---------------------------------------------------------------------------------- online-softmax row update
// s: one row of scores (ncolp entries, the first `valid` allowed); turns it into P in place and updates m, l and the
// output row o (dvp entries). Returns false when the row has no allowed key in this tile (P all 0, nothing changed).
bool lcsa_softmax_row_scalar(float* s, int64_t valid, int64_t ncolp, float& m, float& l, float* o, int64_t dvp) {
  if (valid <= 0) {
    for (int64_t c = 0; c < ncolp; ++c) s[c] = 0.f;
    return false;
  }
  float mx = kLcsaNegInf;
  for (int64_t c = 0; c < valid; ++c) mx = std::max(mx, s[c]);
  const float mn = std::max(m, mx);
  const float alpha = m == kLcsaNegInf ? 0.f : std::exp(m - mn);
  float sum = 0.f;
  for (int64_t c = 0; c < valid; ++c) {
    s[c] = std::exp(s[c] - mn);
    sum += s[c];
  }
  for (int64_t c = valid; c < ncolp; ++c) s[c] = 0.f;
  l = l * alpha + sum;
  m = mn;
  if (alpha != 1.f)
    for (int64_t c = 0; c < dvp; ++c) o[c] *= alpha;
  return true;
}

__attribute__((target("avx2,fma"))) bool lcsa_softmax_row_avx2(float* s, int64_t valid, int64_t ncolp, float& m,
                                                               float& l, float* o, int64_t dvp) {
  if (valid <= 0) {
    for (int64_t c = 0; c < ncolp; ++c) s[c] = 0.f;
    return false;
  }
  for (int64_t c = valid; c < ncolp; ++c) s[c] = kLcsaNegInf;
  __m256 mxv = _mm256_set1_ps(kLcsaNegInf);
  for (int64_t c = 0; c < ncolp; c += 8) mxv = _mm256_max_ps(mxv, _mm256_loadu_ps(s + c));
  const float mn = std::max(m, tl::vm::avx2::hmax(mxv));
  const float alpha = m == kLcsaNegInf ? 0.f : std::exp(m - mn);
  const __m256 mnv = _mm256_set1_ps(mn);
  __m256 sumv = _mm256_setzero_ps();
  for (int64_t c = 0; c < ncolp; c += 8) {
    const __m256 p = tl::vm::avx2::exp(_mm256_sub_ps(_mm256_loadu_ps(s + c), mnv));
    _mm256_storeu_ps(s + c, p);
    sumv = _mm256_add_ps(sumv, p);
  }
  for (int64_t c = valid; c < ncolp; ++c) s[c] = 0.f;  // exp(-inf) is 0 already; keep it exact
  float sum = tl::vm::avx2::hsum(sumv);
  l = l * alpha + sum;
  m = mn;
  if (alpha != 1.f) {
    const __m256 av = _mm256_set1_ps(alpha);
    for (int64_t c = 0; c < dvp; c += 8) _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(o + c), av));
  }
  return true;
}

__attribute__((target("avx512f"))) bool lcsa_softmax_row_avx512(float* s, int64_t valid, int64_t ncolp, float& m,
                                                                float& l, float* o, int64_t dvp) {
  if (valid <= 0) {
    for (int64_t c = 0; c < ncolp; ++c) s[c] = 0.f;
    return false;
  }
  for (int64_t c = valid; c < ncolp; ++c) s[c] = kLcsaNegInf;
  __m512 mxv = _mm512_set1_ps(kLcsaNegInf);
  for (int64_t c = 0; c < ncolp; c += 16) mxv = _mm512_max_ps(mxv, _mm512_loadu_ps(s + c));
  const float mn = std::max(m, _mm512_reduce_max_ps(mxv));
  const float alpha = m == kLcsaNegInf ? 0.f : std::exp(m - mn);
  const __m512 mnv = _mm512_set1_ps(mn);
  __m512 sumv = _mm512_setzero_ps();
  for (int64_t c = 0; c < ncolp; c += 16) {
    const __m512 p = tl::vm::avx512::exp(_mm512_sub_ps(_mm512_loadu_ps(s + c), mnv));
    _mm512_storeu_ps(s + c, p);
    sumv = _mm512_add_ps(sumv, p);
  }
  for (int64_t c = valid; c < ncolp; ++c) s[c] = 0.f;
  const float sum = _mm512_reduce_add_ps(sumv);
  l = l * alpha + sum;
  m = mn;
  if (alpha != 1.f) {
    const __m512 av = _mm512_set1_ps(alpha);
    for (int64_t c = 0; c < dvp; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), av));
  }
  return true;
}

// ------------------------------------------------------------------------------------------------- the driver
struct LcsaDims {
  int64_t BH, Nq, Nk, D, Dv, bs, nqb, nkb;
};

// one (head, query block) item: queries [i0, i1)
void lcsa_item(const LcsaDims& g, LcsaPath path, const float* q, const float* k, const float* v,
               const int64_t* row_ptr, const int64_t* cols, bool causal, float scale, int64_t bh, int64_t qb,
               float* o, float* lse, std::vector<float>& kt, std::vector<float>& s, std::vector<float>& acc,
               std::vector<float>& mrow, std::vector<float>& lrow) {
  const int64_t W = path == LcsaPath::avx512 ? 16 : path == LcsaPath::avx2 ? 8 : 1;
  const int64_t bkp = (g.bs + W - 1) / W * W, dvp = (g.Dv + W - 1) / W * W;
  const int64_t i0 = qb * g.bs, i1 = std::min(g.Nq, i0 + g.bs), nr_all = i1 - i0;
  const float* qh = q + (bh * g.Nq + i0) * g.D;
  const float* kh = k + bh * g.Nk * g.D;
  const float* vh = v + bh * g.Nk * g.Dv;
  std::fill(acc.begin(), acc.begin() + nr_all * dvp, 0.f);
  std::fill(mrow.begin(), mrow.begin() + nr_all, kLcsaNegInf);
  std::fill(lrow.begin(), lrow.begin() + nr_all, 0.f);
  for (int64_t e = row_ptr[qb]; e < row_ptr[qb + 1]; ++e) {
    const int64_t kb = cols[e], j0 = kb * g.bs, j1 = std::min(g.Nk, j0 + g.bs), nk = j1 - j0;
    if (nk <= 0 || (causal && j0 > i1 - 1)) continue;  // past the keys, or every key after every query
    // pack K^T of the tile: kt[d][c], zero-padded to bkp columns
    for (int64_t d = 0; d < g.D; ++d) {
      float* kr = kt.data() + d * bkp;
      for (int64_t c = 0; c < nk; ++c) kr[c] = kh[(j0 + c) * g.D + d];
      for (int64_t c = nk; c < bkp; ++c) kr[c] = 0.f;
    }
    for (int64_t r0 = 0; r0 < nr_all; r0 += 4) {
      const int nr = int(std::min<int64_t>(4, nr_all - r0));
      float* s4 = s.data() + r0 * bkp;
      const float* q4 = qh + r0 * g.D;
      if (path == LcsaPath::avx512)
        lcsa_scores_avx512(q4, g.D, nr, kt.data(), bkp, g.D, bkp, scale, s4, bkp);
      else if (path == LcsaPath::avx2)
        lcsa_scores_avx2(q4, g.D, nr, kt.data(), bkp, g.D, bkp, scale, s4, bkp);
      else
        lcsa_scores_scalar(q4, g.D, nr, kt.data(), bkp, g.D, bkp, scale, s4, bkp);
      bool any = false;
      for (int r = 0; r < nr; ++r) {
        const int64_t i = i0 + r0 + r;
        const int64_t valid = causal ? std::min<int64_t>(nk, i - j0 + 1) : nk;
        float* orow = acc.data() + (r0 + r) * dvp;
        float* srow = s4 + r * bkp;
        bool upd;
        if (path == LcsaPath::avx512)
          upd = lcsa_softmax_row_avx512(srow, valid, bkp, mrow[r0 + r], lrow[r0 + r], orow, dvp);
        else if (path == LcsaPath::avx2)
          upd = lcsa_softmax_row_avx2(srow, valid, bkp, mrow[r0 + r], lrow[r0 + r], orow, dvp);
        else
          upd = lcsa_softmax_row_scalar(srow, valid, bkp, mrow[r0 + r], lrow[r0 + r], orow, dvp);
        any = any || upd;
      }
      if (!any) continue;
      const float* vt = vh + j0 * g.Dv;
      float* o4 = acc.data() + r0 * dvp;
      if (path == LcsaPath::avx512)
        lcsa_pv_avx512(s4, bkp, nr, vt, g.Dv, nk, g.Dv, o4, dvp);
      else if (path == LcsaPath::avx2)
        lcsa_pv_avx2(s4, bkp, nr, vt, g.Dv, nk, g.Dv, o4, dvp);
      else
        lcsa_pv_scalar(s4, bkp, nr, vt, g.Dv, nk, g.Dv, o4, dvp);
    }
  }
  for (int64_t r = 0; r < nr_all; ++r) {
    const float lr = lrow[r];
    float* out = o + (bh * g.Nq + i0 + r) * g.Dv;
    const float* a = acc.data() + r * dvp;
    if (lr > 0.f) {
      const float inv = 1.f / lr;
      for (int64_t c = 0; c < g.Dv; ++c) out[c] = a[c] * inv;
      lse[bh * g.Nq + i0 + r] = mrow[r] + std::log(lr);
    } else {  // no allowed key: 0 (torch's safe softmax convention), lse -inf
      for (int64_t c = 0; c < g.Dv; ++c) out[c] = 0.f;
      lse[bh * g.Nq + i0 + r] = kLcsaNegInf;
    }
  }
}

using LcsaArr = py::array_t<float, py::array::c_style | py::array::forcecast>;
using LcsaIdx = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

py::tuple lcsa_forward(LcsaArr q, LcsaArr k, LcsaArr v, LcsaIdx row_ptr, LcsaIdx cols, int64_t block_size,
                       bool causal, double scale, const std::string& version) {
  const char* fn = "block_sparse_attention";
  tl::need_ndim(q, 3, fn, "q");
  tl::need_ndim(k, 3, fn, "k");
  tl::need_ndim(v, 3, fn, "v");
  if (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0) || k.shape(2) != q.shape(2) || v.shape(1) != k.shape(1))
    tl::value_error(std::string(fn) + ": incompatible shapes q " + tl::shape_str(q) + ", k " + tl::shape_str(k) +
                    ", v " + tl::shape_str(v) + " (need q [BH,Nq,D], k [BH,Nk,D], v [BH,Nk,Dv])");
  if (block_size < 1) tl::value_error(std::string(fn) + ": block_size must be >= 1, got " + std::to_string(block_size));
  LcsaDims g{q.shape(0), q.shape(1), k.shape(1), q.shape(2), v.shape(2), block_size, 0, 0};
  g.nqb = (g.Nq + block_size - 1) / block_size;
  g.nkb = (g.Nk + block_size - 1) / block_size;
  if (row_ptr.ndim() != 1 || row_ptr.shape(0) != g.nqb + 1)
    tl::value_error(std::string(fn) + ": row_ptr must be 1-D with " + std::to_string(g.nqb + 1) +
                    " entries (query blocks + 1), got " + tl::shape_str(row_ptr));
  if (cols.ndim() != 1) tl::value_error(std::string(fn) + ": cols must be 1-D, got " + tl::shape_str(cols));
  const int64_t* rp = row_ptr.data();
  const int64_t* cl = cols.data();
  if (rp[0] != 0 || rp[g.nqb] != cols.shape(0))
    tl::value_error(std::string(fn) + ": row_ptr must start at 0 and end at len(cols) = " +
                    std::to_string(cols.shape(0)));
  for (int64_t b = 0; b < g.nqb; ++b)
    if (rp[b + 1] < rp[b]) tl::value_error(std::string(fn) + ": row_ptr must be non-decreasing");
  for (int64_t e = 0; e < cols.shape(0); ++e)
    if (cl[e] < 0 || cl[e] >= g.nkb)
      tl::value_error(std::string(fn) + ": cols[" + std::to_string(e) + "] = " + std::to_string(cl[e]) +
                      " is not a key block in [0, " + std::to_string(g.nkb) + ")");
  const LcsaPath path = lcsa_pick(version);
  py::array_t<float> o({g.BH, g.Nq, g.Dv});
  py::array_t<float> lse({g.BH, g.Nq});
  if (g.BH == 0 || g.Nq == 0) return py::make_tuple(o, lse);
  const float* pq = q.data();
  const float* pk = k.data();
  const float* pv = v.data();
  float* po = o.mutable_data();
  float* pl = lse.mutable_data();
  const float fscale = float(scale);
  {
    py::gil_scoped_release release;
    const int64_t items = g.BH * g.nqb;
    const int64_t work = g.BH * cols.shape(0) * block_size * block_size * std::max(g.D, g.Dv);
    const int64_t W = 16, bkp = (block_size + W - 1) / W * W, dvp = (g.Dv + W - 1) / W * W;
#pragma omp parallel if (work >= (int64_t(1) << 20) && items > 1)
    {
      std::vector<float> kt(static_cast<size_t>(std::max<int64_t>(1, g.D * bkp)));
      std::vector<float> s(static_cast<size_t>(block_size * bkp)), acc(static_cast<size_t>(block_size * dvp));
      std::vector<float> mrow(static_cast<size_t>(block_size)), lrow(static_cast<size_t>(block_size));
      // head-major items: a thread's next item mostly reuses the same head's K, V
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < items; ++it)
        lcsa_item(g, path, pq, pk, pv, rp, cl, causal, fscale, it / g.nqb, it % g.nqb, po, pl, kt, s, acc, mrow,
                  lrow);
    }
  }
  return py::make_tuple(o, lse);
}

}  // namespace

TL_REGISTER(longctx) {
  m.def("block_sparse_attention", &lcsa_forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("row_ptr"),
        py::arg("cols"), py::arg("block_size"), py::arg("causal") = false, py::arg("scale") = 1.0,
        py::arg("version") = "simd",
        "(o, lse) of block-sparse attention for q [BH,Nq,D], k [BH,Nk,D], v [BH,Nk,Dv] fp32 over the CSR block "
        "layout (row_ptr [nqb+1], cols: key blocks per query block), optionally causal; versions simd (best here), "
        "avx512, avx2, scalar");
  m.def("block_sparse_attention_path",
        [](const std::string& v) { return std::string(lcsa_path_name(lcsa_pick(v))); }, py::arg("version") = "simd",
        "the code path block_sparse_attention runs for this version on this CPU");
}
