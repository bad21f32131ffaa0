// memory_stream_ordered_alloc.cu — stream-ordered allocation with a CUDA memory pool (GPU-only example).
//
// What it shows (notebooks/07_memory_pools): the CUDA driver's own caching allocator. cudaMallocAsync /
// cudaFreeAsync allocate and free *in stream order* from a cudaMemPool_t; with a release threshold the pool keeps
// freed memory cached instead of returning it to the OS/driver at every synchronisation, so a steady-state
// training step allocates without cudaMalloc/cudaFree (and without cudaFree's implicit device synchronisation).
// This is the device-side analogue of tinylearn.memory.CachingAllocator.
//
// Entry points:
//   extern "C" __global__ fill_iota(float* x, int n)        x[i] = i
//   extern "C" __global__ scale_add(const float* x, float* y, float a, int n)   y[i] += a * x[i]
//   extern "C" int tl_stream_ordered_demo(int n, int iters, float* checksum_out)  host driver: creates a pool with
//       release threshold UINT64_MAX, runs `iters` iterations of {cudaMallocFromPoolAsync x, fill, scale_add,
//       cudaFreeAsync x} on one stream, returns 0 on success or the cudaError_t, and the sum of y in checksum_out
//       (expected: iters * n * (n - 1) / 2).
// Build check only on machines without a GPU: nvcc -ptx -arch=sm_80 (tests/test_cuda_compile.py). Never run here.
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" __global__ void fill_iota(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = (float)i;
}

extern "C" __global__ void scale_add(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

extern "C" int tl_stream_ordered_demo(int n, int iters, float* checksum_out) {
  cudaError_t err;
  int device = 0;
  if ((err = cudaGetDevice(&device)) != cudaSuccess) return (int)err;
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool;
  if ((err = cudaMemPoolCreate(&pool, &props)) != cudaSuccess) return (int)err;
  uint64_t threshold = UINT64_MAX;  // keep freed memory cached in the pool
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  float* y = nullptr;
  cudaMallocFromPoolAsync((void**)&y, sizeof(float) * (size_t)n, pool, stream);
  cudaMemsetAsync(y, 0, sizeof(float) * (size_t)n, stream);
  const int threads = 256, blocks = (n + threads - 1) / threads;
  for (int it = 0; it < iters; ++it) {
    float* x = nullptr;  // allocated and freed in stream order: reused from the pool after the first iteration
    cudaMallocFromPoolAsync((void**)&x, sizeof(float) * (size_t)n, pool, stream);
    fill_iota<<<blocks, threads, 0, stream>>>(x, n);
    scale_add<<<blocks, threads, 0, stream>>>(x, y, 1.0f, n);
    cudaFreeAsync(x, stream);
  }
  float* host = new float[n];
  cudaMemcpyAsync(host, y, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost, stream);
  cudaFreeAsync(y, stream);
  err = cudaStreamSynchronize(stream);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += host[i];
  delete[] host;
  *checksum_out = (float)sum;
  cudaStreamDestroy(stream);
  cudaMemPoolDestroy(pool);
  if (err == cudaSuccess) err = cudaGetLastError();
  return (int)err;
}
