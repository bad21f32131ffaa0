// machine_probe.h — the instruction-ceiling probe of machine.cpp, callable from other C++ files (no Python types):
// kernels that choose between versions by what this core issues fastest (quant_int8_packed.h's AVX2 choice) ask it, and
// gemm.cpp's fma_peak (the compute roof) runs its FMA loop on every thread: the one machine probe in cpp_src.
#pragma once
#include <cstdint>
#include <string>

namespace tl {
// multiply-accumulates per second of one core issuing only `kind` (see machine.cpp: fp32_fma_ymm, int8_madd16_ymm,
// int8_u7_ymm, int8_wino_ymm, int8_madd16+fp32_fma_ymm, int8_madd16x2+fp32_fma_ymm, fp32_fma_zmm, int8_vnni_zmm)
// for `trips` loop trips. Throws std::invalid_argument for an unknown kind, trips < 1, or a kind the CPU lacks.
// Takes no lock and does not touch the GIL.
double mac_rate_raw(const std::string& kind, int64_t trips);
// The same loop without the clock, returning the multiply-accumulates it did; `kind` may also be "fp32_fma_scalar"
// (a scalar FMA loop, not one of mac_kinds): gemm.fma_peak runs it on every thread for the compute roof.
double mac_loop(const std::string& kind, int64_t trips);
}  // namespace tl
