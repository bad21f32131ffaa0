// memory/bump.h — mirrors tinylearn/memory/bump.py.
//
//   Bump      offset = top; top += align_up(n, alignment); reset when the last live block is freed
//
// Units are bytes. Bad input throws std::invalid_argument (-> ValueError) or tl::mem::OutOfMemory (-> MemoryError)
// before any state changes.
#pragma once
#include "base.h"

namespace tl {
namespace mem {

class Bump : public Core {
 public:
  Bump(i64 capacity, i64 alignment) : Core(capacity, alignment) {}
  i64 malloc(i64 nbytes) {
    i64 n = check_size(nbytes);
    i64 size = align_up(n, alignment_);
    if (top_ + size > capacity_)
      throw OutOfMemory("BumpAllocator out of memory: nbytes=" + S(n) + " (block " + S(size) + ") does not fit, top=" +
                        S(top_) + ", capacity=" + S(capacity_) + "; free everything or reset()");
    i64 off = top_;
    top_ += size;
    on_malloc(off, size, n, top_);
    return off;
  }
  void free(i64 off) {
    Live l = lookup(off);
    on_free(off, l);
    if (live_.empty()) top_ = 0;
  }
  void reset() {
    live_.clear();
    st_.allocated = st_.requested = 0;
    top_ = 0;
  }
  Stats stats() const {
    Stats s = base_stats();
    s.reserved = top_;
    s.total_free = capacity_ - st_.allocated;
    s.largest_free = capacity_ - top_;
    return s;
  }
  std::vector<std::pair<i64, i64>> free_blocks() const {
    if (top_ < capacity_) return {{top_, capacity_ - top_}};
    return {};
  }

 private:
  i64 top_ = 0;
};

}  // namespace mem
}  // namespace tl
