"""A cache for intermediate tensors that several branches or layers recompute (the same projection of the same
input, a shared positional table): reference counts pin entries in use, LRU timestamps and a TTL evict the rest
under a byte budget.

    cache = TensorCache(capacity_bytes=64 << 20, ttl=2.0)
    k = cache.get_or_compute(("proj", layer, step), lambda: x @ w)     # first branch computes, the others hit
    t = cache.acquire(key); ...; cache.release(key)                    # pinned while in use: never evicted

Policy, in order, when an insert needs room: (1) drop expired entries (idle longer than ``ttl`` since their last
use, and not referenced), (2) evict unreferenced entries in LRU order (oldest last-use timestamp first) until the
new tensor fits. An entry with a reference count above zero is never evicted or expired. When the tensor cannot
fit (larger than the budget, or the rest is pinned) it is not cached: ``put`` returns False and counts a
rejection -- a cache must never turn into an out-of-memory error. Cached arrays are handed out read-only: a
tensor shared by several consumers must not be modified in place by one of them. Not thread-safe.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._inputs import is_int, is_real


class ManualClock:
    """A clock that moves only when told (deterministic TTL tests): ``clock()`` -> now, ``clock.advance(dt)``."""

    def __init__(self, start: float = 0.0) -> None:
        if not np.isfinite(start):
            raise ValueError(f"start: expected a finite time, got {start!r}")
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> float:
        if not (is_real(dt) and np.isfinite(dt) and dt >= 0):
            raise ValueError(f"dt: expected a finite non-negative number of seconds, got {dt!r}")
        self.now += float(dt)
        return self.now


def _check_key(key: Any) -> None:
    try:
        hash(key)
    except TypeError:
        raise ValueError(f"key: expected a hashable key, got {key!r}") from None


@dataclass
class _Entry:
    value: np.ndarray
    nbytes: int
    last_used: float
    refs: int = 0


class TensorCache:
    """Reference-counted LRU/TTL cache of numpy tensors under ``capacity_bytes``; see the module docstring."""

    def __init__(self, capacity_bytes: int, ttl: float | None = None, clock: Callable[[], float] | None = None) -> None:
        if not is_int(capacity_bytes) or capacity_bytes < 1:
            raise ValueError(f"capacity_bytes: expected a positive int, got {capacity_bytes!r}")
        if ttl is not None and not (is_real(ttl) and ttl > 0):
            raise ValueError(f"ttl: expected None or a positive number of seconds, got {ttl!r}")
        if clock is not None and not callable(clock):
            raise ValueError(f"clock: expected a callable returning seconds, got {clock!r}")
        self.capacity_bytes = int(capacity_bytes)
        self.ttl = None if ttl is None else float(ttl)
        self.clock = time.monotonic if clock is None else clock
        self._entries: dict[Hashable, _Entry] = {}
        self.bytes = 0
        self.peak_bytes = 0
        self.hits = 0
        self.misses = 0
        self.rejected = 0
        self.evicted: list[Hashable] = []  # LRU evictions, in order
        self.expired: list[Hashable] = []  # TTL expirations, in order

    # -- queries -------------------------------------------------------------------------------------------------
    def __contains__(self, key: Hashable) -> bool:
        _check_key(key)
        return key in self._entries and not self._is_expired(self._entries[key], self.clock())

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[Hashable]:
        """Cached keys, least recently used first."""
        return [k for k, _ in sorted(self._entries.items(), key=lambda kv: kv[1].last_used)]

    def refcount(self, key: Hashable) -> int:
        return self._entry(key).refs

    def stats(self) -> dict[str, Any]:
        """dict(hits, misses, hit_rate, entries, bytes, peak_bytes, capacity_bytes, evictions, expirations,
        rejected, pinned)."""
        n = self.hits + self.misses
        return {
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hits / n if n else 0.0,
            "entries": len(self._entries),
            "bytes": self.bytes,
            "peak_bytes": self.peak_bytes,
            "capacity_bytes": self.capacity_bytes,
            "evictions": len(self.evicted),
            "expirations": len(self.expired),
            "rejected": self.rejected,
            "pinned": sum(e.refs > 0 for e in self._entries.values()),
        }

    # -- core ----------------------------------------------------------------------------------------------------
    def _entry(self, key: Hashable) -> _Entry:
        try:
            return self._entries[key]
        except (KeyError, TypeError):
            raise ValueError(f"key: {key!r} is not in the cache") from None

    def _is_expired(self, e: _Entry, now: float) -> bool:
        return self.ttl is not None and e.refs == 0 and now - e.last_used > self.ttl

    def _drop(self, key: Hashable) -> None:
        self.bytes -= self._entries.pop(key).nbytes

    def expire(self) -> list[Hashable]:
        """Drop every unreferenced entry idle longer than ``ttl``; returns their keys (oldest first)."""
        now = self.clock()
        gone = [k for k in self.keys() if self._is_expired(self._entries[k], now)]
        for k in gone:
            self._drop(k)
        self.expired.extend(gone)
        return gone

    def get(self, key: Hashable) -> np.ndarray | None:
        """The cached tensor (read-only) and a hit, refreshing its timestamp; None and a miss when absent/expired."""
        _check_key(key)
        now = self.clock()
        e = self._entries.get(key)
        if e is not None and self._is_expired(e, now):
            self._drop(key)
            self.expired.append(key)
            e = None
        if e is None:
            self.misses += 1
            return None
        self.hits += 1
        e.last_used = now
        return e.value

    def put(self, key: Hashable, value: Any, pin: bool = False) -> bool:
        """Cache ``value`` (a numpy array, stored as a read-only view) under ``key``; evicts as the policy says.

        Returns False (and caches nothing) when it cannot fit. ``pin=True`` takes one reference (``release`` it).
        Replacing an existing key keeps its references."""
        if not isinstance(value, np.ndarray):
            raise ValueError(f"value: expected a numpy array, got {type(value).__name__}")
        _check_key(key)
        nbytes = int(value.nbytes)
        old = self._entries.get(key)
        refs = (old.refs if old is not None else 0) + (1 if pin else 0)
        if old is not None:
            self._drop(key)
        self.expire()
        if nbytes > self.capacity_bytes - sum(e.nbytes for e in self._entries.values() if e.refs > 0):
            self.rejected += 1
            if old is not None and old.refs > 0:  # keep the pinned old value rather than lose it
                self._entries[key] = old
                self.bytes += old.nbytes
            return False
        for k in self.keys():  # LRU first
            if self.bytes + nbytes <= self.capacity_bytes:
                break
            if self._entries[k].refs == 0:
                self._drop(k)
                self.evicted.append(k)
        view = value.view()
        view.flags.writeable = False
        self._entries[key] = _Entry(view, nbytes, self.clock(), refs)
        self.bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        return True

    def get_or_compute(self, key: Hashable, compute: Callable[[], Any], pin: bool = False) -> np.ndarray:
        """Cached tensor on a hit; else ``compute()`` (a numpy array), cached when it fits, and returned read-only."""
        if not callable(compute):
            raise ValueError(f"compute: expected a callable returning a numpy array, got {compute!r}")
        v = self.get(key)
        if v is not None:
            if pin:
                self._entries[key].refs += 1
            return v
        value = compute()
        if not isinstance(value, np.ndarray):
            raise ValueError(f"compute: must return a numpy array, returned {type(value).__name__}")
        if self.put(key, value, pin=pin):
            return self._entries[key].value
        view = value.view()
        view.flags.writeable = False
        return view

    def acquire(self, key: Hashable) -> np.ndarray:
        """Take a reference (the entry cannot be evicted or expire until released) and return the tensor (a hit)."""
        e = self._entry(key)
        if self._is_expired(e, self.clock()):
            raise ValueError(f"key: {key!r} has expired (idle longer than ttl={self.ttl})")
        e.refs += 1
        e.last_used = self.clock()
        self.hits += 1
        return e.value

    def release(self, key: Hashable) -> int:
        """Drop one reference; the TTL restarts from now. Returns the remaining count."""
        e = self._entry(key)
        if e.refs == 0:
            raise ValueError(f"key: {key!r} has no references to release")
        e.refs -= 1
        e.last_used = self.clock()
        return e.refs

    def clear(self) -> None:
        """Drop every unreferenced entry (like ``empty_cache``); pinned entries stay."""
        for k in [k for k, e in self._entries.items() if e.refs == 0]:
            self._drop(k)


__all__ = ["ManualClock", "TensorCache"]
