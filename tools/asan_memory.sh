#!/usr/bin/env bash
# AddressSanitizer (+UBSan) run of the C++ allocators of tinylearn.memory, outside Python.
#
# Builds cpp_src/memory/*.h (the pure C++ cores behind tinylearn._C.memory) into a standalone driver with
# -fsanitize=address,undefined and runs it: random malloc/free traces on every allocator with every block filled
# and verified through the arena pointer (an overlap or an out-of-arena offset is a heap-buffer-overflow or a
# mismatch), all bad-input paths (double free, unknown offset, size 0 / > capacity, OOM) with "state unchanged"
# checks, free-everything-leaks-nothing checks, and a 4-thread stress test of the caching allocator.
# Usage: tools/asan_memory.sh [ops_per_allocator]     (CXX overrides the compiler; exit code != 0 on failure)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n_ops="${1:-100000}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/driver.cpp" <<'CPP'
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "memory/base.h"
#include "memory/buddy.h"
#include "memory/bump.h"
#include "memory/caching.h"
#include "memory/freelist.h"
#include "memory/slab.h"
#include "memory/trace.h"

using namespace tl::mem;

static int failures = 0;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                   \
      std::fprintf(stderr, "\n");                          \
      ++failures;                                          \
    }                                                      \
  } while (0)

template <class A, class MF>
static void random_trace(const char* name, A& a, uint8_t* mem, i64 n_ops, i64 max_size, MF do_malloc) {
  std::mt19937_64 rng(42);
  struct B { i64 off, n; uint8_t tag; };
  std::vector<B> live;
  for (i64 t = 0; t < n_ops; ++t) {
    bool alloc = live.empty() || (live.size() < 200 && (rng() % 100) < 52);
    if (alloc) {
      i64 n = 1 + i64(rng() % uint64_t(max_size));
      i64 off;
      try {
        off = do_malloc(a, n);
      } catch (const OutOfMemory&) {
        continue;
      }
      CHECK(off % a.alignment() == 0, "%s: offset %lld not aligned", name, (long long)off);
      CHECK(off >= 0 && off + n <= a.capacity(), "%s: block outside the arena", name);
      uint8_t tag = uint8_t(1 + t % 251);
      std::memset(mem + off, tag, size_t(n));  // ASan: stays inside the arena allocation
      live.push_back({off, n, tag});
    } else {
      size_t k = size_t(rng() % live.size());
      B b = live[k];
      live[k] = live.back();
      live.pop_back();
      for (i64 i = 0; i < b.n; ++i)
        if (mem[b.off + i] != b.tag) {
          CHECK(false, "%s: block at %lld overwritten (overlap)", name, (long long)b.off);
          break;
        }
      a.free(b.off);
    }
  }
  for (auto& b : live) a.free(b.off);
  Stats s = a.stats();
  CHECK(s.allocated == 0 && s.requested == 0 && s.n_live == 0, "%s: leak after freeing all", name);
  CHECK(s.n_alloc == s.n_free, "%s: n_alloc != n_free", name);
  std::printf("%-10s %lld ops ok (peak %lld B, peak reserved %lld B)\n", name, (long long)n_ops, (long long)s.peak,
              (long long)s.peak_reserved);
}

template <class A, class MF>
static void bad_input(const char* name, A& a, MF do_malloc) {
  i64 x = do_malloc(a, 100);
  i64 y = do_malloc(a, 300);
  a.free(x);
  Stats before = a.stats();
  auto expect_value_error = [&](auto fn, const char* what) {
    try {
      fn();
      CHECK(false, "%s: %s did not throw", name, what);
    } catch (const std::invalid_argument&) {
    } catch (...) {
      CHECK(false, "%s: %s threw the wrong type", name, what);
    }
  };
  expect_value_error([&] { a.free(x); }, "double free");
  expect_value_error([&] { a.free(123457); }, "unknown offset");
  expect_value_error([&] { do_malloc(a, 0); }, "malloc(0)");
  expect_value_error([&] { do_malloc(a, -5); }, "malloc(-5)");
  try {
    do_malloc(a, a.capacity() + 1);
    CHECK(false, "%s: oversize malloc did not throw", name);
  } catch (const OutOfMemory&) {
  }
  Stats after = a.stats();
  CHECK(before.allocated == after.allocated && before.n_alloc == after.n_alloc && before.n_free == after.n_free &&
            before.total_free == after.total_free && before.largest_free == after.largest_free,
        "%s: state changed by a rejected call", name);
  a.free(y);
  std::printf("%-10s bad input ok\n", name);
}

int main(int argc, char** argv) {
  i64 n_ops = argc > 1 ? std::atoll(argv[1]) : 200000;
  const i64 cap = 8 << 20;
  auto m1 = [](auto& a, i64 n) { return a.malloc(n); };
  auto m2 = [](Caching& a, i64 n) { return a.malloc(n, 0); };
  {
    Bump a(cap * 64, 64);
    random_trace("bump", a, a.data(), n_ops / 10, 8192, m1);  // bump never reuses: fewer ops
    bad_input("bump", a, m1);
  }
  for (bool best : {false, true}) {
    FreeList a(cap, 64, best);
    random_trace(best ? "best_fit" : "first_fit", a, a.data(), n_ops, 16384, m1);
    bad_input(best ? "best_fit" : "first_fit", a, m1);
  }
  {
    Buddy a(cap - 4096, 256);  // not a power of two on purpose
    random_trace("buddy", a, a.data(), n_ops, 16384, m1);
    bad_input("buddy", a, m1);
  }
  {
    Slab a({16, 64, 200, 1024, 4000, 16384}, cap, 1 << 16, 16);
    random_trace("slab", a, a.data(), n_ops, 16384, m1);
    bad_input("slab", a, m1);
  }
  {
    CachingConfig cfg;
    cfg.small_size = 4096;
    cfg.small_buffer = 16384;
    cfg.large_buffer = 1 << 18;
    cfg.min_large_alloc = 1 << 17;
    cfg.round_large = 8192;
    Caching a(cap, cfg);
    random_trace("caching", a, a.data(), n_ops, 200000, m2);
    bad_input("caching", a, m2);
    a.empty_cache();
    CHECK(a.stats().reserved == 0, "caching: reserved after empty_cache");
    // threads: each fills its blocks with its id and checks them before freeing
    std::vector<std::thread> ts;
    for (int tid = 0; tid < 4; ++tid)
      ts.emplace_back([&a, tid, n_ops] {
        std::mt19937_64 rng(tid);
        std::vector<std::pair<i64, i64>> live;
        for (i64 t = 0; t < n_ops / 4; ++t) {
          if (!live.empty() && (live.size() > 30 || rng() % 2)) {
            auto [off, n] = live.back();
            live.pop_back();
            for (i64 i = 0; i < n; ++i)
              if (a.data()[off + i] != uint8_t(tid + 1)) {
                std::fprintf(stderr, "FAIL thread %d: block %lld overwritten\n", tid, (long long)off);
                std::abort();
              }
            a.free(off);
          } else {
            i64 n = 1 + i64(rng() % 50000);
            i64 off = a.malloc(n, tid % 2);
            std::memset(a.data() + off, tid + 1, size_t(n));
            live.emplace_back(off, n);
          }
        }
        for (auto& [off, n] : live) a.free(off);
      });
    for (auto& t : ts) t.join();
    Stats s = a.stats();
    CHECK(s.allocated == 0 && s.n_alloc == s.n_free, "caching threads: leak");
    std::printf("caching    4-thread stress ok (%lld mallocs)\n", (long long)s.n_alloc);
  }
  if (failures) {
    std::fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  std::printf("asan_memory: all checks passed\n");
  return 0;
}
CPP
"${CXX:-g++}" -std=c++17 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined \
  -pthread -I"$root/cpp_src" "$work/driver.cpp" -o "$work/asan_memory"
ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1" "$work/asan_memory" "$n_ops"
