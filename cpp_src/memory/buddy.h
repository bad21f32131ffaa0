// memory/buddy.h — mirrors tinylearn/memory/buddy.py.
//
//   Buddy     power-of-two blocks >= min_block; split keeps the lower half; merge with buddy = offset ^ size
//
// Units are bytes. Bad input throws std::invalid_argument (-> ValueError) or tl::mem::OutOfMemory (-> MemoryError)
// before any state changes.
#pragma once
#include "base.h"

namespace tl {
namespace mem {

class Buddy : public Core {
 public:
  Buddy(i64 capacity, i64 min_block) : Core(capacity, checked_min_block(min_block)), min_block_(min_block) {
    if (capacity < min_block)
      throw std::invalid_argument("capacity: " + S(capacity) + " is smaller than min_block=" + S(min_block));
    for (int k = 0; k < 64; ++k) free_.emplace_back(&pool_);
    i64 usable = capacity / min_block * min_block;
    i64 size = i64(1) << (63 - __builtin_clzll(uint64_t(usable)));
    i64 off = 0;
    for (; size >= min_block; size /= 2)
      if (off + size <= usable) {
        free_[order(size)].insert(off);
        off += size;
      }
  }
  i64 malloc(i64 nbytes) {
    i64 n = check_size(nbytes);
    i64 need = std::max(min_block_, next_pow2(n));
    int k = order(need);
    int j = k;
    while (j < 63 && free_[j].empty()) ++j;
    if (j >= 63) {
      Stats s = stats();
      throw OutOfMemory("BuddyAllocator out of memory: nbytes=" + S(n) + " needs a " + S(need) +
                        "-byte block, largest_free=" + S(s.largest_free) + ", total_free=" + S(s.total_free) +
                        ", capacity=" + S(capacity_));
    }
    i64 off = *free_[j].begin();
    free_[j].erase(free_[j].begin());
    for (; j > k; --j) free_[j - 1].insert(off + (i64(1) << (j - 1)));  // split: keep the lower half
    on_malloc(off, need, n, off + need);
    return off;
  }
  void free(i64 off) {
    Live l = lookup(off);
    on_free(off, l);
    i64 size = l.size;
    while (true) {
      auto& peers = free_[order(size)];
      auto it = peers.find(off ^ size);  // the buddy
      if (it == peers.end()) break;
      peers.erase(it);
      off = std::min(off, off ^ size);
      size *= 2;
    }
    free_[order(size)].insert(off);
  }
  Stats stats() const {
    Stats s = base_stats();
    for (int k = 0; k < 63; ++k)
      if (!free_[k].empty()) {
        s.total_free += i64(free_[k].size()) << k;
        s.largest_free = i64(1) << k;
      }
    return s;
  }
  std::vector<std::pair<i64, i64>> free_blocks() const {
    std::vector<std::pair<i64, i64>> out;
    for (int k = 0; k < 63; ++k)
      for (i64 o : free_[k]) out.emplace_back(o, i64(1) << k);
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  static i64 checked_min_block(i64 b) {
    if (!is_pow2(b)) throw std::invalid_argument("min_block: must be a positive power of two, got " + S(b));
    return b;
  }
  static int order(i64 size) { return 63 - __builtin_clzll(uint64_t(size)); }
  static i64 next_pow2(i64 n) { return n <= 1 ? 1 : i64(1) << (64 - __builtin_clzll(uint64_t(n - 1))); }
  i64 min_block_;
  std::vector<std::pmr::set<i64>> free_;  // free_[k]: offsets of free blocks of size 2^k
};

}  // namespace mem
}  // namespace tl
