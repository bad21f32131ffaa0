"""The C++ caching allocator's fast path (issue 18): O(1) cached-block reuse with the tree path's decisions.

The fast path (memo of best fit per size class + lazy split cancelled by the matching free) must be invisible
except in time: same offsets, stats, snapshots and errors as the tree path (fast_path=False) and the Python
reference, and zero std::set work on a malloc/free pair of a cached block (counted by fast_counters()).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

import tinylearn.memory as M
from tinylearn import backends

pytestmark = pytest.mark.skipif(not backends.C_available("memory"), reason="tinylearn._C.memory not built")

MiB = 1 << 20
SMALL = dict(small_size=4096, small_buffer=16384, large_buffer=1 << 18, min_large_alloc=1 << 17, round_large=8192)


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


@pytest.mark.parametrize("size", [64, 4096, MiB, 64 * MiB])
def test_reuse_returns_the_same_block_with_zero_tree_work(size: int) -> None:
    alloc = M.CachingAllocator(256 * MiB, backend="cpp")
    a = alloc.malloc(size)
    alloc.free(a)
    alloc.free(alloc.malloc(size))  # first reuse: one best-fit lookup, remembered in the memo
    before = alloc.fast_counters()
    for _ in range(200):
        b = alloc.malloc(size)
        assert b == a
        assert alloc.block_size(b) == M.round_size(size)
        alloc.free(b)
    d = delta(alloc.fast_counters(), before)
    assert d["tree_lookups"] == 0 and d["tree_updates"] == 0, d
    assert d["memo_hits"] == 200 and d["cancels"] == 200 and d["materialized"] == 0, d
    s = alloc.stats()
    assert s["n_alloc"] == s["n_free"] == 202 and s["allocated"] == 0 and s["segments"] == 1


def test_tree_path_does_tree_work_on_every_pair() -> None:
    alloc = M.CachingAllocator(64 * MiB, backend="cpp", fast_path=False)
    alloc.free(alloc.malloc(1000))
    before = alloc.fast_counters()
    for _ in range(50):
        alloc.free(alloc.malloc(1000))
    d = delta(alloc.fast_counters(), before)
    assert d["tree_lookups"] == 50 and d["tree_updates"] == 4 * 50 and d["memo_hits"] == 0  # erase+insert, x2
    assert not alloc.fast_path and M.CachingAllocator(1 << 20, backend="cpp").fast_path
    assert M.CachingAllocator(1 << 20).fast_counters()["tree_lookups"] == 0  # Python reference: one path
    with pytest.raises(TypeError, match="fast_path"):
        M.CachingAllocator(1 << 20, backend="cpp", fast_path=1)


def _state(alloc: M.CachingAllocator) -> tuple:
    return alloc.stats(), alloc.live_blocks(), alloc.free_blocks(), alloc.memory_snapshot()


def _random_program(seed: int, n_ops: int) -> list[tuple]:
    """A mix of the patterns the fast path must get right: immediate malloc/free pairs (cancel), nested pairs,
    random frees (materialize), several streams, sizes across both pools, empty_cache and state queries."""
    rng = np.random.default_rng(seed)
    prog: list[tuple] = []
    live = 0
    sizes = [1, 100, 512, 513, 3000, 4096, 5000, 20000, 70000, 150000, 300000]
    for _ in range(n_ops):
        r = rng.random()
        if r < 0.35:
            prog.append(("pair", int(rng.choice(sizes)), int(rng.integers(2))))
        elif r < 0.65 or live == 0:
            prog.append(("malloc", int(rng.choice(sizes)) + int(rng.integers(0, 8)), int(rng.integers(2))))
            live += 1
        elif r < 0.95:
            prog.append(("free", int(rng.integers(1 << 30))))
            live -= 1
        elif r < 0.97:
            prog.append(("empty_cache",))
        else:
            prog.append(("query",))
    return prog


def _run_program(alloc: M.CachingAllocator, prog: list[tuple]) -> list:
    """Observable trace: every offset, every error, and the full state at each query."""
    obs: list = []
    live: list[int] = []
    for step in prog:
        kind = step[0]
        try:
            if kind == "pair":
                off = alloc.malloc(step[1], stream=step[2])
                obs.append(("pair", off, alloc.block_size(off)))
                alloc.free(off)
            elif kind == "malloc":
                off = alloc.malloc(step[1], step[2])
                obs.append(("malloc", off))
                live.append(off)
            elif kind == "free" and live:
                alloc.free(live.pop(step[1] % len(live)))
            elif kind == "empty_cache":
                alloc.empty_cache()
            elif kind == "query":
                obs.append(_state(alloc))
        except MemoryError as e:
            obs.append(("oom", str(e)))
    for off in live:
        alloc.free(off)
    obs.append(_state(alloc))
    alloc.empty_cache()
    obs.append(_state(alloc))
    return obs


@pytest.mark.parametrize("seed", range(4))
def test_fast_path_matches_tree_path_and_python_on_random_programs(seed: int) -> None:
    prog = _random_program(seed, 3000)
    cap = 3 * MiB if seed % 2 else 64 * MiB  # a tight arena: OOM, release-and-retry
    kw = dict(SMALL, max_split_size=1 << 17) if seed >= 2 else dict(SMALL)
    fast = M.CachingAllocator(cap, backend="cpp", **kw)
    slow = M.CachingAllocator(cap, backend="cpp", fast_path=False, **kw)
    ref = M.CachingAllocator(cap, backend="python", **kw)
    a, b, c = _run_program(fast, prog), _run_program(slow, prog), _run_program(ref, prog)
    assert a == b
    assert a == c
    k = fast.fast_counters()
    assert k["cancels"] > 0 and k["materialized"] > 0 and k["memo_hits"] > 0, k  # every fast-path branch ran
    assert k["tree_lookups"] < slow.fast_counters()["tree_lookups"]


def test_pending_block_is_visible_to_every_query() -> None:
    """Between a fast malloc and the next operation the block is 'pending' (not yet carved in the tree):
    stats, snapshots, block_size, views and live/free lists must already show it."""
    fast = M.CachingAllocator(64 * MiB, backend="cpp")
    slow = M.CachingAllocator(64 * MiB, backend="cpp", fast_path=False)
    for alloc in (fast, slow):
        alloc.free(alloc.malloc(3000))
    pairs = []
    for alloc in (fast, slow):
        off = alloc.malloc(1000)
        v = alloc.view(off, 1000, np.uint8)
        v[:] = 7
        pairs.append((off, alloc.block_size(off), alloc.live_blocks(), _state(alloc), int(v.sum())))
    assert pairs[0] == pairs[1]
    assert fast.fast_counters()["materialized"] == 1  # stats() needed the exact tree


def test_errors_through_the_fast_call_match_the_python_checks() -> None:
    alloc = M.CachingAllocator(1 << 22, backend="cpp")
    a = alloc.malloc(100)
    alloc.free(a)
    p = alloc.malloc(100)  # pending (lazy split)
    before = _state(alloc)
    with pytest.raises(TypeError, match="nbytes: expected an integer, got bool True"):
        alloc.malloc(True)
    with pytest.raises(TypeError, match="nbytes: expected an integer, got float"):
        alloc.malloc(1.5)
    with pytest.raises(TypeError, match="offset: expected an integer, got str"):
        alloc.free("0")
    with pytest.raises(ValueError, match="nbytes: must be positive, got 0"):
        alloc.malloc(0)
    with pytest.raises(MemoryError, match="exceeds the arena capacity"):
        alloc.malloc((1 << 22) + 1)
    with pytest.raises(ValueError, match=r"free\(offset=512\): not a live allocation"):
        alloc.free(512)
    with pytest.raises(ValueError, match="not a live allocation"):
        alloc.free(-512)
    assert _state(alloc) == before
    alloc.free(np.int64(p))  # numpy integers go through the checked fallback
    with pytest.raises(ValueError, match="double free"):
        alloc.free(p)  # the cancelled pending block is gone
    off = alloc.malloc(np.int64(100), stream=np.int32(1))
    assert alloc.memory_snapshot()[-1]["stream"] == 1
    alloc.free(off)
    from tinylearn import _C

    tiny = M.CachingAllocator(1 << 20, backend="cpp")  # one 1 MiB segment
    tiny.free(tiny.malloc(1000))
    tiny.malloc(1000)  # pending
    with pytest.raises(_C.memory.OutOfMemory, match="out of memory"):
        tiny.malloc(1 << 20)
    assert tiny.stats()["num_ooms"] == 1 and tiny.stats()["allocated"] == 1024
    assert alloc.stats()["allocated"] == 0


def test_replay_one_lock_per_trace_gives_the_same_offsets() -> None:
    ops = M.random_ops(5000, (1, 1 << 18), max_live=40, seed=3)
    ref = M.CachingAllocator(64 * MiB, backend="python").replay(ops)
    for fast in (True, False):
        for per_call in (True, False):
            alloc = M.CachingAllocator(64 * MiB, backend="cpp", fast_path=fast)
            offs, secs = alloc._core.replay(ops, per_call)
            np.testing.assert_array_equal(np.asarray(offs), ref)
            assert secs >= 0 and alloc.stats()["allocated"] == 0


def test_fast_calls_contend_with_a_replaying_thread() -> None:
    """The raw fast call keeps the GIL and try_locks; when a C++ replay holds the mutex it must release the GIL
    while it waits (else the replaying thread could not finish): counts stay exact, nothing deadlocks."""
    alloc = M.CachingAllocator(256 * MiB, backend="cpp")
    ops = M.pair_ops(200_000, [64, 4096, 70000], seed=1)
    done: list[int] = []
    t = threading.Thread(target=lambda: done.append(len(alloc._core.replay(ops)[0])))
    t.start()
    n = 0
    while t.is_alive() and n < 200_000:
        off = alloc.malloc(1000, stream=1)
        alloc.free(off)
        n += 1
    t.join(timeout=120)
    assert done == [200_000]
    s = alloc.stats()
    assert s["n_alloc"] == s["n_free"] == 200_000 + n and s["allocated"] == 0


ASAN_DRIVER = r"""
#include <cstdio>
#include <random>
#include <thread>
#include "memory/caching.h"
using namespace tl::mem;
static bool same(const Stats& a, const Stats& b) {
  return a.allocated == b.allocated && a.requested == b.requested && a.reserved == b.reserved && a.peak == b.peak &&
         a.peak_reserved == b.peak_reserved && a.n_alloc == b.n_alloc && a.n_free == b.n_free &&
         a.n_live == b.n_live && a.total_free == b.total_free && a.largest_free == b.largest_free &&
         a.segments == b.segments && a.inactive_split == b.inactive_split && a.num_ooms == b.num_ooms;
}
int main() {
  CachingConfig cfg;
  cfg.small_size = 4096; cfg.small_buffer = 16384; cfg.large_buffer = 1 << 18; cfg.min_large_alloc = 1 << 17;
  cfg.round_large = 8192;
  Caching fast(4 << 20, cfg);
  std::mt19937_64 rng(7);
  std::vector<i64> live_f;
  for (int t = 0; t < 200000; ++t) {  // random mix on a tight arena: cancel, materialize, OOM retry
    int r = int(rng() % 100);
    i64 n = 1 + i64(rng() % 300000);
    if (r < 40) {  // immediate pair: the cancel path
      i64 a = -1;
      try { a = fast.malloc(n, i64(rng() % 2)); } catch (const OutOfMemory&) {}
      if (a >= 0) { std::memset(fast.data() + a, 1, size_t(n)); fast.free(a); }
    } else if (r < 70 || live_f.empty()) {
      i64 a = -1;
      try { a = fast.malloc(n, i64(rng() % 2)); } catch (const OutOfMemory&) {}
      if (a >= 0) { std::memset(fast.data() + a, 2, size_t(n)); live_f.push_back(a); }
    } else {
      size_t i = size_t(rng() % live_f.size());
      fast.free(live_f[i]);
      live_f.erase(live_f.begin() + long(i));
    }
    if (t % 5000 == 0) fast.empty_cache();
  }
  for (i64 a : live_f) fast.free(a);
  fast.empty_cache();
  if (fast.stats().reserved != 0 || fast.stats().allocated != 0) { std::printf("leak\n"); return 1; }
  // pairs only: both paths in lockstep, stats equal after every pair
  CachingConfig tree_cfg;
  tree_cfg.fast_path = false;
  Caching f2(64 << 20, CachingConfig{}), s2(64 << 20, tree_cfg);
  for (int t = 0; t < 20000; ++t) {
    i64 n = 1 + i64(rng() % (4 << 20));
    i64 a = f2.malloc(n, 0), b = s2.malloc(n, 0);
    if (a != b) { std::printf("pair offset mismatch\n"); return 1; }
    std::memset(f2.data() + a, 3, size_t(n));
    f2.free(a); s2.free(b);
    if (t % 1000 == 0 && !same(f2.stats(), s2.stats())) { std::printf("stats mismatch\n"); return 1; }
  }
  // 4 threads of pairs and nested pairs on one allocator
  Caching shared(64 << 20, CachingConfig{});
  std::vector<std::thread> th;
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&shared, k] {
      std::mt19937_64 g(k);
      for (int t = 0; t < 20000; ++t) {
        i64 n = 1 + i64(g() % 100000);
        i64 a = shared.malloc(n, k % 2);
        std::memset(shared.data() + a, k, size_t(n));
        if (t % 3 == 0) { i64 b = shared.malloc(n / 2 + 1, k % 2); shared.free(b); }
        shared.free(a);
      }
    });
  for (auto& x : th) x.join();
  Stats s = shared.stats();
  if (s.allocated != 0 || s.n_alloc != s.n_free) { std::printf("thread leak\n"); return 1; }
  std::printf("fastpath asan ok\n");
  return 0;
}
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ with AddressSanitizer")
def test_fast_path_is_clean_under_asan(tmp_path: Path) -> None:
    """The C++ core alone under ASan+UBSan: fast vs tree path in lockstep, blocks filled, leaks, 4 threads."""
    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "driver.cpp"
    src.write_text("#include <cstring>\n" + ASAN_DRIVER)
    exe = tmp_path / "driver"
    flags = ["-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-pthread"]
    subprocess.run(["g++", *flags, f"-I{root / 'cpp_src'}", str(src), "-o", str(exe)], check=True, capture_output=True)
    out = subprocess.run(
        [str(exe)], capture_output=True, text=True, timeout=300, env={"ASAN_OPTIONS": "detect_leaks=1"}
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "fastpath asan ok" in out.stdout
