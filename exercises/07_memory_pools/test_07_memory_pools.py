"""Tests for exercises/07_memory_pools (run with --impl=reference to check tinylearn's answers)."""

from __future__ import annotations

import numpy as np
import pytest


def test_buddy_address(impl) -> None:
    assert impl.buddy_address(512, 256) == 768
    assert impl.buddy_address(768, 256) == 512
    assert impl.buddy_address(0, 1024) == 1024
    assert impl.buddy_address(3 << 20, 1 << 20) == 2 << 20
    for off in range(0, 1 << 14, 2048):  # buddy of the buddy is the block itself; the pair forms the parent
        b = impl.buddy_address(off, 2048)
        assert impl.buddy_address(b, 2048) == off and min(off, b) % 4096 == 0


def test_split_block(impl) -> None:
    assert impl.split_block(4096, 4096) == ((4096, 2048), (6144, 2048))
    lo, hi = impl.split_block(0, 1 << 20)
    assert impl.buddy_address(*lo) == hi[0]


def test_buddy_free_merges_up(impl) -> None:
    free = {256: {256}, 512: {512}, 1024: set()}
    assert impl.buddy_free(free, 0, 256) == (0, 1024)  # 0+256 -> 512 block, + its buddy 512 -> 1024 at 0
    assert free[256] == set() and free[512] == set() and free[1024] == {0}
    free = {256: {768}}
    assert impl.buddy_free(free, 256, 256) == (256, 256)  # 768 is not 256's buddy (that is 0)
    assert free[256] == {256, 768}


def test_first_fit(impl) -> None:
    holes = [(0, 64), (128, 512), (1024, 256)]
    off, new = impl.first_fit(holes, 200)
    assert off == 128 and new == [(0, 64), (328, 312), (1024, 256)]
    assert holes == [(0, 64), (128, 512), (1024, 256)]  # input untouched
    off, new = impl.first_fit(holes, 64)
    assert off == 0 and new == [(128, 512), (1024, 256)]
    assert impl.first_fit(holes, 513) == (None, holes)


def test_insert_hole_coalesces(impl) -> None:
    holes = [(0, 64), (128, 64)]
    assert impl.insert_hole(holes, 64, 64) == [(0, 192)]  # both sides
    assert impl.insert_hole(holes, 192, 8) == [(0, 64), (128, 72)]  # below only
    assert impl.insert_hole(holes, 100, 28) == [(0, 64), (100, 92)]  # above only
    assert impl.insert_hole(holes, 300, 8) == [(0, 64), (128, 64), (300, 8)]
    with pytest.raises(ValueError, match="160"):
        impl.insert_hole(holes, 160, 8)  # double free


def test_first_fit_and_free_roundtrip(impl) -> None:
    rng = np.random.default_rng(0)
    holes, live = [(0, 1 << 16)], []
    for _ in range(400):
        if live and rng.random() < 0.5:
            off, n = live.pop(int(rng.integers(len(live))))
            holes = impl.insert_hole(holes, off, n)
        else:
            n = int(rng.integers(1, 2000))
            off, new = impl.first_fit(holes, n)
            if off is not None:
                holes = new
                live.append((off, n))
    for off, n in live:
        holes = impl.insert_hole(holes, off, n)
    assert holes == [(0, 1 << 16)]


def test_round_size(impl) -> None:
    assert [impl.round_size(n) for n in (1, 511, 512, 513, 1000, 4096)] == [512, 512, 512, 1024, 1024, 4096]
    assert impl.round_size(100, round_to=64) == 128


def test_fragmentation(impl) -> None:
    assert impl.fragmentation([]) == 0.0
    assert impl.fragmentation([4096]) == 0.0
    assert impl.fragmentation([1024] * 4) == pytest.approx(0.75)
    assert impl.fragmentation([3000, 1000]) == pytest.approx(0.25)


def test_greedy_plan(impl) -> None:
    assert impl.greedy_plan([(100, 0, 1), (100, 2, 3)]) == ([0, 0], 100)
    rng = np.random.default_rng(1)
    lts = []
    for _ in range(120):
        first = int(rng.integers(0, 60))
        lts.append((int(rng.integers(16, 5000)), first, first + int(rng.integers(0, 10))))
    offsets, peak = impl.greedy_plan(lts)
    for i, (si, fi, li) in enumerate(lts):
        for j, (sj, fj, lj) in enumerate(lts[:i]):
            if fi <= lj and fj <= li:
                assert offsets[i] + si <= offsets[j] or offsets[j] + sj <= offsets[i], (i, j)
    live_max = max(sum(s for s, f, la in lts if f <= t <= la) for t in range(80))
    assert peak == max(o + s for o, (s, _, _) in zip(offsets, lts))
    assert live_max <= peak <= 1.2 * live_max
