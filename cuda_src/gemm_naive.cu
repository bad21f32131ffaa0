// gemm_naive.cu — C = A @ B (row-major fp32, A: M x K, B: K x N), one thread per element of C.
// Launch: block (16, 16), grid (ceil(N/16), ceil(M/16)). threadIdx.x runs along a row of C, so the 32 threads of a
// warp read 32 consecutive floats of B (one 128-byte transaction: coalesced) and all read the same A element
// (a broadcast). Every operand comes from global memory: 2 loads per FMA, intensity 0.25 FLOP/byte before caches.
extern "C" __global__ void gemm_naive(const float* __restrict__ A, const float* __restrict__ B,
                                      float* __restrict__ C, int M, int N, int K) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc += A[(size_t)row * K + k] * B[(size_t)k * N + col];
  C[(size_t)row * N + col] = acc;
}
