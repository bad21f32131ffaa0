// memory/freelist.h — mirrors tinylearn/memory/freelist.py.
//
//   FreeList  first fit (lowest-offset hole) or best fit (smallest hole, ties lowest offset); coalescing free
//
// Units are bytes. Bad input throws std::invalid_argument (-> ValueError) or tl::mem::OutOfMemory (-> MemoryError)
// before any state changes.
#pragma once
#include "base.h"

namespace tl {
namespace mem {

class FreeList : public Core {
 public:
  FreeList(i64 capacity, i64 alignment, bool best_fit) : Core(capacity, alignment), best_fit_(best_fit) {
    i64 usable = capacity / alignment * alignment;
    if (usable > 0) add_hole(0, usable);
  }
  bool best_fit() const { return best_fit_; }

  i64 malloc(i64 nbytes) {
    i64 n = check_size(nbytes);
    i64 size = align_up(n, alignment_);
    i64 off = find(size);
    if (off < 0) {
      i64 total = 0, largest = 0;
      free_info(total, largest);
      std::string why = total >= size ? "fragmentation" : "not enough free memory";
      throw OutOfMemory(std::string(best_fit_ ? "best" : "first") + "-fit out of memory (" + why + "): nbytes=" + S(n) +
                        " (block " + S(size) + "), largest_free=" + S(largest) + ", total_free=" + S(total) +
                        ", capacity=" + S(capacity_));
    }
    i64 hole = holes_[off];
    remove_hole(off, hole);
    if (hole > size) add_hole(off + size, hole - size);
    on_malloc(off, size, n, off + size);
    return off;
  }
  void free(i64 off) {
    Live l = lookup(off);
    on_free(off, l);
    i64 start = off, size = l.size;
    auto it = holes_.lower_bound(start);
    if (it != holes_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == start) {
        start = prev->first;
        size += prev->second;
        remove_hole(prev->first, prev->second);
      }
    }
    it = holes_.find(off + l.size);
    if (it != holes_.end()) {
      size += it->second;
      remove_hole(it->first, it->second);
    }
    add_hole(start, size);
  }
  Stats stats() const {
    Stats s = base_stats();
    free_info(s.total_free, s.largest_free);
    return s;
  }
  std::vector<std::pair<i64, i64>> free_blocks() const { return {holes_.begin(), holes_.end()}; }
  i64 largest_hole() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }

 private:
  i64 find(i64 size) const {
    if (best_fit_) {
      auto it = by_size_.lower_bound({size, -1});
      return it == by_size_.end() ? -1 : it->second;
    }
    for (auto& [o, s] : holes_)
      if (s >= size) return o;
    return -1;
  }
  void add_hole(i64 off, i64 size) {
    holes_.emplace(off, size);
    by_size_.emplace(size, off);
  }
  void remove_hole(i64 off, i64 size) {
    holes_.erase(off);
    by_size_.erase({size, off});
  }
  void free_info(i64& total, i64& largest) const {
    total = 0;
    for (auto& [o, s] : holes_) total += s;
    largest = largest_hole();
  }
  bool best_fit_;
  std::pmr::map<i64, i64> holes_{&pool_};               // offset -> size
  std::pmr::set<std::pair<i64, i64>> by_size_{&pool_};  // (size, offset)
};

}  // namespace mem
}  // namespace tl
