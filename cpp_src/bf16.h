// bf16.h — the bfloat16 bit rules, one place (gemm.cpp's bf16_matmul, amp_bf16.cpp's casts).
// bfloat16 is the upper half of a float32: widening appends 16 zero bits (exact); narrowing rounds to nearest even
// by adding 0x7FFF plus the lowest kept bit before the shift (c10::round_to_nearest_even, which torch uses); a NaN
// becomes the quiet NaN 0x7FC0 (the bias could carry a payload into Inf); overflow carries into the exponent: Inf.
#pragma once
#include <cstdint>
#include <cstring>

namespace tl {

inline float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t bf16_round_bits(uint32_t u) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline uint16_t bf16_round(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return bf16_round_bits(u);
}

}  // namespace tl
