"""tinylearn.memory.compaction: plans are valid (no overlaps, in bounds, data preserved) and reach the target."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tinylearn.memory as M
from tinylearn.memory import compaction as C

KiB = 1 << 10


def _fragmented(seed: int, capacity: int = 256 * KiB) -> list[tuple[int, int]]:
    """Live blocks of a first-fit allocator after a random trace with frees."""
    ff = M.FirstFitAllocator(capacity)
    rng = np.random.default_rng(seed)
    live = []
    for _ in range(400):
        if live and rng.random() < 0.45:
            ff.free(live.pop(int(rng.integers(len(live)))))
        else:
            try:
                live.append(ff.malloc(int(rng.integers(1, 24)) * KiB))
            except MemoryError:
                pass
    return [(o, s) for o, s, _ in ff.live_blocks()]


def _check_valid(live: list[tuple[int, int]], capacity: int, plan: C.CompactionPlan, alignment: int = 64) -> None:
    after = plan.layout_after
    assert sorted(s for _, s in after) == sorted(s for _, s in live)  # same blocks, only offsets change
    end = 0
    for o, s in after:
        assert o >= end and o % alignment == 0
        end = o + s
    assert end <= capacity
    assert plan.bytes_moved == sum(s for _, _, s in plan.moves)
    assert plan.largest_free_after == C.largest_free(after, capacity)


def _apply_and_compare(live: list[tuple[int, int]], capacity: int, plan: C.CompactionPlan) -> None:
    rng = np.random.default_rng(1)
    arena = np.zeros(capacity, np.uint8)
    content = {}
    for o, s in live:
        content[o] = rng.integers(0, 256, s, dtype=np.uint8)
        arena[o : o + s] = content[o]
    C.apply_plan(arena, plan)
    new = {o: n for o, n, _ in plan.moves}
    for o, s in live:
        n = new.get(o, o)
        assert (arena[n : n + s] == content[o]).all(), f"block {o} -> {n} corrupted"


@pytest.mark.parametrize("seed", range(6))
def test_window_plan_reaches_target_with_valid_moves(seed: int) -> None:
    cap = 256 * KiB
    live = _fragmented(seed, cap)
    before = C.largest_free(live, cap)
    total_free = cap - sum(s for _, s in live)
    target = before + (total_free - before) // 4
    plan = C.plan_window(live, cap, target)
    assert plan is not None
    _check_valid(live, cap, plan)
    assert plan.largest_free_after >= target > before
    _apply_and_compare(live, cap, plan)
    greedy = C.plan_greedy_ratio(live, cap, target)
    if greedy is not None:
        _check_valid(live, cap, greedy)
        assert greedy.largest_free_after >= target
        _apply_and_compare(live, cap, greedy)


def test_window_plan_is_optimal_on_a_small_case() -> None:
    # brute force: the cheapest set of blocks whose removal leaves a window of `target`, placeable elsewhere
    cap, target = 64 * KiB, 20 * KiB
    live = [(0, 4 * KiB), (8 * KiB, 4 * KiB), (16 * KiB, 12 * KiB), (32 * KiB, 2 * KiB), (40 * KiB, 8 * KiB)]
    live += [(52 * KiB, 2 * KiB)]
    plan = C.plan_window(live, cap, target)
    assert plan is not None and plan.largest_free_after >= target
    best = None
    for k in range(len(live) + 1):
        for subset in itertools.combinations(live, k):
            rest = [b for b in live if b not in subset]
            if C.largest_free(rest, cap) >= target:
                cost = sum(s for _, s in subset)
                best = cost if best is None else min(best, cost)
    # removal alone is a lower bound on any plan's cost (moved blocks must also land somewhere)
    assert plan.bytes_moved == best == 10 * KiB


def test_already_fits_and_impossible() -> None:
    cap = 64 * KiB
    live = [(0, 16 * KiB), (32 * KiB, 16 * KiB)]
    p = C.plan_window(live, cap, 16 * KiB)
    assert p is not None and p.moves == [] and p.bytes_moved == 0
    assert C.plan_window(live, cap, 40 * KiB) is None  # 32 KiB free in total: no plan can make 40 contiguous
    assert C.plan_greedy_ratio(live, cap, 40 * KiB) is None
    p = C.plan_window(live, cap, 32 * KiB)
    assert p is not None and p.bytes_moved == 16 * KiB and p.largest_free_after == 32 * KiB


def test_greedy_can_fail_where_the_window_plan_succeeds() -> None:
    # the greedy ratio first moves the two 1 KiB blocks (best ratio), and the second one takes the only hole the
    # 8 KiB block could have gone to; the window plan places its victims largest first
    cap = 128 * KiB
    live = [(4 * KiB, 1 * KiB), (10 * KiB, 1 * KiB), (16 * KiB, 8 * KiB), (40 * KiB, 80 * KiB)]
    target = 38 * KiB
    w = C.plan_window(live, cap, target)
    g = C.plan_greedy_ratio(live, cap, target)
    assert w is not None and w.largest_free_after >= target and w.bytes_moved == 10 * KiB
    assert g is None


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="overlaps"):
        C.plan_window([(0, 100), (50, 100)], 1000, 10)
    with pytest.raises(ValueError, match="past capacity"):
        C.largest_free([(900, 200)], 1000)
    with pytest.raises(ValueError, match="target"):
        C.plan_window([(0, 100)], 1000, 2000)
    with pytest.raises(ValueError, match="size"):
        C.holes([(0, 0)], 1000)
    with pytest.raises(ValueError, match="capacity"):
        C.holes([], 0)
    with pytest.raises(ValueError, match="arena"):
        C.apply_plan(np.zeros((2, 2), np.uint8), C.CompactionPlan([], 0, 0, 0))
