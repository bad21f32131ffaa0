"""Bump (arena / linear) allocator: malloc is one add, free only bookkeeping; memory comes back on reset.

    malloc(n):  block = align_up(n, alignment);  offset = top;  top += block      (MemoryError if top > capacity)
    free(off):  the block becomes dead; its bytes are NOT reusable until reset()
    reset():    top = 0 (every live offset becomes invalid) -- also done automatically when the last live block
                is freed, so "free everything" returns the whole arena.

Stats: reserved = top (the prefix ever handed out since the last reset). Dead blocks below ``top`` count as free
but unusable, so external fragmentation = 1 - (capacity - top) / (capacity - allocated).
"""

from __future__ import annotations

from .base import Allocator, PyCore, align_up, make_core, register_core


class PyBump(PyCore):
    def __init__(self, capacity: int, alignment: int = 64) -> None:
        super().__init__(capacity, alignment)
        self.top = 0

    def _malloc(self, n: int) -> tuple[int, int]:
        size = align_up(n, self.alignment)
        if self.top + size > self.capacity:
            raise MemoryError(
                f"BumpAllocator out of memory: nbytes={n} (block {size}) does not fit, top={self.top}, "
                f"capacity={self.capacity}; free everything or reset()"
            )
        off = self.top
        self.top += size
        return off, size

    def _release(self, off: int, size: int) -> None:
        if not self.live:
            self.top = 0

    def reset(self) -> None:
        """Forget every live block and start again at offset 0."""
        self.live.clear()
        self.allocated = self.requested = 0
        self.top = 0

    def _reserved(self) -> int:
        return self.top

    def _free_info(self) -> tuple[int, int]:
        return self.capacity - self.allocated, self.capacity - self.top

    def free_blocks(self) -> list[tuple[int, int]]:
        return [(self.top, self.capacity - self.top)] if self.top < self.capacity else []


register_core("Bump", PyBump, lambda C, *a: C.Bump(*a), 1 << 16, 64)


class BumpAllocator(Allocator):
    """Linear allocator over an arena of ``capacity`` bytes; see the module docstring."""

    def __init__(self, capacity: int, alignment: int = 64, *, backend: str = "python") -> None:
        super().__init__(*make_core("Bump", backend, capacity, alignment))

    def reset(self) -> None:
        """Invalidate every live offset; the whole arena is free again."""
        self._core.reset()
