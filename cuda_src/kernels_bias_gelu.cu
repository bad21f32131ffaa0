// kernels_bias_gelu.cu — y = gelu(x + b) over [rows, cols] float32, b of length cols; erf or tanh form.
//
// Versions (validated against torch.nn.functional.gelu in tests/test_kernels_cuda.py):
//   bias_gelu_v1           one thread per element, grid-stride loop
//   bias_gelu_v2_float4    four elements per thread through float4 loads/stores (cols % 4 == 0, aligned)
//   bias_gelu_backward     dx = dy * gelu'(x + b), dbias by atomicAdd into a zero-initialised buffer
// Derivatives: erf form gelu'(u) = Phi(u) + u phi(u), phi(u) = exp(-u^2/2)/sqrt(2 pi);
//              tanh form gelu'(u) = (1 + t)/2 + u/2 (1 - t^2) k (1 + 3 c u^2), t = tanh(k (u + c u^3)).
#include <cuda_runtime.h>

#define K_TANH 0.7978845608028654f
#define C_TANH 0.044715f

__device__ __forceinline__ float gelu_f(float u, int tanh_form) {
  if (tanh_form) return 0.5f * u * (1.f + tanhf(K_TANH * (u + C_TANH * u * u * u)));
  return 0.5f * u * (1.f + erff(u * 0.70710678118654752f));
}

__device__ __forceinline__ float dgelu_f(float u, int tanh_form) {
  if (tanh_form) {
    const float t = tanhf(K_TANH * (u + C_TANH * u * u * u));
    return 0.5f * (1.f + t) + 0.5f * u * (1.f - t * t) * K_TANH * (1.f + 3.f * C_TANH * u * u);
  }
  return 0.5f * (1.f + erff(u * 0.70710678118654752f)) + u * 0.3989422804014327f * expf(-0.5f * u * u);
}

extern "C" __global__ void bias_gelu_v1(const float* __restrict__ x, const float* __restrict__ b, float* __restrict__ y,
                                        long long n, int cols, int tanh_form) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] = gelu_f(x[i] + b[i % cols], tanh_form);
}

extern "C" __global__ void bias_gelu_v2_float4(const float* __restrict__ x, const float* __restrict__ b,
                                               float* __restrict__ y, long long n, int cols, int tanh_form) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float4* y4 = reinterpret_cast<float4*>(y);
  const long long n4 = n / 4;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
    const float4 f = x4[i];
    const int c = (int)((i * 4) % cols);  // cols % 4 == 0, so the 4 elements share a row
    y4[i] = make_float4(gelu_f(f.x + b[c], tanh_form), gelu_f(f.y + b[c + 1], tanh_form),
                        gelu_f(f.z + b[c + 2], tanh_form), gelu_f(f.w + b[c + 3], tanh_form));
  }
}

extern "C" __global__ void bias_gelu_backward(const float* __restrict__ dy, const float* __restrict__ x,
                                              const float* __restrict__ b, float* __restrict__ dx,
                                              float* __restrict__ db, long long n, int cols, int tanh_form) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const int c = (int)(i % cols);
    const float d = dy[i] * dgelu_f(x[i] + b[c], tanh_form);
    dx[i] = d;
    atomicAdd(&db[c], d);
  }
}
