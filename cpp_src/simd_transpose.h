// simd_transpose.h — the 16x16 fp32 register transpose (AVX-512) shared by conv_implicit.cpp (dW's cols panels) and
// conv_direct.cpp (the NCHW <-> channel-blocked reorders): unpack ps, unpack pd, two rounds of 128-bit lane
// shuffles; 16 loads and 16 stores instead of 256 scalar moves.
#pragma once
#include <immintrin.h>
#include <sys/types.h>

namespace tl {

// GCC 12 reports its own _mm512_undefined_* placeholders inside the shuffle intrinsics as uninitialised
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// r[u][i] <- r[i][u] in place
__attribute__((target("avx512f"), always_inline)) inline void transpose16x16_regs(__m512 r[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
      t[8 * i + j + 4] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
    }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
}

// dst[u*ldd + r] = src[r*lds + u] for r, u < 16
__attribute__((target("avx512f"))) inline void transpose16x16_f32(const float* src, ssize_t lds, float* dst,
                                                                  ssize_t ldd) {
  __m512 r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  transpose16x16_regs(r);
#pragma GCC unroll 16
  for (int u = 0; u < 16; ++u) _mm512_storeu_ps(dst + u * ldd, r[u]);
}
#pragma GCC diagnostic pop

}  // namespace tl
