// softmax_rows.h — the statistics of one log-softmax row, shared by log_softmax (kernels_softmax.cpp) and
// cross_entropy (kernels_cross_entropy.cpp): m = max x and ls = log sum e^(x - m), the sum over 8 lanes
// (lane = index % 8) reduced by reduce8. One copy per ISA: scalar (emulating AVX2's 8 lanes), AVX2, AVX-512 (its 16
// lanes folded to 8 first); scalar and AVX2 agree bit for bit. float64 rows use libm (they exist for gradcheck).
#pragma once
#include <limits>

#include "kernels_math.h"

namespace tl {
namespace kern {

struct RowLse {
  float m, ls;
};

inline RowLse row_lse_scalar(const float* x, ssize_t C) {
  float m = -std::numeric_limits<float>::infinity();
  for (ssize_t c = 0; c < C; ++c) m = x[c] > m ? x[c] : m;
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (ssize_t c = 0; c < C; ++c) lanes[c & 7] += vm::scalar::exp(x[c] - m);
  return {m, std::log(reduce8(lanes))};
}

// lanes c0 .. c0 + n - 1 of a tail of n < 8 elements (a masked load reads nothing past the row)
TL_AVX2 inline __m256i tail_mask_avx2(ssize_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// the tail (< 8 elements) goes through one masked vector: element c still lands in lane c % 8, last, as in the
// scalar copy, so the two agree bit for bit
TL_AVX2 inline RowLse row_lse_avx2(const float* x, ssize_t C) {
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const ssize_t cv = C & ~ssize_t(7);
  const __m256i tm = tail_mask_avx2(C - cv);
  const __m256 tz = _mm256_maskload_ps(x + cv, tm);  // masked-off lanes 0: no exp of -inf (denormal work)
  __m256 mv = _mm256_blendv_ps(ninf, tz, _mm256_castsi256_ps(tm));
  for (ssize_t c = 0; c < cv; c += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + c));
  const float m = vm::avx2::hmax(mv);
  const __m256 mb = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  for (ssize_t c = 0; c < cv; c += 8)
    acc = _mm256_add_ps(acc, vm::avx2::exp(_mm256_sub_ps(_mm256_loadu_ps(x + c), mb)));
  if (cv < C)
    acc = _mm256_add_ps(acc, _mm256_and_ps(vm::avx2::exp(_mm256_sub_ps(tz, mb)), _mm256_castsi256_ps(tm)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  return {m, std::log(reduce8(lanes))};
}

// the tail (< 16 elements) goes through one masked vector
TL_AVX512 inline RowLse row_lse_avx512(const float* x, ssize_t C) {
  const ssize_t cv = C & ~ssize_t(15);
  const __mmask16 tm = __mmask16((1u << (C - cv)) - 1u);
  const __m512 tz = _mm512_maskz_loadu_ps(tm, x + cv);  // masked-off lanes 0: no exp of -inf (denormal work)
  __m512 mv = _mm512_mask_mov_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), tm, tz);
  for (ssize_t c = 0; c < cv; c += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + c));
  const float m = _mm512_reduce_max_ps(mv);
  const __m512 mb = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  for (ssize_t c = 0; c < cv; c += 16)
    acc = _mm512_add_ps(acc, vm::avx512::exp(_mm512_sub_ps(_mm512_loadu_ps(x + c), mb)));
  if (tm) acc = _mm512_mask_add_ps(acc, tm, acc, vm::avx512::exp(_mm512_sub_ps(tz, mb)));
  alignas(64) float l16[16];
  _mm512_store_ps(l16, acc);
  float lanes[8];
  for (int l = 0; l < 8; ++l) lanes[l] = l16[l] + l16[l + 8];
  return {m, std::log(reduce8(lanes))};
}

using RowLseFn = RowLse (*)(const float*, ssize_t);

// the float32 copy for this call: vm::best_isa() after TINYLEARN_CPU_FEATURES
inline RowLseFn pick_row_lse() {
  const vm::Isa isa = vm::best_isa();
  return isa == vm::Isa::avx512 ? row_lse_avx512 : isa == vm::Isa::avx2 ? row_lse_avx2 : row_lse_scalar;
}

}  // namespace kern
}  // namespace tl
