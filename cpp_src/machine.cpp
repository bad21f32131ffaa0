// machine.cpp — tiny kernels for measuring the machine (tinylearn.bench.roofline) and the tour notebook.
//
// Versions:
//   triad          a[i] = b[i] + s*c[i] over float64, OpenMP-parallel: STREAM's triad (24 bytes moved / element)
//   matmul_naive   C = A @ B, textbook i-j-k triple loop over fp32, no blocking, no SIMD intent, one thread:
//                  the "why BLAS matters" baseline in notebooks/00_tour
//   matmul_ikj     the same loops reordered i-k-j so the inner loop streams rows (auto-vectorisable), one thread
//   add_chain      n dependent integer adds (1 cycle each on every x86-64 core since the P6), timed: the *measured*
//                  clock (turbo included) for the roofline's theoretical peak — /proc/cpuinfo only has the nominal one
// Each is checked against numpy in tests/test_foundation.py.
#include "registry.h"

#include <chrono>
#include <cstdint>

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

static py::array_t<float> matmul_naive(py::array_t<float, py::array::c_style | py::array::forcecast> A,
                                       py::array_t<float, py::array::c_style | py::array::forcecast> B) {
  check_mm(A, B, "matmul_naive");
  const ssize_t M = A.shape(0), K = A.shape(1), N = B.shape(1);
  py::array_t<float> C({M, N});
  const float* a = A.data();
  const float* b = B.data();
  float* c = C.mutable_data();
  py::gil_scoped_release release;
  for (ssize_t i = 0; i < M; ++i)
    for (ssize_t j = 0; j < N; ++j) {
      float acc = 0.f;
      for (ssize_t k = 0; k < K; ++k) acc += a[i * K + k] * b[k * N + j];
      c[i * N + j] = acc;
    }
  return C;
}

static py::array_t<float> matmul_ikj(py::array_t<float, py::array::c_style | py::array::forcecast> A,
                                     py::array_t<float, py::array::c_style | py::array::forcecast> B) {
  check_mm(A, B, "matmul_ikj");
  const ssize_t M = A.shape(0), K = A.shape(1), N = B.shape(1);
  py::array_t<float> C({M, N});
  const float* a = A.data();
  const float* b = B.data();
  float* c = C.mutable_data();
  py::gil_scoped_release release;
  for (ssize_t i = 0; i < M * N; ++i) c[i] = 0.f;
  for (ssize_t i = 0; i < M; ++i)
    for (ssize_t k = 0; k < K; ++k) {
      const float aik = a[i * K + k];
      const float* brow = b + k * N;
      float* crow = c + i * N;
      for (ssize_t j = 0; j < N; ++j) crow[j] += aik * brow[j];
    }
  return C;
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

TL_REGISTER(machine) {
  m.doc() = "machine-measurement kernels: STREAM triad, naive matmuls, add-chain clock";
  m.def("triad", &triad, py::arg("a"), py::arg("b"), py::arg("c"), py::arg("s"),
        "a[:] = b + s*c (float64, OpenMP); moves 24 bytes per element");
  m.def("matmul_naive", &matmul_naive, py::arg("A"), py::arg("B"), "C = A @ B, i-j-k loops, fp32, one thread");
  m.def("matmul_ikj", &matmul_ikj, py::arg("A"), py::arg("B"), "C = A @ B, i-k-j loops (vectorisable), one thread");
  m.def("add_chain", &add_chain, py::arg("n"),
        "time (seconds) of n dependent integer adds, 1 cycle each: n / seconds is the core clock in Hz");
}
