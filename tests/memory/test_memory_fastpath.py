"""The C++ caching allocator's fast path (issue 18): O(1) cached-block reuse with the tree path's decisions.

The fast path (memo of best fit per size class + lazy split cancelled by the matching free) must be invisible
except in time: same offsets, stats, snapshots and errors as the tree path (fast_path=False) and the Python
reference, and zero std::set work on a malloc/free pair of a cached block (counted by fast_counters()).

The per-thread cache (thread_cache=N) changes placement (cached blocks are not free for best fit) but not the
user's view: the same allocated/requested/n_alloc/n_free/n_live and live block sizes as the reference after every
operation, every block back in the pool after thread exit, reserved = allocated + total_free + thread_cached.
"""

from __future__ import annotations

import queue
import shutil
import subprocess
import threading
import time
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
    _C = backends.load_C()

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


# ---- per-thread cache ----

USER_KEYS = ("requested", "n_alloc", "n_free", "n_live")


def _user_view(alloc: M.CachingAllocator) -> tuple:
    """What does not depend on placement (a large-pool block's size does: a remainder <= small_size is not split)."""
    s = alloc.stats()
    live = alloc.live_blocks()
    assert s["allocated"] == s["active"] == sum(b[1] for b in live)
    assert all(b[1] == M.round_size(b[2]) for b in live if b[2] <= SMALL["small_size"])  # small pool: exact size
    return tuple(s[k] for k in USER_KEYS), sorted(b[2] for b in live)


def _check_identity(alloc: M.CachingAllocator) -> None:
    s = alloc.stats()
    assert s["reserved"] == s["allocated"] + s["total_free"] + s["thread_cached"], s
    assert s["thread_cached"] == alloc.thread_cache_stats()["thread_cached"]
    snap = alloc.memory_snapshot()
    cached = sum(b["size"] for seg in snap for b in seg["blocks"] if b["state"] == "thread_cached")
    assert cached == s["thread_cached"] and sum(seg["allocated_size"] for seg in snap) == s["allocated"]


def test_thread_cache_pairs_take_no_lock_and_keep_the_users_stats() -> None:
    alloc = M.CachingAllocator(64 * MiB, backend="cpp", thread_cache=8)
    assert alloc.thread_cache == 8 and alloc._core.thread_cache_max_size == 64 * 512
    alloc.free(alloc.malloc(64))  # registers this thread's cache, refills a batch of 4 blocks of 512 B
    t0, k0 = alloc.thread_cache_stats(), alloc.fast_counters()
    assert t0["threads"] == 1 and t0["refills"] == 4 and t0["thread_cached"] == 4 * 512
    offs = set()
    for i in range(1000):
        off = alloc.malloc(64 + i % 7)
        offs.add(off)
        assert alloc.block_size(off) == 512
        alloc.free(off)
    t1, k1 = alloc.thread_cache_stats(), alloc.fast_counters()
    assert t1["hits_alloc"] - t0["hits_alloc"] == 1000 and t1["hits_free"] - t0["hits_free"] == 1000
    assert t1["refills"] == t0["refills"] and t1["flushes"] == t0["flushes"] == 0  # never went to the pool
    assert delta(k1, k0) == dict.fromkeys(k0, 0) and len(offs) == 1  # no pool work at all; LIFO: the same block
    s = alloc.stats()
    assert s["n_alloc"] == s["n_free"] == 1001 and s["allocated"] == s["requested"] == s["n_live"] == 0
    _check_identity(alloc)
    a, b = alloc.malloc(100), alloc.malloc(5000)  # two classes (one served by a refill); 5000 B -> 5120 B
    assert alloc.live_blocks() == sorted([(a, 512, 100), (b, 5120, 5000)])
    assert alloc.stats()["requested"] == 5100 and alloc.stats()["allocated"] == 5632
    _check_identity(alloc)
    alloc.free(a)
    with pytest.raises(ValueError, match="double free"):
        alloc.free(a)  # sits in this thread's cache now
    with pytest.raises(ValueError, match="not a live allocation"):
        alloc.block_size(a)
    alloc.free(b)
    alloc.empty_cache()  # flushes this thread's cache, then releases the (now entirely free) segment
    s = alloc.stats()
    assert s["reserved"] == s["thread_cached"] == s["segments"] == 0 and s["n_alloc"] == s["n_free"] == 1003


@pytest.mark.parametrize("seed", range(3))
def test_thread_cache_user_view_matches_the_reference_on_random_programs(seed: int) -> None:
    """Placement differs, the user's view does not: after every operation the same requested bytes, counts and
    multiset of requested sizes as the Python reference, small blocks of the same size; caps are respected."""
    prog = _random_program(seed, 3000)
    kw = dict(SMALL, thread_cache=4, thread_cache_bytes=8192) if seed else dict(SMALL, thread_cache=64)
    tc = M.CachingAllocator(256 * MiB, backend="cpp", **kw)
    ref = M.CachingAllocator(256 * MiB, backend="python", **SMALL)
    live_t: list[int] = []
    live_r: list[int] = []
    for step in prog:
        kind = step[0]
        if kind == "pair":
            a, b = tc.malloc(step[1], stream=step[2]), ref.malloc(step[1], stream=step[2])
            if step[1] <= SMALL["small_size"]:
                assert tc.block_size(a) == ref.block_size(b)
            tc.free(a)
            ref.free(b)
        elif kind == "malloc":
            live_t.append(tc.malloc(step[1], step[2]))
            live_r.append(ref.malloc(step[1], step[2]))
        elif kind == "free" and live_t:
            i = step[1] % len(live_t)
            tc.free(live_t.pop(i))
            ref.free(live_r.pop(i))
        elif kind == "empty_cache":
            tc.empty_cache()
            ref.empty_cache()
        assert _user_view(tc) == _user_view(ref)
        held = tc.thread_cache_stats()["thread_cached"]
        assert held <= (8192 if seed else 64 * 4096)  # the per-thread byte cap (classes up to small_size = 4 KiB)
    _check_identity(tc)
    for off in live_t:
        tc.free(off)
    tc.flush_thread_cache()
    tc.empty_cache()
    s = tc.stats()
    assert s["reserved"] == s["allocated"] == s["thread_cached"] == 0 and s["n_alloc"] == s["n_free"]


def _wait_for_thread_exits(alloc: M.CachingAllocator, keep: int = 0) -> None:
    """Thread.join() returns when the Python thread state is gone, a moment before the OS thread runs its C++
    thread_local destructors (which flush the caches): wait for them."""
    deadline = time.monotonic() + 30
    while alloc.thread_cache_stats()["threads"] > keep and time.monotonic() < deadline:
        time.sleep(0.01)


def test_thread_cache_python_threads_cross_thread_frees_and_exit() -> None:
    """Python threads allocate, hand blocks to each other through a queue and free them there; when they exit their
    caches go back to the pool: every block accounted for, every byte returned by empty_cache()."""
    alloc = M.CachingAllocator(64 * MiB, backend="cpp", thread_cache=16)
    q: queue.Queue[int] = queue.Queue()
    n_threads, n_iter = 4, 3000
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            rng = np.random.default_rng(k)
            mine: list[int] = []
            for i in range(n_iter):
                off = alloc.malloc(int(rng.integers(1, 9000)))
                alloc.arena[off] = k
                (q.put if i % 3 == 0 else mine.append)(off)
                if len(mine) > 8:
                    alloc.free(mine.pop(int(rng.integers(len(mine)))))
                try:
                    alloc.free(q.get_nowait())  # most likely another thread's block
                except queue.Empty:
                    pass
            for off in mine:
                alloc.free(off)
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    _wait_for_thread_exits(alloc)
    ts = alloc.thread_cache_stats()
    assert ts["threads"] == 0 and ts["thread_cached"] == 0  # exited threads flushed their caches
    left = []
    while not q.empty():
        left.append(q.get())
    s = alloc.stats()
    assert s["n_live"] == len(left) and s["n_alloc"] == n_threads * n_iter and s["n_free"] == s["n_alloc"] - len(left)
    _check_identity(alloc)
    for off in left:
        alloc.free(off)  # the main thread's cache takes them
    s = alloc.stats()
    assert s["allocated"] == s["requested"] == s["n_live"] == 0 and s["n_free"] == s["n_alloc"]
    _check_identity(alloc)
    alloc.empty_cache()
    assert alloc.stats()["reserved"] == 0 and alloc.stats()["segments"] == 0


def test_empty_cache_asks_the_other_threads_to_flush() -> None:
    """empty_cache() cannot take another thread's cached blocks: it asks, and the owner flushes at its next push
    or refill (a pop is served from the cache as before). Checked while the worker is still alive, so the flush
    seen is the requested one, not the one every thread does at exit."""
    alloc = M.CachingAllocator(64 * MiB, backend="cpp", thread_cache=8)
    go, done, leave = threading.Event(), threading.Event(), threading.Event()
    kept: list[int] = []

    def worker() -> None:
        alloc.free(alloc.malloc(1000))  # this thread's cache now holds blocks of 1024 B
        done.set()
        go.wait(timeout=60)
        a = alloc.malloc(1000)  # a pop: served from the cache, no flush yet
        kept.append(alloc.thread_cache_stats()["flushes"])
        alloc.free(a)  # the next push: flushes (as asked)
        kept.append(alloc.malloc(1000))  # then refills
        done.set()
        leave.wait(timeout=60)

    t = threading.Thread(target=worker)
    t.start()
    done.wait(timeout=60)
    done.clear()
    held = alloc.thread_cache_stats()["thread_cached"]
    assert held > 0
    alloc.empty_cache()  # cannot take another thread's blocks: it asks; the segment stays
    assert alloc.stats()["thread_cached"] == held and alloc.stats()["segments"] == 1
    flushes = alloc.thread_cache_stats()["flushes"]
    go.set()
    done.wait(timeout=60)
    assert t.is_alive()
    assert kept[0] == flushes  # the pop did not flush
    assert alloc.thread_cache_stats()["flushes"] > flushes  # the push did
    leave.set()
    t.join(timeout=60)
    _wait_for_thread_exits(alloc)
    alloc.free(kept[1])
    alloc.empty_cache()
    s = alloc.stats()
    assert s["reserved"] == s["thread_cached"] == 0 and s["n_alloc"] == s["n_free"] == 3


def test_thread_cache_rejects_offsets_that_are_not_live_cached_blocks() -> None:
    """free() finds a cached block with one rotate + compare (offset rotated by log2(round_to) must index the live
    table): negative, misaligned, past-the-arena and huge offsets are errors, through the fast call and through
    pybind11 (Caching::free), and leave the user's view unchanged; the size-class limit is exact at both ends."""
    alloc = M.CachingAllocator(MiB, backend="cpp", thread_cache=4)
    top = alloc._core.thread_cache_max_size
    a = alloc.malloc(100)
    before = alloc.stats()
    bad = [a + 1, a + 256, a - 512 if a >= 512 else -512, -1, -512, -(2**63), MiB, 4 * MiB, 2**62, 2**63 - 512]
    for free in (alloc.free, alloc._core.free):
        for off in bad:
            with pytest.raises(ValueError, match="not a live allocation"):
                free(off)
    assert alloc.stats() == before and alloc.live_blocks() == [(a, 512, 100)]
    for n in (0, -1, -(2**63)):
        with pytest.raises(ValueError, match="nbytes: must be positive"):
            alloc.malloc(n)
    h0 = alloc.thread_cache_stats()["hits_alloc"]
    b, c = alloc.malloc(top), alloc.malloc(top + 1)  # the largest cached class; the next size takes the pool
    assert alloc.thread_cache_stats()["hits_alloc"] == h0 + 1
    assert alloc.block_size(b) == top and alloc.block_size(c) == top + 512
    for off in (a, b, c):
        alloc._core.free(off)
    s = alloc.stats()
    assert s["allocated"] == s["n_live"] == 0 and s["n_alloc"] == s["n_free"] == 3
    _check_identity(alloc)


def test_thread_cache_bad_arguments() -> None:
    with pytest.raises(ValueError, match="thread_cache: expected 0"):
        M.CachingAllocator(MiB, backend="cpp", thread_cache=65)
    with pytest.raises(ValueError, match="thread_cache: expected 0"):
        M.CachingAllocator(MiB, backend="cpp", thread_cache=-1)
    with pytest.raises(ValueError, match="thread_cache: only the C\\+\\+ core"):
        M.CachingAllocator(MiB, backend="python", thread_cache=4)
    with pytest.raises(ValueError, match="thread_cache_bytes: must be >= round_to"):
        M.CachingAllocator(MiB, backend="cpp", thread_cache=4, thread_cache_bytes=100)
    with pytest.raises(TypeError, match="thread_cache"):
        M.CachingAllocator(MiB, backend="cpp", thread_cache=2.0)
    with pytest.raises(ValueError, match="thread_cache_stats"):
        M.CachingAllocator(MiB, backend="python").thread_cache_stats()
    off = M.CachingAllocator(MiB, backend="cpp")  # off by default: no key, no cache
    assert off.thread_cache == 0 and "thread_cached" not in off.stats()


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
@pytest.mark.standalone_sanitizer
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ with AddressSanitizer")
def test_fast_path_is_clean_under_asan(tmp_path: Path) -> None:
    """The C++ core alone under ASan+UBSan: fast vs tree path in lockstep, blocks filled, leaks, 4 threads."""
    root = Path(__file__).resolve().parents[2]
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


TC_DRIVER = r"""
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include "memory/caching.h"
using namespace tl::mem;
#define CHECK(c, msg) do { if (!(c)) { std::printf("FAIL %s (line %d)\n", msg, __LINE__); return 1; } } while (0)
static bool filled(const uint8_t* p, i64 n, uint8_t v) {
  for (i64 i = 0; i < n; ++i) if (p[i] != v) return false;
  return true;
}
int main() {
  CachingConfig cfg;
  cfg.small_size = 1 << 16; cfg.small_buffer = 1 << 18; cfg.large_buffer = 1 << 20; cfg.min_large_alloc = 1 << 19;
  cfg.round_large = 1 << 16; cfg.thread_cache = 8; cfg.thread_cache_bytes = 1 << 17;
  Caching a(256 << 20, cfg);
  // random malloc/free from 4 threads; a quarter of the frees are of blocks another thread allocated
  std::mutex xmu;
  std::vector<std::pair<i64, std::pair<i64, uint8_t>>> exchange;  // offset, (nbytes, fill)
  std::atomic<i64> n_malloc{0}, n_free{0};
  auto worker = [&](int k, int iters) {
    std::mt19937_64 g(k + 1);
    std::vector<std::pair<i64, std::pair<i64, uint8_t>>> live;
    for (int t = 0; t < iters; ++t) {
      int r = int(g() % 100);
      if (r < 40 || live.empty()) {
        i64 n = (g() % 10 == 0) ? 1 + i64(g() % 200000) : 1 + i64(g() % 3000);
        i64 s = (g() % 8 == 0) ? 1 : 0;
        uint8_t v = uint8_t(1 + g() % 250);
        i64 off = a.malloc(n, s);
        n_malloc++;
        std::memset(a.data() + off, v, size_t(n));
        live.push_back({off, {n, v}});
      } else if (r < 75) {
        size_t i = size_t(g() % live.size());
        auto [off, nv] = live[i];
        if (!filled(a.data() + off, nv.first, nv.second)) { std::printf("FAIL overlap\n"); std::abort(); }
        a.free(off);
        n_free++;
        live.erase(live.begin() + long(i));
      } else if (r < 88) {  // post one to the others
        std::lock_guard<std::mutex> l(xmu);
        exchange.push_back(live.back());
        live.pop_back();
      } else {  // free one another thread posted
        std::pair<i64, std::pair<i64, uint8_t>> e{-1, {0, 0}};
        {
          std::lock_guard<std::mutex> l(xmu);
          if (!exchange.empty()) { e = exchange.back(); exchange.pop_back(); }
        }
        if (e.first >= 0) {
          if (!filled(a.data() + e.first, e.second.first, e.second.second)) {
            std::printf("FAIL overlap x\n");
            std::abort();
          }
          a.free(e.first);
          n_free++;
        }
      }
      if (t % 3000 == 0 && k == 0) a.empty_cache();  // asks the other threads to flush
      if (t % 5000 == 0 && k == 1) (void)a.stats();
    }
    for (auto& [off, nv] : live) { a.free(off); n_free++; }
  };
  std::vector<std::thread> th;
  for (int k = 0; k < 4; ++k) th.emplace_back(worker, k, 20000 + 5000 * k);
  for (auto& x : th) x.join();
  // every worker exited: their caches were flushed back; the main thread frees what is left in the exchange
  auto ts = a.thread_cache_stats();
  CHECK(ts.threads == 0 && ts.thread_cached == 0, "exited threads still hold blocks");
  i64 tc = -1;
  Stats mid = a.stats(&tc);
  CHECK(mid.n_live == i64(exchange.size()), "n_live != blocks in the exchange");
  CHECK(mid.n_alloc == n_malloc.load() && mid.n_free == n_free.load(), "n_alloc / n_free");
  CHECK(mid.allocated + mid.total_free + tc == mid.reserved, "reserved identity");
  for (auto& [off, nv] : exchange) { a.free(off); n_free++; }  // the main thread gets a cache for these
  Stats s2 = a.stats(&tc);
  CHECK(s2.allocated == 0 && s2.requested == 0 && s2.n_live == 0, "main frees");
  CHECK(s2.allocated + s2.total_free + tc == s2.reserved, "reserved identity 2");
  CHECK(s2.n_alloc == s2.n_free && s2.n_alloc == n_malloc.load(), "counts 2");
  a.empty_cache();  // flushes the main thread's cache, then releases every segment
  Stats s3 = a.stats(&tc);
  CHECK(tc == 0 && s3.reserved == 0 && s3.segments == 0, "every byte returned");
  // double free of a block that went back to a thread cache
  i64 x = a.malloc(100, 0);
  a.free(x);
  bool threw = false;
  try { a.free(x); } catch (const std::invalid_argument&) { threw = true; }
  CHECK(threw, "double free not detected");
  CHECK(a.requested_size(a.malloc(100, 0)) == 100, "requested_size");
  // an allocator destroyed while a thread still has a cache for it; the thread exits later
  {
    std::atomic<int> phase{0};
    auto* b = new Caching(8 << 20, cfg);
    std::thread t([&] {
      b->free(b->malloc(64, 0));
      phase = 1;
      while (phase != 2) std::this_thread::yield();
      Caching c2(8 << 20, cfg);  // a new allocator (maybe at the same address): a cache of its own
      c2.free(c2.malloc(64, 0));
      if (c2.thread_cache_stats().thread_cached != 4 * 512) std::abort();  // a batch of thread_cache / 2
    });
    while (phase != 1) std::this_thread::yield();
    delete b;
    phase = 2;
    t.join();
  }
  std::printf("thread cache ok\n");
  return 0;
}
"""


@pytest.mark.slow
@pytest.mark.standalone_sanitizer
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ with sanitizers")
@pytest.mark.parametrize("sanitizer", ["address,undefined", "thread"])
def test_thread_cache_stress_from_cpp_threads(tmp_path: Path, sanitizer: str) -> None:
    """The C++ core alone: 4 std::threads of random malloc/free (a quarter of the frees cross-thread, blocks filled
    and checked: two live blocks never overlap), empty_cache() and stats() from inside; after the threads exit every
    block is back (stats exact, empty_cache() returns every byte), double free detected, an allocator destroyed
    while a thread still holds a cache for it. ASan+UBSan (leaks included) and ThreadSanitizer (data races)."""
    root = Path(__file__).resolve().parents[2]
    src = tmp_path / "tc_driver.cpp"
    src.write_text(TC_DRIVER)
    exe = tmp_path / "tc_driver"
    flags = ["-std=c++17", "-O1", "-g", f"-fsanitize={sanitizer}", "-pthread"]
    if sanitizer != "thread":
        flags.append("-fno-sanitize-recover=all")
    subprocess.run(["g++", *flags, f"-I{root / 'cpp_src'}", str(src), "-o", str(exe)], check=True, capture_output=True)
    env = {"ASAN_OPTIONS": "detect_leaks=1", "TSAN_OPTIONS": "halt_on_error=1"}
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, env=env)
    if sanitizer == "thread" and "unexpected memory mapping" in out.stderr:
        pytest.skip("ThreadSanitizer cannot run with this kernel's address layout")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "thread cache ok" in out.stdout and "WARNING" not in out.stderr, out.stderr
