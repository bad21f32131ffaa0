// sparse_csr_spmv.cu — CSR sparse matrix x dense vector, y = A x (fp32), two classic mappings of rows to threads.
//
// Format (as tinylearn/sparse/csr.py): indptr int64 [M+1], indices int32 [nnz], data float [nnz].
//
// Versions:
//   csr_spmv_scalar  one thread per row. Simple; neighbouring threads read far-apart data (uncoalesced), and a
//                    warp waits for its longest row. Good when rows are short (< ~8 nonzeros).
//   csr_spmv_vector  one warp (32 lanes) per row: lanes stride through the row (coalesced loads of indices/data),
//                    then a shuffle-tree reduction (__shfl_down_sync) leaves the sum in lane 0. Good for long rows.
// Launch: scalar  grid = ceil(M / block), block = 256;  vector  grid = ceil(M * 32 / block), block = 256.
// Both are checked on a GPU by tests/test_sparse.py (marked gpu); here nvcc -ptx -arch=sm_80 compiles them.
#include <cstdint>
#include "common.cuh"

extern "C" __global__ void csr_spmv_scalar(const int64_t* __restrict__ indptr, const int32_t* __restrict__ indices,
                                           const float* __restrict__ data, const float* __restrict__ x,
                                           float* __restrict__ y, int64_t M) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= M) return;
  float acc = 0.f;
  for (int64_t k = indptr[row]; k < indptr[row + 1]; ++k) acc += data[k] * __ldg(&x[indices[k]]);
  y[row] = acc;
}

extern "C" __global__ void csr_spmv_vector(const int64_t* __restrict__ indptr, const int32_t* __restrict__ indices,
                                           const float* __restrict__ data, const float* __restrict__ x,
                                           float* __restrict__ y, int64_t M) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = tid / 32;
  const int lane = threadIdx.x & 31;
  if (row >= M) return;  // whole warps exit together: row is uniform across a warp
  float acc = 0.f;
  for (int64_t k = indptr[row] + lane; k < indptr[row + 1]; k += 32) acc += data[k] * __ldg(&x[indices[k]]);
  acc = warp_reduce_sum(acc);  // lane 0 holds the row sum
  if (lane == 0) y[row] = acc;
}
