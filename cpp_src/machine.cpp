// machine.cpp — tiny kernels for measuring the machine (tinylearn.bench.roofline) and the tour notebook.
//
// Versions:
//   triad          a[i] = b[i] + s*c[i] over float64, OpenMP-parallel: STREAM's triad (24 bytes moved / element)
//   matmul_naive   C = A @ B, textbook i-j-k triple loop over fp32, no blocking, no SIMD intent, one thread:
//                  the "why BLAS matters" baseline in notebooks/00_tour
//   matmul_ikj     the same loops reordered i-k-j so the inner loop streams rows (auto-vectorisable), one thread
//   add_chain      n dependent integer adds (1 cycle each on every x86-64 core since the P6), timed: the *measured*
//                  clock (turbo included) for the roofline's theoretical peak — /proc/cpuinfo only has the nominal one
//   mac_rate       multiply-accumulates per second of one core issuing only one instruction mix, 10 independent
//                  accumulators (more than latency x issue rate on current cores): the *instruction ceiling* of an
//                  fp32 FMA, an exact int8 step (vpmaddwd + vpaddd; vpmaddubsw + vpmaddwd + vpaddd; Winograd's
//                  vpaddw x 2 + vpmaddwd + vpaddd, 4 products per lane; vpdpbusd) and two mixed int + fp32 steps
//                  (6 vpmaddwd : 4 FMAs and 8 : 4). Which execution ports issue each instruction differs between
//                  cores (Zen 2: two FMA pipes but one integer-multiply pipe), so "int8 is 2x fp32" is a property
//                  of the core, to be measured before a kernel is tuned toward it (bench.roofline.mac_ceilings)
// Each is checked against numpy in tests/test_foundation.py.
#include "registry.h"

#include <chrono>
#include <cstdint>
#include <string>

#include "cpu_features.h"
#include "machine_probe.h"

namespace py = pybind11;

static void triad(py::array_t<double, py::array::c_style> a, py::array_t<double, py::array::c_style> b,
                  py::array_t<double, py::array::c_style> c, double s) {
  if (a.ndim() != 1 || b.ndim() != 1 || c.ndim() != 1 || a.shape(0) != b.shape(0) || a.shape(0) != c.shape(0))
    tl::value_error("triad: a, b, c must be 1-D arrays of equal length");
  const ssize_t n = a.shape(0);
  double* pa = a.mutable_data();
  const double* pb = b.data();
  const double* pc = c.data();
  py::gil_scoped_release release;
#pragma omp parallel for schedule(static)
  for (ssize_t i = 0; i < n; ++i) pa[i] = pb[i] + s * pc[i];
}

static void check_mm(const py::array_t<float, py::array::c_style>& A, const py::array_t<float, py::array::c_style>& B,
                     const char* name) {
  if (A.ndim() != 2 || B.ndim() != 2)
    tl::value_error(std::string(name) + ": A and B must be 2-D, got ndim " + std::to_string(A.ndim()) + " and " +
                    std::to_string(B.ndim()));
  if (A.shape(1) != B.shape(0))
    tl::value_error(std::string(name) + ": inner dimensions differ: A is (" + std::to_string(A.shape(0)) + ", " +
                    std::to_string(A.shape(1)) + "), B is (" + std::to_string(B.shape(0)) + ", " +
                    std::to_string(B.shape(1)) + ")");
}

using MmArg = py::array_t<float, py::array::c_style | py::array::forcecast>;

// The frame both matmul probes share: check shapes, allocate C (M, N), run loops(a, b, c, M, K, N) without the GIL.
template <class Loops>
static py::array_t<float> mm_probe_frame(const MmArg& A, const MmArg& B, const char* name, Loops loops) {
  check_mm(A, B, name);
  const ssize_t M = A.shape(0), K = A.shape(1), N = B.shape(1);
  py::array_t<float> C({M, N});
  const float* a = A.data();
  const float* b = B.data();
  float* c = C.mutable_data();
  py::gil_scoped_release release;
  loops(a, b, c, M, K, N);
  return C;
}

static py::array_t<float> matmul_naive(MmArg A, MmArg B) {
  return mm_probe_frame(A, B, "matmul_naive", [](const float* a, const float* b, float* c, ssize_t M, ssize_t K,
                                                 ssize_t N) {
    for (ssize_t i = 0; i < M; ++i)
      for (ssize_t j = 0; j < N; ++j) {
        float acc = 0.f;
        for (ssize_t k = 0; k < K; ++k) acc += a[i * K + k] * b[k * N + j];
        c[i * N + j] = acc;
      }
  });
}

static py::array_t<float> matmul_ikj(MmArg A, MmArg B) {
  return mm_probe_frame(A, B, "matmul_ikj", [](const float* a, const float* b, float* c, ssize_t M, ssize_t K,
                                               ssize_t N) {
    for (ssize_t i = 0; i < M * N; ++i) c[i] = 0.f;
    for (ssize_t i = 0; i < M; ++i)
      for (ssize_t k = 0; k < K; ++k) {
        const float aik = a[i * K + k];
        const float* brow = b + k * N;
        float* crow = c + i * N;
        for (ssize_t j = 0; j < N; ++j) crow[j] += aik * brow[j];
      }
  });
}

// A chain of n dependent adds x += one: each add needs the previous result, so the chain takes n cycles whatever
// the issue width. The adds are inline asm (the compiler cannot fold the chain into x += n) and reg+reg (some cores,
// e.g. Golden Cove, fold *immediate* adds at rename and would run faster than one per cycle). Eight adds per loop
// trip hide the loop's own counter/branch (which run in parallel on other ports). Returns seconds.
static double add_chain(int64_t n) {
  if (n < 8) tl::value_error("add_chain: n must be >= 8, got " + std::to_string(n));
  volatile uint64_t seed = 1;  // opaque to the compiler: the increment is not a known constant
  uint64_t one = seed, x = 0;
  const int64_t trips = n / 8;
  py::gil_scoped_release release;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < trips; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    asm volatile(
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
        : "+r"(x)
        : "r"(one));
#elif defined(__aarch64__)
    asm volatile(
        "add %0, %0, %1\n\tadd %0, %0, %1\n\tadd %0, %0, %1\n\tadd %0, %0, %1\n\t"
        "add %0, %0, %1\n\tadd %0, %0, %1\n\tadd %0, %0, %1\n\tadd %0, %0, %1"
        : "+r"(x)
        : "r"(one));
#else
    for (int k = 0; k < 8; ++k) {
      x += one;
      asm volatile("" : "+r"(x));  // compiler barrier per add: no folding, no reassociation
    }
#endif
  }
  const auto t1 = std::chrono::steady_clock::now();
  seed = x;  // keep the result observable
  return std::chrono::duration<double>(t1 - t0).count();
}

// ---- instruction ceilings: mac_rate --------------------------------------------------------------------------
// One asm block per kind, the loop inside it (registers live across trips), every register zeroed first (no
// denormals or NaNs in the FMA operands, which some cores handle in microcode). Operands: ymm/zmm14 and 15 (ones:
// ymm11 for the u7 widening), accumulators 0-9, products through 12/13. vzeroupper at the end (no SSE transition
// penalty for the caller). The clobbers name xmm registers: GCC has no ymm/zmm clobber names, and xmmN covers them.
#define TL_MR_CLOBBERS                                                                                             \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", \
      "xmm14", "xmm15", "cc", "memory"
#define TL_MR_ZERO_YMM                                                                                        \
  "vpxor %%xmm0, %%xmm0, %%xmm0\n vpxor %%xmm1, %%xmm1, %%xmm1\n vpxor %%xmm2, %%xmm2, %%xmm2\n"             \
  "vpxor %%xmm3, %%xmm3, %%xmm3\n vpxor %%xmm4, %%xmm4, %%xmm4\n vpxor %%xmm5, %%xmm5, %%xmm5\n"             \
  "vpxor %%xmm6, %%xmm6, %%xmm6\n vpxor %%xmm7, %%xmm7, %%xmm7\n vpxor %%xmm8, %%xmm8, %%xmm8\n"             \
  "vpxor %%xmm9, %%xmm9, %%xmm9\n vpxor %%xmm10, %%xmm10, %%xmm10\n vpxor %%xmm12, %%xmm12, %%xmm12\n"       \
  "vpxor %%xmm13, %%xmm13, %%xmm13\n vpxor %%xmm14, %%xmm14, %%xmm14\n vpxor %%xmm15, %%xmm15, %%xmm15\n"    \
  "vpcmpeqw %%ymm11, %%ymm11, %%ymm11\n"
#define TL_MR_X10(M) M(0, 12) M(1, 13) M(2, 12) M(3, 13) M(4, 12) M(5, 13) M(6, 12) M(7, 13) M(8, 12) M(9, 13)
#define TL_MR_FMA_Y(a, t) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #a "\n"
#define TL_MR_MADD16_Y(a, t) "vpmaddwd %%ymm14, %%ymm15, %%ymm" #t "\n vpaddd %%ymm" #t ", %%ymm" #a ", %%ymm" #a "\n"
#define TL_MR_U7_Y(a, t)                                                                                  \
  "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #t "\n vpmaddwd %%ymm" #t ", %%ymm11, %%ymm" #t "\n vpaddd %%ymm" #t \
  ", %%ymm" #a ", %%ymm" #a "\n"
// Winograd's inner-product step (quant_int8_ukr.h, avx2_wino): x = xa + xb, y = ya + yb (vpaddw), vpmaddwd(x, y)
// covers 4 products per int32 lane, 32 MACs per 4 instructions; temporaries t and u
#define TL_MR_WINO_Y(a, t, u)                                                                               \
  "vpaddw %%ymm14, %%ymm15, %%ymm" #t "\n vpaddw %%ymm15, %%ymm14, %%ymm" #u "\n vpmaddwd %%ymm" #u ", %%ymm" #t \
  ", %%ymm" #t "\n vpaddd %%ymm" #t ", %%ymm" #a ", %%ymm" #a "\n"
#define TL_MR_X10W(M)                                                                                    \
  M(0, 12, 10) M(1, 13, 11) M(2, 12, 10) M(3, 13, 11) M(4, 12, 10) M(5, 13, 11) M(6, 12, 10) M(7, 13, 11) \
      M(8, 12, 10) M(9, 13, 11)
#define TL_MR_FMA_Z(a, t) "vfmadd231ps %%zmm14, %%zmm15, %%zmm" #a "\n"
#define TL_MR_VNNI_Z(a, t) "vpdpbusd %%zmm14, %%zmm15, %%zmm" #a "\n"
// int + fp32 in one stream: 6 vpmaddwd + vpaddd (accumulators 0-5) and 4 FMAs (6-9) per group
#define TL_MR_MIX_Y                                                                                           \
  TL_MR_MADD16_Y(0, 12) TL_MR_FMA_Y(6, 0) TL_MR_MADD16_Y(1, 13) TL_MR_MADD16_Y(2, 12) TL_MR_FMA_Y(7, 0)        \
  TL_MR_MADD16_Y(3, 13) TL_MR_FMA_Y(8, 0) TL_MR_MADD16_Y(4, 12) TL_MR_MADD16_Y(5, 13) TL_MR_FMA_Y(9, 0)
// int + fp32, two vpmaddwd + vpaddd per FMA: 8 (accumulators 0-7) and 4 FMAs (8-11; ymm11 zeroed first) per group.
// On a core whose only integer-multiply pipe is one of its two FMA pipes (Zen 2), 1 vpmaddwd + 1 FMA per cycle
// would be 16 + 8 = 24 MACs: 1.5x the fp32 ceiling if nothing else got in the way (the vpaddds, the scheduler)
#define TL_MR_MIX2_Y                                                                                          \
  TL_MR_MADD16_Y(0, 12) TL_MR_MADD16_Y(1, 13) TL_MR_FMA_Y(8, 0) TL_MR_MADD16_Y(2, 12) TL_MR_MADD16_Y(3, 13)    \
  TL_MR_FMA_Y(9, 0) TL_MR_MADD16_Y(4, 12) TL_MR_MADD16_Y(5, 13) TL_MR_FMA_Y(10, 0) TL_MR_MADD16_Y(6, 12)       \
  TL_MR_MADD16_Y(7, 13) TL_MR_FMA_Y(11, 0)
#define TL_MR_LOOP(BODY, ZERO)                                                                   \
  asm volatile(ZERO "1:\n" BODY BODY "dec %0\n jnz 1b\n vzeroupper\n" : "+r"(trips)::TL_MR_CLOBBERS)

struct MacKind {
  const char* name;
  const char* needs;     // CPU features (cpu_detected names, comma-free: at most two)
  const char* needs2;
  double macs_per_trip;  // two groups per trip
};
static const MacKind kMacKinds[] = {
    {"fp32_fma_ymm", "avx2", "fma", 2 * 10 * 8},        // vfmadd231ps ymm: 8 MACs
    {"int8_madd16_ymm", "avx2", "avx2", 2 * 10 * 16},   // vpmaddwd ymm: 16 int16 MACs (+ vpaddd)
    {"int8_u7_ymm", "avx2", "avx2", 2 * 10 * 32},       // vpmaddubsw ymm: 32 u8 x s8 MACs (+ vpmaddwd + vpaddd)
    {"int8_wino_ymm", "avx2", "avx2", 2 * 10 * 32},     // 2 vpaddw + vpmaddwd + vpaddd: 32 MACs (Winograd)
    {"int8_madd16+fp32_fma_ymm", "avx2", "fma", 2 * (6 * 16 + 4 * 8)},
    {"int8_madd16x2+fp32_fma_ymm", "avx2", "fma", 2 * (8 * 16 + 4 * 8)},
    {"fp32_fma_zmm", "avx512f", "avx512f", 2 * 10 * 16},      // vfmadd231ps zmm: 16 MACs
    {"int8_vnni_zmm", "avx512f", "avx512vnni", 2 * 10 * 64},  // vpdpbusd zmm: 64 u8 x s8 MACs
};

// The scalar fp32 FMA loop: not one of kMacKinds (mac_kinds / mac_ceilings list the SIMD ceilings), the scalar roof of
// gemm.fma_peak (isa="scalar"). Distinct start values: with equal ones the compiler proves the chains identical and
// keeps only one.
static const MacKind kScalarFma = {"fp32_fma_scalar", "", "", 2 * 10 * 1};
__attribute__((optimize("no-tree-vectorize"))) static void fma_loop_scalar(int64_t trips) {
  const float x = 0.999999f, y = 1e-7f;
  float r[10] = {1.0f, 1.01f, 1.02f, 1.03f, 1.04f, 1.05f, 1.06f, 1.07f, 1.08f, 1.09f};
  float r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3], r4 = r[4], r5 = r[5], r6 = r[6], r7 = r[7], r8 = r[8], r9 = r[9];
  for (int64_t t = 0; t < 2 * trips; ++t) {
    r0 = __builtin_fmaf(r0, x, y); r1 = __builtin_fmaf(r1, x, y); r2 = __builtin_fmaf(r2, x, y);
    r3 = __builtin_fmaf(r3, x, y); r4 = __builtin_fmaf(r4, x, y); r5 = __builtin_fmaf(r5, x, y);
    r6 = __builtin_fmaf(r6, x, y); r7 = __builtin_fmaf(r7, x, y); r8 = __builtin_fmaf(r8, x, y);
    r9 = __builtin_fmaf(r9, x, y);
  }
  volatile float sink = r0 + r1 + r2 + r3 + r4 + r5 + r6 + r7 + r8 + r9;  // keep the chains alive
  (void)sink;
}

// kind -> its entry; checks the kind, the trip count and the CPU features (std::invalid_argument, ValueError)
static const MacKind& check_kind(const std::string& kind, int64_t trips) {
  const MacKind* k = kind == kScalarFma.name ? &kScalarFma : nullptr;
  std::string names;
  for (const MacKind& m : kMacKinds) {
    if (kind == m.name) k = &m;
    names += std::string(names.empty() ? "" : ", ") + m.name;
  }
  if (k == nullptr) tl::value_error("mac_rate: kind must be one of " + names + ", got '" + kind + "'");
  if (trips < 1) tl::value_error("mac_rate: trips must be >= 1, got " + std::to_string(trips));
#if defined(__x86_64__)
  if (k != &kScalarFma)
    for (const char* f : {k->needs, k->needs2})
      if (!tl::cpu_detected(f)) tl::value_error("mac_rate: kind '" + kind + "' needs " + f + ", which this CPU lacks");
#else
  if (k != &kScalarFma) tl::value_error("mac_rate: x86-64 only");
#endif
  return *k;
}

// the loop of a checked kind; returns the multiply-accumulates done
static double run_kind(const MacKind& k, int64_t trips) {
  const int64_t n = trips;
  if (&k == &kScalarFma) {
    fma_loop_scalar(trips);
    return k.macs_per_trip * double(n);
  }
#if defined(__x86_64__)
  const std::string kind = k.name;
  if (kind == "fp32_fma_ymm")
    TL_MR_LOOP(TL_MR_X10(TL_MR_FMA_Y), TL_MR_ZERO_YMM);
  else if (kind == "int8_madd16_ymm")
    TL_MR_LOOP(TL_MR_X10(TL_MR_MADD16_Y), TL_MR_ZERO_YMM);
  else if (kind == "int8_u7_ymm")
    TL_MR_LOOP(TL_MR_X10(TL_MR_U7_Y), TL_MR_ZERO_YMM);
  else if (kind == "int8_wino_ymm")
    TL_MR_LOOP(TL_MR_X10W(TL_MR_WINO_Y), TL_MR_ZERO_YMM);
  else if (kind == "int8_madd16+fp32_fma_ymm")
    TL_MR_LOOP(TL_MR_MIX_Y, TL_MR_ZERO_YMM);
  else if (kind == "int8_madd16x2+fp32_fma_ymm")
    TL_MR_LOOP(TL_MR_MIX2_Y, TL_MR_ZERO_YMM "vpxor %%xmm11, %%xmm11, %%xmm11\n");
  else if (kind == "fp32_fma_zmm")
    TL_MR_LOOP(TL_MR_X10(TL_MR_FMA_Z), TL_MR_ZERO_YMM);  // a VEX xmm zeroing clears the whole zmm
  else
    TL_MR_LOOP(TL_MR_X10(TL_MR_VNNI_Z), TL_MR_ZERO_YMM);
#endif
  return k.macs_per_trip * double(n);
}

// The probe itself (machine_probe.h): no GIL handling, so C++ dispatchers can call it.
double tl::mac_loop(const std::string& kind, int64_t trips) { return run_kind(check_kind(kind, trips), trips); }

double tl::mac_rate_raw(const std::string& kind, int64_t trips) {
  const MacKind& k = check_kind(kind, trips);
  const auto t0 = std::chrono::steady_clock::now();
  const double macs = run_kind(k, trips);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return macs / secs;
}

static double mac_rate(const std::string& kind, int64_t trips) {
  py::gil_scoped_release release;  // re-taken while an exception unwinds
  return tl::mac_rate_raw(kind, trips);
}

TL_REGISTER(machine) {
  m.doc() = "machine-measurement kernels: STREAM triad, naive matmuls, add-chain clock";
  m.def("triad", &triad, py::arg("a"), py::arg("b"), py::arg("c"), py::arg("s"),
        "a[:] = b + s*c (float64, OpenMP); moves 24 bytes per element");
  m.def("matmul_naive", &matmul_naive, py::arg("A"), py::arg("B"), "C = A @ B, i-j-k loops, fp32, one thread");
  m.def("matmul_ikj", &matmul_ikj, py::arg("A"), py::arg("B"), "C = A @ B, i-k-j loops (vectorisable), one thread");
  m.def("add_chain", &add_chain, py::arg("n"),
        "time (seconds) of n dependent integer adds, 1 cycle each: n / seconds is the core clock in Hz");
  m.def("mac_rate", &mac_rate, py::arg("kind"), py::arg("trips"),
        "multiply-accumulates per second of this core issuing only `kind` (fp32_fma_ymm, int8_madd16_ymm, int8_u7_ymm, "
        "int8_wino_ymm, "
        "int8_madd16+fp32_fma_ymm, int8_madd16x2+fp32_fma_ymm, fp32_fma_zmm, int8_vnni_zmm) over `trips` loop trips, "
        "10 independent accumulators");
  m.def(
      "mac_kinds", []() {
        py::list out;
        for (const MacKind& k : kMacKinds) out.append(k.name);
        return out;
      },
      "the kinds mac_rate measures");
}
