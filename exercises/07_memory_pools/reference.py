"""Reference answers: thin adapters over tinylearn.memory."""

from __future__ import annotations

from tinylearn.memory import buddy as _buddy
from tinylearn.memory import freelist as _freelist
from tinylearn.memory import planner as _planner
from tinylearn.memory.base import external_fragmentation
from tinylearn.memory.caching import round_size as _round_size


def buddy_address(offset: int, size: int) -> int:
    return _buddy.buddy_of(offset, size)


def split_block(offset: int, size: int) -> tuple[tuple[int, int], tuple[int, int]]:
    return _buddy.split_block(offset, size)


def buddy_free(free_lists: dict[int, set[int]], offset: int, size: int) -> tuple[int, int]:
    return _buddy.merge_free(free_lists, offset, size)


def first_fit(holes: list[tuple[int, int]], size: int) -> tuple[int | None, list[tuple[int, int]]]:
    return _freelist.first_fit(holes, size)


def insert_hole(holes: list[tuple[int, int]], offset: int, size: int) -> list[tuple[int, int]]:
    return _freelist.insert_hole(holes, offset, size)


def round_size(nbytes: int, round_to: int = 512) -> int:
    return _round_size(nbytes, round_to)


def fragmentation(free_sizes: list[int]) -> float:
    return external_fragmentation(sum(free_sizes), max(free_sizes, default=0))


def greedy_plan(lifetimes: list[tuple[int, int, int]]) -> tuple[list[int], int]:
    return _planner.plan(lifetimes, strategy="size")
