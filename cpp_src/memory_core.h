// memory_core.h — the C++ allocators behind tinylearn._C.memory, free of Python so that tools/asan_memory.sh can
// build them into a standalone AddressSanitizer driver. Each class mirrors its Python reference in
// tinylearn/memory/*.py decision for decision, so both backends return the same offsets for the same trace:
//
//   Bump      offset = top; top += align_up(n, alignment); reset when the last live block is freed
//   FreeList  first fit (lowest-offset hole) or best fit (smallest hole, ties lowest offset); coalescing free
//   Buddy     power-of-two blocks >= min_block; split keeps the lower half; merge with buddy = offset ^ size
//   Slab      size classes in slabs; lowest partial slab first, then the lowest free slab; freed objects first,
//             then a per-slab bump index; empty slabs released
//   Caching   PyTorch CUDACachingAllocator rules (512 B rounding, small/large pools, best fit keyed by
//             (stream, size, offset), split/merge, cached segments, empty_cache, release-and-retry on OOM);
//             thread-safe: one std::mutex around every public call; live blocks are found through a direct
//             table indexed by offset / round_to (8 bytes per 512 B of arena = 1/64 of the capacity), which is
//             ~20% faster per malloc+free pair than a hash map
//
// Units are bytes. Bad input throws std::invalid_argument (-> ValueError) or tl::mem::OutOfMemory
// (-> MemoryError) before any state changes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory_resource>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tl {
namespace mem {

using i64 = int64_t;

struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline i64 align_up(i64 x, i64 a) { return (x + a - 1) / a * a; }
inline bool is_pow2(i64 x) { return x > 0 && (x & (x - 1)) == 0; }
inline std::string S(i64 v) { return std::to_string(v); }

struct Stats {
  i64 capacity = 0, allocated = 0, requested = 0, reserved = 0, peak = 0, peak_reserved = 0;
  i64 n_alloc = 0, n_free = 0, n_live = 0, total_free = 0, largest_free = 0;
  // caching allocator extras
  i64 segments = 0, n_segment_alloc = 0, n_segment_free = 0, num_alloc_retries = 0, num_ooms = 0, inactive_split = 0;
  double fragmentation() const { return total_free <= 0 ? 0.0 : 1.0 - double(largest_free) / double(total_free); }
  double internal_fragmentation() const { return allocated == 0 ? 0.0 : 1.0 - double(requested) / double(allocated); }
};

struct Live {
  i64 size, requested;
};

// The arena memory (page aligned, untouched until used) plus the bookkeeping every allocator shares.
class Core {
 public:
  Core(i64 capacity, i64 alignment) : capacity_(capacity), alignment_(alignment) {
    if (capacity <= 0) throw std::invalid_argument("capacity: must be positive, got " + S(capacity));
    if (!is_pow2(alignment)) throw std::invalid_argument("alignment: must be a positive power of two, got " + S(alignment));
    mem_ = static_cast<uint8_t*>(std::aligned_alloc(4096, size_t(align_up(capacity, 4096))));
    if (!mem_) throw OutOfMemory("could not reserve an arena of " + S(capacity) + " bytes");
  }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;
  ~Core() { std::free(mem_); }

  i64 capacity() const { return capacity_; }
  i64 alignment() const { return alignment_; }
  uint8_t* data() const { return mem_; }

  i64 block_size(i64 off) const {
    auto it = live_.find(off);
    if (it == live_.end()) throw std::invalid_argument("offset=" + S(off) + ": not a live allocation");
    return it->second.size;
  }
  std::vector<std::tuple<i64, i64, i64>> live_blocks() const {
    std::vector<std::tuple<i64, i64, i64>> out;
    for (auto& [o, l] : live_) out.emplace_back(o, l.size, l.requested);
    std::sort(out.begin(), out.end());
    return out;
  }

 protected:
  i64 check_size(i64 n) const {
    if (n <= 0) throw std::invalid_argument("nbytes: must be positive, got " + S(n));
    if (n > capacity_) throw OutOfMemory("nbytes=" + S(n) + " exceeds the arena capacity of " + S(capacity_) + " bytes");
    return n;
  }
  Live lookup(i64 off) const {
    auto it = live_.find(off);
    if (it == live_.end())
      throw std::invalid_argument("free(offset=" + S(off) + "): not a live allocation (double free or never allocated)");
    return it->second;
  }
  void on_malloc(i64 off, i64 size, i64 n, i64 reserved_now) {
    live_.emplace(off, Live{size, n});
    st_.allocated += size;
    st_.requested += n;
    st_.n_alloc += 1;
    st_.peak = std::max(st_.peak, st_.allocated);
    st_.peak_reserved = std::max(st_.peak_reserved, reserved_now);
  }
  void on_free(i64 off, const Live& l) {
    live_.erase(off);
    st_.allocated -= l.size;
    st_.requested -= l.requested;
    st_.n_free += 1;
  }
  Stats base_stats() const {
    Stats s = st_;
    s.capacity = capacity_;
    s.n_live = i64(live_.size());
    i64 r = 0;
    for (auto& [o, l] : live_) r = std::max(r, o + l.size);
    s.reserved = r;
    return s;
  }

  i64 capacity_, alignment_;
  uint8_t* mem_ = nullptr;
  // node-based containers draw their nodes from this per-allocator pool instead of glibc malloc
  std::pmr::unsynchronized_pool_resource pool_;
  std::pmr::unordered_map<i64, Live> live_{&pool_};
  Stats st_;
};

// ---------------------------------------------------------------------------------------------------- Bump
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

// ------------------------------------------------------------------------------------------------ FreeList
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
  std::pmr::map<i64, i64> holes_{&pool_};                 // offset -> size
  std::pmr::set<std::pair<i64, i64>> by_size_{&pool_};  // (size, offset)
};

// --------------------------------------------------------------------------------------------------- Buddy
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

// ---------------------------------------------------------------------------------------------------- Slab
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
      throw OutOfMemory("SlabAllocator out of memory: nbytes=" + S(n) + " (class " + S(stride) + "): no free object in class " +
                        S(stride) + " and no free slab (n_slabs=" + S(n_slabs_) + ", slab_size=" + S(slab_size_) + ")");
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

// ------------------------------------------------------------------------------------------------- Caching
struct CachingConfig {
  i64 round_to = 512, small_size = 1 << 20, small_buffer = 2 << 20, large_buffer = 20 << 20,
      min_large_alloc = 10 << 20, round_large = 2 << 20, max_split_size = -1;  // -1: unlimited
};

struct CBlock {
  i64 offset, size, stream, segment, requested = 0;
  bool small, allocated = false;
  CBlock *prev = nullptr, *next = nullptr;
};

struct CBlockLess {
  bool operator()(const CBlock* a, const CBlock* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->offset < b->offset;
  }
};

struct SegmentInfo {
  i64 offset, total_size, stream;
  bool small;
  std::vector<std::tuple<i64, i64, i64, bool>> blocks;  // offset, size, requested, allocated
};

class Caching {
 public:
  Caching(i64 capacity, const CachingConfig& cfg) : cfg_(cfg), device_(capacity, cfg.round_to, false) {
    const std::pair<const char*, i64> checks[] = {{"small_size", cfg.small_size}, {"small_buffer", cfg.small_buffer},
                                                  {"large_buffer", cfg.large_buffer},
                                                  {"min_large_alloc", cfg.min_large_alloc},
                                                  {"round_large", cfg.round_large}};
    for (auto& [name, v] : checks)
      if (v <= 0) throw std::invalid_argument(std::string(name) + ": must be positive, got " + S(v));
    max_split_ = cfg.max_split_size < 0 ? (i64(1) << 62) : cfg.max_split_size;
    live_tab_.assign(size_t(capacity / cfg.round_to + 1), nullptr);
  }
  ~Caching() {
    for (auto& [o, seg] : segments_)
      for (CBlock* b = seg.second; b;) {
        CBlock* nx = b->next;
        delete b;
        b = nx;
      }
    for (CBlock* b : spare_) delete b;
  }
  Caching(const Caching&) = delete;
  Caching& operator=(const Caching&) = delete;

  i64 capacity() const { return device_.capacity(); }
  i64 alignment() const { return cfg_.round_to; }
  uint8_t* data() const { return device_.data(); }

  i64 malloc(i64 nbytes, i64 stream) {
    std::lock_guard<std::mutex> g(mu_);
    if (nbytes <= 0) throw std::invalid_argument("nbytes: must be positive, got " + S(nbytes));
    if (nbytes > capacity())
      throw OutOfMemory("nbytes=" + S(nbytes) + " exceeds the arena capacity of " + S(capacity()) + " bytes");
    i64 size = nbytes < cfg_.round_to ? cfg_.round_to : align_up(nbytes, cfg_.round_to);
    bool small = size <= cfg_.small_size;
    CBlock* b = find_free(small, stream, size);
    if (b == nullptr) {
      b = new_segment(nbytes, size, small, stream);
    } else {
      pool(small).erase(b);
    }
    if (should_split(b, size)) {
      CBlock* rest = make_block(b->offset + size, b->size - size, stream, small, b->segment);
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      pool(small).insert(rest);
    }
    b->allocated = true;
    b->requested = nbytes;
    live_tab_[size_t(b->offset / cfg_.round_to)] = b;
    n_live_ += 1;
    st_.allocated += b->size;
    st_.requested += nbytes;
    st_.n_alloc += 1;
    st_.peak = std::max(st_.peak, st_.allocated);
    st_.peak_reserved = std::max(st_.peak_reserved, reserved_);
    return b->offset;
  }

  void free(i64 off) {
    std::lock_guard<std::mutex> g(mu_);
    CBlock* b = live_find(off);
    if (b == nullptr)
      throw std::invalid_argument("free(offset=" + S(off) + "): not a live allocation (double free or never allocated)");
    live_tab_[size_t(off / cfg_.round_to)] = nullptr;
    n_live_ -= 1;
    b->allocated = false;
    st_.allocated -= b->size;
    st_.requested -= b->requested;
    b->requested = 0;
    st_.n_free += 1;
    // merge with free neighbours; the lower block object survives, so a segment's first block never changes
    CBlock* nx = b->next;
    if (nx && !nx->allocated) {
      pool(nx->small).erase(nx);
      absorb(b, nx);
    }
    CBlock* pv = b->prev;
    if (pv && !pv->allocated) {
      pool(pv->small).erase(pv);
      absorb(pv, b);
      b = pv;
    }
    pool(b->small).insert(b);
  }

  void empty_cache() {
    std::lock_guard<std::mutex> g(mu_);
    release_cached();
  }

  i64 block_size(i64 off) {
    std::lock_guard<std::mutex> g(mu_);
    CBlock* b = live_find(off);
    if (b == nullptr) throw std::invalid_argument("offset=" + S(off) + ": not a live allocation");
    return b->size;
  }
  i64 requested_size(i64 off) {
    std::lock_guard<std::mutex> g(mu_);
    CBlock* b = live_find(off);
    if (b == nullptr) throw std::invalid_argument("offset=" + S(off) + ": not a live allocation");
    return b->requested;
  }

  Stats stats() {
    std::lock_guard<std::mutex> g(mu_);
    Stats s = st_;
    s.capacity = capacity();
    s.reserved = reserved_;
    s.n_live = n_live_;
    s.total_free = reserved_ - st_.allocated;
    for (auto* p : {&small_pool_, &large_pool_})
      for (CBlock* b : *p) {
        s.largest_free = std::max(s.largest_free, b->size);
        if (b->prev || b->next) s.inactive_split += b->size;
      }
    s.segments = i64(segments_.size());
    return s;
  }

  std::vector<std::tuple<i64, i64, i64>> live_blocks() {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<std::tuple<i64, i64, i64>> out;
    for (CBlock* b : live_tab_)
      if (b) out.emplace_back(b->offset, b->size, b->requested);
    return out;
  }
  std::vector<std::pair<i64, i64>> free_blocks() {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<std::pair<i64, i64>> out;
    for (auto* p : {&small_pool_, &large_pool_})
      for (CBlock* b : *p) out.emplace_back(b->offset, b->size);
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<SegmentInfo> snapshot() {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<SegmentInfo> out;
    for (auto& [off, seg] : segments_) {
      CBlock* b = seg.second;
      SegmentInfo si{off, seg.first, b->stream, b->small, {}};
      for (; b; b = b->next) si.blocks.emplace_back(b->offset, b->size, b->requested, b->allocated);
      out.push_back(std::move(si));
    }
    return out;
  }

 private:
  using Pool = std::pmr::set<CBlock*, CBlockLess>;
  // hi (the block right after lo) joins lo
  void absorb(CBlock* lo, CBlock* hi) {
    lo->size += hi->size;
    lo->next = hi->next;
    if (hi->next) hi->next->prev = lo;
    recycle(hi);
  }
  Pool& pool(bool small) { return small ? small_pool_ : large_pool_; }

  CBlock* make_block(i64 off, i64 size, i64 stream, bool small, i64 segment) {
    CBlock* b;
    if (!spare_.empty()) {
      b = spare_.back();
      spare_.pop_back();
    } else {
      b = new CBlock;
    }
    *b = CBlock{off, size, stream, segment, 0, small, false, nullptr, nullptr};
    return b;
  }
  void recycle(CBlock* b) { spare_.push_back(b); }

  CBlock* find_free(bool small, i64 stream, i64 size) {
    Pool& p = pool(small);
    CBlock key{-1, size, stream, 0, 0, small, false, nullptr, nullptr};
    auto it = p.lower_bound(&key);
    if (it == p.end() || (*it)->stream != stream) return nullptr;
    CBlock* b = *it;
    if (!small) {
      if (size < max_split_ && b->size >= max_split_) return nullptr;
      if (size >= max_split_ && b->size >= size + cfg_.large_buffer) return nullptr;
    }
    return b;
  }
  bool should_split(const CBlock* b, i64 size) const {
    i64 remaining = b->size - size;
    if (b->small) return remaining >= cfg_.round_to;
    return size < max_split_ && remaining > cfg_.small_size;
  }
  i64 allocation_size(i64 size) const {
    if (size <= cfg_.small_size) return cfg_.small_buffer;
    if (size < cfg_.min_large_alloc) return cfg_.large_buffer;
    return align_up(size, cfg_.round_large);
  }
  void release_cached() {
    for (bool small : {true, false}) {
      Pool& p = pool(small);
      for (auto it = p.begin(); it != p.end();) {
        CBlock* b = *it;
        if (b->prev == nullptr && b->next == nullptr) {
          it = p.erase(it);
          reserved_ -= segments_.at(b->offset).first;
          segments_.erase(b->offset);
          device_.free(b->offset);
          st_.n_segment_free += 1;
          recycle(b);
        } else {
          ++it;
        }
      }
    }
  }
  CBlock* new_segment(i64 n, i64 size, bool small, i64 stream) {
    i64 seg = std::min(allocation_size(size), capacity() / cfg_.round_to * cfg_.round_to);  // small arenas
    i64 off;
    try {
      off = device_.malloc(seg);
    } catch (const OutOfMemory&) {
      st_.num_alloc_retries += 1;
      release_cached();
      try {
        off = device_.malloc(seg);
      } catch (const OutOfMemory&) {
        st_.num_ooms += 1;
        throw OutOfMemory("CachingAllocator out of memory: tried to allocate nbytes=" + S(n) + " (rounded " + S(size) +
                          ", segment " + S(seg) + "); capacity " + S(capacity()) + ", " + S(st_.allocated) +
                          " allocated, " + S(reserved_) + " reserved, " + S(capacity() - reserved_) +
                          " not reserved (after releasing cached blocks)");
      }
    }
    CBlock* b = make_block(off, seg, stream, small, off);
    segments_[off] = {seg, b};
    reserved_ += seg;
    st_.n_segment_alloc += 1;
    return b;
  }

  CachingConfig cfg_;
  i64 max_split_;
  FreeList device_;  // "cudaMalloc": first fit over the arena, segments aligned to round_to
  std::pmr::unsynchronized_pool_resource res_;  // nodes of the containers below (guarded by mu_)
  Pool small_pool_{&res_}, large_pool_{&res_};
  std::vector<CBlock*> live_tab_;  // offset / round_to -> live block (nullptr if none)
  i64 n_live_ = 0;
  CBlock* live_find(i64 off) const {
    if (off < 0 || off % cfg_.round_to) return nullptr;
    size_t i = size_t(off / cfg_.round_to);
    return i < live_tab_.size() ? live_tab_[i] : nullptr;
  }
  std::map<i64, std::pair<i64, CBlock*>> segments_;  // segment offset -> (size, first block)
  i64 reserved_ = 0;
  std::vector<CBlock*> spare_;
  Stats st_;
  std::mutex mu_;
};

// ------------------------------------------------------------------------------------------- trace replay
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
        throw std::invalid_argument("ops[" + S(r) + "]: free of malloc #" + S(arg) + " which is not live at that point");
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
