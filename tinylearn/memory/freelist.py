"""Free-list allocators: first-fit and best-fit over a sorted list of holes, with coalescing on free.

    holes: disjoint (offset, size) intervals sorted by offset, never two adjacent (they are merged)
    malloc(n):  block = align_up(n, alignment)
                first fit: the lowest-offset hole with size >= block
                best fit:  the smallest hole with size >= block (ties: lowest offset)
                the block takes the front of the hole; the rest (if any) stays a hole
    free(off):  insert hole (off, block); merge with the previous hole if prev.end == off and with the next
                one if off + block == next.offset  (coalescing keeps external fragmentation honest)

MemoryError when no hole fits; the message says whether that is lack of memory or fragmentation
(total_free >= block but largest_free < block).
"""

from __future__ import annotations

import bisect

from .base import Allocator, PyCore, align_up, make_core, register_core


def first_fit(holes: list[tuple[int, int]], size: int) -> tuple[int | None, list[tuple[int, int]]]:
    """Pure first fit over ``holes`` (sorted, disjoint (offset, size)): (offset or None, new holes)."""
    for i, (o, s) in enumerate(holes):
        if s >= size:
            rest = [(o + size, s - size)] if s > size else []
            return o, holes[:i] + rest + holes[i + 1 :]
    return None, list(holes)


def insert_hole(holes: list[tuple[int, int]], offset: int, size: int) -> list[tuple[int, int]]:
    """Pure coalescing free: ``holes`` plus (offset, size), merged with the hole ending at ``offset`` and the one
    starting at ``offset + size``; ValueError if it overlaps an existing hole (a double free)."""
    i = bisect.bisect_left(holes, (offset, 0))
    if (i > 0 and holes[i - 1][0] + holes[i - 1][1] > offset) or (i < len(holes) and holes[i][0] < offset + size):
        raise ValueError(f"insert_hole(offset={offset}, size={size}): overlaps a free hole (double free?)")
    lo, hi = i, i
    if i > 0 and holes[i - 1][0] + holes[i - 1][1] == offset:
        lo = i - 1
        offset, size = holes[i - 1][0], size + holes[i - 1][1]
    if i < len(holes) and holes[i][0] == offset + size:
        size += holes[i][1]
        hi = i + 1
    return holes[:lo] + [(offset, size)] + holes[hi:]


class PyFreeList(PyCore):
    def __init__(self, capacity: int, alignment: int = 64, best_fit: bool = False) -> None:
        super().__init__(capacity, alignment)
        self.best_fit = bool(best_fit)
        usable = capacity // self.alignment * self.alignment
        self.starts: list[int] = [0] if usable else []  # hole offsets, sorted
        self.holes: dict[int, int] = {0: usable} if usable else {}  # hole offset -> size

    def _find(self, size: int) -> int | None:
        if self.best_fit:
            fits = [(s, o) for o, s in self.holes.items() if s >= size]
            return min(fits)[1] if fits else None
        return next((o for o in self.starts if self.holes[o] >= size), None)

    def _malloc(self, n: int) -> tuple[int, int]:
        size = align_up(n, self.alignment)
        off = self._find(size)
        if off is None:
            total, largest = self._free_info()
            why = "fragmentation" if total >= size else "not enough free memory"
            raise MemoryError(
                f"{'best' if self.best_fit else 'first'}-fit out of memory ({why}): nbytes={n} (block {size}), "
                f"largest_free={largest}, total_free={total}, capacity={self.capacity}"
            )
        hole = self.holes.pop(off)
        i = bisect.bisect_left(self.starts, off)
        if hole > size:  # the remainder keeps the hole's slot in the sorted list
            self.starts[i] = off + size
            self.holes[off + size] = hole - size
        else:
            del self.starts[i]
        return off, size

    def _release(self, off: int, size: int) -> None:
        i = bisect.bisect_left(self.starts, off)
        if i > 0:  # merge with the hole just below
            prev = self.starts[i - 1]
            if prev + self.holes[prev] == off:
                off, size = prev, size + self.holes.pop(prev)
                i -= 1
                del self.starts[i]
        if i < len(self.starts) and self.starts[i] == off + size:  # merge with the hole just above
            size += self.holes.pop(self.starts[i])
            del self.starts[i]
        self.starts.insert(i, off)
        self.holes[off] = size

    def _free_info(self) -> tuple[int, int]:
        return sum(self.holes.values()), max(self.holes.values(), default=0)

    def free_blocks(self) -> list[tuple[int, int]]:
        return [(o, self.holes[o]) for o in self.starts]


register_core("FreeList", PyFreeList, lambda C, *a: C.FreeList(*a), 1 << 16, 64)


class FirstFitAllocator(Allocator):
    """First-fit free list with coalescing over an arena of ``capacity`` bytes."""

    best_fit = False

    def __init__(self, capacity: int, alignment: int = 64, *, backend: str = "python") -> None:
        super().__init__(*make_core("FreeList", backend, capacity, alignment, self.best_fit))


class BestFitAllocator(FirstFitAllocator):
    """Best-fit free list (smallest hole that fits, ties -> lowest offset) with coalescing."""

    best_fit = True
