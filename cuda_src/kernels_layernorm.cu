// kernels_layernorm.cu — LayerNorm over the last dim of [rows, cols] float32: y = (x - mean) * rstd * w + b.
//
// Versions (validated against torch.nn.functional.layer_norm in tests/test_kernels_cuda.py):
//   layernorm_forward_v1_naive   one thread per row: mean pass, variance pass, write pass
//   layernorm_forward_v2_welford one warp per row; each lane runs Welford (n, mean, M2) over its strided elements,
//                                lanes merged with Chan's formula through __shfl_xor_sync; stores mean and rstd
//   layernorm_backward_warp      one warp per row: dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w;
//                                dw, db accumulated with atomicAdd into zero-initialised buffers
#include <cuda_runtime.h>
#include "common.cuh"

extern "C" __global__ void layernorm_forward_v1_naive(const float* __restrict__ x, const float* __restrict__ w,
                                                      const float* __restrict__ b, float* __restrict__ y,
                                                      float* __restrict__ mean, float* __restrict__ rstd, int rows,
                                                      int cols, float eps) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + (long long)r * cols;
  float s = 0.f;
  for (int c = 0; c < cols; ++c) s += xr[c];
  const float mu = s / cols;
  float v = 0.f;
  for (int c = 0; c < cols; ++c) v += (xr[c] - mu) * (xr[c] - mu);
  const float rs = rsqrtf(v / cols + eps);
  for (int c = 0; c < cols; ++c) y[(long long)r * cols + c] = (xr[c] - mu) * rs * w[c] + b[c];
  mean[r] = mu;
  rstd[r] = rs;
}

extern "C" __global__ void layernorm_forward_v2_welford(const float* __restrict__ x, const float* __restrict__ w,
                                                        const float* __restrict__ b, float* __restrict__ y,
                                                        float* __restrict__ mean, float* __restrict__ rstd, int rows,
                                                        int cols, float eps) {
  const int warps = blockDim.x / 32;
  const int r = blockIdx.x * warps + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const float* xr = x + (long long)r * cols;
  float n = 0.f, mu = 0.f, m2 = 0.f;
  for (int c = lane; c < cols; c += 32) {
    n += 1.f;
    const float delta = xr[c] - mu;
    mu += delta / n;
    m2 += delta * (xr[c] - mu);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float n2 = __shfl_xor_sync(kFullMask, n, o);
    const float mu2 = __shfl_xor_sync(kFullMask, mu, o);
    const float m22 = __shfl_xor_sync(kFullMask, m2, o);
    const float tot = n + n2;
    if (tot > 0.f) {
      const float delta = mu2 - mu;
      mu += delta * n2 / tot;
      m2 += m22 + delta * delta * n * n2 / tot;
      n = tot;
    }
  }
  const float rs = rsqrtf(m2 / cols + eps);
  for (int c = lane; c < cols; c += 32) y[(long long)r * cols + c] = (xr[c] - mu) * rs * w[c] + b[c];
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

extern "C" __global__ void layernorm_backward_warp(const float* __restrict__ dy, const float* __restrict__ x,
                                                   const float* __restrict__ w, const float* __restrict__ mean,
                                                   const float* __restrict__ rstd, float* __restrict__ dx,
                                                   float* __restrict__ dw, float* __restrict__ db, int rows, int cols) {
  const int warps = blockDim.x / 32;
  const int r = blockIdx.x * warps + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const long long off = (long long)r * cols;
  const float mu = mean[r], rs = rstd[r];
  float a = 0.f, bb = 0.f;
  for (int c = lane; c < cols; c += 32) {
    const float xh = (x[off + c] - mu) * rs;
    const float g = dy[off + c] * w[c];
    a += g;
    bb += g * xh;
    atomicAdd(&dw[c], dy[off + c] * xh);
    atomicAdd(&db[c], dy[off + c]);
  }
  a = warp_allreduce_sum(a);
  bb = warp_allreduce_sum(bb);
  a /= cols;
  bb /= cols;
  for (int c = lane; c < cols; c += 32) {
    const float xh = (x[off + c] - mu) * rs;
    dx[off + c] = rs * (dy[off + c] * w[c] - a - xh * bb);
  }
}
