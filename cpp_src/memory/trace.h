// memory/trace.h — mirrors tinylearn/memory/trace.py.
//
//   trace replay: run a (op, arg) trace of mallocs and frees through any allocator (count_mallocs, run_ops)
//
// Units are bytes. Bad input throws std::invalid_argument (-> ValueError) or tl::mem::OutOfMemory (-> MemoryError)
// before any state changes.
#pragma once
#include "base.h"

namespace tl {
namespace mem {

// ops: m rows (op, arg): (0, nbytes) malloc -> out[i] for the i-th malloc; (1, i) free the i-th malloc's block.
// Validates every row before running; returns nothing, fills `out` (size = number of mallocs).
inline i64 count_mallocs(const i64* ops, i64 m) {
  i64 n = 0;
  std::vector<char> freed;
  for (i64 r = 0; r < m; ++r) {
    i64 op = ops[2 * r], arg = ops[2 * r + 1];
    if (op == 0) {
      if (arg <= 0) throw std::invalid_argument("ops[" + S(r) + "]: malloc size must be positive, got " + S(arg));
      ++n;
      freed.push_back(0);
    } else if (op == 1) {
      if (arg < 0 || arg >= n || freed[size_t(arg)])
        throw std::invalid_argument("ops[" + S(r) + "]: free of malloc #" + S(arg) +
                                    " which is not live at that point");
      freed[size_t(arg)] = 1;
    } else {
      throw std::invalid_argument("ops[" + S(r) + "]: op must be 0 (malloc) or 1 (free), got " + S(op));
    }
  }
  return n;
}

template <class MallocFn, class FreeFn>
inline void run_ops(const i64* ops, i64 m, i64* out, MallocFn&& do_malloc, FreeFn&& do_free) {
  i64 k = 0;
  for (i64 r = 0; r < m; ++r) {
    if (ops[2 * r] == 0)
      out[k++] = do_malloc(ops[2 * r + 1]);
    else
      do_free(out[ops[2 * r + 1]]);
  }
}

}  // namespace mem
}  // namespace tl
