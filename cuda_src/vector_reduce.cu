// vector_reduce.cu — the foundation's first CUDA kernel: sum a float vector with a block reduction.
//
// Versions (launch: grid = ceil(n / (2 * blockDim.x)) for v1/v2, any grid for v3; out[blockIdx.x] = partial sum,
// reduce the partials with a second launch of the same kernel or on the host):
//   v1 block_reduce_shared   each thread loads two elements, tree reduction in shared memory with
//                            __syncthreads() between halving steps (blockDim.x a power of two, <= 1024)
//   v2 block_reduce_warp     same loads; shared memory only down to 32 partials, then __shfl_down_sync
//                            inside one warp (no barriers in the last 5 steps)
//   v3 grid_stride_reduce    grid-stride loop (any n with a fixed grid), float4 vectorised loads when the
//                            pointer is 16-byte aligned, warp shuffles, one atomicAdd per block into out[0]
// Checked against numpy in tests/test_kernels_cuda.py (@pytest.mark.gpu).
#include <cuda_runtime.h>
#include "common.cuh"

extern "C" __global__ void block_reduce_shared(const float* __restrict__ x, float* __restrict__ out, int n) {
  extern __shared__ float buf[];
  const int tid = threadIdx.x;
  const int i = blockIdx.x * blockDim.x * 2 + tid;
  float v = 0.f;
  if (i < n) v += x[i];
  if (i + blockDim.x < n) v += x[i + blockDim.x];
  buf[tid] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) buf[tid] += buf[tid + s];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = buf[0];
}

extern "C" __global__ void block_reduce_warp(const float* __restrict__ x, float* __restrict__ out, int n) {
  extern __shared__ float buf[];
  const int tid = threadIdx.x;
  const int i = blockIdx.x * blockDim.x * 2 + tid;
  float v = 0.f;
  if (i < n) v += x[i];
  if (i + blockDim.x < n) v += x[i + blockDim.x];
  buf[tid] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s >= 32; s >>= 1) {
    if (tid < s) buf[tid] += buf[tid + s];
    __syncthreads();
  }
  if (tid < 32) {
    float w = blockDim.x >= 32 ? buf[tid] : (tid < blockDim.x ? buf[tid] : 0.f);
    w = warp_reduce_sum(w);
    if (tid == 0) out[blockIdx.x] = w;
  }
}

extern "C" __global__ void grid_stride_reduce(const float* __restrict__ x, float* __restrict__ out, long long n) {
  __shared__ float warp_partials[32];
  float v = 0.f;
  const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  if ((reinterpret_cast<unsigned long long>(x) & 15ull) == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const long long n4 = n / 4;
    for (long long i = tid; i < n4; i += stride) {
      const float4 f = x4[i];
      v += (f.x + f.y) + (f.z + f.w);
    }
    for (long long i = n4 * 4 + tid; i < n; i += stride) v += x[i];
  } else {
    for (long long i = tid; i < n; i += stride) v += x[i];
  }
  v = warp_reduce_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_partials[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (blockDim.x + 31) / 32 ? warp_partials[lane] : 0.f;
    v = warp_reduce_sum(v);
    if (lane == 0) atomicAdd(out, v);
  }
}
