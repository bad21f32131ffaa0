// conv_direct.h — v3 of the cpp conv2d (conv_direct.cpp): direct convolution over a channel-blocked layout.
#pragma once
#include <sys/types.h>

#include <utility>

namespace tl {
// The channel block v3 uses at the SIMD level selected now: 16 (AVX-512), 8 (AVX2) or 0 (scalar: no v3).
ssize_t conv_direct_block();
// Whether v3 covers a conv with these parameters on the SIMD level selected now (fp32 is the caller's check).
bool conv_direct_eligible(ssize_t C, ssize_t OC, std::pair<ssize_t, ssize_t> kernel, std::pair<ssize_t, ssize_t> stride,
                          std::pair<ssize_t, ssize_t> dilation, ssize_t groups);
// The channel block of the small-C forward (conv2d_direct_plain_f32) for these parameters, 0 when it does not apply:
// no channel block divides C, one divides OC, groups 1, no dilation, a kernel larger than 1x1, column stride <= 2.
ssize_t conv_direct_plain_block(ssize_t C, ssize_t OC, std::pair<ssize_t, ssize_t> kernel,
                                std::pair<ssize_t, ssize_t> stride, std::pair<ssize_t, ssize_t> dilation,
                                ssize_t groups);
// Which direct forward serves a conv of these parameters on the SIMD level selected now (fp32 is the caller's check):
// the channel-blocked one (conv2d_direct_f32, where conv_direct_eligible), else the small-C one
// (conv2d_direct_plain_f32, where conv_direct_plain_block > 0), else none (v2 runs).
enum class ConvDirectKind { none, blocked, plain };
ConvDirectKind conv_direct_forward_kind(ssize_t C, ssize_t OC, std::pair<ssize_t, ssize_t> kernel,
                                        std::pair<ssize_t, ssize_t> stride, std::pair<ssize_t, ssize_t> dilation,
                                        ssize_t groups);
// The same conv as conv2d_direct_f32 with strides (sh, sw) on a planar input (the stem: 3 channels, 7x7, stride 2).
void conv2d_direct_plain_f32(const float* x, const float* wt, const float* bias, float* y, ssize_t N, ssize_t C,
                             ssize_t H, ssize_t W, ssize_t OC, ssize_t kh, ssize_t kw, ssize_t sh, ssize_t sw,
                             ssize_t ph, ssize_t pw, ssize_t OH, ssize_t OW, bool flip);
// y [N, OC, OH, OW] = conv2d(x, W, bias), stride 1, padding (ph, pw), no dilation, groups 1; OpenMP threads from
// 3e7 multiply-adds.
// flip: wt is [C, OC, kh, kw] and W[o, c, i, j] = wt[c, o, kh-1-i, kw-1-j] (dX of a stride-1 conv).
void conv2d_direct_f32(const float* x, const float* wt, const float* bias, float* y, ssize_t N, ssize_t C, ssize_t H,
                       ssize_t W, ssize_t OC, ssize_t kh, ssize_t kw, ssize_t ph, ssize_t pw, ssize_t OH, ssize_t OW,
                       bool flip);
// dW [OC, C, kh, kw] of the same convs (stride 1, no dilation, groups 1), x [N, C, H, W], dy [N, OC, OH, OW].
void conv2d_direct_dweight_f32(const float* x, const float* dy, float* dw, ssize_t N, ssize_t C, ssize_t H,
                               ssize_t W, ssize_t OC, ssize_t kh, ssize_t kw, ssize_t ph, ssize_t pw, ssize_t OH,
                               ssize_t OW);
}  // namespace tl
