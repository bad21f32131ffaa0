"""Compaction: move a few live blocks so that a large contiguous free range appears (seed questions 88b, 222).

A long training run fragments an arena: plenty of memory is free in total, but no single hole fits the next
large request, and the allocator raises out-of-memory. Compaction moves live blocks. It is only possible when
whoever holds the offsets can be told the new ones (a handle table: tensors point to blocks through an
indirection, and the move happens when no kernel uses the block), so the goal is to move *few* bytes.

Two planners over a layout (live blocks ``[(offset, size)]`` in an arena of ``capacity`` bytes); both return a
:class:`CompactionPlan` of moves (old offset, new offset, size) into holes, never overlapping anything live:

- :func:`plan_window` — the target window with the fewest live bytes in it. Any window can be slid left until
  it starts at 0 or at the end of a live block without taking in more blocks, so only those starts are tried;
  the blocks inside the cheapest feasible window are moved (largest first, best fit) into holes outside it.
  Optimal in bytes moved among windows whose victims can be re-placed by that best-fit step.
- :func:`plan_greedy_ratio` — the greedy of question 222: repeatedly move the block with the best
  (free run its removal would create) / (bytes to move) ratio into a best-fit hole elsewhere, until the largest
  free run reaches the target. Cheap, but it can move more bytes than the window plan, or fail where it succeeds.

:func:`apply_plan` performs the moves on a byte arena (numpy) and :func:`largest_free` measures the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .base import align_up, check_int


@dataclass
class CompactionPlan:
    moves: list[tuple[int, int, int]]  # (old offset, new offset, size)
    bytes_moved: int
    largest_free_before: int
    largest_free_after: int
    window: tuple[int, int] | None = None  # (start, size) of the cleared window (plan_window only)
    layout_after: list[tuple[int, int]] = field(default_factory=list)


def _check_layout(live: Any, capacity: int) -> list[tuple[int, int]]:
    cap = check_int("capacity", capacity)
    if cap <= 0:
        raise ValueError(f"capacity: must be > 0, got {cap}")
    blocks = sorted((check_int("offset", o), check_int("size", s)) for o, s in live)
    end = 0
    for o, s in blocks:
        if s <= 0:
            raise ValueError(f"live: block at offset {o} has size {s}; sizes must be > 0")
        if o < end:
            raise ValueError(f"live: block at offset {o} overlaps the previous block (which ends at {end})")
        end = o + s
    if end > cap:
        raise ValueError(f"live: blocks end at {end}, past capacity {cap}")
    return blocks


def holes(live: Any, capacity: int) -> list[tuple[int, int]]:
    """Free ranges [(offset, size)] between the live blocks, in address order."""
    out, pos = [], 0
    for o, s in _check_layout(live, capacity):
        if o > pos:
            out.append((pos, o - pos))
        pos = o + s
    if capacity > pos:
        out.append((pos, capacity - pos))
    return out


def largest_free(live: Any, capacity: int) -> int:
    """The largest contiguous free range (0 when the arena is full)."""
    return max((s for _, s in holes(live, capacity)), default=0)


def _place(victims: list[tuple[int, int]], free: list[tuple[int, int]], alignment: int) -> list[tuple[int, int, int]]:
    """Best-fit placement of ``victims`` (largest first) into ``free`` holes; [] when one does not fit."""
    free = list(free)
    moves = []
    for o, s in sorted(victims, key=lambda b: (-b[1], b[0])):
        best = None
        for i, (ho, hs) in enumerate(free):
            start = align_up(ho, alignment)
            waste = start - ho
            if hs - waste >= s and (best is None or hs < free[best][1]):
                best = i
        if best is None:
            return []
        ho, hs = free[best]
        start = align_up(ho, alignment)
        moves.append((o, start, s))
        rest = [(ho, start - ho), (start + s, ho + hs - start - s)]
        free[best : best + 1] = [h for h in rest if h[1] > 0]
    return moves


def _after(live: list[tuple[int, int]], moves: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    new = {o: n for o, n, _ in moves}
    return sorted((new.get(o, o), s) for o, s in live)


def _check_target(target: int, capacity: int) -> int:
    t = check_int("target", target)
    if not 0 < t <= capacity:
        raise ValueError(f"target: must be in 1..capacity ({capacity}), got {t}")
    return t


def plan_window(live: Any, capacity: int, target: int, alignment: int = 64) -> CompactionPlan | None:
    """Clear one window of ``target`` bytes moving the fewest live bytes; None when no window can be cleared."""
    blocks = _check_layout(live, capacity)
    target = _check_target(target, capacity)
    before = largest_free(blocks, capacity)
    if before >= target:
        return CompactionPlan([], 0, before, before, None, blocks)
    starts = sorted({0, *(align_up(o + s, alignment) for o, s in blocks)})
    candidates = []
    for w in starts:
        if w + target > capacity:
            continue
        victims = [(o, s) for o, s in blocks if o < w + target and o + s > w]
        candidates.append((sum(s for _, s in victims), w, victims))
    for cost, w, victims in sorted(candidates):
        outside = []
        for ho, hs in holes(blocks, capacity):  # the holes minus the window
            for a, b in ((ho, min(ho + hs, w)), (max(ho, w + target), ho + hs)):
                if b > a:
                    outside.append((a, b - a))
        moves = _place(victims, outside, alignment) if victims else []
        if victims and not moves:
            continue
        layout = _after(blocks, moves)
        return CompactionPlan(moves, cost, before, largest_free(layout, capacity), (w, target), layout)
    return None


def plan_greedy_ratio(
    live: Any, capacity: int, target: int, alignment: int = 64, max_moves: int | None = None
) -> CompactionPlan | None:
    """Question 222's greedy: move the block with the best freed-run / size ratio, until the target fits.

    Each block moves at most once (no ping-pong). None when the target is not reached."""
    layout = _check_layout(live, capacity)
    target = _check_target(target, capacity)
    before = largest_free(layout, capacity)
    moved: set[int] = set()  # new offsets of blocks already moved
    moves: list[tuple[int, int, int]] = []
    limit = len(layout) if max_moves is None else check_int("max_moves", max_moves)
    while largest_free(layout, capacity) < target and len(moves) < limit:
        hl = holes(layout, capacity)
        free_at = {o: s for o, s in hl}
        free_end = {o + s: s for o, s in hl}
        scored = []
        for o, s in layout:
            if o in moved:
                continue
            run = free_end.get(o, 0) + s + free_at.get(o + s, 0)
            scored.append((-run / s, o, s, run))
        found = None
        for _, o, s, run in sorted(scored):
            # destinations: holes not adjacent to the block (moving next door frees nothing) and smaller than the
            # run the move creates (filling a smaller hole to open a larger run)
            dest = [(ho, hs) for ho, hs in hl if ho + hs != o and ho != o + s and hs < run]
            mv = _place([(o, s)], dest, alignment)
            if mv:
                found = mv[0]
                break
        if found is None:
            return None
        moves.append(found)
        moved.add(found[1])
        layout = _after(layout, [found])
    after = largest_free(layout, capacity)
    if after < target:
        return None
    # a block moved twice would appear as two moves; each block moves once, so the moves compose directly
    return CompactionPlan(moves, sum(s for _, _, s in moves), before, after, None, layout)


def apply_plan(arena: np.ndarray, plan: CompactionPlan) -> None:
    """Copy each moved block's bytes to its new offset in ``arena`` (a 1-D uint8 array), in plan order.

    Destinations are holes (free at planning time and not any other move's source before it moves), so the
    copies do not clobber live data when applied in order."""
    if not isinstance(arena, np.ndarray) or arena.ndim != 1:
        raise ValueError(f"arena: expected a 1-D numpy array, got {type(arena).__name__}")
    for old, new, size in plan.moves:
        if max(old, new) + size > arena.size:
            raise ValueError(f"plan: move {old} -> {new} of {size} bytes runs past the arena ({arena.size} bytes)")
        arena[new : new + size] = arena[old : old + size].copy()
