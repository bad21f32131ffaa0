"""Slab allocator: fixed size classes carved out of equal slabs; empty slabs go back to the shared pool.

    classes:  sorted(align_up(s, alignment) for s in sizes)      (object stride of each class)
    arena:    capacity // slab_size slabs; a slab is free or belongs to one class and holds
              slab_size // stride objects at slab_offset + k * stride
    malloc(n):  c = smallest class >= n;  take the lowest-index partial slab of c (or the lowest free slab,
                which becomes c's); pop its most recently freed object, else its next never-used object
                (a per-slab bump index: taking a slab costs O(1), not O(objects per slab))
    free(off):  push the object back on its slab's free stack; when the slab's last object comes back the slab
                returns to the free pool (so a burst of one class does not pin memory forever)

Internal fragmentation = class rounding + the slab tail (slab_size % stride). reserved = slabs in use * slab_size.
"""

from __future__ import annotations

import bisect
from typing import Any

from .base import Allocator, PyCore, align_up, check_int, make_core, register_core


class PySlab(PyCore):
    def __init__(self, sizes: Any, capacity: int = 1 << 24, slab_size: int = 1 << 16, alignment: int = 16) -> None:
        super().__init__(capacity, alignment)
        slab_size = check_int("slab_size", slab_size)
        if slab_size <= 0 or slab_size % self.alignment:
            raise ValueError(f"slab_size: must be a positive multiple of alignment={self.alignment}, got {slab_size}")
        raw = [check_int("sizes", s) for s in sizes]
        if not raw or min(raw) <= 0:
            raise ValueError(f"sizes: need at least one positive size class, got {raw}")
        self.classes = sorted({align_up(s, self.alignment) for s in raw})
        if self.classes[-1] > slab_size:
            raise ValueError(f"sizes: class {self.classes[-1]} is larger than slab_size={slab_size}")
        self.slab_size = slab_size
        self.n_slabs = capacity // slab_size
        if self.n_slabs == 0:
            raise ValueError(f"capacity: {capacity} holds no slab of {slab_size} bytes")
        self.slab_class = [-1] * self.n_slabs  # class index or -1 (free slab)
        self.slab_free: list[list[int]] = [[] for _ in range(self.n_slabs)]  # stack of freed object offsets
        self.slab_next = [0] * self.n_slabs  # objects [0, next) have been handed out at least once
        self.slab_used = [0] * self.n_slabs
        self.free_slabs = list(range(self.n_slabs))  # sorted
        self.partial: list[list[int]] = [[] for _ in self.classes]  # per class: sorted partial slab indices

    def class_of(self, n: int) -> int:
        c = bisect.bisect_left(self.classes, n)
        if c == len(self.classes):
            raise ValueError(f"nbytes={n} is larger than the largest size class {self.classes[-1]}")
        return c

    def _malloc(self, n: int) -> tuple[int, int]:
        c = self.class_of(n)
        stride = self.classes[c]
        if self.partial[c]:
            slab = self.partial[c][0]
        elif self.free_slabs:
            slab = self.free_slabs.pop(0)
            self.slab_class[slab] = c
            self.slab_free[slab] = []
            self.slab_next[slab] = 0
            bisect.insort(self.partial[c], slab)
            self.peak_reserved = max(self.peak_reserved, self._reserved())
        else:
            raise MemoryError(
                f"SlabAllocator out of memory: nbytes={n} (class {stride}): no free object in class {stride} and "
                f"no free slab (n_slabs={self.n_slabs}, slab_size={self.slab_size})"
            )
        if self.slab_free[slab]:
            off = self.slab_free[slab].pop()
        else:
            off = slab * self.slab_size + self.slab_next[slab] * stride
            self.slab_next[slab] += 1
        self.slab_used[slab] += 1
        if self._n_free_objects(slab, stride) == 0:
            self.partial[c].remove(slab)
        return off, stride

    def _reserved_after_malloc(self, off: int, size: int) -> int:
        return self._reserved()

    def _release(self, off: int, size: int) -> None:
        slab = off // self.slab_size
        c = self.slab_class[slab]
        self.slab_free[slab].append(off)
        self.slab_used[slab] -= 1
        if self._n_free_objects(slab, size) == 1:  # was full: becomes partial again
            bisect.insort(self.partial[c], slab)
        if self.slab_used[slab] == 0:  # empty: back to the shared pool
            self.partial[c].remove(slab)
            self.slab_free[slab] = []
            self.slab_class[slab] = -1
            bisect.insort(self.free_slabs, slab)

    def _n_free_objects(self, slab: int, stride: int) -> int:
        return len(self.slab_free[slab]) + self.slab_size // stride - self.slab_next[slab]

    def _reserved(self) -> int:
        return (self.n_slabs - len(self.free_slabs)) * self.slab_size

    def _free_info(self) -> tuple[int, int]:
        """Free slabs (largest = longest run of adjacent free slabs) + free objects of partial slabs."""
        total = len(self.free_slabs) * self.slab_size
        run = best_run = 0
        prev = -2
        for s in self.free_slabs:
            run = run + 1 if s == prev + 1 else 1
            best_run, prev = max(best_run, run), s
        largest = best_run * self.slab_size
        for c, slabs in enumerate(self.partial):
            for slab in slabs:
                total += self._n_free_objects(slab, self.classes[c]) * self.classes[c]
                largest = max(largest, self.classes[c])
        return total, largest

    def free_blocks(self) -> list[tuple[int, int]]:
        out = [(s * self.slab_size, self.slab_size) for s in self.free_slabs]
        for c, slabs in enumerate(self.partial):
            st = self.classes[c]
            for s in slabs:
                out += [(o, st) for o in self.slab_free[s]]
                out += [(s * self.slab_size + k * st, st) for k in range(self.slab_next[s], self.slab_size // st)]
        return sorted(out)


register_core(
    "Slab", PySlab, lambda C, sizes, *a: C.Slab([check_int("sizes", s) for s in sizes], *a), (64, 256, 1024, 4096)
)


class SlabAllocator(Allocator):
    """Size-class allocator: ``sizes`` are the object sizes served; see the module docstring."""

    def __init__(
        self,
        sizes: Any,
        capacity: int = 1 << 24,
        slab_size: int = 1 << 16,
        alignment: int = 16,
        *,
        backend: str = "python",
    ) -> None:
        core, name = make_core("Slab", backend, sizes, capacity, slab_size, alignment)
        super().__init__(core, name)
        self.classes = list(core.classes)
        self.slab_size = int(slab_size)
