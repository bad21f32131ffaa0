// gemm_regtile.cu — register tiling: 256 threads compute a BM x BN = 64 x 64 tile of C, each thread a TM x TN = 4 x 4
// sub-tile held in 16 registers. Per k step a thread loads TM values of A and TN of B from shared memory into
// registers and does TM*TN = 16 FMAs (an outer product): 8 shared loads per 16 FMAs instead of 2 per 1.
// A's tile is stored transposed (As[k][m]) so the TM values a thread needs are contiguous. Bank conflicts (replayed
// by tinylearn/gemm/cuda_trace.py): a warp's transposed store writes m in {0, 1} x k in 0..15; with rows of BM = 64
// words every one of those 32 words sits in bank 0 or 1 (16-way conflict), so each As row is padded by 2 words
// (bank = 2k + m: 32 different banks). Thread tx reads the B columns tx + 16j (not 4tx + j, which made tx and tx + 8
// share a bank: 2-way), and stores C with the same mapping (16 threads write 64 contiguous bytes).
// Launch: block 256, grid (ceil(N/64), ceil(M/64)). Any M, N, K (out-of-range elements load as 0).
#define BM 64
#define BN 64
#define BK 16
#define TM 4
#define TN 4

extern "C" __global__ void gemm_regtile(const float* __restrict__ A, const float* __restrict__ B,
                                        float* __restrict__ C, int M, int N, int K) {
  __shared__ float As[BK][BM + 2];  // +2: conflict-free transposed store
  __shared__ float Bs[BK][BN];
  const int tid = threadIdx.x;
  const int tx = tid % (BN / TN), ty = tid / (BN / TN);  // 16 x 16 threads
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  float acc[TM][TN] = {};
  float a[TM], b[TN];
  for (int t = 0; t < K; t += BK) {
    // 64 x 16 of A and 16 x 64 of B: 1024 elements each, 4 per thread; consecutive tids read consecutive addresses
    for (int e = tid; e < BM * BK; e += 256) {
      const int m = e / BK, k = e % BK;
      const int r = row0 + m, c = t + k;
      As[k][m] = (r < M && c < K) ? A[(size_t)r * K + c] : 0.f;
    }
    for (int e = tid; e < BK * BN; e += 256) {
      const int k = e / BN, n = e % BN;
      const int r = t + k, c = col0 + n;
      Bs[k][n] = (r < K && c < N) ? B[(size_t)r * N + c] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = As[k][ty * TM + i];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = Bs[k][tx + j * (BN / TN)];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int r = row0 + ty * TM + i;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int c = col0 + tx + j * (BN / TN);
      if (r < M && c < N) C[(size_t)r * N + c] = acc[i][j];
    }
  }
}
