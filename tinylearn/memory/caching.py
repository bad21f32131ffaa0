"""Caching allocator modelled on PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp).

"cudaMalloc" here is a first-fit segment allocation from the arena (slow and rare); blocks are handed out from
cached segments (fast and frequent). Rules, with PyTorch's defaults (every constant is a constructor argument):

    round_size(n)    = round_to (512)  if n < round_to  else  align_up(n, round_to)
    pool             = small if size <= small_size (1 MiB) else large          (separate free-block pools)
    segment size     = small_buffer (2 MiB)        if size <= small_size
                       large_buffer (20 MiB)       if size <  min_large_alloc (10 MiB)
                       align_up(size, round_large (2 MiB))   otherwise
    find a block     best fit: the smallest cached free block of the same pool *and stream* with size >= size
                     (ties -> lowest offset); with max_split_size set, large requests do not take blocks that
                     are too big (PyTorch's oversize rules)
    split            small pool: remainder >= round_to;  large pool: remainder > small_size (and size <
                     max_split_size); the remainder stays in the pool as a free block of the same segment
    free             never returns memory to the arena: the block is merged with free neighbours of its
                     segment and cached
    empty_cache()    releases every cached segment that is entirely free
                     (capped at the arena size, so a small arena is one segment)
    out of memory    when the segment allocation fails: release all cached free segments and retry once, then
                     MemoryError with allocated / reserved / free like torch's OOM message

Fast path (C++ core, ``fast_path=True``, the default): cached-block reuse without walking the std::set. A memo per
size class remembers which block best fit chose in a given pool state, and the block a malloc takes stays in the
tree until another operation needs the exact tree; freeing it right away cancels the split and restores the exact
previous state. The decisions (offsets, stats, snapshots) are those of the tree path and of this reference;
``fast_counters()`` counts memo hits and tree operations. ``fast_path=False`` runs the tree path on every call.

Per-thread cache (C++ core, ``thread_cache=N`` blocks per size class; 0 = off, the default): small blocks of
stream 0 are served from a thread-local array per size class in front of the locked pool, refilled from / flushed to
it in batches, so the common malloc/free pair takes no lock and no atomic read-modify-write (glibc's tcache idea).
A block freed by another thread goes to the freeing thread's cache; thread exit flushes a thread's cache back;
``empty_cache()`` flushes the caller's cache and asks the other threads to flush at their next call. Cached blocks
are not free for best fit, so offsets differ from the reference; ``stats()`` is the user's view (cached blocks are
not allocated) plus ``thread_cached`` bytes: reserved = allocated + total_free + thread_cached.

Streams: every block belongs to the stream it was allocated on and is only reused for that stream
(``malloc(nbytes, stream=s)``), as blocks are in PyTorch's per-stream pools.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from .. import backends
from .base import Allocator, align_up, check_int, external_fragmentation, make_core, register_core
from .freelist import PyFreeList

MiB = 1 << 20


def round_size(nbytes: int, round_to: int = 512) -> int:
    """PyTorch's size rounding: at least ``round_to`` bytes, then up to a multiple of ``round_to``."""
    return round_to if nbytes < round_to else align_up(nbytes, round_to)


@dataclass(frozen=True)
class CachingConfig:
    """The caching allocator's knobs with PyTorch's defaults: the one place they are written (the Python core,
    the C++ core's arguments and ``allocation_size`` all read this)."""

    round_to: int = 512
    small_size: int = MiB
    small_buffer: int = 2 * MiB
    large_buffer: int = 20 * MiB
    min_large_alloc: int = 10 * MiB
    round_large: int = 2 * MiB
    max_split_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("small_size", "small_buffer", "large_buffer", "min_large_alloc", "round_large"):
            if check_int(name, getattr(self, name)) <= 0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        if self.max_split_size is not None and check_int("max_split_size", self.max_split_size) < 0:
            raise ValueError(f"max_split_size: must be non-negative (or None), got {self.max_split_size}")

    def segment_size(self, size: int) -> int:
        """Segment size requested from the device ("cudaMalloc") for a rounded request of ``size`` bytes."""
        if size <= self.small_size:
            return self.small_buffer
        if size < self.min_large_alloc:
            return self.large_buffer
        return align_up(size, self.round_large)


DEFAULT = CachingConfig()


def allocation_size(size: int, **config: int) -> int:
    """Segment size for a rounded request of ``size`` bytes (keywords override ``CachingConfig`` fields)."""
    return CachingConfig(**config).segment_size(size)


@dataclass(eq=False)
class Block:
    offset: int
    size: int
    stream: int
    small: bool  # which pool the block's segment belongs to
    segment: int  # offset of the segment it is carved from
    allocated: bool = False
    requested: int = 0
    prev: Block | None = None
    next: Block | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.stream, self.size, self.offset)


class PyCaching:
    """Python reference core of CachingAllocator (same decisions, same offsets as the C++ core)."""

    def __init__(self, capacity: int, config: CachingConfig = DEFAULT) -> None:
        self.device = PyFreeList(capacity, config.round_to)  # validates capacity and round_to (power of two)
        self.config = config
        self.capacity, self.alignment, self.round_to = self.device.capacity, config.round_to, config.round_to
        self.small_size, self.large_buffer = config.small_size, config.large_buffer
        self.max_split_size = config.max_split_size if config.max_split_size is not None else (1 << 62)
        self.pools: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # sorted keys of free blocks
        self.blocks: dict[int, Block] = {}  # offset -> block (free or allocated)
        self.live: dict[int, Block] = {}
        self.segments: dict[int, int] = {}  # segment offset -> size
        self.allocated = self.requested = self.peak = self.peak_reserved = 0
        self.n_alloc = self.n_free = self.n_segment_alloc = self.n_segment_free = self.n_retries = 0
        self.n_ooms = 0

    # -- helpers --------------------------------------------------------------------------------------------
    def _pool_insert(self, b: Block) -> None:
        bisect.insort(self.pools[b.small], b.key)

    def _pool_remove(self, b: Block) -> None:
        pool = self.pools[b.small]
        del pool[bisect.bisect_left(pool, b.key)]

    def _find_free(self, small: bool, stream: int, size: int) -> Block | None:
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (stream, size, -1))
        if i == len(pool) or pool[i][0] != stream:
            return None
        b = self.blocks[pool[i][2]]
        if not small:  # PyTorch's oversize-block rules (inactive unless max_split_size is set)
            if size < self.max_split_size and b.size >= self.max_split_size:
                return None
            if size >= self.max_split_size and b.size >= size + self.large_buffer:
                return None
        return b

    def _should_split(self, b: Block, size: int) -> bool:
        remaining = b.size - size
        if b.small:
            return remaining >= self.round_to
        return size < self.max_split_size and remaining > self.small_size

    def _reserved(self) -> int:
        return sum(self.segments.values())

    def _release_cached(self) -> None:
        """Give every cached segment that is entirely free back to the arena ("cudaFree")."""
        for small in (True, False):
            for key in list(self.pools[small]):
                b = self.blocks[key[2]]
                if b.prev is None and b.next is None:
                    self._pool_remove(b)
                    del self.blocks[b.offset]
                    del self.segments[b.offset]
                    self.device.free(b.offset)
                    self.n_segment_free += 1

    def _new_segment(self, n: int, size: int, small: bool, stream: int) -> Block:
        seg = self.config.segment_size(size)
        seg = min(seg, self.capacity // self.round_to * self.round_to)  # an arena smaller than one segment
        try:
            off = self.device.malloc(seg)
        except MemoryError:
            self.n_retries += 1
            self._release_cached()
            try:
                off = self.device.malloc(seg)
            except MemoryError:
                self.n_ooms += 1
                reserved = self._reserved()
                raise MemoryError(
                    f"CachingAllocator out of memory: tried to allocate nbytes={n} (rounded {size}, segment "
                    f"{seg}); capacity {self.capacity}, {self.allocated} allocated, {reserved} reserved, "
                    f"{self.capacity - reserved} not reserved (after releasing cached blocks)"
                ) from None
        self.segments[off] = seg
        self.n_segment_alloc += 1
        b = Block(off, seg, stream, small, off)
        self.blocks[off] = b
        return b

    # -- public ---------------------------------------------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0) -> int:
        n = check_int("nbytes", nbytes)
        stream = check_int("stream", stream)
        if n <= 0:
            raise ValueError(f"nbytes: must be positive, got {n}")
        if n > self.capacity:
            raise MemoryError(f"nbytes={n} exceeds the arena capacity of {self.capacity} bytes")
        size = round_size(n, self.round_to)
        small = size <= self.small_size
        b = self._find_free(small, stream, size)
        if b is None:
            b = self._new_segment(n, size, small, stream)
        else:
            self._pool_remove(b)
        if self._should_split(b, size):
            rest = Block(b.offset + size, b.size - size, stream, small, b.segment, prev=b, next=b.next)
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            b.size = size
            self.blocks[rest.offset] = rest
            self._pool_insert(rest)
        b.allocated, b.requested = True, n
        self.live[b.offset] = b
        self.allocated += b.size
        self.requested += n
        self.n_alloc += 1
        self.peak = max(self.peak, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self._reserved())
        return b.offset

    def free(self, offset: int) -> None:
        off = check_int("offset", offset)
        b = self.live.pop(off, None)
        if b is None:
            raise ValueError(f"free(offset={off}): not a live allocation (double free or never allocated)")
        b.allocated = False
        self.allocated -= b.size
        self.requested -= b.requested
        b.requested = 0
        self.n_free += 1
        del self.blocks[off]
        for nb in (b.prev, b.next):  # merge with free neighbours of the same segment
            if nb is not None and not nb.allocated:
                self._pool_remove(nb)
                del self.blocks[nb.offset]
                if nb is b.prev:
                    b.offset, b.prev = nb.offset, nb.prev
                    if nb.prev is not None:
                        nb.prev.next = b
                else:
                    b.next = nb.next
                    if nb.next is not None:
                        nb.next.prev = b
                b.size += nb.size
        self.blocks[b.offset] = b
        self._pool_insert(b)

    def empty_cache(self) -> None:
        self._release_cached()

    def block_size(self, offset: int) -> int:
        off = check_int("offset", offset)
        if off not in self.live:
            raise ValueError(f"offset={off}: not a live allocation")
        return self.live[off].size

    def live_blocks(self) -> list[tuple[int, int, int]]:
        return sorted((b.offset, b.size, b.requested) for b in self.live.values())

    def free_blocks(self) -> list[tuple[int, int]]:
        return sorted((k[2], k[1]) for pool in self.pools.values() for k in pool)

    def snapshot(self) -> list[dict[str, Any]]:
        segs = []
        for seg_off in sorted(self.segments):
            blocks, b = [], self.blocks.get(seg_off)
            while b is not None:
                state = "active_allocated" if b.allocated else "inactive"
                blocks.append(dict(offset=b.offset, size=b.size, requested=b.requested, state=state))
                b = b.next
            first = self.blocks[seg_off]
            segs.append(
                dict(
                    offset=seg_off,
                    total_size=self.segments[seg_off],
                    allocated_size=sum(x["size"] for x in blocks if x["state"] == "active_allocated"),
                    stream=first.stream,
                    segment_type="small" if first.small else "large",
                    blocks=blocks,
                )
            )
        return segs

    def stats(self) -> dict[str, Any]:
        reserved = self._reserved()
        total_free = reserved - self.allocated
        largest = max((k[1] for pool in self.pools.values() for k in pool), default=0)
        split_free = sum(
            k[1]
            for pool in self.pools.values()
            for k in pool
            if self.blocks[k[2]].prev is not None or self.blocks[k[2]].next is not None
        )
        return {
            "capacity": self.capacity,
            "allocated": self.allocated,
            "requested": self.requested,
            "reserved": reserved,
            "active": self.allocated,
            "peak": self.peak,
            "peak_reserved": self.peak_reserved,
            "n_alloc": self.n_alloc,
            "n_free": self.n_free,
            "n_live": len(self.live),
            "total_free": total_free,
            "largest_free": largest,
            "fragmentation": external_fragmentation(total_free, largest),
            "internal_fragmentation": 0.0 if self.allocated == 0 else 1.0 - self.requested / self.allocated,
            "segments": len(self.segments),
            "n_segment_alloc": self.n_segment_alloc,
            "n_segment_free": self.n_segment_free,
            "num_alloc_retries": self.n_retries,
            "num_ooms": self.n_ooms,
            "inactive_split": split_free,
        }


def _cpp_caching(
    C: Any,
    capacity: int,
    c: CachingConfig,
    fast_path: bool = True,
    thread_cache: int = 0,
    thread_cache_bytes: int = MiB,
) -> Any:
    m = -1 if c.max_split_size is None else c.max_split_size
    return C.Caching(
        capacity,
        c.round_to,
        c.small_size,
        c.small_buffer,
        c.large_buffer,
        c.min_large_alloc,
        c.round_large,
        m,
        fast_path,
        thread_cache,
        thread_cache_bytes,
    )


register_core("Caching", PyCaching, _cpp_caching, 1 << 20, DEFAULT)


class CachingAllocator(Allocator):
    """PyTorch-style caching allocator over an arena of ``capacity`` bytes; see the module docstring.

    ``malloc(nbytes, stream=0)``; ``empty_cache()``; ``memory_snapshot()``; ``memory_stats()`` (= stats()).
    The C++ backend is thread-safe (one mutex; the GIL is released inside malloc/free); ``thread_cache=N`` (C++
    only) puts a per-thread cache of N blocks per small size class in front of it (see the module docstring).
    """

    def __init__(
        self,
        capacity: int,
        round_to: int = DEFAULT.round_to,
        small_size: int = DEFAULT.small_size,
        small_buffer: int = DEFAULT.small_buffer,
        large_buffer: int = DEFAULT.large_buffer,
        min_large_alloc: int = DEFAULT.min_large_alloc,
        round_large: int = DEFAULT.round_large,
        max_split_size: int | None = DEFAULT.max_split_size,
        *,
        backend: str = "python",
        fast_path: bool = True,
        thread_cache: int = 0,
        thread_cache_bytes: int = MiB,
    ) -> None:
        if not isinstance(fast_path, bool):
            raise TypeError(f"fast_path: expected a bool, got {type(fast_path).__name__} {fast_path!r}")
        if not 0 <= check_int("thread_cache", thread_cache) <= 64:
            raise ValueError(f"thread_cache: expected 0 (off) to 64 blocks per size class, got {thread_cache}")
        if check_int("thread_cache_bytes", thread_cache_bytes) < round_to:
            raise ValueError(f"thread_cache_bytes: must be >= round_to ({round_to}), got {thread_cache_bytes}")
        config = CachingConfig(
            round_to, small_size, small_buffer, large_buffer, min_large_alloc, round_large, max_split_size
        )
        core, name = make_core("Caching", backend, capacity, config)
        if name != "cpp" and thread_cache:
            raise ValueError(f"thread_cache: only the C++ core has a per-thread cache (backend={backend!r})")
        if name == "cpp" and (not fast_path or thread_cache):
            core = _cpp_caching(
                backends.load_C("memory"), capacity, config, fast_path, thread_cache, thread_cache_bytes
            )
        super().__init__(core, name)
        self.round_to = int(round_to)
        self.fast_path = fast_path and name == "cpp"
        self.thread_cache = int(thread_cache)

    def malloc(self, nbytes: int, stream: int = 0) -> int:  # replaced per instance in __init__
        """Allocate ``nbytes`` on ``stream`` (blocks are only reused by the stream they were made on)."""
        return int(self._core.malloc(nbytes, stream))

    def empty_cache(self) -> None:
        """Return every cached, entirely free segment to the arena (like torch.cuda.empty_cache())."""
        self._core.empty_cache()

    def fast_counters(self) -> dict[str, int]:
        """C++ core: memo hits, std::set lookups / inserts+erases, cancelled and materialized lazy splits.
        The Python reference has one path: every malloc is one tree lookup (zeros here)."""
        if self.backend == "cpp":
            return {k: int(v) for k, v in self._core.fast_counters().items()}
        return dict.fromkeys(("memo_hits", "tree_lookups", "tree_updates", "cancels", "materialized"), 0)

    def thread_cache_stats(self) -> dict[str, int]:
        """Per-thread cache (C++ core with ``thread_cache > 0``): bytes / blocks held in thread caches, mallocs and
        frees served without the lock, blocks refilled from and flushed to the pool, threads with a cache."""
        if self.backend != "cpp":
            raise ValueError("thread_cache_stats: only the C++ core has a per-thread cache (backend='python')")
        return {k: int(v) for k, v in self._core.thread_cache_stats().items()}

    def flush_thread_cache(self) -> None:
        """Return the calling thread's cached blocks to the pool (what thread exit does); no-op without a cache."""
        if self.backend == "cpp":
            self._core.flush_thread_cache()

    def memory_stats(self) -> dict[str, Any]:
        return self.stats()

    def memory_snapshot(self) -> list[dict[str, Any]]:
        """Segments in address order, each with its blocks (like torch.cuda.memory_snapshot())."""
        return [dict(s) for s in self._core.snapshot()]
