"""A host-side, three-tier store of KV blocks: the swap target of preemption and the tiers behind the device arena.

    store = TieredKVStore((2, 16, 4, 64), np.float32, fast_blocks=64, slow_blocks=256, disk_path=tmpdir,
                          disk_blocks=4096)
    tier = store.put(key, block)       # -> "fast"; the LRU blocks move fast -> slow -> disk when a tier is full
    store.prefetch(next_keys)          # background thread promotes them to "fast"
    block = store.get(key)             # a copy, exact bytes; promotes the block to "fast" (LRU order updated)

Tiers (a block lives in exactly one of them; every tier is sized in blocks):

    "fast"   one preallocated numpy arena [fast_blocks, *block_shape] with a free list of slots: put/get copy in/out.
    "slow"   RAM, blocks losslessly compressed: byte-shuffle (byte j of every element stored together, the
             Blosc/HDF5 "shuffle" filter) then zlib level 1. Shuffling groups the sign/exponent bytes of float KV,
             which repeat, away from the noisy low mantissa bytes, so zlib finds runs; level 1 keeps it fast. Held
             as one ``bytes`` per block, so its RAM is the compressed size (``stats()["slow"]["stored_bytes"]``,
             ``compression_ratio``); capacity is ``slow_blocks`` blocks whatever their compressed size.
             ``slow_codec="zlib"`` (no shuffle) is there to measure the difference. Decompression gives the exact
             bytes back (checked by the tests in every tier, NaN payloads included).
    "disk"   an ``np.memmap`` [disk_blocks, *block_shape] with a free list. ``disk_path``: a directory (a fresh file
             is created in it), a path that does not exist (created), or an existing file of exactly the right size
             (reused, never deleted). ``close()`` flushes and fsyncs it and deletes the file if the store created it.

LRU: each tier keeps its blocks in recency order (``OrderedDict``). A new or promoted block enters "fast" as the
most recent; when a tier is full its least recently used block is demoted to the next tier down (cascading), so the
global recency order is disk < slow < fast. ``put`` raises MemoryError (naming the capacities) only when every tier
is full; a block is never dropped: every put block stays retrievable, exact, until ``discard``/``pop``/``close``.

Prefetch: ``prefetch(keys)`` queues keys for ``prefetch_threads`` daemon worker threads that promote them to "fast"
under the store's lock, so the ``get`` that follows is a fast hit (counted in ``stats()["prefetch_hits"]``). Every
public method takes the same re-entrant lock: get/put/prefetch are safe from several threads. ``wait_prefetch``
blocks until the queue is drained (and re-raises the first error a worker hit).

Stats: per tier capacity, used, gets (gets served from that tier), bytes_in/bytes_out (raw bytes written to / read
from it: puts, demotions, promotions), mean_get_s (measured wall time of the gets it served, promotion included);
hits/misses (gets served by "fast" or not), demotions, promotions, prefetched, prefetch_hits.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
import time
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._inputs import as_int

TIERS = ("fast", "slow", "disk")
CODECS = ("shuffle-zlib", "zlib")
_STOP = object()


def compress_block(block: np.ndarray, codec: str = "shuffle-zlib", level: int = 1) -> bytes:
    """Lossless bytes of a C-contiguous block: byte-shuffle (``codec="shuffle-zlib"``) then zlib at ``level``."""
    a = np.ascontiguousarray(block)
    raw = a.view(np.uint8).reshape(-1, a.dtype.itemsize)
    if codec == "shuffle-zlib":
        raw = raw.T  # [itemsize, n]: byte j of every element together
    elif codec != "zlib":
        raise ValueError(f"codec: expected one of {CODECS}, got {codec!r}")
    return zlib.compress(np.ascontiguousarray(raw).tobytes(), level)


def decompress_block(data: bytes, shape: tuple[int, ...], dtype: Any, codec: str = "shuffle-zlib") -> np.ndarray:
    """Inverse of ``compress_block``: a new writable array with the exact original bytes."""
    dt = np.dtype(dtype)
    raw = np.frombuffer(zlib.decompress(data), np.uint8)
    if codec == "shuffle-zlib":
        raw = raw.reshape(dt.itemsize, -1).T
    elif codec != "zlib":
        raise ValueError(f"codec: expected one of {CODECS}, got {codec!r}")
    return np.ascontiguousarray(raw).view(dt).reshape(shape)


def _shape_arg(block_shape: Any) -> tuple[int, ...]:
    dims = (block_shape,) if not isinstance(block_shape, Sequence | np.ndarray) else tuple(block_shape)
    if len(dims) == 0:
        raise ValueError(f"block_shape: expected a non-empty shape, got {block_shape!r}")
    return tuple(as_int(d, f"block_shape[{i}]", min=1) for i, d in enumerate(dims))


class TieredKVStore:
    """KV blocks in three tiers: a RAM arena ("fast"), compressed RAM ("slow"), an mmap'd file ("disk").

    See the module docstring for the layout, the LRU demotion rule, prefetch and the stats."""

    def __init__(
        self,
        block_shape: Any,
        dtype: Any = np.float32,
        *,
        fast_blocks: int,
        slow_blocks: int = 0,
        disk_path: str | os.PathLike | None = None,
        disk_blocks: int = 0,
        prefetch_threads: int = 1,
        slow_codec: str = "shuffle-zlib",
    ) -> None:
        self.block_shape = _shape_arg(block_shape)
        try:
            self.dtype = np.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"dtype: expected a numpy dtype, got {dtype!r}") from e
        if self.dtype.hasobject or self.dtype.itemsize == 0:
            raise TypeError(f"dtype: expected a fixed-size numeric dtype, got {self.dtype}")
        fast_blocks = as_int(fast_blocks, "fast_blocks", min=1)
        slow_blocks = as_int(slow_blocks, "slow_blocks", min=0)
        disk_blocks = as_int(disk_blocks, "disk_blocks", min=0)
        self._threads_n = as_int(prefetch_threads, "prefetch_threads", min=1)
        if slow_codec not in CODECS:
            raise ValueError(f"slow_codec: expected one of {CODECS}, got {slow_codec!r}")
        if disk_blocks > 0 and disk_path is None:
            raise ValueError(f"disk_path: required when disk_blocks > 0 (disk_blocks={disk_blocks}), got None")
        if disk_blocks == 0 and disk_path is not None:
            raise ValueError(f"disk_blocks: must be >= 1 when disk_path is given ({disk_path!r}), got 0")
        self.slow_codec = slow_codec
        self.block_nbytes = int(np.prod(self.block_shape)) * self.dtype.itemsize
        self.capacity = {"fast": fast_blocks, "slow": slow_blocks, "disk": disk_blocks}
        self._order = [t for t in TIERS if self.capacity[t] > 0]
        self._fast = np.empty((fast_blocks, *self.block_shape), self.dtype)
        self._slots: dict[str, OrderedDict] = {t: OrderedDict() for t in TIERS}  # key -> slot (fast/disk) or bytes
        self._free = {"fast": list(range(fast_blocks - 1, -1, -1)), "disk": list(range(disk_blocks - 1, -1, -1))}
        self._where: dict[Hashable, str] = {}
        self._mm: np.memmap | None = None
        self.disk_path: Path | None = None
        self._created = False
        self._finalizer: Any = None
        if disk_blocks:
            self._open_disk(Path(os.fspath(disk_path)), disk_blocks)
        self._lock = threading.RLock()
        self._pcond = threading.Condition()
        self._pending = 0
        self._perror: BaseException | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._prefetched: set[Hashable] = set()
        self._closed = False
        self._c = {t: {"gets": 0, "bytes_in": 0, "bytes_out": 0, "get_s": 0.0} for t in TIERS}
        self._n = {"demotions": 0, "promotions": 0, "prefetched": 0, "prefetch_hits": 0}

    def _open_disk(self, path: Path, disk_blocks: int) -> None:
        shape = (disk_blocks, *self.block_shape)
        size = disk_blocks * self.block_nbytes
        if path.is_dir():
            fd, name = tempfile.mkstemp(prefix="tinylearn-kv-", suffix=".bin", dir=path)
            os.close(fd)
            path, self._created = Path(name), True
        elif path.exists():
            if path.stat().st_size != size:
                raise ValueError(
                    f"disk_path: existing file {str(path)!r} has {path.stat().st_size} bytes, expected "
                    f"{size} (= disk_blocks {disk_blocks} x {self.block_nbytes} bytes per block); refusing to resize it"
                )
        else:
            if not path.parent.is_dir():
                raise ValueError(f"disk_path: directory {str(path.parent)!r} does not exist")
            self._created = True
        mode = "w+" if self._created else "r+"
        self._mm = np.memmap(path, dtype=self.dtype, mode=mode, shape=shape)
        self.disk_path = path
        if self._created:  # the file goes even if close() is never called
            self._finalizer = weakref.finalize(self, _unlink, str(path))

    # ---- tier primitives (caller holds the lock) ----------------------------------------------------------------

    def _store(self, tier: str, key: Hashable, block: np.ndarray) -> None:
        if tier == "fast":
            slot = self._free["fast"].pop()
            self._fast[slot] = block
        elif tier == "slow":
            slot = compress_block(block, self.slow_codec)
        else:
            slot = self._free["disk"].pop()
            self._mm[slot] = block
        self._slots[tier][key] = slot
        self._where[key] = tier
        self._c[tier]["bytes_in"] += self.block_nbytes

    def _read(self, tier: str, key: Hashable) -> np.ndarray:
        slot = self._slots[tier][key]
        if tier == "fast":
            out = self._fast[slot].copy()
        elif tier == "slow":
            out = decompress_block(slot, self.block_shape, self.dtype, self.slow_codec)
        else:
            out = np.array(self._mm[slot])
        self._c[tier]["bytes_out"] += self.block_nbytes
        return out

    def _remove(self, key: Hashable) -> str:
        tier = self._where.pop(key)
        slot = self._slots[tier].pop(key)
        if tier != "slow":
            self._free[tier].append(slot)
        self._prefetched.discard(key)
        return tier

    def _insert(self, level: int, key: Hashable, block: np.ndarray) -> None:
        """Store ``block`` in tier ``self._order[level]``, first demoting that tier's LRU block if it is full."""
        tier = self._order[level]
        if len(self._slots[tier]) >= self.capacity[tier]:
            victim = next(iter(self._slots[tier]))
            vblock = self._read(tier, victim)
            self._remove(victim)
            self._insert(level + 1, victim, vblock)  # a free slot exists below: the total count was checked
            self._n["demotions"] += 1
        self._store(tier, key, block)

    def _promote(self, key: Hashable) -> np.ndarray:
        tier = self._where[key]
        if tier == "fast":
            self._slots["fast"].move_to_end(key)
            return self._read("fast", key)
        block = self._read(tier, key)
        self._remove(key)  # frees its slot first, so the cascade below always finds room
        self._insert(0, key, block)
        self._n["promotions"] += 1
        return block

    def _key(self, key: Hashable) -> str:
        if self._closed:
            raise RuntimeError("TieredKVStore: the store is closed")
        try:
            return self._where[key]
        except (KeyError, TypeError):
            raise KeyError(f"key: {key!r} is not in the store") from None

    # ---- public API ---------------------------------------------------------------------------------------------

    def put(self, key: Hashable, block: np.ndarray) -> str:
        """Store a copy of ``block`` under ``key`` (replacing any block of that key) in "fast"; returns the tier."""
        if not isinstance(block, np.ndarray):
            raise TypeError(f"block: expected a numpy array, got {type(block).__name__}")
        if block.shape != self.block_shape or block.dtype != self.dtype:
            raise ValueError(
                f"block: expected shape {self.block_shape} dtype {self.dtype}, got shape {block.shape} dtype "
                f"{block.dtype}"
            )
        hash(key)  # TypeError for an unhashable key, before anything moves
        with self._lock:
            if self._closed:
                raise RuntimeError("TieredKVStore: the store is closed")
            if key in self._where:
                self._remove(key)
            elif len(self._where) >= sum(self.capacity.values()):
                caps = ", ".join(f"{t}={self.capacity[t]}" for t in TIERS)
                raise MemoryError(
                    f"TieredKVStore full: {len(self._where)} blocks stored, capacities {caps} blocks of "
                    f"{self.block_nbytes} bytes; discard or pop blocks first"
                )
            self._insert(0, key, block)
            return self._where[key]

    def get(self, key: Hashable) -> np.ndarray:
        """A copy of the block (exact bytes); promotes it to "fast" as the most recently used. KeyError if absent."""
        with self._lock:
            tier = self._key(key)
            t0 = time.perf_counter()
            out = self._promote(key)
            c = self._c[tier]
            c["gets"] += 1
            c["get_s"] += time.perf_counter() - t0
            if tier == "fast" and key in self._prefetched:
                self._n["prefetch_hits"] += 1
            self._prefetched.discard(key)
            return out

    def pop(self, key: Hashable) -> np.ndarray:
        """``get`` then ``discard``, under one lock."""
        with self._lock:
            out = self.get(key)
            self._remove(key)
            return out

    def discard(self, key: Hashable) -> None:
        """Drop the block of ``key`` (KeyError if absent), freeing its slot."""
        with self._lock:
            self._key(key)
            self._remove(key)

    def tier_of(self, key: Hashable) -> str:
        """The tier holding ``key``: "fast", "slow" or "disk" (KeyError if absent)."""
        with self._lock:
            return self._key(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            try:
                return key in self._where
            except TypeError:
                return False

    def __len__(self) -> int:
        with self._lock:
            return len(self._where)

    def prefetch(self, keys: Sequence[Hashable]) -> None:
        """Asynchronously promote ``keys`` to "fast" (missing keys are ignored); ``wait_prefetch`` to join."""
        if isinstance(keys, str | bytes) or not isinstance(keys, Sequence | np.ndarray | set | frozenset):
            raise TypeError(f"keys: expected a sequence of keys, got {type(keys).__name__} {keys!r}")
        with self._lock:
            if self._closed:
                raise RuntimeError("TieredKVStore: the store is closed")
            while len(self._workers) < self._threads_n:
                w = threading.Thread(target=_prefetch_worker, args=(weakref.ref(self), self._queue), daemon=True)
                w.name = f"TieredKVStore-prefetch-{len(self._workers)}"
                w.start()
                self._workers.append(w)
        keys = list(keys)
        for i, k in enumerate(keys):
            try:
                hash(k)
            except TypeError:
                raise TypeError(f"keys[{i}]: expected a hashable key, got {type(k).__name__} {k!r}") from None
        with self._pcond:
            self._pending += len(keys)
        for k in keys:
            self._queue.put(k)

    def _prefetch_one(self, key: Hashable) -> None:
        with self._lock:
            if self._closed or key not in self._where or self._where[key] == "fast":
                return
            self._promote(key)
            self._prefetched.add(key)
            self._n["prefetched"] += 1

    def _prefetch_done(self, err: BaseException | None) -> None:
        with self._pcond:
            self._pending -= 1
            if err is not None and self._perror is None:
                self._perror = err
            self._pcond.notify_all()

    def wait_prefetch(self, timeout: float | None = None) -> bool:
        """Block until every queued prefetch is done (True) or ``timeout`` seconds pass (False)."""
        with self._pcond:
            done = self._pcond.wait_for(lambda: self._pending == 0, timeout)
            err, self._perror = self._perror, None
        if err is not None:
            raise RuntimeError(f"TieredKVStore: a prefetch failed: {err!r}") from err
        return bool(done)

    def stats(self) -> dict[str, Any]:
        """Per-tier counters and the global ones; see the module docstring."""
        with self._lock:
            out: dict[str, Any] = {}
            for t in TIERS:
                c = self._c[t]
                out[t] = {
                    "capacity": self.capacity[t],
                    "used": len(self._slots[t]),
                    "gets": c["gets"],
                    "bytes_in": c["bytes_in"],
                    "bytes_out": c["bytes_out"],
                    "mean_get_s": c["get_s"] / c["gets"] if c["gets"] else float("nan"),
                }
            stored = sum(len(b) for b in self._slots["slow"].values())
            out["slow"]["stored_bytes"] = stored
            out["slow"]["compression_ratio"] = (
                len(self._slots["slow"]) * self.block_nbytes / stored if stored else float("nan")
            )
            out["slow"]["codec"] = self.slow_codec
            hits = self._c["fast"]["gets"]
            misses = self._c["slow"]["gets"] + self._c["disk"]["gets"]
            out.update(self._n, hits=hits, misses=misses, block_nbytes=self.block_nbytes)
            out["hit_rate"] = hits / (hits + misses) if hits + misses else float("nan")
            return out

    def close(self) -> None:
        """Stop the prefetch threads, flush + fsync the disk tier, delete its file if the store created it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for _ in self._workers:
            self._queue.put(_STOP)
        for w in self._workers:
            w.join(timeout=10.0)
        with self._lock:
            if self._mm is not None:
                self._mm.flush()
                with open(self.disk_path, "rb+") as f:
                    os.fsync(f.fileno())
                mapping = getattr(self._mm, "_mmap", None)
                if mapping is not None:
                    mapping.close()  # release the mapping now, not at garbage collection
                self._mm = None
                if self._finalizer is not None:
                    self._finalizer()  # unlinks the file the store created
            self._slots = {t: OrderedDict() for t in TIERS}
            self._where.clear()

    def __enter__(self) -> TieredKVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        caps = ", ".join(f"{t}={len(self._slots[t])}/{self.capacity[t]}" for t in TIERS)
        return f"TieredKVStore(block_shape={self.block_shape}, dtype={self.dtype}, {caps}, codec={self.slow_codec})"


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _prefetch_worker(ref: weakref.ref, q: queue.SimpleQueue) -> None:
    """Worker loop; holds the store only weakly between keys, so an unclosed store can still be collected."""
    while True:
        key = q.get()
        if key is _STOP:
            return
        store = ref()
        if store is None:
            return
        err = None
        try:
            store._prefetch_one(key)
        except BaseException as e:  # noqa: BLE001  (reported by wait_prefetch)
            err = e
        store._prefetch_done(err)
        del store


def measure_get_latency(
    block_shape: Any = (2, 16, 4, 128),
    dtype: Any = np.float32,
    *,
    n: int = 32,
    disk_dir: str | os.PathLike | None = None,
) -> dict[str, float]:
    """Median seconds of one ``get`` served by each tier (default block: 64 KiB float32), measured here.

    "fast": a copy out of the arena. "slow"/"disk": a store with ``fast_blocks=1``, so each get also demotes the
    block it displaces (a compression or a disk write): the cost of a miss when the fast tier is full, which is the
    steady state of a swap tier. The disk tier reads through the OS page cache (a recently written file is in RAM)."""
    n = as_int(n, "n", min=2)
    rng = np.random.default_rng(0)
    shape = _shape_arg(block_shape)
    blocks = [rng.standard_normal(shape).astype(dtype) for _ in range(n + 1)]
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=disk_dir) as d:
        for tier, kw in (
            ("fast", {"fast_blocks": n + 1}),
            ("slow", {"fast_blocks": 1, "slow_blocks": n}),
            ("disk", {"fast_blocks": 1, "disk_path": d, "disk_blocks": n}),
        ):
            with TieredKVStore(shape, dtype, **kw) as s:
                for i, b in enumerate(blocks):
                    s.put(i, b)
                times = []
                for i in range(n):  # key i is the LRU one of its tier: every get is served by ``tier``
                    t0 = time.perf_counter()
                    s.get(i)
                    times.append(time.perf_counter() - t0)
                if s.stats()[tier]["gets"] != n:
                    raise RuntimeError(f"measure_get_latency: expected {n} gets from {tier}, got {s.stats()}")
            out[tier] = float(np.median(times))
    return out
