// memory/caching_tcache.h — the per-thread cache of tl::mem::Caching (memory/caching.h, "Per-thread cache" in its
// header comment): the member functions that serve malloc / free from a thread's bins without the lock, register
// and retire a thread's cache, and move blocks between the bins and the pool under the lock. Included at the end
// of memory/caching.h (the class must be complete here); include that file, not this one.
#pragma once
#include "caching.h"

namespace tl {
namespace mem {

inline bool Caching::tc_pop_fast(i64 nbytes, i64& off) {
  TCache* t = tc_mine();
  if (t == nullptr) return false;  // (a requested flush happens at the next push or refill, see TCache::lim)
  size_t k = size_t((uint64_t(nbytes) - 1) >> shift_);  // size class: rounded size = (k + 1) * round_to
  TBin& b = t->bin[k];
  uint64_t w = b.w.load(std::memory_order_relaxed);
  if (w < TBin::kOne) return false;  // empty
  // the top block comes from b.top, loaded in parallel with w: a pop does not wait for w (stored by the last
  // push) to find its slot; the next top is read from the stack afterwards, off the malloc's critical path
  off = b.top;
  uint64_t n = (w >> 48) - 1;
  if (n) b.top = b.base[n - 1];
  b.w.store(w - TBin::kOne + 1, std::memory_order_relaxed);  // count - 1, pops + 1
  tc_tab_[size_t(off >> shift_)].store(nbytes, std::memory_order_relaxed);
  t->held_bytes -= i64(k + 1) << shift_;
  return true;
}

inline size_t Caching::tc_index(i64 off) const {
  uint64_t x = uint64_t(off);
  return size_t((x >> shift_) | (x << ((64 - shift_) & 63)));
}

inline bool Caching::tc_push(i64 off) {
  size_t i = tc_index(off);
  if (i >= tc_tab_n_) return false;
  i64 r = tc_tab_[i].load(std::memory_order_relaxed);
  return r > 0 && tc_push_fast(off, i, r);
}

inline bool Caching::tc_push_fast(i64 off, size_t i, i64 r) {
  TCache* t = tc_mine();
  if (t == nullptr) return false;
  size_t k = size_t(uint64_t(r - 1) >> shift_);
  TBin& b = t->bin[k];
  uint64_t w = b.w.load(std::memory_order_relaxed);
  i64 size = i64(k + 1) << shift_;
  if ((w >> 48) >= uint64_t(t->lim.load(std::memory_order_relaxed)) || t->held_bytes + size > tc_bytes_)
    return false;
  tc_tab_[i].store(0, std::memory_order_relaxed);
  b.base[w >> 48] = off;
  b.top = off;
  b.w.store(w + TBin::kOne, std::memory_order_relaxed);
  t->held_bytes += size;
  return true;
}

inline bool Caching::tc_user_block(i64 off) const {
  size_t i = tc_index(off);
  return i < tc_tab_n_ && tc_tab_[i].load(std::memory_order_relaxed) > 0;
}

inline void Caching::tc_register() {
  if (!tc_on_ || tc_exiting || tc_mine()) return;
  std::lock_guard<std::mutex> g(tc_global_mu());
  std::lock_guard<std::mutex> l(mu_);
  TcOwner& own = tc_owner();
  for (auto it = own.list.begin(); it != own.list.end();) {  // drop caches of destroyed allocators
    if ((*it)->alloc == nullptr) {
      if (tc_tls.t == *it) tc_tls = TcTls{};
      delete *it;
      it = own.list.erase(it);
    } else {
      ++it;
    }
  }
  auto* t = new TCache(this, id_, int(cfg_.thread_cache), tc_ncls_);
  own.list.push_back(t);
  tc_reg_.push_back(t);
  tc_tls = TcTls{id_, t};
  uintptr_t tp = thread_pointer();
  Hint& h = hint_[hint_slot(tp)];
  if (tp != 0 && h.tp.load(std::memory_order_relaxed) == 0) {  // claim the slot (cleared again at thread exit)
    h.t.store(t, std::memory_order_relaxed);
    h.tp.store(tp, std::memory_order_relaxed);
    t->hint_tp = tp;
  }
}

inline void Caching::tc_retire(TCache* t) {
  std::lock_guard<std::mutex> l(mu_);
  tc_flush_all(t);
  if (t->hint_tp) {  // this (exiting) thread's slot; its thread pointer may be reused by a new thread
    Hint& h = hint_[hint_slot(t->hint_tp)];
    h.tp.store(0, std::memory_order_relaxed);
    h.t.store(nullptr, std::memory_order_relaxed);
  }
  i64 pops = t->pops();
  tc_pool_.hits_alloc.add(pops);
  tc_pool_.hits_free.add(t->flushed - t->refilled + pops);  // pushes (nothing held now)
  tc_reg_.erase(std::find(tc_reg_.begin(), tc_reg_.end(), t));
}

inline uintptr_t Caching::thread_pointer() {
#if defined(__x86_64__)
  uintptr_t tp;
  asm("mov %%fs:0, %0" : "=r"(tp));
  return tp;
#else
  return 0;
#endif
}

inline TCache* Caching::tc_mine() const {
  uintptr_t tp = thread_pointer();
  const Hint& h = hint_[hint_slot(tp)];
  if (__builtin_expect(tp != 0 && h.tp.load(std::memory_order_relaxed) == tp, 1))
    return h.t.load(std::memory_order_relaxed);
  return tc_mine_slow();
}

inline Caching::TcStats Caching::tc_sum(bool with_slack) const {
  TcStats s;
  s.hits_alloc = tc_pool_.hits_alloc.get();
  s.hits_free = tc_pool_.hits_free.get();
  for (const TCache* t : tc_reg_) {
    i64 held = 0, pops = t->pops();
    for (int k = 0; k < t->ncls; ++k) {
      i64 n = t->count(size_t(k));
      held += n;
      s.thread_cached += n * (i64(k + 1) << shift_);
    }
    s.thread_cached_blocks += held;
    s.hits_alloc += pops;
    s.hits_free += held - t->refilled + t->flushed + pops;
  }
  if (with_slack)
    for (size_t i = 0; i < tc_tab_n_; ++i) {
      i64 r = tc_tab_[i].load(std::memory_order_relaxed);
      if (r > 0) s.slack += round(r) - r;
    }
  return s;
}

inline void Caching::tc_push_block(TCache* t, i64 off, size_t k) {
  tc_tab_[size_t(off >> shift_)].store(0, std::memory_order_relaxed);
  int n = t->count(k);
  t->bin[k].base[n] = off;
  t->set_count(k, n + 1);
  t->held_bytes += i64(k + 1) << shift_;
}

inline void Caching::tc_flush_bin(TCache* t, int k, int count) {
  int n = t->count(size_t(k));
  count = std::min(count, n);
  if (count == 0) return;
  i64* bin = t->bin[k].base;
  for (int j = 0; j < count; ++j) {
    live_tab_[size_t(bin[j] >> shift_)]->tc_held = false;
    pool_free(bin[j]);
  }
  std::copy(bin + count, bin + n, bin);
  t->set_count(size_t(k), n - count);
  flush_n_ += count;
  t->flushed += count;
  t->held_bytes -= i64(count) * (i64(k + 1) << shift_);
}

inline void Caching::tc_flush_half(TCache* t, i64 size) {
  for (int k = 0; k < tc_ncls_; ++k) tc_flush_bin(t, k, (t->count(size_t(k)) + 1) / 2);
  if (t->held_bytes + size > cfg_.thread_cache_bytes) tc_flush_all(t);
}

inline void Caching::tc_flush_all(TCache* t) {
  for (int k = 0; k < tc_ncls_; ++k) tc_flush_bin(t, k, t->count(size_t(k)));
  t->flush_req.store(false, std::memory_order_relaxed);
  t->lim.store(t->cap, std::memory_order_relaxed);
}

inline i64 Caching::tc_refill_pop(TCache* t, i64 nbytes) {
  if (t->flush_req.load(std::memory_order_relaxed)) tc_flush_all(t);
  i64 size = round(nbytes);
  size_t k = size_t(size >> shift_) - 1;
  tc_locked_ += 1;
  if (t->held_bytes + size > cfg_.thread_cache_bytes) tc_flush_half(t, size);
  i64 room = (cfg_.thread_cache_bytes - t->held_bytes) / size;
  i64 want = std::max<i64>(1, std::min<i64>({std::max(1, t->cap / 2), room, t->cap - t->count(k)}));
  i64 got = 0;
  for (; got < want; ++got) {
    i64 off;
    if (got == 0) {
      try {
        off = pool_malloc(size, 0);
      } catch (const OutOfMemory&) {
        if (t->held_bytes == 0) throw;
        st_.num_ooms -= 1;  // not an OOM yet: this thread's cached blocks go back first
        tc_flush_all(t);  // release what this thread hoards, then the pool's own release-and-retry
        off = pool_malloc(size, 0);
      }
    } else {
      if (pend_) materialize();
      if (find_free(true, 0, size) == nullptr) break;  // no segment growth for the extra blocks
      off = pool_malloc(size, 0);
    }
    if (pend_) materialize();
    live_tab_[size_t(off >> shift_)]->tc_held = true;
    t->bin[k].base[t->count(k)] = off;
    t->set_count(k, t->count(k) + 1);
  }
  refill_n_ += got;
  t->refilled += got;
  t->held_bytes += got * size;
  i64 off = -1;
  tc_pop(nbytes, 0, off);  // cannot fail: the bin has >= 1 block and no flush is requested
  return off;
}

// thread exit: flush every cache of this thread back to its allocator (if it still exists)
inline TcOwner::~TcOwner() {
  tc_exiting = true;
  tc_tls = TcTls{};
  std::lock_guard<std::mutex> g(tc_global_mu());
  for (TCache* t : list) {
    if (t->alloc) t->alloc->tc_retire(t);
    delete t;
  }
  list.clear();
}

}  // namespace mem
}  // namespace tl
