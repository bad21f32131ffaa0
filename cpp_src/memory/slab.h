// memory/slab.h — mirrors tinylearn/memory/slab.py.
//
//   Slab      size classes in slabs; lowest partial slab first, then the lowest free slab; freed objects first,
//           then a per-slab bump index; empty slabs released
//
// Units are bytes. Bad input throws std::invalid_argument (-> ValueError) or tl::mem::OutOfMemory (-> MemoryError)
// before any state changes.
#pragma once
#include "base.h"

namespace tl {
namespace mem {

class Slab : public Core {
 public:
  Slab(const std::vector<i64>& sizes, i64 capacity, i64 slab_size, i64 alignment)
      : Core(capacity, alignment), slab_size_(slab_size) {
    if (slab_size <= 0 || slab_size % alignment)
      throw std::invalid_argument("slab_size: must be a positive multiple of alignment=" + S(alignment) + ", got " +
                                  S(slab_size));
    if (sizes.empty()) throw std::invalid_argument("sizes: need at least one positive size class, got []");
    for (i64 s : sizes) {
      if (s <= 0) throw std::invalid_argument("sizes: need at least one positive size class, got " + S(s));
      classes_.push_back(align_up(s, alignment));
    }
    std::sort(classes_.begin(), classes_.end());
    classes_.erase(std::unique(classes_.begin(), classes_.end()), classes_.end());
    if (classes_.back() > slab_size)
      throw std::invalid_argument("sizes: class " + S(classes_.back()) + " is larger than slab_size=" + S(slab_size));
    n_slabs_ = capacity / slab_size;
    if (n_slabs_ == 0)
      throw std::invalid_argument("capacity: " + S(capacity) + " holds no slab of " + S(slab_size) + " bytes");
    slab_class_.assign(n_slabs_, -1);
    slab_free_.resize(n_slabs_);
    slab_used_.assign(n_slabs_, 0);
    slab_next_.assign(n_slabs_, 0);
    for (i64 i = 0; i < n_slabs_; ++i) free_slabs_.insert(free_slabs_.end(), i);
    partial_.resize(classes_.size());
  }
  const std::vector<i64>& classes() const { return classes_; }

  i64 malloc(i64 nbytes) {
    i64 n = check_size(nbytes);
    auto cit = std::lower_bound(classes_.begin(), classes_.end(), n);
    if (cit == classes_.end())
      throw std::invalid_argument("nbytes=" + S(n) + " is larger than the largest size class " + S(classes_.back()));
    size_t c = size_t(cit - classes_.begin());
    i64 stride = classes_[c];
    i64 slab;
    if (!partial_[c].empty()) {
      slab = *partial_[c].begin();
    } else if (!free_slabs_.empty()) {
      slab = *free_slabs_.begin();
      free_slabs_.erase(free_slabs_.begin());
      slab_class_[slab] = i64(c);
      slab_free_[slab].clear();
      slab_next_[slab] = 0;
      partial_[c].insert(slab);
    } else {
      throw OutOfMemory("SlabAllocator out of memory: nbytes=" + S(n) + " (class " + S(stride) +
                        "): no free object in class " + S(stride) + " and no free slab (n_slabs=" + S(n_slabs_) +
                        ", slab_size=" + S(slab_size_) + ")");
    }
    i64 off;
    if (!slab_free_[slab].empty()) {
      off = slab_free_[slab].back();
      slab_free_[slab].pop_back();
    } else {
      off = slab * slab_size_ + slab_next_[slab] * stride;
      slab_next_[slab] += 1;
    }
    slab_used_[slab] += 1;
    if (n_free_objects(slab, stride) == 0) partial_[c].erase(slab);
    on_malloc(off, stride, n, reserved());
    return off;
  }
  void free(i64 off) {
    Live l = lookup(off);
    on_free(off, l);
    i64 slab = off / slab_size_;
    i64 c = slab_class_[slab];
    slab_free_[slab].push_back(off);
    slab_used_[slab] -= 1;
    if (n_free_objects(slab, l.size) == 1) partial_[c].insert(slab);
    if (slab_used_[slab] == 0) {
      partial_[c].erase(slab);
      slab_free_[slab].clear();
      slab_class_[slab] = -1;
      free_slabs_.insert(slab);
    }
  }
  Stats stats() const {
    Stats s = base_stats();
    s.reserved = reserved();
    s.total_free = i64(free_slabs_.size()) * slab_size_;
    i64 run = 0, best = 0, prev = -2;
    for (i64 sl : free_slabs_) {
      run = sl == prev + 1 ? run + 1 : 1;
      best = std::max(best, run);
      prev = sl;
    }
    s.largest_free = best * slab_size_;
    for (size_t c = 0; c < classes_.size(); ++c)
      for (i64 sl : partial_[c]) {
        s.total_free += n_free_objects(sl, classes_[c]) * classes_[c];
        s.largest_free = std::max(s.largest_free, classes_[c]);
      }
    return s;
  }
  std::vector<std::pair<i64, i64>> free_blocks() const {
    std::vector<std::pair<i64, i64>> out;
    for (i64 sl : free_slabs_) out.emplace_back(sl * slab_size_, slab_size_);
    for (size_t c = 0; c < classes_.size(); ++c)
      for (i64 sl : partial_[c]) {
        for (i64 o : slab_free_[sl]) out.emplace_back(o, classes_[c]);
        for (i64 k = slab_next_[sl]; k < slab_size_ / classes_[c]; ++k)
          out.emplace_back(sl * slab_size_ + k * classes_[c], classes_[c]);
      }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  i64 reserved() const { return (n_slabs_ - i64(free_slabs_.size())) * slab_size_; }
  i64 n_free_objects(i64 slab, i64 stride) const {
    return i64(slab_free_[slab].size()) + slab_size_ / stride - slab_next_[slab];
  }
  i64 slab_size_, n_slabs_ = 0;
  std::vector<i64> classes_;
  std::vector<i64> slab_class_;
  std::vector<std::vector<i64>> slab_free_;
  std::vector<i64> slab_used_;
  std::vector<i64> slab_next_;  // objects [0, next) of a slab have been handed out at least once
  std::set<i64> free_slabs_;
  std::vector<std::set<i64>> partial_;
};

}  // namespace mem
}  // namespace tl
