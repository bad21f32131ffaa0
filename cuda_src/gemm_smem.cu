// gemm_smem.cu — shared-memory tiling: a block of TILE x TILE threads computes a TILE x TILE tile of C. Per step it
// stages a TILE x TILE tile of A and of B in shared memory (each element loaded from global memory once per block
// instead of once per thread), syncs, and runs TILE FMAs per thread out of shared memory: global traffic / TILE.
// Launch: block (32, 32), grid (ceil(N/32), ceil(M/32)). Shared reads: As[ty][k] is the same address for the whole
// warp (broadcast), Bs[k][tx] is 32 consecutive words = 32 different banks: no bank conflicts.
#define TILE 32

extern "C" __global__ void gemm_smem(const float* __restrict__ A, const float* __restrict__ B,
                                     float* __restrict__ C, int M, int N, int K) {
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
  float acc = 0.f;
  for (int t = 0; t < K; t += TILE) {
    As[ty][tx] = (row < M && t + tx < K) ? A[(size_t)row * K + t + tx] : 0.f;
    Bs[ty][tx] = (t + ty < K && col < N) ? B[(size_t)(t + ty) * N + col] : 0.f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();  // nobody overwrites the tiles while a slower warp still reads them
  }
  if (row < M && col < N) C[(size_t)row * N + col] = acc;
}
