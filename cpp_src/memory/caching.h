// memory/caching.h — mirrors tinylearn/memory/caching.py.
//
//   Caching   PyTorch CUDACachingAllocator rules (512 B rounding, small/large pools, best fit keyed by
//            (stream, size, offset), split/merge, cached segments, empty_cache, release-and-retry on OOM);
//            thread-safe: one std::mutex around every public call; live blocks are found through a direct
//            table indexed by offset / round_to (8 bytes per 512 B of arena = 1/64 of the capacity), which is
//            ~20% faster per malloc+free pair than a hash map
//
// Fast path (cfg.fast_path, default on): a front for cached-block reuse that makes exactly the decisions of the
// tree path (same offsets, same stats, same snapshots as the Python reference), so it is invisible except in time:
//   * a memo per size class: a direct-mapped table (stream, rounded size) -> the block best fit chose, tagged with
//     the id of the pool state it was computed in; a hit in the same state skips the std::set walk;
//   * a lazy split: the block taken by malloc stays in the tree untouched while the handed-out block is "pending";
//     the tree erase / split / remainder insert happen only when another operation needs the exact tree
//     (materialize). Freeing the pending block again (the malloc/free pair, a temporary's whole life) cancels
//     the split: the state is bit-for-bit the one before the malloc, so the state id goes back to it and the memo
//     entries computed there stay valid. A cached-block reuse is then O(1): zero tree lookups, zero updates.
//   Anything else (a second malloc, freeing another block, stats(), empty_cache()) first materializes the pending
//   split, i.e. does the tree work the old path did, once. fast_counters() counts memo hits and tree operations.
//
// Units are bytes. Bad input throws std::invalid_argument (-> ValueError) or tl::mem::OutOfMemory (-> MemoryError)
// before any state changes.
#pragma once
#include "base.h"
#include "freelist.h"  // the "device" a caching allocator carves its segments from

namespace tl {
namespace mem {

struct CachingConfig {
  i64 round_to = 512, small_size = 1 << 20, small_buffer = 2 << 20, large_buffer = 20 << 20, min_large_alloc = 10 << 20,
      round_large = 2 << 20, max_split_size = -1;  // -1: unlimited
  bool fast_path = true;  // memo + lazy split (same decisions as the tree path, see the header comment)
};

// fast path counters (not part of Stats: the Python reference has one path and the same stats keys)
struct FastCounters {
  i64 memo_hits = 0, tree_lookups = 0, tree_updates = 0, cancels = 0, materialized = 0;
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
    const std::pair<const char*, i64> checks[] = {{"small_size", cfg.small_size},
                                                  {"small_buffer", cfg.small_buffer},
                                                  {"large_buffer", cfg.large_buffer},
                                                  {"min_large_alloc", cfg.min_large_alloc},
                                                  {"round_large", cfg.round_large}};
    for (auto& [name, v] : checks)
      if (v <= 0) throw std::invalid_argument(std::string(name) + ": must be positive, got " + S(v));
    max_split_ = cfg.max_split_size < 0 ? (i64(1) << 62) : cfg.max_split_size;
    live_tab_.assign(size_t(capacity / cfg.round_to + 1), nullptr);
    while ((i64(1) << shift_) < cfg.round_to) ++shift_;  // round_to is a power of two (checked by device_)
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
    return malloc_locked(nbytes, stream);
  }
  void free(i64 off) {
    std::lock_guard<std::mutex> g(mu_);
    free_locked(off);
  }
  // the mutex every public call takes; malloc_locked / free_locked expect it held (the Python fast calls try_lock
  // it while holding the GIL and only release the GIL when it is contended)
  std::mutex& mutex() { return mu_; }

  i64 malloc_locked(i64 nbytes, i64 stream) {
    if (nbytes <= 0) throw std::invalid_argument("nbytes: must be positive, got " + S(nbytes));
    if (nbytes > capacity())
      throw OutOfMemory("nbytes=" + S(nbytes) + " exceeds the arena capacity of " + S(capacity()) + " bytes");
    i64 size = nbytes < cfg_.round_to ? cfg_.round_to : (nbytes + cfg_.round_to - 1) & ~(cfg_.round_to - 1);
    bool small = size <= cfg_.small_size;
    CBlock* b;
    if (cfg_.fast_path) {
      if (pend_) materialize();
      Memo& m = memo_[(uint64_t(size >> shift_) ^ (uint64_t(stream) * 0x9E3779B97F4A7C15ull)) & (kMemo - 1)];
      if (m.state == state_ && m.size == size && m.stream == stream) {
        b = m.block;
        fc_.memo_hits += 1;
      } else {
        b = find_free(small, stream, size);
        if (b) m = Memo{state_, size, stream, b};
      }
      if (b) return take_lazily(b, size, nbytes);
    } else {
      b = find_free(small, stream, size);
    }
    state_ = ++next_state_;
    if (b == nullptr) {
      b = new_segment(nbytes, size, small, stream);
    } else {
      pool_erase(b);
    }
    if (should_split(b, size)) {
      CBlock* rest = make_block(b->offset + size, b->size - size, stream, small, b->segment);
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      pool_insert(rest);
    }
    b->allocated = true;
    b->requested = nbytes;
    live_tab_[size_t(b->offset >> shift_)] = b;
    n_live_ += 1;
    st_.allocated += b->size;
    st_.requested += nbytes;
    st_.n_alloc += 1;
    st_.peak = std::max(st_.peak, st_.allocated);
    st_.peak_reserved = std::max(st_.peak_reserved, reserved_);
    return b->offset;
  }

  void free_locked(i64 off) {
    CBlock* b = live_find(off);
    if (b == nullptr)
      throw std::invalid_argument("free(offset=" + S(off) +
                                  "): not a live allocation (double free or never allocated)");
    if (b == &pend_blk_) {  // the pending block comes back: cancel the lazy split, no tree work at all
      live_tab_[size_t(off >> shift_)] = nullptr;
      n_live_ -= 1;
      st_.allocated -= b->size;
      st_.requested -= b->requested;
      st_.n_free += 1;
      pend_ = nullptr;
      state_ = pend_state_;  // exactly the state before that malloc
      fc_.cancels += 1;
      return;
    }
    if (pend_) materialize();
    state_ = ++next_state_;
    live_tab_[size_t(off >> shift_)] = nullptr;
    n_live_ -= 1;
    b->allocated = false;
    st_.allocated -= b->size;
    st_.requested -= b->requested;
    b->requested = 0;
    st_.n_free += 1;
    // merge with free neighbours; the lower block object survives, so a segment's first block never changes
    CBlock* nx = b->next;
    if (nx && !nx->allocated) {
      pool_erase(nx);
      absorb(b, nx);
    }
    CBlock* pv = b->prev;
    if (pv && !pv->allocated) {
      pool_erase(pv);
      absorb(pv, b);
      b = pv;
    }
    pool_insert(b);
  }

  void empty_cache() {
    std::lock_guard<std::mutex> g(mu_);
    if (pend_) materialize();
    release_cached();
  }

  FastCounters fast_counters() {
    std::lock_guard<std::mutex> g(mu_);
    return fc_;
  }
  bool fast_path() const { return cfg_.fast_path; }

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
    if (pend_) materialize();
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
    if (pend_) materialize();
    std::vector<std::pair<i64, i64>> out;
    for (auto* p : {&small_pool_, &large_pool_})
      for (CBlock* b : *p) out.emplace_back(b->offset, b->size);
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<SegmentInfo> snapshot() {
    std::lock_guard<std::mutex> g(mu_);
    if (pend_) materialize();
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
  void pool_insert(CBlock* b) {
    pool(b->small).insert(b);
    fc_.tree_updates += 1;
  }
  void pool_erase(CBlock* b) {
    pool(b->small).erase(b);
    fc_.tree_updates += 1;
  }

  // fast path: hand out free block b (which best fit chose) without touching the tree. The handed-out block is
  // pend_blk_ (an object of its own: b stays in the tree with its key intact until materialize()).
  i64 take_lazily(CBlock* b, i64 size, i64 nbytes) {
    bool split = should_split(b, size);
    pend_blk_ = CBlock{b->offset, split ? size : b->size, b->stream, b->segment, nbytes, b->small, true,
                       nullptr, nullptr};
    pend_ = b;
    pend_split_ = split;
    pend_state_ = state_;
    state_ = ++next_state_;
    live_tab_[size_t(b->offset >> shift_)] = &pend_blk_;
    n_live_ += 1;
    st_.allocated += pend_blk_.size;
    st_.requested += nbytes;
    st_.n_alloc += 1;
    st_.peak = std::max(st_.peak, st_.allocated);
    st_.peak_reserved = std::max(st_.peak_reserved, reserved_);
    return pend_blk_.offset;
  }
  // do the tree work the old path did at the pending malloc: the virtual state (and state_) does not change
  void materialize() {
    CBlock* b = pend_;
    pend_ = nullptr;
    pool_erase(b);
    if (pend_split_) {
      i64 size = pend_blk_.size;
      CBlock* rest = make_block(b->offset + size, b->size - size, b->stream, b->small, b->segment);
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      pool_insert(rest);
    }
    b->allocated = true;
    b->requested = pend_blk_.requested;
    live_tab_[size_t(b->offset >> shift_)] = b;
    fc_.materialized += 1;
  }

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
    fc_.tree_lookups += 1;
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
    state_ = ++next_state_;
    for (bool small : {true, false}) {
      Pool& p = pool(small);
      for (auto it = p.begin(); it != p.end();) {
        CBlock* b = *it;
        if (b->prev == nullptr && b->next == nullptr) {
          it = p.erase(it);
          fc_.tree_updates += 1;
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
  int shift_ = 0;  // log2(round_to): the hot path shifts and masks instead of dividing
  FreeList device_;                             // "cudaMalloc": first fit over the arena, segments aligned to round_to
  std::pmr::unsynchronized_pool_resource res_;  // nodes of the containers below (guarded by mu_)
  Pool small_pool_{&res_}, large_pool_{&res_};
  std::vector<CBlock*> live_tab_;  // offset / round_to -> live block (nullptr if none)
  i64 n_live_ = 0;
  CBlock* live_find(i64 off) const {
    if (off < 0 || (off & (cfg_.round_to - 1))) return nullptr;
    size_t i = size_t(off >> shift_);
    return i < live_tab_.size() ? live_tab_[i] : nullptr;
  }
  std::map<i64, std::pair<i64, CBlock*>> segments_;  // segment offset -> (size, first block)
  i64 reserved_ = 0;
  std::vector<CBlock*> spare_;
  Stats st_;
  std::mutex mu_;
  // fast path state: a pool state id (a fresh one after every change; a cancelled lazy split restores the previous
  // one), the memo, the one pending lazy split
  struct Memo {
    i64 state = 0, size = 0, stream = 0;
    CBlock* block = nullptr;
  };
  static constexpr size_t kMemo = 256;
  Memo memo_[kMemo];
  i64 state_ = 1, next_state_ = 1;
  CBlock* pend_ = nullptr;  // the free block (still in the tree) the pending malloc took
  CBlock pend_blk_{0, 0, 0, 0, 0, false, false, nullptr, nullptr};  // the block that malloc handed out
  bool pend_split_ = false;
  i64 pend_state_ = 0;
  FastCounters fc_;
};

}  // namespace mem
}  // namespace tl
