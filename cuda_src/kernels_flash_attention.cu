// kernels_flash_attention.cu — O = softmax(Q K^T / sqrt(D) [causal]) V for q [BH, Nq, D], k [BH, Nk, D],
// v [BH, Nk, DV], float32; also writes lse [BH, Nq] for a recompute backward.
//
// Versions (validated against torch scaled_dot_product_attention in tests/test_kernels_cuda.py):
//   attention_v1_naive     one thread per query row, two passes over all keys (max, then exp-sum and P V),
//                          no shared memory — O(1) extra memory but every thread re-reads all of K and V
//   flash_attention_v2     grid (ceil(Nq / BR), BH), BR = blockDim.x threads = one query row each; K and V tiles
//                          of BC rows staged in shared memory (one coalesced load per tile, reused by BR rows);
//                          per-row online softmax (running max m, sum l) and accumulator in registers.
//                          D, DV <= 128 (compile-time MAXD); dynamic shared memory = 2 * BC * MAXD floats.
// Causal: key j > query i is masked (top-left aligned, torch's is_causal); tiles past the block's last query
// are skipped.
#include <cuda_runtime.h>
#include <math_constants.h>

#define MAXD 128

extern "C" __global__ void attention_v1_naive(const float* __restrict__ q, const float* __restrict__ k,
                                              const float* __restrict__ v, float* __restrict__ o,
                                              float* __restrict__ lse, int nq, int nk, int d, int dv, int causal,
                                              float scale) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int bh = blockIdx.y;
  if (i >= nq || d > MAXD || dv > MAXD) return;
  const float* qi = q + ((long long)bh * nq + i) * d;
  const float* kh = k + (long long)bh * nk * d;
  const float* vh = v + (long long)bh * nk * dv;
  const int last = causal ? min(nk - 1, i) : nk - 1;
  float m = -CUDART_INF_F;
  for (int j = 0; j <= last; ++j) {
    float s = 0.f;
    for (int t = 0; t < d; ++t) s += qi[t] * kh[(long long)j * d + t];
    m = fmaxf(m, s * scale);
  }
  float acc[MAXD];
  for (int t = 0; t < dv; ++t) acc[t] = 0.f;
  float l = 0.f;
  for (int j = 0; j <= last; ++j) {
    float s = 0.f;
    for (int t = 0; t < d; ++t) s += qi[t] * kh[(long long)j * d + t];
    const float p = __expf(s * scale - m);
    l += p;
    for (int t = 0; t < dv; ++t) acc[t] += p * vh[(long long)j * dv + t];
  }
  float* oi = o + ((long long)bh * nq + i) * dv;
  for (int t = 0; t < dv; ++t) oi[t] = acc[t] / l;
  lse[(long long)bh * nq + i] = m + logf(l);
}

extern "C" __global__ void flash_attention_v2(const float* __restrict__ q, const float* __restrict__ k,
                                              const float* __restrict__ v, float* __restrict__ o,
                                              float* __restrict__ lse, int nq, int nk, int d, int dv, int causal,
                                              float scale, int bc) {
  extern __shared__ float smem[];
  float* ks = smem;              // [bc][MAXD]
  float* vs = smem + bc * MAXD;  // [bc][MAXD]
  const int br = blockDim.x;
  const int i0 = blockIdx.x * br;
  const int i = i0 + threadIdx.x;
  const int bh = blockIdx.y;
  const bool active = i < nq && d <= MAXD && dv <= MAXD;
  float qreg[MAXD], acc[MAXD];
  for (int t = 0; t < MAXD; ++t) {
    qreg[t] = (active && t < d) ? q[((long long)bh * nq + i) * d + t] : 0.f;
    acc[t] = 0.f;
  }
  float m = -CUDART_INF_F, l = 0.f;
  const int hi = causal ? min(nk, i0 + br) : nk;
  for (int j0 = 0; j0 < hi; j0 += bc) {
    const int cnt = min(bc, nk - j0);
    // cooperative, coalesced load of the K and V tiles
    for (int e = threadIdx.x; e < cnt * d; e += br) ks[(e / d) * MAXD + e % d] = k[((long long)bh * nk + j0) * d + e];
    for (int e = threadIdx.x; e < cnt * dv; e += br)
      vs[(e / dv) * MAXD + e % dv] = v[((long long)bh * nk + j0) * dv + e];
    __syncthreads();
    if (active) {
      for (int j = 0; j < cnt; ++j) {
        if (causal && j0 + j > i) break;
        float s = 0.f;
        for (int t = 0; t < d; ++t) s += qreg[t] * ks[j * MAXD + t];
        s *= scale;
        const float mn = fmaxf(m, s);
        const float alpha = __expf(m - mn);  // m = -inf on the first key: alpha = 0
        const float p = __expf(s - mn);
        l = l * alpha + p;
        for (int t = 0; t < dv; ++t) acc[t] = acc[t] * alpha + p * vs[j * MAXD + t];
        m = mn;
      }
    }
    __syncthreads();
  }
  if (active) {
    float* oi = o + ((long long)bh * nq + i) * dv;
    for (int t = 0; t < dv; ++t) oi[t] = acc[t] / l;
    lse[(long long)bh * nq + i] = m + logf(l);
  }
}
