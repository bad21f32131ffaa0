// memory/base.h — what every C++ allocator behind tinylearn._C.memory shares (tinylearn/memory/base.py): units,
// OutOfMemory, align_up, Stats, Live and the Core class (arena bookkeeping, mutex). Free of Python so that
// tools/asan_memory.sh can build the allocators into a standalone AddressSanitizer driver.
// One header per allocator, each mirroring its Python reference in tinylearn/memory/*.py decision for decision,
// so both backends return the same offsets for the same trace:
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
//             ~20% faster per malloc+free pair than a hash map; a fast path (memo of best fit per size class +
//             lazy split cancelled by the matching free) reuses a cached block with no tree work, same decisions;
//             opt-in per-thread cache (thread_cache=N blocks per small size class, caching.h): a malloc/free
//             pair takes no lock, refills and flushes go to the locked pool in batches, flushed at thread exit
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
    if (!is_pow2(alignment))
      throw std::invalid_argument("alignment: must be a positive power of two, got " + S(alignment));
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
    if (n > capacity_)
      throw OutOfMemory("nbytes=" + S(n) + " exceeds the arena capacity of " + S(capacity_) + " bytes");
    return n;
  }
  Live lookup(i64 off) const {
    auto it = live_.find(off);
    if (it == live_.end())
      throw std::invalid_argument("free(offset=" + S(off) +
                                  "): not a live allocation (double free or never allocated)");
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

}  // namespace mem
}  // namespace tl
