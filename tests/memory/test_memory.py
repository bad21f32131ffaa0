"""tl.memory allocators: invariants under random traces, Python == C++ offsets, bad input, allocator rules."""

from __future__ import annotations

import bisect

import numpy as np
import pytest

import tinylearn.memory as M
from tinylearn.backends import load_C
from tinylearn.memory.buddy import initial_blocks

BACKENDS = ["python", "cpp"]
NAMES = list(M.ALLOCATORS)
SMALL_CACHING = dict(
    small_size=4096, small_buffer=16384, large_buffer=1 << 18, min_large_alloc=1 << 17, round_large=8192
)


def make(name: str, backend: str, capacity: int = 1 << 20):
    cls = M.ALLOCATORS[name]
    if name == "slab":
        return cls([16, 64, 200, 1024, 4000], capacity=capacity, slab_size=1 << 14, backend=backend)
    if name == "caching":
        return cls(capacity, backend=backend, **SMALL_CACHING)
    if name == "bump":
        return cls(capacity * 16, backend=backend)
    return cls(capacity, backend=backend)


def sizes_for(name: str) -> tuple[int, int]:
    return (1, 4000)


class Model:
    """Reference model: live intervals [offset, offset+requested) must never overlap; tracks requested bytes."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: dict[int, int] = {}

    def add(self, off: int, n: int) -> None:
        i = bisect.bisect_left(self.starts, off)
        if i > 0:
            prev = self.starts[i - 1]
            assert self.ends[prev] <= off, f"block at {off} overlaps the live block at {prev}"
        if i < len(self.starts):
            assert off + n <= self.starts[i], f"block [{off}, {off + n}) overlaps the live block at {self.starts[i]}"
        self.starts.insert(i, off)
        self.ends[off] = off + n

    def remove(self, off: int) -> None:
        self.starts.remove(off)
        del self.ends[off]


def run_checked(alloc, ops: np.ndarray, fill: bool = True, check_every: int = 97) -> list[int]:
    """Replay with the model: no overlap, alignment, data integrity (each block filled with its tag), stats."""
    model, offsets, sizes = Model(), [], []
    live_req = 0
    for t, (op, arg) in enumerate(ops.tolist()):
        if op == 0:
            off = alloc.malloc(arg)
            assert isinstance(off, int)
            assert off % alloc.alignment == 0, f"offset {off} not aligned to {alloc.alignment}"
            assert 0 <= off and off + arg <= alloc.capacity
            model.add(off, arg)
            offsets.append(off)
            sizes.append(arg)
            live_req += arg
            if fill:
                alloc.view(off, arg, np.uint8)[:] = len(offsets) % 251
        else:
            off, n = offsets[arg], sizes[arg]
            if fill:
                v = alloc.view(off, n, np.uint8)
                assert (v == (arg + 1) % 251).all(), f"block {arg} at {off} was overwritten"
            alloc.free(off)
            model.remove(off)
            live_req -= n
        if t % check_every == 0:
            s = alloc.stats()
            blocks = alloc.live_blocks()
            assert s["requested"] == live_req
            assert s["n_live"] == len(model.starts) == len(blocks)
            assert s["allocated"] == sum(b[1] for b in blocks)
            assert s["peak"] >= s["allocated"] and s["peak_reserved"] >= s["reserved"] >= 0
            assert 0.0 <= s["fragmentation"] < 1.0 and s["largest_free"] <= s["total_free"]
            ends = [o + sz for o, sz, _ in blocks]
            assert all(e <= o2 for e, (o2, _, _) in zip(ends, blocks[1:])), "live blocks overlap (block sizes)"
    return offsets


def assert_whole_again(name: str, alloc) -> None:
    """After everything is freed nothing leaks and the free space is whole again."""
    s = alloc.stats()
    assert s["allocated"] == 0 and s["requested"] == 0 and s["n_live"] == 0
    assert s["n_alloc"] == s["n_free"]
    if name == "caching":
        alloc.empty_cache()
        assert alloc.stats()["reserved"] == 0 and alloc.stats()["segments"] == 0
        return
    free = alloc.free_blocks()
    if name in ("first_fit", "best_fit", "bump"):
        assert free == [(0, alloc.capacity // alloc.alignment * alloc.alignment)]
    elif name == "buddy":
        assert free == initial_blocks(alloc.capacity, alloc.min_block)
    elif name == "slab":
        assert s["reserved"] == 0 and s["fragmentation"] == 0.0
    assert s["fragmentation"] == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_random_trace_invariants(name: str, backend: str) -> None:
    alloc = make(name, backend)
    ops = M.random_ops(10_000, sizes_for(name), max_live=48, seed=NAMES.index(name))
    run_checked(alloc, ops)
    assert_whole_again(name, alloc)


@pytest.mark.parametrize("name", NAMES)
def test_python_and_cpp_give_identical_offsets(name: str) -> None:
    ops = M.random_ops(6_000, (1, 4000), max_live=80, seed=7)
    py_alloc, cpp_alloc = make(name, "python"), make(name, "cpp")
    a = py_alloc.replay(ops)
    b = cpp_alloc.replay(ops)  # the C++ loop (replay_native)
    c = M.replay_python(make(name, "cpp"), ops)  # C++ allocator driven from Python
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    sa, sb = py_alloc.stats(), cpp_alloc.stats()
    assert set(M.STAT_KEYS) <= set(sa) and set(sa) == set(sb)
    for k in sa:
        assert sa[k] == pytest.approx(sb[k]), k


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_random_trace_100k_ops(name: str) -> None:
    ops = M.random_ops(100_000, (1, 4000), max_live=200, seed=11)
    for backend in BACKENDS:
        alloc = make(name, backend, capacity=4 << 20)
        offs = run_checked(alloc, ops, fill=backend == "cpp", check_every=997)
        assert_whole_again(name, alloc)
        if backend == "python":
            ref = offs
        else:
            assert offs == ref


# ---------------------------------------------------------------------------------------------- bad input
def _state(alloc):
    return alloc.stats(), alloc.live_blocks(), alloc.free_blocks()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_bad_input_raises_and_leaves_state_unchanged(name: str, backend: str) -> None:
    alloc = make(name, backend)
    a = alloc.malloc(100)
    b = alloc.malloc(300)
    alloc.free(a)
    before = _state(alloc)
    with pytest.raises(ValueError, match=rf"offset={a}"):
        alloc.free(a)  # double free
    with pytest.raises(ValueError, match="offset=12345"):
        alloc.free(12345)  # never allocated
    for bad in (0, -8):
        with pytest.raises(ValueError, match=rf"nbytes.*{bad}"):
            alloc.malloc(bad)
    too_big = alloc.capacity + 1
    with pytest.raises(MemoryError, match=str(too_big)):
        alloc.malloc(too_big)
    with pytest.raises(TypeError):
        alloc.malloc(2.5)
    with pytest.raises(ValueError, match="misaligned"):
        alloc.view(b + 2, 4, np.float32)
    with pytest.raises(ValueError, match="past the end"):
        alloc.view(b, 10_000, np.float64)
    with pytest.raises(ValueError, match="not inside a live allocation"):
        alloc.view(a, 4, np.float32)
    assert _state(alloc) == before
    alloc.free(b)
    assert_whole_again(name, alloc)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["first_fit", "best_fit", "buddy", "bump", "slab"])
def test_out_of_memory_leaves_state_unchanged(name: str, backend: str) -> None:
    alloc = make(name, backend, capacity=1 << 16)
    offs = []
    with pytest.raises(MemoryError, match="out of memory"):
        for _ in range(10_000):
            offs.append(alloc.malloc(4000))
    before = _state(alloc)
    with pytest.raises(MemoryError):
        alloc.malloc(4000)
    assert _state(alloc) == before
    for o in offs:
        alloc.free(o)
    assert_whole_again(name, alloc)


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_reads_and_writes_the_arena(backend: str) -> None:
    alloc = M.FirstFitAllocator(1 << 16, backend=backend)
    off = alloc.malloc(12 * 8)
    x = alloc.view(off, (3, 4), np.float64)
    x[:] = np.arange(12).reshape(3, 4)
    assert x.ctypes.data == alloc.arena.ctypes.data + off
    assert x.ctypes.data % 64 == 0
    np.testing.assert_array_equal(alloc.arena[off : off + 96].view(np.float64), np.arange(12))
    np.testing.assert_array_equal(alloc.view(off + 32, 2, np.float64), [4.0, 5.0])  # inside the block


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError, match="capacity"):
        M.FirstFitAllocator(0)
    with pytest.raises(ValueError, match="min_block"):
        M.BuddyAllocator(1 << 16, min_block=300)
    with pytest.raises(ValueError, match="min_block"):
        M.BuddyAllocator(1 << 16, min_block=300, backend="cpp")
    with pytest.raises(ValueError, match="sizes"):
        M.SlabAllocator([0, 64])
    with pytest.raises(ValueError, match="slab_size"):
        M.SlabAllocator([1 << 20], slab_size=1 << 16, backend="cpp")
    with pytest.raises(ValueError, match="backend"):
        M.BumpAllocator(1024, backend="cuda")
    with pytest.raises(ValueError, match="larger than the largest size class"):
        M.SlabAllocator([64]).malloc(65)


# ------------------------------------------------------------------------------------- allocator rules
@pytest.mark.parametrize("backend", BACKENDS)
def test_buddy_split_merge_and_units(backend: str) -> None:
    cap = 1 << 16
    alloc = M.BuddyAllocator(cap, min_block=256, backend=backend)
    a = alloc.malloc(1)  # one 256-byte block: nothing else is lost (bytes everywhere)
    s = alloc.stats()
    assert (a, s["allocated"], s["total_free"]) == (0, 256, cap - 256)
    assert alloc.free_blocks() == [
        (256, 256),
        (512, 512),
        (1024, 1024),
        (2048, 2048),
        (4096, 4096),
        (8192, 8192),
        (16384, 16384),
        (32768, 32768),
    ]
    b = alloc.malloc(300)  # 512-byte block at the lowest free 512 block
    assert b == 512 and M.buddy_of(b, 512) == 0
    c = alloc.malloc(256)
    assert c == 256  # the buddy of a
    alloc.free(a)
    alloc.free(c)  # a and c merge to (0, 512), which merges with b's block once b is freed
    assert (0, 512) in alloc.free_blocks()
    alloc.free(b)
    assert alloc.free_blocks() == [(0, cap)]
    for n in (1, 255, 256, 257, 1000, 4096, 5000):
        off = alloc.malloc(n)
        size = alloc.block_size(off)
        assert size == max(256, M.next_pow2(n)) and off % size == 0
        alloc.free(off)


@pytest.mark.parametrize("backend", BACKENDS)
def test_buddy_non_power_of_two_capacity(backend: str) -> None:
    alloc = M.BuddyAllocator(1_000_000, min_block=256, backend=backend)
    usable = 1_000_000 // 256 * 256
    assert sum(s for _, s in alloc.free_blocks()) == usable == alloc.stats()["total_free"]
    big = alloc.malloc(1 << 19)
    assert big == 0
    with pytest.raises(MemoryError):
        alloc.malloc(1 << 19)  # 512 KiB more would need a second aligned 512 KiB block


@pytest.mark.parametrize("backend", BACKENDS)
def test_first_fit_vs_best_fit_and_coalescing(backend: str) -> None:
    ff = M.FirstFitAllocator(4096, alignment=64, backend=backend)
    bf = M.BestFitAllocator(4096, alignment=64, backend=backend)
    for alloc in (ff, bf):
        blocks = [alloc.malloc(n) for n in (512, 64, 128, 64, 1024)]  # 0, 512, 576, 704, 768
        assert blocks == [0, 512, 576, 704, 768]
        alloc.free(blocks[0])  # hole 512 at 0
        alloc.free(blocks[2])  # hole 128 at 576
    assert ff.malloc(100) == 0  # first hole that fits
    assert bf.malloc(100) == 576  # smallest hole that fits
    alloc = M.FirstFitAllocator(4096, alignment=64, backend=backend)
    a, b, c = alloc.malloc(64), alloc.malloc(64), alloc.malloc(64)
    alloc.free(a)
    alloc.free(c)
    assert alloc.free_blocks() == [(0, 64), (128, 4096 - 128)]  # c merged with the tail hole
    alloc.free(b)
    assert alloc.free_blocks() == [(0, 4096)]  # coalesced on both sides


@pytest.mark.parametrize("backend", BACKENDS)
def test_bump_reset_only(backend: str) -> None:
    alloc = M.BumpAllocator(1024, alignment=64, backend=backend)
    a, b = alloc.malloc(10), alloc.malloc(100)
    assert (a, b) == (0, 64)
    alloc.free(a)
    assert alloc.malloc(10) == 192  # freed memory is not reused before reset
    s = alloc.stats()
    assert s["reserved"] == 256 and s["total_free"] == 1024 - 192 and s["largest_free"] == 768
    alloc.reset()
    assert alloc.malloc(8) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_slab_classes_and_release(backend: str) -> None:
    alloc = M.SlabAllocator([24, 64], capacity=4096, slab_size=1024, alignment=16, backend=backend)
    assert alloc.classes == [32, 64]
    offs = [alloc.malloc(20) for _ in range(33)]  # 32 objects of 32 B fill one slab
    assert offs[:3] == [0, 32, 64] and offs[32] == 1024
    assert alloc.stats()["reserved"] == 2048
    big = alloc.malloc(64)
    assert big == 2048  # another class takes its own slab
    for o in offs:
        alloc.free(o)
    assert alloc.stats()["reserved"] == 1024  # emptied slabs went back to the pool
    assert alloc.stats()["internal_fragmentation"] == 0.0
    alloc.free(big)
    assert alloc.stats()["reserved"] == 0


# -------------------------------------------------------------------------------------- caching allocator
def test_round_size_and_allocation_size() -> None:
    assert [M.round_size(n) for n in (1, 511, 512, 513, 1000, 1 << 20)] == [512, 512, 512, 1024, 1024, 1 << 20]
    mib = 1 << 20
    assert M.allocation_size(512) == 2 * mib
    assert M.allocation_size(mib) == 2 * mib
    assert M.allocation_size(mib + 512) == 20 * mib
    assert M.allocation_size(10 * mib) == 10 * mib
    assert M.allocation_size(11 * mib) == 12 * mib


@pytest.mark.parametrize("backend", BACKENDS)
def test_caching_split_reuse_and_cache(backend: str) -> None:
    mib = 1 << 20
    alloc = M.CachingAllocator(64 * mib, backend=backend)
    a = alloc.malloc(1000)  # rounded to 1024, small pool, 2 MiB segment split
    b = alloc.malloc(1000)  # remainder reused
    assert b == a + 1024
    s = alloc.stats()
    assert (s["segments"], s["reserved"], s["allocated"], s["requested"]) == (1, 2 * mib, 2048, 2000)
    assert s["internal_fragmentation"] == pytest.approx(1 - 2000 / 2048)
    alloc.free(a)
    assert alloc.malloc(600) == a  # best fit: the freed 1024 block beats the large remainder
    big = alloc.malloc(3 * mib)  # large pool: a 20 MiB segment, split (remainder > 1 MiB)
    s = alloc.stats()
    assert s["segments"] == 2 and s["reserved"] == 22 * mib
    alloc.free(big)
    assert alloc.stats()["reserved"] == 22 * mib  # cached, not returned
    assert alloc.malloc(3 * mib) == big and alloc.stats()["n_segment_alloc"] == 2  # cache hit
    snap = alloc.memory_snapshot()
    assert [seg["segment_type"] for seg in snap] == ["small", "large"]
    assert sum(bl["size"] for bl in snap[0]["blocks"]) == snap[0]["total_size"] == 2 * mib
    assert snap[1]["blocks"][0]["state"] == "active_allocated"
    for seg in snap:  # blocks tile their segment in address order
        ends = [bl["offset"] + bl["size"] for bl in seg["blocks"]]
        assert [bl["offset"] for bl in seg["blocks"][1:]] == ends[:-1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_caching_streams_empty_cache_and_oom_retry(backend: str) -> None:
    mib = 1 << 20
    alloc = M.CachingAllocator(24 * mib, backend=backend)
    a = alloc.malloc(4 * mib, stream=0)  # 20 MiB segment on stream 0
    alloc.free(a)
    b = alloc.malloc(1000, stream=1)  # a new small segment: stream 0's cached block is not used
    s = alloc.stats()
    assert s["segments"] == 2 and s["reserved"] == 22 * mib
    c = alloc.malloc(4 * mib, stream=1)  # needs 20 MiB more: OOM -> release cached segment -> retry succeeds
    s = alloc.stats()
    assert s["num_alloc_retries"] == 1 and s["n_segment_free"] == 1 and s["reserved"] == 22 * mib
    with pytest.raises(MemoryError, match="out of memory.*nbytes=4194304"):
        alloc.malloc(4 * mib, stream=2)
    assert alloc.stats()["num_ooms"] == 1
    alloc.free(b)
    alloc.free(c)
    alloc.empty_cache()
    s = alloc.stats()
    assert s["reserved"] == 0 and s["segments"] == 0 and s["fragmentation"] == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_caching_small_arena_is_one_segment(backend: str) -> None:
    alloc = M.CachingAllocator(1 << 20, backend=backend)  # smaller than the 2 MiB small-pool segment
    a, b = alloc.malloc(100), alloc.malloc(5000)
    assert (a, b) == (0, 512)
    s = alloc.stats()
    assert s["segments"] == 1 and s["reserved"] == 1 << 20
    with pytest.raises(MemoryError, match="out of memory"):
        alloc.malloc(1 << 20)
    alloc.free(a)
    alloc.free(b)
    alloc.empty_cache()
    assert alloc.stats()["reserved"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_caching_max_split_size(backend: str) -> None:
    mib = 1 << 20
    alloc = M.CachingAllocator(128 * mib, max_split_size=8 * mib, backend=backend)
    a = alloc.malloc(30 * mib)  # oversize block: not split
    alloc.free(a)
    b = alloc.malloc(2 * mib)  # must not take the cached 30 MiB oversize block
    assert b != a and alloc.stats()["segments"] == 2


def test_caching_cpp_thread_safety() -> None:
    """Several Python threads hammer one C++ caching allocator (the GIL is released inside malloc/free)."""
    import threading

    alloc = M.CachingAllocator(64 << 20, backend="cpp", **SMALL_CACHING)
    n_threads, n_ops = 4, 4000
    errors: list[BaseException] = []

    def work(tid: int) -> None:
        try:
            rng = np.random.default_rng(tid)
            live: list[tuple[int, int]] = []
            for _ in range(n_ops):
                if live and (len(live) > 20 or rng.random() < 0.45):
                    off, n = live.pop(int(rng.integers(len(live))))
                    assert (alloc.view(off, n, np.uint8) == tid + 1).all(), "another thread wrote into my block"
                    alloc.free(off)
                else:
                    n = int(rng.integers(1, 20000))
                    off = alloc.malloc(n, stream=tid % 2)
                    alloc.view(off, n, np.uint8)[:] = tid + 1
                    live.append((off, n))
            for off, _ in live:
                alloc.free(off)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[0]
    s = alloc.stats()
    assert s["allocated"] == 0 and s["n_alloc"] == s["n_free"] and s["n_live"] == 0
    alloc.empty_cache()
    assert alloc.stats()["reserved"] == 0


def test_cpp_replay_in_threads_releases_gil() -> None:
    import threading

    alloc = M.CachingAllocator(256 << 20, backend="cpp")
    ops = M.random_ops(20_000, (1, 1 << 16), max_live=100, seed=3)
    results = []
    threads = [threading.Thread(target=lambda: results.append(alloc._core.replay(ops)[0])) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 3
    assert alloc.stats()["allocated"] == 0 and alloc.stats()["n_alloc"] == 3 * len(results[0])


def test_malloc_replay_baseline_runs() -> None:
    _C = load_C()

    secs = _C.memory.malloc_replay(M.pair_ops(1000, 1 << 20))
    assert secs > 0
    with pytest.raises(ValueError, match=r"ops\[1\]"):
        _C.memory.malloc_replay(np.array([[0, 8], [1, 5]]))


def test_replay_rejects_bad_traces() -> None:
    alloc = M.FirstFitAllocator(1 << 16, backend="cpp")
    with pytest.raises(ValueError, match=r"ops\[1\].*not live"):
        alloc.replay(np.array([[0, 8], [1, 1]]))
    with pytest.raises(ValueError, match=r"ops\[2\]"):
        alloc.replay(np.array([[0, 8], [1, 0], [1, 0]]))
    with pytest.raises(ValueError, match=r"shape"):
        alloc.replay(np.zeros((3, 3), dtype=np.int64))
    assert alloc.stats()["n_alloc"] == 0


def test_backends_registry_and_one_caching_config() -> None:
    """Allocator cores are registered as memory.<kind> (python, cpp); backend=None takes the fastest built one.
    The caching allocator's knobs live in one CachingConfig that both cores and allocation_size read."""
    from tinylearn import backends

    for kind in ("Bump", "FreeList", "Buddy", "Slab", "Caching"):
        assert backends.registered(f"memory.{kind}") == ["python", "cpp"]
    assert M.BumpAllocator(4096, backend=None).backend == backends.available("memory.Bump")[0]
    cfg = M.CachingConfig()
    assert (cfg.round_to, cfg.small_size, cfg.large_buffer) == (512, 1 << 20, 20 << 20)
    assert all(M.allocation_size(n) == cfg.segment_size(n) for n in (512, 1 << 20, (1 << 20) + 512, 11 << 20))
    py, cpp = (
        M.CachingAllocator(1 << 22, small_buffer=8192),
        M.CachingAllocator(1 << 22, small_buffer=8192, backend="cpp"),
    )
    assert [py.malloc(n) for n in (100, 5000, 3000)] == [cpp.malloc(n) for n in (100, 5000, 3000)]
    with pytest.raises(ValueError, match="small_buffer"):
        M.CachingConfig(small_buffer=0)
