// common.cuh — device helpers shared by the cuda_src/*.cu kernels (include "common.cuh"; nvcc finds it next to the
// including file, cupy.RawModule through -I<cuda_src> — see tinylearn/kernels/cuda.py).
//
//   kFullMask                   every lane of a warp takes part in the shuffle
//   warp_allreduce_sum(v)       butterfly (__shfl_xor_sync) sum: every lane ends with the warp's total
//   warp_reduce_sum(v)          tree (__shfl_down_sync) sum: lane 0 ends with the warp's total (others: partials)
// Both take 5 shuffle steps for 32 lanes; the summation order is fixed, so results repeat bit for bit.
#pragma once

static constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_allreduce_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_reduce_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(kFullMask, v, o);
  return v;
}
