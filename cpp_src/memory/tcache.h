// memory/tcache.h — the per-thread cache's data structures for memory/caching.h (see its header comment, "Per-thread
// cache"): single-writer counters, a bin (a LIFO stack of offsets of one size class in one word), one thread's cache
// for one allocator, and the thread_local owner whose destructor (thread exit, memory/caching_tcache.h) flushes them.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "base.h"

namespace tl {
namespace mem {

// ---- per-thread cache plumbing (see the header comment) ----
class Caching;
// a counter written by one thread only (plain load + store, no read-modify-write), read by others under the lock
struct TcCount {
  std::atomic<i64> v{0};
  void add(i64 d) { v.store(v.load(std::memory_order_relaxed) + d, std::memory_order_relaxed); }
  i64 get() const { return v.load(std::memory_order_relaxed); }
};
struct TcCounters {
  TcCount hits_alloc, hits_free;  // mallocs / frees served by a thread cache
};
// (a live cache counts only its pops; its pushes follow from held = refilled - flushed - pops + pushes)
// One bin: a LIFO stack of offsets of one size class and its counters in ONE word written only by the owner,
// w = count << 48 | pops (pops: mallocs this bin served, wraps after 2^48), so a pop is one load + one store of
// the word (count - 1, pops + 1) and a push one add (count + 1); stats() reads the word (relaxed).
struct TBin {
  static constexpr uint64_t kOne = uint64_t(1) << 48;  // count 1
  static constexpr uint64_t kPops = kOne - 1;          // mask of the pop counter
  std::atomic<uint64_t> w{0};
  i64* base = nullptr;  // the bin's cap slots
  i64 top = -1;         // = base[count - 1] when count > 0 (owner only): pop reads it without waiting for w
};
// one thread's cache for one allocator: bins of offsets per size class (round_to, 2 round_to, ...), LIFO
struct TCache {
  Caching* alloc;  // nullptr once the allocator is destroyed (guarded by tc_global_mu())
  uint64_t id;     // the allocator's id (never reused, unlike its address)
  int cap, ncls;
  i64 held_bytes = 0;                  // owner only: bytes in the bins (the byte cap)
  uintptr_t hint_tp = 0;               // the allocator's hint slot this thread claimed (0: none)
  i64 refilled = 0, flushed = 0;       // blocks moved from / to the pool (under the allocator's mutex)
  std::atomic<bool> flush_req{false};  // set by empty_cache() of another thread (with lim = 0), read by the owner
  std::atomic<int> lim;                // cap, or 0 while a flush is requested: the next push fails into the slow path
  TBin bin[64];                        // class k: bin[k].base[0, count(k)) (written by the owner)
  std::unique_ptr<i64[]> slots;        // storage of the bins: class k at slots[k * cap, (k + 1) * cap)
  TCache(Caching* a, uint64_t i, int cap_, int ncls_)
      : alloc(a), id(i), cap(cap_), ncls(ncls_), lim(cap_), slots(new i64[size_t(cap_) * size_t(ncls_)]) {
    for (int k = 0; k < ncls_; ++k) bin[k].base = &slots[size_t(k) * size_t(cap_)];
  }
  int count(size_t k) const { return int(bin[k].w.load(std::memory_order_relaxed) >> 48); }
  void set_count(size_t k, int v) {
    uint64_t w = bin[k].w.load(std::memory_order_relaxed);
    bin[k].w.store((uint64_t(v) << 48) | (w & TBin::kPops), std::memory_order_relaxed);
    if (v > 0) bin[k].top = bin[k].base[v - 1];
  }
  i64 pops() const {  // mallocs served by this cache
    i64 s = 0;
    for (int k = 0; k < ncls; ++k) s += i64(bin[k].w.load(std::memory_order_relaxed) & TBin::kPops);
    return s;
  }
};
struct TcTls {
  uint64_t id = 0;
  TCache* t = nullptr;
};
inline thread_local TcTls tc_tls;          // the last (allocator id, cache) this thread used: trivially destructible
inline thread_local bool tc_exiting = false;  // set when this thread's caches were flushed at exit
struct TcOwner {  // this thread's caches; the destructor (thread exit) flushes them back
  std::vector<TCache*> list;
  ~TcOwner();
};
inline TcOwner& tc_owner() {
  static thread_local TcOwner o;
  return o;
}
inline std::mutex& tc_global_mu() {  // lock order: tc_global_mu() before an allocator's mutex
  static std::mutex m;
  return m;
}
inline uint64_t tc_new_id() {
  static std::atomic<uint64_t> n{0};
  return n.fetch_add(1) + 1;
}

}  // namespace mem
}  // namespace tl
