"""Migrating a parameter shard between a hot tier (RAM) and a cold tier (a memmapped file) while updates continue.

The shard has a **version** (one per applied update) and, while a migration runs, an **append-only update log**
of ``(version, index, delta)``. ``update`` takes a short lock, applies ``x[index] += delta`` to the current tier,
bumps the version and appends to the log when a migration is running. ``migrate(to)``:

1. copy: the shard is copied to the destination chunk by chunk; each chunk is copied under the lock (a short,
   bounded hold) and remembers the version it was copied at, ``v_c`` -- the copy is consistent per chunk;
2. replay: log entries with ``version > v_c`` are applied to the part of chunk ``c`` they touch, in version order,
   without the lock (the updater keeps going and appending);
3. switch: under the lock, the last log entries are replayed and the destination becomes the current tier
   (atomic for readers and updaters: they take the same lock); the log is dropped.

Every update with version <= v_c is in the copied bytes of chunk c and every later one is replayed exactly once on
it, in the same order as on the source, so the destination equals the source bit for bit (the same float
additions in the same order): no update lost, none applied twice.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

Index = slice | np.ndarray | int


class TieredShard:
    """A 1-D shard living in RAM (``"hot"``) or in a memmapped file (``"cold"``); see the module docstring."""

    def __init__(self, data: np.ndarray, cold_path: str | os.PathLike[str], *, chunk_elems: int = 1 << 16) -> None:
        data = np.asarray(data)
        if data.ndim != 1:
            raise ValueError(f"data must be 1-D (a flat shard), got shape {data.shape}")
        if isinstance(chunk_elems, bool) or not isinstance(chunk_elems, int) or chunk_elems <= 0:
            raise ValueError(f"chunk_elems must be an int > 0, got {chunk_elems!r}")
        self.cold_path, self.chunk_elems = Path(cold_path), chunk_elems
        self.tier = "hot"
        self._x: np.ndarray = np.array(data, copy=True)
        self.version = 0
        self._lock = threading.Lock()
        self._log: list[tuple[int, Index, Any]] | None = None
        self.max_hold_s = 0.0  # longest time migrate() held the lock (an updater's worst stall)
        self.migrations: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return self._x.shape[0]

    def update(self, index: Index, delta: Any) -> int:
        """``x[index] += delta`` (duplicates in an index array accumulate); returns the new version."""
        with self._lock:
            _apply(self._x, index, delta)
            self.version += 1
            if self._log is not None:
                self._log.append((self.version, index, delta))
            return self.version

    def snapshot(self) -> tuple[int, np.ndarray]:
        """(version, a copy of the values) taken atomically."""
        with self._lock:
            return self.version, np.array(self._x, copy=True)

    def migrate(self, to: str) -> dict[str, Any]:
        """Move the shard to tier ``to`` ("hot" or "cold") while updates continue; returns timing and log stats."""
        if to not in ("hot", "cold"):
            raise ValueError(f"to must be 'hot' or 'cold', got {to!r}")
        t0 = time.perf_counter()
        with self._lock:
            if to == self.tier:
                return {"to": to, "skipped": True}
            if self._log is not None:
                raise RuntimeError("a migration is already running")
            self._log = []
            n, dtype = self._x.shape[0], self._x.dtype
        try:
            return self._migrate(to, n, dtype, t0)
        except BaseException:
            with self._lock:  # a failed move (disk full, ...) leaves the source tier current and stops logging
                self._log = None
            raise

    def _migrate(self, to: str, n: int, dtype: np.dtype, t0: float) -> dict[str, Any]:
        if to == "cold":
            dst: np.ndarray = np.lib.format.open_memmap(self.cold_path, mode="w+", dtype=dtype, shape=(n,))
        else:
            dst = np.empty(n, dtype)
        ce = self.chunk_elems
        starts = list(range(0, n, ce))
        vers = []
        for s in starts:  # 1. copy chunk by chunk, each consistent at the version it was copied at
            h0 = time.perf_counter()
            with self._lock:
                dst[s : s + ce] = self._x[s : s + ce]
                vers.append(self.version)
            self.max_hold_s = max(self.max_hold_s, time.perf_counter() - h0)
        done = 0  # 2. replay the log while updates continue; 3. switch under the lock
        replayed = 0
        while True:
            with self._lock:
                pending = len(self._log) - done
                final = pending <= 64
                if final:
                    h0 = time.perf_counter()
                    replayed += self._replay(dst, starts, vers, self._log[done:])
                    if to == "cold":
                        dst.flush()
                    self._x, self.tier, self._log, logged = dst, to, None, len(self._log)
                    self.max_hold_s = max(self.max_hold_s, time.perf_counter() - h0)
                    break
                batch = self._log[done:]  # entries are appended, never changed: safe to read outside the lock
            replayed += self._replay(dst, starts, vers, batch)
            done += len(batch)
        if to == "hot" and self.cold_path.exists():
            self.cold_path.unlink()
        st = {"to": to, "seconds": time.perf_counter() - t0, "logged": logged, "replayed": replayed}
        st["max_hold_s"] = self.max_hold_s
        self.migrations.append(st)
        return st

    def _replay(
        self, dst: np.ndarray, starts: list[int], vers: list[int], entries: list[tuple[int, Index, Any]]
    ) -> int:
        ce, n, applied = self.chunk_elems, dst.shape[0], 0
        for v, index, delta in entries:
            idx = np.arange(*index.indices(n)) if isinstance(index, slice) else np.asarray(index)
            d = np.broadcast_to(np.asarray(delta, dtype=dst.dtype), np.shape(idx))
            chunk = idx // ce
            keep = np.asarray(vers, dtype=np.int64)[chunk] < v  # chunk copied before this update
            if keep.all():
                _apply(dst, index, delta)
            elif keep.any():
                _apply(dst, idx[keep], d[keep])
            applied += int(keep.any())
        return applied

    def values(self) -> np.ndarray:
        """A copy of the current values."""
        return self.snapshot()[1]


def _apply(x: np.ndarray, index: Index, delta: Any) -> None:
    if isinstance(index, (slice, int, np.integer)):
        x[index] += delta
    else:
        np.add.at(x, np.asarray(index), delta)


def apply_all(x0: np.ndarray, updates: list[tuple[Index, Any]]) -> np.ndarray:
    """The reference: every update applied in order to a copy of ``x0``."""
    x = np.array(x0, copy=True)
    for index, delta in updates:
        _apply(x, index, delta)
    return x


__all__ = ["TieredShard", "apply_all"]
