// gemm_vec4.cu — gemm_regtile plus 128-bit memory instructions: global loads of A and B and stores of C as float4
// (one LDG.128 moves 4 floats: a quarter of the load instructions for the same bytes), shared reads of the 4
// A values and 4 B values a thread needs as float4 too. Requires K % 4 == 0 and N % 4 == 0 (rows 16-byte aligned);
// the host pads other shapes with zeros. Launch: block 256, grid (ceil(N/64), ceil(M/64)).
// The transposed store of A (thread (am, ak) writes As[ak + j][am], am = tid / 4 in 0..7 per warp) put the 4 rows
// ak + j of one store instruction in the same 8 banks (4-way conflict). Padding would break the 16-byte alignment of
// the float4 reads, so the column is XOR-swizzled instead: As[k][m ^ SWZ(k)] moves rows k = 0-3, 4-7, 8-11, 12-15
// to four different groups of 8 banks; SWZ(k) is a multiple of 8, so a float4 at (ty * TM) ^ SWZ(k) stays aligned
// and holds the same 4 values in order (replayed and emulated in tinylearn/gemm/cuda_trace.py).
#define BM 64
#define BN 64
#define BK 16
#define TM 4
#define TN 4
#define SWZ(k) ((((k) >> 2) & 3) << 3)

extern "C" __global__ void gemm_vec4(const float* __restrict__ A, const float* __restrict__ B,
                                     float* __restrict__ C, int M, int N, int K) {
  __shared__ __align__(16) float As[BK][BM];
  __shared__ __align__(16) float Bs[BK][BN];
  const int tid = threadIdx.x;
  const int tx = tid % (BN / TN), ty = tid / (BN / TN);
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  float acc[TM][TN] = {};
  // each thread loads one float4 of A (64 rows x 4 float4 per row) and one float4 of B (16 rows x 16 float4)
  const int am = tid / (BK / 4), ak = (tid % (BK / 4)) * 4;
  const int bk = tid / (BN / 4), bn = (tid % (BN / 4)) * 4;
  for (int t = 0; t < K; t += BK) {
    float4 va = make_float4(0.f, 0.f, 0.f, 0.f), vb = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row0 + am < M && t + ak < K) va = *reinterpret_cast<const float4*>(A + (size_t)(row0 + am) * K + t + ak);
    if (t + bk < K && col0 + bn < N) vb = *reinterpret_cast<const float4*>(B + (size_t)(t + bk) * N + col0 + bn);
    As[ak + 0][am ^ SWZ(ak + 0)] = va.x;  // transpose on the way into shared memory
    As[ak + 1][am ^ SWZ(ak + 1)] = va.y;
    As[ak + 2][am ^ SWZ(ak + 2)] = va.z;
    As[ak + 3][am ^ SWZ(ak + 3)] = va.w;
    *reinterpret_cast<float4*>(&Bs[bk][bn]) = vb;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const float4 a4 = *reinterpret_cast<const float4*>(&As[k][(ty * TM) ^ SWZ(k)]);
      const float4 b4 = *reinterpret_cast<const float4*>(&Bs[k][tx * TN]);
      const float a[TM] = {a4.x, a4.y, a4.z, a4.w}, b[TN] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int r = row0 + ty * TM + i, c = col0 + tx * TN;
    if (r < M && c < N)  // N % 4 == 0 and c % 4 == 0: the whole float4 is in range
      *reinterpret_cast<float4*>(C + (size_t)r * N + c) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
  }
}
