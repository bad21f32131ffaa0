"""Exercises for notebooks/07_memory_pools: allocator arithmetic you should be able to do on a whiteboard.

Units are bytes everywhere. Run ``pytest exercises/07_memory_pools`` (your code) or ``--impl=reference``.

Each stub's NotImplementedError names the library function its reference answer (reference.py) calls.
"""

from __future__ import annotations


def buddy_address(offset: int, size: int) -> int:
    """Offset of the buddy of the power-of-two block (offset, size); offset is a multiple of size.

    Example: buddy_address(512, 256) == 768, buddy_address(768, 256) == 512, buddy_address(0, 1024) == 1024.
    """
    raise NotImplementedError("reference solution: tinylearn/memory/buddy.py:buddy_of")


def split_block(offset: int, size: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two halves of a power-of-two block: ((offset, size // 2), (offset + size // 2, size // 2))."""
    raise NotImplementedError("reference solution: tinylearn/memory/buddy.py:split_block")


def buddy_free(free_lists: dict[int, set[int]], offset: int, size: int) -> tuple[int, int]:
    """Put the freed block (offset, size) into ``free_lists`` (size -> set of free offsets), merging it with its
    buddy as long as the buddy is free with the same size (remove the buddy, double the size, keep the lower
    offset). Mutates ``free_lists``; returns the (offset, size) finally inserted."""
    raise NotImplementedError("reference solution: tinylearn/memory/buddy.py:merge_free")


def first_fit(holes: list[tuple[int, int]], size: int) -> tuple[int | None, list[tuple[int, int]]]:
    """First fit: take ``size`` bytes from the front of the lowest-offset hole that is big enough.

    ``holes`` is a sorted list of disjoint (offset, size). Returns (offset, new_holes), or (None, holes) when no
    hole fits. Do not mutate the input."""
    raise NotImplementedError("reference solution: tinylearn/memory/freelist.py:first_fit")


def insert_hole(holes: list[tuple[int, int]], offset: int, size: int) -> list[tuple[int, int]]:
    """Free with coalescing: return the sorted hole list with (offset, size) added and merged with an adjacent
    hole below (ending at offset) and/or above (starting at offset + size). Raise ValueError naming the offset if
    the new hole overlaps an existing one (that would be a double free)."""
    raise NotImplementedError("reference solution: tinylearn/memory/freelist.py:insert_hole")


def round_size(nbytes: int, round_to: int = 512) -> int:
    """PyTorch caching-allocator rounding: ``round_to`` if nbytes < round_to, else nbytes rounded up to a
    multiple of ``round_to``. round_size(1) == 512, round_size(513) == 1024."""
    raise NotImplementedError("reference solution: tinylearn/memory/caching.py:round_size")


def fragmentation(free_sizes: list[int]) -> float:
    """External fragmentation of a set of free blocks: 1 - largest / total (0.0 when there is no free memory)."""
    raise NotImplementedError("reference solution: tinylearn/memory/base.py:external_fragmentation")


def greedy_plan(lifetimes: list[tuple[int, int, int]]) -> tuple[list[int], int]:
    """Static planner, greedy by size: lifetimes are (size, first_use, last_use), uses inclusive; tensors whose
    intervals intersect must not overlap in memory. Place the largest first (ties: earlier first_use, then
    index); each goes into the smallest gap between already placed *conflicting* tensors that fits, else on top
    of them. Return (offsets, peak) with peak = max(offset + size). (Any valid plan with a good peak passes the
    tests; this is TFLite's GreedyBySize.)"""
    raise NotImplementedError("reference solution: tinylearn/memory/planner.py:plan")
