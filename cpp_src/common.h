// common.h — helpers every cpp_src/*.cpp may use: shape formatting and argument checks for error messages, and
// the OpenMP thread queries (1 / 0 in a build without OpenMP). Header-only; everything lives in namespace tl.
//
//   shape_str(a)               "(2, 3)" / "(4,)" — numpy's spelling, for ValueError messages
//   need_ndim(a, nd, fn, name) ValueError "<fn>: <name> must be <nd>-D, got ndim <k>"
//   need_same(a, b, fn, na, nb) ValueError when the shapes of a and b differ
//   n_threads(), thread_id()   omp_get_max_threads() / omp_get_thread_num(), or 1 / 0 without OpenMP
//   Rung, parse_rung(v, fn)    the v0_scalar / v1_simd / v2_threads versions ladder of an elementwise kernel
//   stream_output(bytes), head_to(p, align)  when to use non-temporal stores for an output; scalar head length
//   run_chunks(n, grain, threads, body)  body(begin, end) over [0, n): one call, or one per OpenMP thread with
//                                        at least `grain` elements each (small inputs stay on the calling thread)
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "registry.h"

#ifdef TINYLEARN_OPENMP
#include <omp.h>
#endif

namespace tl {

inline std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

inline void need_ndim(const py::array& a, int nd, const char* fn, const char* name) {
  if (a.ndim() != nd)
    value_error(std::string(fn) + ": " + name + " must be " + std::to_string(nd) + "-D, got ndim " +
                std::to_string(a.ndim()));
}

inline void need_same(const py::array& a, const py::array& b, const char* fn, const char* na, const char* nb) {
  bool ok = a.ndim() == b.ndim();
  for (ssize_t i = 0; ok && i < a.ndim(); ++i) ok = a.shape(i) == b.shape(i);
  if (!ok)
    value_error(std::string(fn) + ": " + na + " shape " + shape_str(a) + " does not match " + nb + " shape " +
                shape_str(b));
}

inline int n_threads() {
#ifdef TINYLEARN_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

inline int thread_id() {
#ifdef TINYLEARN_OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// The versions ladder of an elementwise kernel (quant_affine.cpp, quant_fp8.cpp): v0 plain scalar, v1 SIMD at the
// level cpu_features.h allows, v2 = v1 split over threads ('auto' is the best rung: v2).
enum class Rung { scalar, simd, threads };

inline Rung parse_rung(const std::string& v, const char* fn) {
  if (v == "v0_scalar") return Rung::scalar;
  if (v == "v1_simd") return Rung::simd;
  if (v == "v2_threads" || v == "auto") return Rung::threads;
  value_error(std::string(fn) + ": version must be 'v0_scalar', 'v1_simd', 'v2_threads' or 'auto', got '" + v + "'");
}

// Non-temporal ("streaming") stores for outputs larger than kStreamMinBytes: a normal store to a line that is not
// in cache first reads it (read-for-ownership), so an output that does not stay in cache costs 3 streams of memory
// traffic (read x, read y's old line, write y); _mm*_stream_ps writes around the cache (2 streams). Small outputs
// keep normal stores: their consumer reads them from cache. TINYLEARN_STREAM_MIN_BYTES (bytes, read on every call)
// overrides the threshold: 0 streams everything (the tests use it), a huge value turns streaming off.
// Measured (LayerNorm fp32 alone, 1 thread, CPU time, 2-core AMD EPYC box under load): 1-4 MiB outputs equal or
// slower streamed, 8 MiB 0.49 -> 0.43 ms, 16 MiB 2.1 -> 1.3 ms. Not used where it lost: softmax's three-pass rows
// (y is already in cache from the exp pass; streaming it was 35% slower) and dequantize (1 B in, 4 B out: the
// output stays in L3 across calls; streamed 2.7x slower at 1M elements, slower up to 16 MiB).
constexpr int64_t kStreamMinBytes = int64_t(4) << 20;
inline bool stream_output(int64_t bytes) {
  const char* e = std::getenv("TINYLEARN_STREAM_MIN_BYTES");
  const int64_t min = (e && *e) ? static_cast<int64_t>(std::atoll(e)) : kStreamMinBytes;
  return bytes > min;
}
// elements of float before p reaches an `align`-byte boundary (p itself 4-byte aligned, as numpy's float32 is)
inline int64_t head_to(const float* p, unsigned align) {
  return static_cast<int64_t>(((align - (reinterpret_cast<uintptr_t>(p) & (align - 1))) & (align - 1)) / 4);
}

// body(begin, end) over [0, n): on the calling thread, or split evenly over min(threads, n / grain) OpenMP threads
// (so each thread gets >= grain elements and inputs below 2 * grain never pay for a parallel region).
template <typename F>
void run_chunks(int64_t n, int64_t grain, bool threads, F body) {
  const int64_t want = threads ? std::min<int64_t>(n_threads(), n / grain) : 1;
  if (want < 2) {
    body(int64_t(0), n);
    return;
  }
#ifdef TINYLEARN_OPENMP
  const int nt = int(want);
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = thread_id(), per = (n + nt - 1) / nt;
    const int64_t b = std::min(n, t * per), e = std::min(n, b + per);
    if (b < e) body(b, e);
  }
#endif
}

}  // namespace tl
