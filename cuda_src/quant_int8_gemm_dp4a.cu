// quant_int8_gemm_dp4a.cu — exact int8 x int8 -> int32 GEMM with __dp4a (sm_61+), for tinylearn.quant.
//
// C[M,N] = A[M,K] @ B[K,N]. __dp4a(a, b, c) = c + sum_{t<4} a.byte[t] * b.byte[t] with signed bytes, exact int32.
// Layouts: A row-major with K padded to a multiple of 4 (lda = K4 * 4 bytes, zero padding); B given transposed and
// padded the same way (Bt[N][K4*4]) so both operands read 4 consecutive k values as one int32.
//
// Versions:
//   int8_gemm_dp4a_naive   one thread per C element, loops over K/4 words (reference for the tiled one)
//   int8_gemm_dp4a_tiled   32x32 output tile per 256-thread block, 4 outputs per thread, K staged through shared
//                          memory in 32-word (128-byte) slabs; each thread loads one A word and one B word per slab row
// Launch: naive  grid (ceil(N/16), ceil(M/16)), block (16, 16)
//         tiled  grid (ceil(N/32), ceil(M/32)), block (32, 8)
// Not run here (no GPU): compiled by tests/test_quant_gemm.py with nvcc -ptx -arch=sm_80.

extern "C" __global__ void int8_gemm_dp4a_naive(const int* __restrict__ A, const int* __restrict__ Bt,
                                                int* __restrict__ C, int M, int N, int K4) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  int acc = 0;
  for (int k = 0; k < K4; ++k) acc = __dp4a(A[row * K4 + k], Bt[col * K4 + k], acc);
  C[row * N + col] = acc;
}

#define TILE 32
extern "C" __global__ void int8_gemm_dp4a_tiled(const int* __restrict__ A, const int* __restrict__ Bt,
                                                int* __restrict__ C, int M, int N, int K4) {
  __shared__ int As[TILE][TILE + 1];             // [row in tile][k word], +1 avoids bank conflicts
  __shared__ int Bs[TILE][TILE + 1];             // [col in tile][k word]
  const int tx = threadIdx.x, ty = threadIdx.y;  // 32 x 8
  const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
  int acc[4] = {0, 0, 0, 0};
  for (int k0 = 0; k0 < K4; k0 += TILE) {
    for (int r = ty; r < TILE; r += 8) {
      const int gr = row0 + r, gc = col0 + r, gk = k0 + tx;
      As[r][tx] = (gr < M && gk < K4) ? A[gr * K4 + gk] : 0;
      Bs[r][tx] = (gc < N && gk < K4) ? Bt[gc * K4 + gk] : 0;
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < TILE; ++k) {
      const int b = Bs[tx][k];
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] = __dp4a(As[ty + 8 * i][k], b, acc[i]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = row0 + ty + 8 * i, c = col0 + tx;
    if (r < M && c < N) C[r * N + c] = acc[i];
  }
}
