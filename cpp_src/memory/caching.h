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
// Per-thread cache (cfg.thread_cache = blocks per size class, 0 = off, the default): small blocks of stream 0
// (rounded size <= min(small_size, 64 * round_to, thread_cache_bytes)) are served from a thread_local array per
// size class in front of the locked pool, so the common malloc/free pair takes no lock and no atomic
// read-modify-write (plain loads/stores; counters are single-writer relaxed atomics):
//   * the hit path (tc_pop_fast / tc_push_fast) is a few dozen instructions, like glibc's tcache: the cache is
//     found through a table indexed by a hash of the thread pointer (no __tls_get_addr call, see tc_mine), the
//     size class is a shift, "cacheable" one unsigned compare, a bin is one word (count << 48 | pops), a base
//     pointer and a copy of its top entry (so a pop loads the block in parallel with the count instead of after it:
//     one store-to-load forward less on the malloc -> free -> malloc chain, 13.1 -> 11.0 ns per 64 B pair on Zen 2),
//     and free finds a cached block through tc_tab_ after one rotate + compare (range and alignment);
//   * malloc pops the bin of its size class; an empty bin is refilled under the lock with a batch of
//     max(1, thread_cache / 2) blocks carved from cached free blocks (only the first may create a segment);
//   * free pushes the block on the freeing thread's bin (a block freed by another thread than the one that
//     allocated it goes to the freeing thread's cache); a full bin first flushes half of itself to the pool under
//     the lock; a thread holds at most thread_cache blocks per class and thread_cache_bytes in all (no hoarding);
//   * from the pool's point of view a cached block is allocated (flag tc_held); the user's view is recovered
//     exactly in stats(): allocated/requested/n_alloc/n_free/n_live subtract what sits in thread caches and add
//     the per-thread hit counters; stats()["thread_cached"] = bytes held in thread caches, so
//     reserved = allocated + total_free + thread_cached; peak / peak_reserved are the pool's (an upper bound);
//   * thread exit flushes the thread's caches back to their pools (a thread_local owner's destructor); the
//     allocator's destructor detaches the caches of live threads; empty_cache() flushes the calling thread's
//     cache and asks every other thread to flush at its next push or refill (a relaxed limit its push reads);
//   * with a thread cache, offsets differ from the tree path / Python reference (cached blocks are not free for
//     best fit); everything else (errors, double-free detection, stats identities) holds. Two threads freeing the
//     same block at the same moment is undefined, as in every malloc.
//
// Files: this one (the pool: tree path and fast path), tcache.h (the per-thread cache's data structures),
// caching_tcache.h (Caching's per-thread cache member functions, included at the end of this file).
// Why one file (> 500 lines): it is one class whose pool rules (best fit, split / merge, memo, lazy split, release
// and retry) change one state together under one mutex; apart, each rule would read half of another's invariants.
//
// Units are bytes. Bad input throws std::invalid_argument (-> ValueError) or tl::mem::OutOfMemory (-> MemoryError)
// before any state changes.
#pragma once
#include "base.h"
#include <atomic>
#include <memory>

#include "freelist.h"  // the "device" a caching allocator carves its segments from
#include "tcache.h"    // the per-thread cache's data structures

namespace tl {
namespace mem {

struct CachingConfig {
  i64 round_to = 512, small_size = 1 << 20, small_buffer = 2 << 20, large_buffer = 20 << 20, min_large_alloc = 10 << 20,
      round_large = 2 << 20, max_split_size = -1;  // -1: unlimited
  bool fast_path = true;  // memo + lazy split (same decisions as the tree path, see the header comment)
  i64 thread_cache = 0;   // per-thread cache: blocks per size class (0: off; at most 64)
  i64 thread_cache_bytes = 1 << 20;  // per-thread cap on cached bytes (all classes of one allocator)
};

// fast path counters (not part of Stats: the Python reference has one path and the same stats keys)
struct FastCounters {
  i64 memo_hits = 0, tree_lookups = 0, tree_updates = 0, cancels = 0, materialized = 0;
};

struct CBlock {
  i64 offset, size, stream, segment, requested = 0;
  bool small, allocated = false;
  CBlock *prev = nullptr, *next = nullptr;
  bool tc_held = false;  // taken from the pool by a thread cache (allocated for the pool; see tc_tab_ for the user)
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
  std::vector<std::tuple<i64, i64, i64, int>> blocks;  // offset, size, requested, state (0 free, 1 allocated, 2 thread cached)
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
    if (cfg.thread_cache < 0 || cfg.thread_cache > 64)
      throw std::invalid_argument("thread_cache: expected 0 (off) to 64 blocks per size class, got " +
                                  S(cfg.thread_cache));
    if (cfg.thread_cache > 0 && cfg.thread_cache_bytes < cfg.round_to)
      throw std::invalid_argument("thread_cache_bytes: must be >= round_to (" + S(cfg.round_to) + "), got " +
                                  S(cfg.thread_cache_bytes));
    max_split_ = cfg.max_split_size < 0 ? (i64(1) << 62) : cfg.max_split_size;
    live_tab_.assign(size_t(capacity / cfg.round_to + 1), nullptr);
    while ((i64(1) << shift_) < cfg.round_to) ++shift_;  // round_to is a power of two (checked by device_)
    if (cfg.thread_cache > 0) {
      tc_on_ = true;
      tc_max_ = std::min({cfg.small_size, 64 * cfg.round_to, cfg.thread_cache_bytes}) & ~(cfg.round_to - 1);
      tc_ncls_ = int(tc_max_ >> shift_);
      tc_on_ = tc_ncls_ > 0;
      size_t n = live_tab_.size();
      tc_tab_.reset(new std::atomic<i64>[n]);
      for (size_t i = 0; i < n; ++i) tc_tab_[i].store(0, std::memory_order_relaxed);
      if (tc_on_) {
        tc_lim_ = uint64_t(tc_max_);
        tc_tab_n_ = n;
        tc_bytes_ = cfg.thread_cache_bytes;
      }
    }
  }
  ~Caching() {
    if (tc_on_) {  // threads still alive keep their (now detached) caches until they exit
      std::lock_guard<std::mutex> g(tc_global_mu());
      for (TCache* t : tc_reg_) t->alloc = nullptr;
    }
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
    if (tc_cacheable(nbytes, stream)) {
      i64 off;
      if (tc_pop_fast(nbytes, off)) return off;  // no lock, no atomic read-modify-write
      tc_register();                                // no-op once this thread has a cache
      std::lock_guard<std::mutex> g(mu_);
      return malloc_locked(nbytes, stream);
    }
    std::lock_guard<std::mutex> g(mu_);
    return pool_malloc(nbytes, stream);
  }
  void free(i64 off) {
    size_t i = tc_index(off);
    if (i < tc_tab_n_) {
      i64 r = tc_tab_[i].load(std::memory_order_relaxed);
      if (r > 0) {  // a live block a thread cache handed out
        if (tc_push_fast(off, i, r)) return;
        tc_register();
      }
    }
    std::lock_guard<std::mutex> g(mu_);
    free_locked(off);
  }
  // the mutex every public call takes; malloc_locked / free_locked expect it held (the Python fast calls try_lock
  // it while holding the GIL and only release the GIL when it is contended)
  std::mutex& mutex() { return mu_; }

  i64 malloc_locked(i64 nbytes, i64 stream) {
    if (tc_on_) {
      i64 off;
      if (tc_pop(nbytes, stream, off)) return off;
      if (tc_cacheable(nbytes, stream))
        if (TCache* t = tc_mine()) return tc_refill_pop(t, nbytes);
    }
    return pool_malloc(nbytes, stream);
  }

  void free_locked(i64 off) {
    if (tc_on_) {
      if (tc_push(off)) return;
      if (tc_user_block(off)) {  // a live block handed out by a thread cache that the lock-free push could not take
        size_t i = size_t(off >> shift_);
        i64 r = tc_tab_[i].load(std::memory_order_relaxed);
        i64 size = round(r);
        if (TCache* t = tc_mine()) {
          if (t->flush_req.load(std::memory_order_relaxed)) tc_flush_all(t);
          int k = int(size >> shift_) - 1;
          tc_locked_ += 1;
          if (t->count(size_t(k)) == t->cap) tc_flush_bin(t, k, std::max(1, t->cap / 2));
          if (t->held_bytes + size > cfg_.thread_cache_bytes) tc_flush_half(t, size);
          tc_push_block(t, off, size_t(k));
          return;
        }
        // no cache in this thread (not registered, or exiting): straight back to the pool (the pool's n_free
        // counts this free; its requested drops by the block size, which stats() accounts for)
        tc_tab_[i].store(0, std::memory_order_relaxed);
        live_tab_[i]->tc_held = false;
        pool_free(off);
        return;
      }
      CBlock* b = live_find(off);
      if (b && b->tc_held) throw_not_live(off);  // sits in a thread cache: freed twice
    }
    pool_free(off);
  }

  void empty_cache() {
    std::lock_guard<std::mutex> g(mu_);
    if (tc_on_) {
      TCache* mine = tc_mine();
      for (TCache* t : tc_reg_) {
        if (t == mine)
          tc_flush_all(t);
        else {  // the owner flushes at its next push or refill
          t->flush_req.store(true, std::memory_order_relaxed);
          t->lim.store(0, std::memory_order_relaxed);
        }
      }
    }
    if (pend_) materialize();
    release_cached();
  }
  // flush the calling thread's cache of this allocator back to the pool (what thread exit does)
  void flush_thread_cache() {
    if (!tc_on_) return;
    std::lock_guard<std::mutex> g(mu_);
    if (TCache* t = tc_mine()) tc_flush_all(t);
  }

  FastCounters fast_counters() {
    std::lock_guard<std::mutex> g(mu_);
    return fc_;
  }
  bool fast_path() const { return cfg_.fast_path; }
  i64 thread_cache() const { return tc_on_ ? cfg_.thread_cache : 0; }
  i64 thread_cache_max_size() const { return tc_on_ ? tc_max_ : 0; }

  struct TcStats {
    i64 thread_cached = 0, thread_cached_blocks = 0, hits_alloc = 0, hits_free = 0, refills = 0, flushes = 0,
        threads = 0, slack = 0, locked_calls = 0;
  };
  TcStats thread_cache_stats() {
    std::lock_guard<std::mutex> g(mu_);
    TcStats s = tc_sum();
    s.refills = refill_n_;
    s.flushes = flush_n_;
    s.locked_calls = tc_locked_;
    s.threads = i64(tc_reg_.size());
    return s;
  }

  i64 block_size(i64 off) {
    std::lock_guard<std::mutex> g(mu_);
    CBlock* b = user_live_find(off);
    if (b == nullptr) throw std::invalid_argument("offset=" + S(off) + ": not a live allocation");
    return b->size;
  }
  i64 requested_size(i64 off) {
    std::lock_guard<std::mutex> g(mu_);
    CBlock* b = user_live_find(off);
    if (b == nullptr) throw std::invalid_argument("offset=" + S(off) + ": not a live allocation");
    return b->tc_held ? tc_tab_[size_t(off >> shift_)].load(std::memory_order_relaxed) : b->requested;
  }

  // thread_cached (optional): bytes held in thread caches; reserved = allocated + total_free + thread_cached.
  // Exact when no other thread is inside malloc/free (their hit counters are read as they are).
  Stats stats(i64* thread_cached = nullptr) {
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
    if (tc_on_) {  // the user's view: blocks in thread caches are not allocated; hits count as calls
      TcStats t = tc_sum(true);
      s.allocated -= t.thread_cached;
      s.requested -= t.thread_cached + t.slack;
      s.n_alloc += t.hits_alloc - refill_n_;
      s.n_free += t.hits_free - flush_n_;
      s.n_live -= t.thread_cached_blocks;
      if (thread_cached) *thread_cached = t.thread_cached;
    } else if (thread_cached) {
      *thread_cached = 0;
    }
    return s;
  }

  std::vector<std::tuple<i64, i64, i64>> live_blocks() {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<std::tuple<i64, i64, i64>> out;
    for (size_t i = 0; i < live_tab_.size(); ++i) {
      CBlock* b = live_tab_[i];
      if (!b) continue;
      if (b->tc_held) {
        i64 r = tc_tab_[i].load(std::memory_order_relaxed);
        if (r > 0) out.emplace_back(b->offset, b->size, r);
      } else {
        out.emplace_back(b->offset, b->size, b->requested);
      }
    }
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
      for (; b; b = b->next) {
        if (b->tc_held) {
          i64 r = tc_tab_[size_t(b->offset >> shift_)].load(std::memory_order_relaxed);
          si.blocks.emplace_back(b->offset, b->size, r > 0 ? r : 0, r > 0 ? 1 : 2);
        } else {
          si.blocks.emplace_back(b->offset, b->size, b->requested, b->allocated ? 1 : 0);
        }
      }
      out.push_back(std::move(si));
    }
    return out;
  }

  // ---- per-thread cache, lock-free part (public for the Python fast calls) ----
  bool tc_on() const { return tc_on_; }
  // stream 0 and 0 < nbytes <= tc_max_ (tc_lim_ is 0 when the cache is off): one unsigned compare
  bool tc_cacheable(i64 nbytes, i64 stream) const { return stream == 0 && uint64_t(nbytes) - 1 < tc_lim_; }
  // serve malloc from this thread's cache: false when the bin is empty / not cacheable / no cache yet
  bool tc_pop(i64 nbytes, i64 stream, i64& off) { return tc_cacheable(nbytes, stream) && tc_pop_fast(nbytes, off); }
  // tc_pop for a cacheable nbytes
  bool tc_pop_fast(i64 nbytes, i64& off);
  // offset -> tc_tab_ index; an offset that is negative or not a multiple of round_to rotates its low (or sign)
  // bits to the top and fails the i < tc_tab_n_ check, so one compare checks range and alignment
  size_t tc_index(i64 off) const;
  // take a freed block into this thread's cache: false when it is not a thread-cache block or the bin is full
  bool tc_push(i64 off);
  // tc_push for a live thread-cache block: off, its tc_tab_ index i and requested bytes r = tc_tab_[i] > 0
  bool tc_push_fast(i64 off, size_t i, i64 r);
  // a live block handed out by some thread cache (requested bytes recorded in tc_tab_)
  bool tc_user_block(i64 off) const;
  bool tc_registered() const { return tc_mine() != nullptr; }
  // give the calling thread a cache for this allocator (takes tc_global_mu() then the mutex: call it unlocked)
  void tc_register();
  // thread exit (tc_global_mu() held): flush t back to the pool, keep its counters, forget it
  void tc_retire(TCache* t);

 private:
  using Pool = std::pmr::set<CBlock*, CBlockLess>;
  i64 round(i64 nbytes) const {
    return nbytes < cfg_.round_to ? cfg_.round_to : (nbytes + cfg_.round_to - 1) & ~(cfg_.round_to - 1);
  }
  [[noreturn]] static void throw_not_live(i64 off) {
    throw std::invalid_argument("free(offset=" + S(off) + "): not a live allocation (double free or never allocated)");
  }
  // the live block the user sees at off (nullptr for a block sitting in a thread cache)
  CBlock* user_live_find(i64 off) const {
    CBlock* b = live_find(off);
    if (b && b->tc_held && tc_tab_[size_t(off >> shift_)].load(std::memory_order_relaxed) == 0) return nullptr;
    return b;
  }

  i64 pool_malloc(i64 nbytes, i64 stream) {
    if (nbytes <= 0) throw std::invalid_argument("nbytes: must be positive, got " + S(nbytes));
    if (nbytes > capacity())
      throw OutOfMemory("nbytes=" + S(nbytes) + " exceeds the arena capacity of " + S(capacity()) + " bytes");
    i64 size = round(nbytes);
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
    if (should_split(b, size)) split_block(b, size);
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

  void pool_free(i64 off) {
    CBlock* b = live_find(off);
    if (b == nullptr) throw_not_live(off);
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

  // b (out of the tree) keeps its first `size` bytes; the rest becomes a free block of the same segment, inserted
  // in the pool. The one place a block is split (tree path malloc and the deferred split of the fast path).
  void split_block(CBlock* b, i64 size) {
    CBlock* rest = make_block(b->offset + size, b->size - size, b->stream, b->small, b->segment);
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    pool_insert(rest);
  }

  // ---- per-thread cache, locked part (mu_ held, called by the owning thread) ----
  // The calling thread's cache. First a table in this allocator indexed by the thread pointer (x86-64: %fs:0 is
  // the thread's own TCB address, unique among live threads, read without a call), written only by the thread it
  // names (register / exit, so a thread that finds its own pointer reads its own writes), then the thread_local
  // (in a shared library every thread_local access is a __tls_get_addr call), then this thread's list.
  static uintptr_t thread_pointer();
  static size_t hint_slot(uintptr_t tp) { return size_t((uint64_t(tp) * 0x9E3779B97F4A7C15ull) >> 60); }
  TCache* tc_mine() const;
  __attribute__((noinline)) TCache* tc_mine_slow() const {
    const TcTls& s = tc_tls;
    if (s.id == id_) return s.t;
    if (!tc_on_ || tc_exiting) return nullptr;
    for (TCache* t : tc_owner().list)
      if (t->id == id_) {
        tc_tls = TcTls{id_, t};
        return t;
      }
    return nullptr;
  }  // slack (with_slack): sum of block size - requested over the live blocks thread caches handed out (the pool
  // counts them at their block size): a scan of tc_tab_, so only stats() asks for it
  TcStats tc_sum(bool with_slack = false) const;
  void tc_push_block(TCache* t, i64 off, size_t k);
  // return the `count` oldest blocks of bin k to the pool
  void tc_flush_bin(TCache* t, int k, int count);
  // over the byte cap: return the older half of every bin (all of it if that is not enough for `size` more bytes),
  // so the next overflow is again about half the budget away (flushing everything would thrash)
  void tc_flush_half(TCache* t, i64 size);
  void tc_flush_all(TCache* t);
  // an empty bin: carve a batch of blocks of this class from the pool (only the first may create a segment),
  // keep all but one in the bin, hand that one out
  i64 tc_refill_pop(TCache* t, i64 nbytes);

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
    if (pend_split_) split_block(b, pend_blk_.size);
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
  // per-thread cache
  const uint64_t id_ = tc_new_id();
  bool tc_on_ = false;
  int tc_ncls_ = 0;  // size classes round_to, 2 round_to, ..., tc_max_
  i64 tc_max_ = 0;
  std::unique_ptr<std::atomic<i64>[]> tc_tab_;  // offset / round_to -> requested bytes of a block a thread cache
  size_t tc_tab_n_ = 0;                         // handed out and the user holds (0: none); 0 when off
  uint64_t tc_lim_ = 0;                         // tc_max_ when the cache is on, else 0 (see tc_cacheable)
  i64 tc_bytes_ = 0;                            // cfg_.thread_cache_bytes (next to the hot fields)
  std::vector<TCache*> tc_reg_;                 // caches of live threads (changed under tc_global_mu() and mu_)
  TcCounters tc_pool_;                          // hit counters of exited threads (mu_)
  struct Hint {
    std::atomic<uintptr_t> tp{0};
    std::atomic<TCache*> t{nullptr};
  };
  Hint hint_[16];  // thread pointer -> cache, see tc_mine()
  i64 refill_n_ = 0, flush_n_ = 0;              // pool mallocs into / frees out of thread caches
  i64 tc_locked_ = 0;                           // cacheable mallocs / frees that had to take the lock
};

}  // namespace mem
}  // namespace tl

#include "caching_tcache.h"  // Caching's per-thread cache: the member functions declared above
