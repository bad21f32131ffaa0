// kernels_softmax.cu — row softmax y = exp(x - max) / sum exp(x - max) over [rows, cols] float32, row-major.
//
// Versions (llm.c dev/cuda style; each validated against torch.softmax in tests/test_kernels_cuda.py):
//   softmax_v1_naive         one thread per row, three sequential passes over the row (baseline)
//   softmax_v2_shared        one block per row; strided loads, max then sum reduced in shared memory with a
//                            tree of __syncthreads() steps; blockDim.x a power of two <= 1024
//   softmax_v3_warp_online   one warp per row (blockDim.x = 32 * warps_per_block); each lane keeps an online
//                            (max, sum) pair over its strided elements, pairs merged with __shfl_xor_sync:
//                            m = max(m_a, m_b), d = d_a e^(m_a - m) + d_b e^(m_b - m); float4 loads when cols%4==0
//   softmax_backward_warp    dx = y * (dy - sum(dy * y)), one warp per row, shuffle reduction
// Fully masked rows (all -inf) give NaN, like torch.
#include <cuda_runtime.h>
#include <math_constants.h>
#include "common.cuh"

extern "C" __global__ void softmax_v1_naive(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + (long long)r * cols;
  float* yr = y + (long long)r * cols;
  float m = -CUDART_INF_F;
  for (int c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
  float s = 0.f;
  for (int c = 0; c < cols; ++c) s += expf(xr[c] - m);
  for (int c = 0; c < cols; ++c) yr[c] = expf(xr[c] - m) / s;
}

extern "C" __global__ void softmax_v2_shared(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
  extern __shared__ float buf[];
  const int r = blockIdx.x, tid = threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + (long long)r * cols;
  float* yr = y + (long long)r * cols;
  float m = -CUDART_INF_F;
  for (int c = tid; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  buf[tid] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) buf[tid] = fmaxf(buf[tid], buf[tid + s]);
    __syncthreads();
  }
  m = buf[0];
  __syncthreads();
  float sum = 0.f;
  for (int c = tid; c < cols; c += blockDim.x) sum += expf(xr[c] - m);
  buf[tid] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) buf[tid] += buf[tid + s];
    __syncthreads();
  }
  const float inv = 1.f / buf[0];
  for (int c = tid; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) * inv;
}

__device__ __forceinline__ void online_merge(float& m, float& d, float m2, float d2) {
  const float mn = fmaxf(m, m2);
  if (mn == -CUDART_INF_F) return;  // both empty / fully masked so far
  d = (m == -CUDART_INF_F ? 0.f : d * __expf(m - mn)) + (m2 == -CUDART_INF_F ? 0.f : d2 * __expf(m2 - mn));
  m = mn;
}

extern "C" __global__ void softmax_v3_warp_online(const float* __restrict__ x, float* __restrict__ y, int rows,
                                                  int cols) {
  const int warps = blockDim.x / 32;
  const int r = blockIdx.x * warps + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const float* xr = x + (long long)r * cols;
  float* yr = y + (long long)r * cols;
  float m = -CUDART_INF_F, d = 0.f;
  const bool vec = (cols % 4 == 0) && ((reinterpret_cast<unsigned long long>(xr) & 15ull) == 0);
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int c = lane; c < cols / 4; c += 32) {
      const float4 f = x4[c];
      online_merge(m, d, f.x, 1.f);
      online_merge(m, d, f.y, 1.f);
      online_merge(m, d, f.z, 1.f);
      online_merge(m, d, f.w, 1.f);
    }
  } else {
    for (int c = lane; c < cols; c += 32) online_merge(m, d, xr[c], 1.f);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(kFullMask, m, o);
    const float d2 = __shfl_xor_sync(kFullMask, d, o);
    online_merge(m, d, m2, d2);
  }
  const float inv = (m == -CUDART_INF_F) ? CUDART_NAN_F : 1.f / d;
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    float4* y4 = reinterpret_cast<float4*>(yr);
    for (int c = lane; c < cols / 4; c += 32) {
      const float4 f = x4[c];
      y4[c] = make_float4(__expf(f.x - m) * inv, __expf(f.y - m) * inv, __expf(f.z - m) * inv, __expf(f.w - m) * inv);
    }
  } else {
    for (int c = lane; c < cols; c += 32) yr[c] = __expf(xr[c] - m) * inv;
  }
}

extern "C" __global__ void softmax_backward_warp(const float* __restrict__ y, const float* __restrict__ dy,
                                                 float* __restrict__ dx, int rows, int cols) {
  const int warps = blockDim.x / 32;
  const int r = blockIdx.x * warps + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const long long off = (long long)r * cols;
  float s = 0.f;
  for (int c = lane; c < cols; c += 32) s += y[off + c] * dy[off + c];
  s = warp_allreduce_sum(s);
  for (int c = lane; c < cols; c += 32) dx[off + c] = y[off + c] * (dy[off + c] - s);
}
