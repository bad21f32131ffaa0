// cpu_features.h — the one run-time CPU feature check every dispatching C++ kernel uses.
//
//   if (tl::cpu_has("avx512vnni")) ... else if (tl::cpu_has("avx2")) ... else scalar
//
// TINYLEARN_CPU_FEATURES forces a level (read on every call, so a process may change it between calls):
//   unset / ""  the features the CPU reports (__builtin_cpu_supports)
//   scalar      no SIMD feature at all: every kernel takes its portable C++ path
//   avx2        the x86-64-v3 set only (sse4.2, avx, avx2, fma, f16c), and only where the CPU has it
//   avx512      the features the CPU reports (AVX-512 where present): the top level, spelled for symmetry
// Any other value raises std::invalid_argument (ValueError in Python) naming the variable and the choices.
// Note: the switch selects hand-written SIMD paths (intrinsics under __attribute__((target))). What the
// compiler auto-vectorises follows the build flags (TINYLEARN_NATIVE=OFF builds for baseline x86-64).
#pragma once
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace tl {

// The forced level: "" (not forced), "scalar", "avx2" or "avx512".
inline std::string cpu_features_forced() {
  const char* v = std::getenv("TINYLEARN_CPU_FEATURES");
  if (v == nullptr) return "";
  std::string s(v);
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (s.empty() || s == "scalar" || s == "avx2" || s == "avx512") return s;
  throw std::invalid_argument("TINYLEARN_CPU_FEATURES: unknown value '" + std::string(v) +
                              "' (choose scalar, avx2, avx512, or leave it unset)");
}

// What the CPU reports, ignoring the switch. Unknown names raise std::invalid_argument.
inline bool cpu_detected(const std::string& f) {
  __builtin_cpu_init();
  if (f == "sse4.2") return __builtin_cpu_supports("sse4.2");
  if (f == "avx") return __builtin_cpu_supports("avx");
  if (f == "avx2") return __builtin_cpu_supports("avx2");
  if (f == "fma") return __builtin_cpu_supports("fma");
  if (f == "f16c") return __builtin_cpu_supports("f16c");
  if (f == "avx512f") return __builtin_cpu_supports("avx512f");
  if (f == "avx512bw") return __builtin_cpu_supports("avx512bw");
  if (f == "avx512vl") return __builtin_cpu_supports("avx512vl");
  if (f == "avx512vnni") return __builtin_cpu_supports("avx512vnni");
  if (f == "avxvnni") return __builtin_cpu_supports("avxvnni");
  if (f == "avx512bf16") return __builtin_cpu_supports("avx512bf16");
  throw std::invalid_argument(
      "cpu_supports: unknown feature '" + f +
      "' (sse4.2, avx, avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512vnni, avxvnni, avx512bf16)");
}

inline const char* const kCpuFeatureNames[] = {"sse4.2",  "avx",      "avx2",     "fma",        "f16c",
                                               "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avxvnni",
                                               "avx512bf16"};

// The effective answer: what a kernel may use after TINYLEARN_CPU_FEATURES.
inline bool cpu_has(const char* feature) {
  const std::string f(feature);
  const bool detected = cpu_detected(f);
  const std::string forced = cpu_features_forced();
  if (forced.empty() || forced == "avx512") return detected;
  if (forced == "scalar") return false;
  // avx2: the x86-64-v3 subset
  const bool in_level = f == "sse4.2" || f == "avx" || f == "avx2" || f == "fma" || f == "f16c";
  return in_level && detected;
}

}  // namespace tl
