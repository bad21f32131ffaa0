"""Buddy allocator: power-of-two blocks, split on malloc, merge with the buddy on free, O(log capacity).

All sizes in bytes. A block of size s = 2^k lives at an offset that is a multiple of s; its *buddy* is

    buddy(offset, s) = offset ^ s          (flip the bit that distinguishes the two halves of the parent)

    malloc(n):  need = max(min_block, next_pow2(n));  take the lowest-offset free block of the smallest size
                s >= need; while s > need: s //= 2 and put the upper half (offset + s) on the free list of s
    free(off):  s = block size; while buddy(off, s) is free with size s: remove it, off = min(off, buddy),
                s *= 2;  put (off, s) on the free list of s

The arena (capacity rounded down to a multiple of min_block) starts as its binary decomposition: the largest
power-of-two block at 0, then the next at its end, ... so a capacity that is not a power of two still works,
and no bytes are lost on the first allocation. Internal fragmentation = rounding up to a power of two.
"""

from __future__ import annotations

from .base import Allocator, PyCore, check_int, check_power_of_two, make_core, register_core


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    n = check_int("n", n)
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    return 1 << (n - 1).bit_length()


def buddy_of(offset: int, size: int) -> int:
    """Offset of the buddy of the block (offset, size): offset XOR size."""
    return offset ^ size


def split_block(offset: int, size: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two halves (offset, size/2) and (offset + size/2, size/2) of a power-of-two block."""
    half = size // 2
    return (offset, half), (offset + half, half)


def merge_free(free_lists: dict[int, set[int]], offset: int, size: int) -> tuple[int, int]:
    """Free block (offset, size) into ``free_lists`` (size -> set of offsets), merging with its buddy while the
    buddy is free with the same size; returns the final (offset, size) that was inserted."""
    while True:
        b = buddy_of(offset, size)
        peers = free_lists.get(size)
        if not peers or b not in peers:
            break
        peers.remove(b)
        offset, size = min(offset, b), size * 2
    free_lists.setdefault(size, set()).add(offset)
    return offset, size


def initial_blocks(capacity: int, min_block: int) -> list[tuple[int, int]]:
    """Binary decomposition of the usable arena into aligned power-of-two blocks, largest first."""
    usable = capacity // min_block * min_block
    out, off = [], 0
    size = 1 << (usable.bit_length() - 1) if usable else 0
    while size >= min_block:
        if off + size <= usable:
            out.append((off, size))
            off += size
        size //= 2
    return out


class PyBuddy(PyCore):
    def __init__(self, capacity: int, min_block: int = 256) -> None:
        min_block = check_power_of_two("min_block", min_block)
        super().__init__(capacity, min_block)
        capacity = self.capacity  # a Python int (numpy integers are valid sizes)
        if capacity < min_block:
            raise ValueError(f"capacity: {capacity} is smaller than min_block={min_block}")
        self.min_block = min_block
        self.free_lists: dict[int, set[int]] = {}  # block size -> offsets of free blocks of that size
        for off, size in initial_blocks(capacity, min_block):
            self.free_lists.setdefault(size, set()).add(off)

    def _malloc(self, n: int) -> tuple[int, int]:
        need = max(self.min_block, next_pow2(n))
        sizes = [s for s, offs in self.free_lists.items() if s >= need and offs]
        if not sizes:
            total, largest = self._free_info()
            raise MemoryError(
                f"BuddyAllocator out of memory: nbytes={n} needs a {need}-byte block, largest_free={largest}, "
                f"total_free={total}, capacity={self.capacity}"
            )
        s = min(sizes)
        off = min(self.free_lists[s])
        self.free_lists[s].remove(off)
        while s > need:  # split, keep the lower half
            (off, s), (hi, _) = split_block(off, s)
            self.free_lists.setdefault(s, set()).add(hi)
        return off, s

    def _release(self, off: int, size: int) -> None:
        merge_free(self.free_lists, off, size)

    def _free_info(self) -> tuple[int, int]:
        total = sum(s * len(o) for s, o in self.free_lists.items())
        return total, max((s for s, o in self.free_lists.items() if o), default=0)

    def free_blocks(self) -> list[tuple[int, int]]:
        return sorted((o, s) for s, offs in self.free_lists.items() for o in offs)


register_core("Buddy", PyBuddy, lambda C, *a: C.Buddy(*a), 1 << 16, 64)


class BuddyAllocator(Allocator):
    """Binary buddy allocator over ``capacity`` bytes with blocks of at least ``min_block`` bytes."""

    def __init__(self, capacity: int, min_block: int = 256, *, backend: str = "python") -> None:
        super().__init__(*make_core("Buddy", backend, capacity, min_block))
        self.min_block = int(min_block)
