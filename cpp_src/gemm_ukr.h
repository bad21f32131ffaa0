// gemm_ukr.h — the packed GEMM micro-kernels of gemm.cpp for other kernels (conv_implicit.cpp's implicit-GEMM conv).
//
// Contract of ukr(kc, a, b, c, ldc):  c[i*ldc + j] += sum_k a[k*MR + i] * b[k*NR + j]  for the full MR x NR tile,
// a = an MR-row micro-panel (MR values per k), b = an NR-column micro-panel (NR values per k, 64-byte aligned).
// The kernel is the best ISA this CPU has at or below TINYLEARN_CPU_FEATURES (avx512 6x32 / avx2 6x16 fp32,
// 6x16 / 6x8 fp64, a scalar 6x16 / 6x8 loop otherwise), the one gemm.matmul(version="simd") uses.
#pragma once
#include <sys/types.h>

namespace tl {

template <class T>
struct GemmMicroKernel {
  void (*ukr)(ssize_t kc, const T* a, const T* b, T* c, ssize_t ldc);
  ssize_t MR, NR;
  const char* isa;  // "avx512", "avx2" or "scalar"
};

GemmMicroKernel<float> gemm_micro_kernel_f32();
GemmMicroKernel<double> gemm_micro_kernel_f64();

}  // namespace tl
