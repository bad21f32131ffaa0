// conv_direct.cpp — v3 of the cpp conv2d: a direct convolution over a channel-blocked layout (fp32), the scheme
// oneDNN's CPU convolutions use; forward (also dX of stride-1 convs, on the flipped weights) and dW. The body is
// conv_direct_simd.inc, compiled twice: AVX-512 with B = 16-channel blocks (nChw16c) and AVX2 with B = 8 (nChw8c);
// TINYLEARN_CPU_FEATURES picks, as for the GEMM micro-kernels. Checked against v2 and torch at every level in
// tests/test_conv_implicit.py.
//
//   xb[n][cb][Hp][Wp][B]     = x[n, cb*B + c, h - ph, w - pw]       (a zero border: padding costs no branch)
//   wb[ob][cb][i][j][Bc][Bo] = W[ob*B + o, cb*B + c, i, j]          (flip_weight: W~ read from the dX weight layout)
//   y[n, ob*B + o, oh, ow]   = b[o] + sum_{cb, i, j, c} xb[n][cb][oh + i][ow + j][c] * wb[ob][cb][i][j][c][o]
//
// Versions of the forward (the ladder, conv2d.py's FWD_VERSIONS): v0/v1 im2col + OpenBLAS, v2 implicit GEMM
// (conv_implicit.cpp: B packed from the image per KC block and tile), v3 this file. What v3 removes: v2 packs
// K x N*L values of B per call (9x the input for 3x3; ~12% of its time at 256 channels, per perf) and accumulates
// through strided NCHW rows; here the input is reordered once (1x the input) and the inner loop reads it in place.
//
// Forward register tile: UR output columns of one output row x NB (1 or 2) blocks of B output channels = UR*NB
// accumulators (UR <= 14 on AVX-512: 28 of 32 zmm + 2 weights + 1 broadcast; UR <= 6 on AVX2: 12 of 16 ymm + 2 + 1).
// Per (cb, i, j, c): NB weight vectors are loaded and each of the UR input values is broadcast into NB
// FMAs. The tile goes back to NCHW through a B x B register transpose. Items (n, output-channel pair, oh) run on one
// OpenMP team after the two reorders; below 3e7 MACs on the calling thread alone (kDirectParallelMinMacs: in a
// training step of small layers a team's spinning workers cost more than they save).
// dW: dy is reordered to [N][OC/B][OH][OW][B] too; one work item per (output-channel block, input-channel block)
// pair owns a B x B x kh x kw block of dW (no reduction between threads) and accumulates it over the positions in
// chunks of ~256 (B FMAs per dy vector and B broadcasts).
// Small-C forward (forward_plain): where no channel block divides C (the stem's 3 channels, the digits CNN's 1), the
// input is only zero-padded, planar (xp[n][c][Hp][Wp]), W is wp[ob][c][i][j][Bo], and the same register tile
// broadcasts xp[c][oh*sh + i][(ow0 + u)*sw + j]: any row stride, column stride 1 or 2 (template). On the stem
// (7x7/2 3 -> 64 @224, batch 4, 2 threads) it is 5.0 ms against v2's 6.3 and torch's 4.8 (AVX-512).
// Scope of the channel-blocked kernels (everything else, and dW of small-C layers, runs v2): fp32, stride 1,
// dilation 1, groups 1, a kernel larger than 1x1, C and OC multiples of B, the AVX-512 or AVX2 level selected (on
// AVX-512, channel counts that 16 does not divide but 8 does take the AVX2 build); any H, W, padding.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "common.h"
#include "conv_direct.h"
#include "gemm_ukr.h"
#include "simd_transpose.h"

namespace py = pybind11;

namespace {

struct FreeDel {
  void operator()(float* p) const { std::free(p); }
};
std::unique_ptr<float[], FreeDel> alloc64(size_t n) {
  void* p = std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  return std::unique_ptr<float[], FreeDel>(static_cast<float*>(p));
}

}  // namespace

// ------------------------------------------------------------------------------ AVX-512: 16-channel blocks
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace cd_avx512 {
using vf = __m512;
constexpr ssize_t kB = 16;  // channels per block = lanes
constexpr int kMaxUR = 14;  // 2 x 14 accumulators + 2 weight vectors + 1 broadcast of the 32 zmm registers
inline vf load(const float* p) { return _mm512_load_ps(p); }
inline vf loadu(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, vf v) { _mm512_store_ps(p, v); }
inline vf splat(float v) { return _mm512_set1_ps(v); }
inline vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf zero() { return _mm512_setzero_ps(); }
inline vf load_first(const float* p, int cnt) { return _mm512_maskz_loadu_ps(__mmask16((1u << cnt) - 1), p); }
inline void store_first(float* p, vf v, int cnt) { _mm512_mask_storeu_ps(p, __mmask16((1u << cnt) - 1), v); }
inline void transpose(vf r[16]) { tl::transpose16x16_regs(r); }
#include "conv_direct_simd.inc"
}  // namespace cd_avx512
#pragma GCC pop_options

// ------------------------------------------------------------------------------ AVX2: 8-channel blocks
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace cd_avx2 {
using vf = __m256;
constexpr ssize_t kB = 8;
// 2 x 6 accumulators + 2 weights + 1 broadcast = 15 of the 16 ymm registers. 7 columns (14 accumulators) left
// GCC one register short: it kept the weights in registers and spilled an accumulator, a store-to-load chain
// through the stack in every step, and the forward ran at 1.9x torch on a true AVX2 build (-mavx2, no AVX-512)
// against 1.0-1.05x with 6. Under -march=native on an AVX-512 machine this namespace may use all 32 registers, so
// the forced-AVX2 proxy there hid the spill: measure AVX2 kernels with a portable build (TINYLEARN_NATIVE=OFF).
constexpr int kMaxUR = 6;
inline vf load(const float* p) { return _mm256_load_ps(p); }
inline vf loadu(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, vf v) { _mm256_store_ps(p, v); }
inline vf splat(float v) { return _mm256_set1_ps(v); }
inline vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf zero() { return _mm256_setzero_ps(); }
inline __m256i first(int cnt) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline vf load_first(const float* p, int cnt) { return _mm256_maskload_ps(p, first(cnt)); }
// (not vmaskmovps: its store form is slow on AMD cores, ~1 per 10+ cycles; the output tiles of small layers showed it)
inline void store_first(float* p, vf v, int cnt) {
  if (cnt == 8) return _mm256_storeu_ps(p, v);
  __m128 lo = _mm256_castps256_ps128(v);
  if (cnt & 4) {
    _mm_storeu_ps(p, lo);
    lo = _mm256_extractf128_ps(v, 1);
    p += 4;
  }
  if (cnt & 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(p), lo);
    lo = _mm_movehl_ps(lo, lo);
    p += 2;
  }
  if (cnt & 1) _mm_store_ss(p, lo);
}
inline void transpose(vf r[8]) {  // 8 x 8 in place: unpack ps, shuffle ps, 128-bit lane permutes
  vf t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    u[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}
#include "conv_direct_simd.inc"
}  // namespace cd_avx2
#pragma GCC pop_options

namespace tl {

// The channel block of the level selected now (TINYLEARN_CPU_FEATURES, as the GEMM micro-kernels): 16 on AVX-512,
// 8 on AVX2, 0 (no v3) at the scalar level.
ssize_t conv_direct_block() {
  const std::string isa = gemm_micro_kernel_f32().isa;
  return isa == "avx512" ? 16 : isa == "avx2" ? 8 : 0;
}

// The largest channel block that divides n > 0: the level's own, or a smaller one down to the AVX2 build's 8; 0 when
// none does (or n <= 0).
static ssize_t conv_direct_block_dividing(ssize_t n) {
  for (ssize_t B = conv_direct_block(); B >= 8; B /= 2)
    if (n > 0 && n % B == 0) return B;
  return 0;
}

// The block for C input and OC output channels: the level's own, or on AVX-512 the AVX2 build's 8 when 16 does not
// divide both (8 -> 16 channels, as in small CNNs); 0 when no block divides them (v3 then runs v2). The blocks are
// powers of two, so the largest that divides both is the smaller of the two largest.
ssize_t conv_direct_block_for(ssize_t C, ssize_t OC) {
  return std::min(conv_direct_block_dividing(C), conv_direct_block_dividing(OC));
}

// Whether v3 serves a conv of these parameters here (fp32 is the caller's check).
// 1x1 stays on v2: its B panels are plain copies of x, and v3's reorders weigh 9x more against 9x fewer FMAs
// (measured 5.6 vs 4.7 ms for 64->256 @56, batch 4, one thread).
bool conv_direct_eligible(ssize_t C, ssize_t OC, std::pair<ssize_t, ssize_t> k, std::pair<ssize_t, ssize_t> s,
                          std::pair<ssize_t, ssize_t> d, ssize_t groups) {
  return groups == 1 && k.first * k.second > 1 && s.first == 1 && s.second == 1 && d.first == 1 && d.second == 1 &&
         conv_direct_block_for(C, OC) > 0;
}

// The small-C forward (forward_plain): no channel block divides C (the stem's 3 input channels), one divides OC;
// groups 1, no dilation, a kernel larger than 1x1, any row stride, column stride 1 or 2. Its block: the level's own
// when it divides OC, else 8 (the AVX2 build). 0 when it does not apply.
ssize_t conv_direct_plain_block(ssize_t C, ssize_t OC, std::pair<ssize_t, ssize_t> k, std::pair<ssize_t, ssize_t> s,
                                std::pair<ssize_t, ssize_t> d, ssize_t groups) {
  if (groups != 1 || k.first * k.second <= 1 || d.first != 1 || d.second != 1 || s.first < 1 || s.second < 1 ||
      s.second > 2 || C <= 0 || conv_direct_block_for(C, OC) != 0)
    return 0;
  return conv_direct_block_dividing(OC);
}

ConvDirectKind conv_direct_forward_kind(ssize_t C, ssize_t OC, std::pair<ssize_t, ssize_t> k,
                                        std::pair<ssize_t, ssize_t> s, std::pair<ssize_t, ssize_t> d, ssize_t groups) {
  if (conv_direct_eligible(C, OC, k, s, d, groups)) return ConvDirectKind::blocked;
  if (conv_direct_plain_block(C, OC, k, s, d, groups) > 0) return ConvDirectKind::plain;
  return ConvDirectKind::none;
}

// Below this many multiply-adds v3 runs on the calling thread. Its team's libgomp workers spin after the region
// (GOMP_SPINCOUNT) and, in a training step of small layers, steal the cores from the OpenBLAS / numpy work that
// follows: the digits CNN step (its 8 -> 16 conv: 7e6 MACs) took 8.2 ms with a 2-thread v3, 4.3 ms on v1, and with
// OMP_WAIT_POLICY=passive 3.0 ms, so the kernel was not the cost.
constexpr double kDirectParallelMinMacs = 3e7;

static int direct_threads(ssize_t N, ssize_t C, ssize_t OC, ssize_t OH, ssize_t OW, ssize_t kh, ssize_t kw) {
  return double(N) * OC * OH * OW * C * kh * kw >= kDirectParallelMinMacs ? n_threads() : 1;
}

void conv2d_direct_f32(const float* x, const float* wt, const float* bias, float* y, ssize_t N, ssize_t C, ssize_t H,
                       ssize_t W, ssize_t OC, ssize_t kh, ssize_t kw, ssize_t ph, ssize_t pw, ssize_t OH, ssize_t OW,
                       bool flip) {
  const int nt = direct_threads(N, C, OC, OH, OW, kh, kw);
  if (conv_direct_block_for(C, OC) == 16)
    cd_avx512::forward(x, wt, bias, y, N, C, H, W, OC, kh, kw, ph, pw, OH, OW, flip, nt);
  else
    cd_avx2::forward(x, wt, bias, y, N, C, H, W, OC, kh, kw, ph, pw, OH, OW, flip, nt);
}

void conv2d_direct_plain_f32(const float* x, const float* wt, const float* bias, float* y, ssize_t N, ssize_t C,
                             ssize_t H, ssize_t W, ssize_t OC, ssize_t kh, ssize_t kw, ssize_t sh, ssize_t sw,
                             ssize_t ph, ssize_t pw, ssize_t OH, ssize_t OW, bool flip) {
  const int nt = direct_threads(N, C, OC, OH, OW, kh, kw);
  if (conv_direct_plain_block(C, OC, {kh, kw}, {sh, sw}, {1, 1}, 1) == 16)
    cd_avx512::forward_plain(x, wt, bias, y, N, C, H, W, OC, kh, kw, sh, sw, ph, pw, OH, OW, flip, nt);
  else
    cd_avx2::forward_plain(x, wt, bias, y, N, C, H, W, OC, kh, kw, sh, sw, ph, pw, OH, OW, flip, nt);
}

void conv2d_direct_dweight_f32(const float* x, const float* dy, float* dw, ssize_t N, ssize_t C, ssize_t H,
                               ssize_t W, ssize_t OC, ssize_t kh, ssize_t kw, ssize_t ph, ssize_t pw, ssize_t OH,
                               ssize_t OW) {
  const int nt = direct_threads(N, C, OC, OH, OW, kh, kw);
  if (conv_direct_block_for(C, OC) == 16)
    cd_avx512::dweight(x, dy, dw, N, C, H, W, OC, kh, kw, ph, pw, OH, OW, nt);
  else
    cd_avx2::dweight(x, dy, dw, N, C, H, W, OC, kh, kw, ph, pw, OH, OW, nt);
}

}  // namespace tl

TL_REGISTER(conv) {
  m.def(
      "direct_eligible",
      [](ssize_t C, ssize_t OC, std::pair<ssize_t, ssize_t> k, std::pair<ssize_t, ssize_t> s,
         std::pair<ssize_t, ssize_t> d, ssize_t groups) { return tl::conv_direct_eligible(C, OC, k, s, d, groups); },
      py::arg("C"), py::arg("OC"), py::arg("kernel_size"), py::arg("stride"), py::arg("dilation"), py::arg("groups"),
      "whether conv2d_forward(version='v3') runs the direct kernel (fp32) for these parameters here");
  m.def(
      "direct_forward_eligible",
      [](ssize_t C, ssize_t OC, std::pair<ssize_t, ssize_t> k, std::pair<ssize_t, ssize_t> s,
         std::pair<ssize_t, ssize_t> d, ssize_t groups) {
        const tl::ConvDirectKind kind = tl::conv_direct_forward_kind(C, OC, k, s, d, groups);
        return kind != tl::ConvDirectKind::none;
      },
      py::arg("C"), py::arg("OC"), py::arg("kernel_size"), py::arg("stride"), py::arg("dilation"), py::arg("groups"),
      "whether conv2d_forward(version='v3') runs a direct kernel (fp32) for these parameters here: the channel-blocked "
      "one (direct_eligible) or the small-C one (no channel block divides C, e.g. the 3-channel stem; any row stride, "
      "column stride 1 or 2)");
  m.def("direct_block", &tl::conv_direct_block,
        "v3's channel block at the SIMD level selected now: 16 (AVX-512), 8 (AVX2), 0 (scalar: v3 runs v2)");
}
