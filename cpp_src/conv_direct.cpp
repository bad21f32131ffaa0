// conv_direct.cpp — v3 of the cpp conv2d forward: a direct convolution over a channel-blocked layout (fp32, AVX-512),
// the scheme oneDNN's CPU convolutions use. Checked against v2 / numpy / torch in tests/test_conv_direct.py.
//
//   xb[n][cb][Hp][Wp][16]      = x[n, cb*16 + c, h - ph, w - pw]   (zero border: padding costs no branch)
//   wb[ob][cb][i][j][16c][16o] = W[ob*16 + o, cb*16 + c, i, j]    (flip_weight: W~ read from the dX weight layout)
//   y[n, ob*16 + o, oh, ow]    = b[o] + sum_{cb, i, j, c} xb[n][cb][oh + i][ow + j][c] * wb[ob][cb][i][j][c][o]
//
// Versions of the forward (the ladder, conv2d.py's FWD_VERSIONS): v0/v1 im2col + OpenBLAS, v2 implicit GEMM
// (conv_im2col.cpp: B packed from the image per KC block and tile), v3 this file. What v3 removes: v2 packs
// K x N*L values of B per call (9x the input for 3x3; ~12% of its time at 256 channels, per perf) and accumulates
// through strided NCHW rows; here the input is reordered once (1x the input) and the inner loop reads it in place.
//
// Register tile: UR (<= 14) output columns of one output row x NB (1 or 2) blocks of 16 output channels =
// UR*NB zmm accumulators (28 of 32 at the widest). Per (cb, i, j, c): NB weight vectors are loaded and each of the
// UR input values is broadcast and multiplied into NB accumulators: UR*NB FMAs per UR + NB loads. The tile is
// written to NCHW through a 16 x UR scratch transpose. Items (n, output-channel pair, oh) run on one OpenMP team
// after the two reorders (same team, one barrier).
// dW (conv2d_direct_dweight_f32, same scope): dy is reordered to [N][OC/16][OH][OW][16] too; one work item per
// (output-channel block, input-channel block) pair owns a 16 x 16 x kh x kw block of dW (no reduction between
// threads) and accumulates it over the positions in chunks of ~256 (16 FMAs per dy vector and 16 broadcasts).
// Scope (everything else runs v2): fp32, stride 1, dilation 1, groups 1, a kernel larger than 1x1, C and OC
// multiples of 16, the AVX-512 level selected (TINYLEARN_CPU_FEATURES); any H, W, padding.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>
#include <cstring>
#include <memory>
#include <string>

#include "common.h"
#include "conv_direct.h"
#include "gemm_ukr.h"
#include "simd_transpose.h"

namespace py = pybind11;

namespace {

constexpr ssize_t kB = 16;   // channels per block (one zmm of fp32)
constexpr int kMaxUR = 14;  // output columns per register tile (2 x 14 accumulators + 2 weights + 1 broadcast)

struct FreeDel {
  void operator()(float* p) const { std::free(p); }
};
std::unique_ptr<float[], FreeDel> alloc64(size_t n) {
  void* p = std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  return std::unique_ptr<float[], FreeDel>(static_cast<float*>(p));
}

// acc[u][b] += sum over the (cb, i, j, c) of the tile's reduction; xr: xb at (n, cb=0, oh, ow0), wr: wb at (ob, 0)
template <int UR, int NB>
__attribute__((target("avx512f"))) void tile_kernel(const float* xr, const float* wr, ssize_t CB, ssize_t kh,
                                                    ssize_t kw, ssize_t Hp, ssize_t Wp, ssize_t wob,
                                                    const float* bias, float* y, ssize_t L) {
  __m512 acc[UR][NB];
#pragma GCC unroll 2
  for (int b = 0; b < NB; ++b) {
    const __m512 v = bias ? _mm512_loadu_ps(bias + b * kB) : _mm512_setzero_ps();
#pragma GCC unroll 14
    for (int u = 0; u < UR; ++u) acc[u][b] = v;
  }
  for (ssize_t cb = 0; cb < CB; ++cb) {
    for (ssize_t i = 0; i < kh; ++i) {
      for (ssize_t j = 0; j < kw; ++j) {
        const float* xp = xr + ((cb * Hp + i) * Wp + j) * kB;
        const float* wp = wr + ((cb * kh + i) * kw + j) * kB * kB;
        for (int c = 0; c < kB; ++c) {
          __m512 wv[NB];
#pragma GCC unroll 2
          for (int b = 0; b < NB; ++b) wv[b] = _mm512_load_ps(wp + b * wob + c * kB);
#pragma GCC unroll 14
          for (int u = 0; u < UR; ++u) {
            const __m512 xv = _mm512_set1_ps(xp[u * kB + c]);
#pragma GCC unroll 2
            for (int b = 0; b < NB; ++b) acc[u][b] = _mm512_fmadd_ps(xv, wv[b], acc[u][b]);
          }
        }
      }
    }
  }
  // NCHW: y[o, ow0 + u] for the tile's 16*NB channels o and UR columns u: a 16x16 register transpose per block,
  // then one masked store of UR values per channel row
  const __mmask16 m = __mmask16((1u << UR) - 1);
#pragma GCC unroll 2
  for (int b = 0; b < NB; ++b) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int u = 0; u < 16; ++u) r[u] = u < UR ? acc[u < UR ? u : 0][b] : _mm512_setzero_ps();
    tl::transpose16x16_regs(r);
#pragma GCC unroll 16
    for (int o = 0; o < 16; ++o) _mm512_mask_storeu_ps(y + (b * kB + o) * L, m, r[o]);
  }
}

// d[u*16 + c] = s[c*plane + u] for c < 16, u < cnt (one row of 16 input planes -> cnt channel-blocked pixels)
__attribute__((target("avx512f"))) void reorder_block(const float* s, ssize_t plane, float* d, int cnt) {
  const __mmask16 m = __mmask16((1u << cnt) - 1);
  __m512 r[16];
#pragma GCC unroll 16
  for (int c = 0; c < 16; ++c) r[c] = _mm512_maskz_loadu_ps(m, s + c * plane);
  tl::transpose16x16_regs(r);
  for (int u = 0; u < cnt; ++u) _mm512_store_ps(d + u * kB, r[u]);
}

// x [N, C, H, W] -> xb[n][cb][H + 2ph][W + 2pw][16] with a zero border; a worksharing loop (call inside a
// parallel region; no barrier at the end)
void reorder_input(const float* x, float* xb, ssize_t N, ssize_t C, ssize_t H, ssize_t W, ssize_t ph, ssize_t pw) {
  const ssize_t CB = C / kB, Hp = H + 2 * ph, Wp = W + 2 * pw;
#pragma omp for schedule(static) nowait
  for (ssize_t r = 0; r < N * CB * Hp; ++r) {
    const ssize_t n = r / (CB * Hp), cb = (r / Hp) % CB, hp = r % Hp, h = hp - ph;
    float* d = xb + r * Wp * kB;
    if (h < 0 || h >= H) {
      std::memset(d, 0, size_t(Wp * kB) * sizeof(float));
      continue;
    }
    std::memset(d, 0, size_t(pw * kB) * sizeof(float));
    std::memset(d + (pw + W) * kB, 0, size_t(pw * kB) * sizeof(float));
    const float* src = x + ((n * C + cb * kB) * H + h) * W;
    for (ssize_t w0 = 0; w0 < W; w0 += kB)  // 16 channels x 16 columns -> 16 pixels of 16 channels
      reorder_block(src + w0, H * W, d + (pw + w0) * kB, int(std::min(kB, W - w0)));
  }
}

// dW tile of one (ob, cb, tap): acc[c] (16 output channels o in lanes) += sum over the chunk's positions of
// xb[.., oh + i, ow + j, c] * dyb[.., oh, ow, :]; 16 FMAs per 1 load + 16 broadcasts
__attribute__((target("avx512f"))) void dw_tile(const float* xr, const float* dr, ssize_t rows, ssize_t OW,
                                                ssize_t Wp, float* tile) {
  __m512 acc[kB];
#pragma GCC unroll 16
  for (int c = 0; c < kB; ++c) acc[c] = _mm512_load_ps(tile + c * kB);
  for (ssize_t r = 0; r < rows; ++r, xr += Wp * kB, dr += OW * kB)
    for (ssize_t ow = 0; ow < OW; ++ow) {
      const __m512 dv = _mm512_load_ps(dr + ow * kB);
      const float* xp = xr + ow * kB;
#pragma GCC unroll 16
      for (int c = 0; c < kB; ++c) acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(xp[c]), dv, acc[c]);
    }
#pragma GCC unroll 16
  for (int c = 0; c < kB; ++c) _mm512_store_ps(tile + c * kB, acc[c]);
}

using TileFn = void (*)(const float*, const float*, ssize_t, ssize_t, ssize_t, ssize_t, ssize_t, ssize_t,
                        const float*, float*, ssize_t);

template <int NB, int... U>
constexpr std::array<TileFn, sizeof...(U)> tile_table(std::integer_sequence<int, U...>) {
  return {&tile_kernel<U + 1, NB>...};
}

TileFn tile_fn(int ur, int nb) {
  static const auto t1 = tile_table<1>(std::make_integer_sequence<int, kMaxUR>{});
  static const auto t2 = tile_table<2>(std::make_integer_sequence<int, kMaxUR>{});
  return nb == 2 ? t2[size_t(ur - 1)] : t1[size_t(ur - 1)];
}

}  // namespace

namespace tl {

// Whether v3 serves a conv of these parameters here (fp32 is the caller's check).
// 1x1 stays on v2: its B panels are plain copies of x, and v3's reorders weigh 9x more against 9x fewer FMAs
// (measured 5.6 vs 4.7 ms for 64->256 @56, batch 4, one thread).
bool conv_direct_eligible(ssize_t C, ssize_t OC, std::pair<ssize_t, ssize_t> k, std::pair<ssize_t, ssize_t> s,
                          std::pair<ssize_t, ssize_t> d, ssize_t groups) {
  return groups == 1 && k.first * k.second > 1 && s.first == 1 && s.second == 1 && d.first == 1 && d.second == 1 && C % kB == 0 &&
         OC % kB == 0 && C > 0 && OC > 0 && std::string(gemm_micro_kernel_f32().isa) == "avx512";
}

// y [N, OC, OH, OW] (allocated by the caller) = conv2d(x, W, bias), stride 1, padding (ph, pw), no dilation.
// flip: wt is [C, OC, kh, kw] and W[o, c, i, j] = wt[c, o, kh-1-i, kw-1-j] (dX of a stride-1 conv).
void conv2d_direct_f32(const float* x, const float* wt, const float* bias, float* y, ssize_t N, ssize_t C, ssize_t H,
                       ssize_t W, ssize_t OC, ssize_t kh, ssize_t kw, ssize_t ph, ssize_t pw, ssize_t OH, ssize_t OW,
                       bool flip, int nt) {
  const ssize_t CB = C / kB, OB = OC / kB, Hp = H + 2 * ph, Wp = W + 2 * pw, KK = kh * kw, L = OH * OW;
  // + kB floats: the last tile's broadcasts stay inside the buffer whatever its width
  auto xb = alloc64(size_t(N * CB * Hp * Wp * kB + kB));
  auto wb = alloc64(size_t(OB * CB * KK * kB * kB));
  const ssize_t wob = CB * KK * kB * kB;  // floats between consecutive output-channel blocks in wb
  // ow blocks: ceil(OW / 14) of them, as even as possible (56 -> 4 x 14, 20 -> 10 + 10)
  const ssize_t nblk = (OW + kMaxUR - 1) / kMaxUR;
  const ssize_t npair = (OB + 1) / 2, items = N * npair * OH;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    reorder_input(x, xb.get(), N, C, H, W, ph, pw);  // omp for nowait
    // weight -> wb[ob][cb][i][j][c][o]
#pragma omp for schedule(static)
    for (ssize_t r = 0; r < OB * CB * KK; ++r) {
      const ssize_t ob = r / (CB * KK), cb = (r / KK) % CB, t = r % KK;
      float* d = wb.get() + r * kB * kB;
      for (ssize_t c = 0; c < kB; ++c)
        for (ssize_t o = 0; o < kB; ++o) {
          const ssize_t oo = ob * kB + o, cc = cb * kB + c;
          d[c * kB + o] = flip ? wt[(cc * OC + oo) * KK + (KK - 1 - t)] : wt[(oo * C + cc) * KK + t];
        }
    }  // implicit barrier: both reorders are complete
#pragma omp for schedule(dynamic, 1)
    for (ssize_t it = 0; it < items; ++it) {
      const ssize_t n = it / (npair * OH), pr = (it / OH) % npair, oh = it % OH;
      const ssize_t ob = 2 * pr;
      const int nb = ob + 1 < OB ? 2 : 1;
      const float* xr = xb.get() + (n * CB * Hp + oh) * Wp * kB;
      const float* wr = wb.get() + ob * wob;
      const float* bb = bias ? bias + ob * kB : nullptr;
      float* yr = y + (n * OC + ob * kB) * L + oh * OW;
      for (ssize_t q = 0; q < nblk; ++q) {
        const ssize_t ow0 = OW * q / nblk, ur = OW * (q + 1) / nblk - ow0;
        tile_fn(int(ur), nb)(xr + ow0 * kB, wr, CB, kh, kw, Hp, Wp, wob, bb, yr + ow0, L);
      }
    }
  }
}

// dW [OC, C, kh, kw] = sum over n, oh, ow of dy[n, o, oh, ow] * xpad[n, c, oh + i, ow + j] (stride 1, no
// dilation, groups 1). Both operands reordered to the blocked layout (x padded as in the forward, dy to
// [N][OC/16][OH][OW][16]); work items are the (ob, cb) pairs, each owning its 16 x 16 x kh x kw block of dW (no
// reduction between threads); per pair the positions run in chunks of output rows (~256 positions: the chunk's dy
// and x rows stay in L1/L2 while all kh*kw taps use them), each tap's 16 x 16 tile accumulated in an L1 buffer.
void conv2d_direct_dweight_f32(const float* x, const float* dy, float* dw, ssize_t N, ssize_t C, ssize_t H,
                               ssize_t W, ssize_t OC, ssize_t kh, ssize_t kw, ssize_t ph, ssize_t pw, ssize_t OH,
                               ssize_t OW, int nt) {
  const ssize_t CB = C / kB, OB = OC / kB, Hp = H + 2 * ph, Wp = W + 2 * pw, KK = kh * kw, L = OH * OW;
  auto xb = alloc64(size_t(N * CB * Hp * Wp * kB + kB));
  auto db = alloc64(size_t(N * OB * L * kB));
  const ssize_t R = std::max<ssize_t>(1, std::min<ssize_t>(OH, 256 / std::max<ssize_t>(OW, 1)));  // rows per chunk
  // per thread: the current pair's dW block [tap][c][o] (allocated here: an exception must not leave the region)
  auto tiles_all = alloc64(size_t(nt * KK * kB * kB));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    reorder_input(x, xb.get(), N, C, H, W, ph, pw);
#pragma omp for schedule(static)
    for (ssize_t r = 0; r < N * OB * OH; ++r) {  // dy -> dyb: one output row of 16 channels at a time
      const ssize_t n = r / (OB * OH), ob = (r / OH) % OB, oh = r % OH;
      const float* src = dy + ((n * OC + ob * kB) * OH + oh) * OW;
      float* d = db.get() + r * OW * kB;
      for (ssize_t w0 = 0; w0 < OW; w0 += kB) reorder_block(src + w0, L, d + w0 * kB, int(std::min(kB, OW - w0)));
    }  // implicit barrier: both reorders are complete
    float* const tiles = tiles_all.get() + tl::thread_id() * KK * kB * kB;
#pragma omp for schedule(dynamic, 1)
    for (ssize_t pr = 0; pr < OB * CB; ++pr) {
      const ssize_t ob = pr / CB, cb = pr % CB;
      std::memset(tiles, 0, size_t(KK * kB * kB) * sizeof(float));
      for (ssize_t n = 0; n < N; ++n)
        for (ssize_t oh0 = 0; oh0 < OH; oh0 += R) {
          const ssize_t rows = std::min(R, OH - oh0);
          const float* dr = db.get() + ((n * OB + ob) * OH + oh0) * OW * kB;
          for (ssize_t i = 0; i < kh; ++i)
            for (ssize_t j = 0; j < kw; ++j) {
              const float* xr = xb.get() + (((n * CB + cb) * Hp + oh0 + i) * Wp + j) * kB;
              dw_tile(xr, dr, rows, OW, Wp, tiles + (i * kw + j) * kB * kB);
            }
        }
      for (ssize_t t = 0; t < KK; ++t)  // [tap][c][o] -> dW[o][c][tap]
        for (ssize_t c = 0; c < kB; ++c)
          for (ssize_t o = 0; o < kB; ++o)
            dw[((ob * kB + o) * C + cb * kB + c) * KK + t] = tiles[size_t((t * kB + c) * kB + o)];
    }
  }
}

}  // namespace tl

TL_REGISTER(conv) {
  m.def(
      "direct_eligible",
      [](ssize_t C, ssize_t OC, std::pair<ssize_t, ssize_t> k, std::pair<ssize_t, ssize_t> s,
         std::pair<ssize_t, ssize_t> d, ssize_t groups) { return tl::conv_direct_eligible(C, OC, k, s, d, groups); },
      py::arg("C"), py::arg("OC"), py::arg("kernel_size"), py::arg("stride"), py::arg("dilation"), py::arg("groups"),
      "whether conv2d_forward(version='v3') runs the direct kernel (fp32) for these parameters here");
}
