"""Static memory planning: given every tensor's (size, first_use, last_use), assign offsets before running.

Two tensors *conflict* when their closed use intervals intersect (a.first <= b.last and b.first <= a.last); a
plan is valid when conflicting tensors get disjoint byte ranges. peak = max(offset + size).

    lower bound  = max over time t of the sum of sizes live at t        (no plan can beat it)

Strategies (both O(n^2) in the worst case, n = number of tensors):
    "size"      greedy by size (TFLite's GreedyBySize): largest tensor first; among the already placed tensors
                that conflict with it, put it in the smallest gap that fits (best fit), else above them all
    "interval"  interval colouring / offline first fit: tensors in order of first_use; each at the lowest
                offset not overlapping a conflicting placed tensor
    "breadth"   greedy by breadth (TFLite's GreedyByBreadth, Pisarchyk & Lee 2020): time steps in order of the
                bytes live at them, widest first; at each, its not yet placed tensors largest first, best fit. A
                tensor is therefore placed at the widest step of its lifetime: the order is (-breadth of that
                step, step, -size)
    "best"      run all three, keep the plan with the lowest peak (ties -> the first of size, interval, breadth)
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import align_up, check_int, check_power_of_two

Lifetime = tuple[int, int, int]


def _check(lifetimes: Sequence[Sequence[int]]) -> list[Lifetime]:
    out = []
    for i, item in enumerate(lifetimes):
        try:
            size, first, last = item
        except (TypeError, ValueError):
            raise ValueError(f"lifetimes[{i}]: expected (size, first_use, last_use), got {item!r}") from None
        size, first, last = check_int("size", size), check_int("first_use", first), check_int("last_use", last)
        if size <= 0:
            raise ValueError(f"lifetimes[{i}]: size must be positive, got {size}")
        if first > last:
            raise ValueError(f"lifetimes[{i}]: first_use={first} is after last_use={last}")
        out.append((size, first, last))
    return out


def lower_bound(lifetimes: Sequence[Sequence[int]], alignment: int = 1) -> int:
    """max_t sum(size of tensors live at t) with sizes rounded up to ``alignment``."""
    lts = _check(lifetimes)
    alignment = check_power_of_two("alignment", alignment)
    events = sorted(
        [(f, 0, align_up(s, alignment)) for s, f, _ in lts] + [(last, 1, -align_up(s, alignment)) for s, _, last in lts]
    )
    live = best = 0
    for _, _, delta in events:  # at equal times, allocations (0) come before releases (1): closed intervals
        live += delta
        best = max(best, live)
    return best


def _conflicts(a: Lifetime, b: Lifetime) -> bool:
    return a[1] <= b[2] and b[1] <= a[2]


def _place(size: int, busy: list[tuple[int, int]], best_fit: bool) -> int:
    """Lowest (first fit) or tightest (best fit) offset for ``size`` bytes avoiding the ``busy`` ranges."""
    best_off, best_gap, cursor = None, None, 0
    for off, end in sorted(busy):
        gap = off - cursor
        if gap >= size:
            if not best_fit:
                return cursor
            if best_gap is None or gap < best_gap:
                best_off, best_gap = cursor, gap
        cursor = max(cursor, end)
    return cursor if best_off is None else best_off


def _breadth_order(lts: list[Lifetime]) -> list[int]:
    """Tensors in greedy-by-breadth order: by the widest step of their lifetime (bytes live there, descending),
    then that step, then size descending."""
    if not lts:
        return []
    import numpy as np

    size, first, last = (np.array(c, dtype=np.int64) for c in zip(*lts, strict=True))
    times = np.unique(np.concatenate([first, last]))
    f, la = np.searchsorted(times, first), np.searchsorted(times, last)
    delta = np.zeros(len(times) + 1, np.int64)
    np.add.at(delta, f, size)
    np.add.at(delta, la + 1, -size)
    breadth = np.cumsum(delta)[:-1]  # bytes live at each distinct time
    top = [int(f[i] + np.argmax(breadth[f[i] : la[i] + 1])) for i in range(len(lts))]
    return sorted(range(len(lts)), key=lambda i: (-int(breadth[top[i]]), top[i], -lts[i][0], i))


def plan_greedy(lifetimes: Sequence[Sequence[int]], strategy: str = "size", alignment: int = 1) -> list[int]:
    """Offsets for one strategy ("size", "interval" or "breadth"); see the module docstring."""
    lts = _check(lifetimes)
    alignment = check_power_of_two("alignment", alignment)
    if strategy == "size":
        order = sorted(range(len(lts)), key=lambda i: (-lts[i][0], lts[i][1], i))
    elif strategy == "interval":
        order = sorted(range(len(lts)), key=lambda i: (lts[i][1], -lts[i][0], i))
    elif strategy == "breadth":
        order = _breadth_order(lts)
    else:
        raise ValueError(f"strategy: expected 'size', 'interval', 'breadth' or 'best', got {strategy!r}")
    offsets: list[int | None] = [None] * len(lts)
    placed: list[int] = []
    for i in order:
        size = align_up(lts[i][0], alignment)
        busy = []
        for j in placed:
            if _conflicts(lts[i], lts[j]):
                busy.append((offsets[j], offsets[j] + align_up(lts[j][0], alignment)))
        offsets[i] = _place(size, busy, best_fit=strategy != "interval")
        placed.append(i)
    return [int(o) for o in offsets]


def plan(lifetimes: Sequence[Sequence[int]], strategy: str = "best", alignment: int = 1) -> tuple[list[int], int]:
    """Static plan: (offsets, peak) with peak = max(offset + size); offsets are multiples of ``alignment``.

    ``lifetimes``: [(size_bytes, first_use, last_use)], uses inclusive. ValueError on size <= 0 or
    first_use > last_use."""
    lts = _check(lifetimes)
    if not lts:
        return [], 0
    strategies = ("size", "interval", "breadth") if strategy == "best" else (strategy,)
    best: tuple[list[int], int] | None = None
    for s in strategies:
        offs = plan_greedy(lts, s, alignment)
        peak = max(o + s_ for o, (s_, _, _) in zip(offs, lts))
        if best is None or peak < best[1]:
            best = (offs, peak)
    assert best is not None
    return best


def check_plan(lifetimes: Sequence[Sequence[int]], offsets: Sequence[int]) -> None:
    """AssertionError naming the pair if two conflicting tensors overlap in memory."""
    lts = _check(lifetimes)
    order = sorted(range(len(lts)), key=lambda i: offsets[i])
    for a_i, a in enumerate(order):
        for b in order[a_i + 1 :]:
            if offsets[b] >= offsets[a] + lts[a][0]:
                break
            if _conflicts(lts[a], lts[b]):
                raise AssertionError(f"tensors {a} and {b} are live together and overlap in memory")
