// common.h — helpers every cpp_src/*.cpp may use: shape formatting and argument checks for error messages, and
// the OpenMP thread queries (1 / 0 in a build without OpenMP). Header-only; everything lives in namespace tl.
//
//   shape_str(a)               "(2, 3)" / "(4,)" — numpy's spelling, for ValueError messages
//   need_ndim(a, nd, fn, name) ValueError "<fn>: <name> must be <nd>-D, got ndim <k>"
//   need_same(a, b, fn, na, nb) ValueError when the shapes of a and b differ
//   n_threads(), thread_id()   omp_get_max_threads() / omp_get_thread_num(), or 1 / 0 without OpenMP
#pragma once
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

}  // namespace tl
