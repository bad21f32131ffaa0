"""tinylearn.dist.ring_order and tinylearn.dist.chunking: ring order on heterogeneous links, adaptive chunking."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tinylearn.dist.chunking import adaptive_chunk, chunked_all_reduce, transfer_end
from tinylearn.dist.ring_order import order_ring, ring_time


def _racks(p: int = 8, racks: int = 4, slow_pairs: tuple[tuple[int, int], ...] = ((0, 1), (2, 3))) -> np.ndarray:
    rack = np.arange(p) % racks
    inter = np.full((racks, racks), 25.0)
    for a, b in slow_pairs:
        inter[a, b] = inter[b, a] = 12.5
    bw = np.where(rack[:, None] == rack[None, :], 150.0, inter[rack[:, None], rack[None, :]]) * 1e9
    cost = 2e-6 + (1 << 20) / bw
    np.fill_diagonal(cost, np.inf)
    return cost


def test_ring_time_is_two_p_minus_one_times_the_slowest_hop() -> None:
    cost = np.array([[0, 1.0, 5.0], [1.0, 0, 2.0], [5.0, 2.0, 0]])
    assert ring_time([0, 1, 2], cost) == (2 * 2 * 5.0, 1.0 + 2.0 + 5.0)
    assert ring_time([2, 1, 0], cost) == (20.0, 8.0)


def test_order_ring_matches_brute_force_on_8_ranks() -> None:
    cost = _racks()
    best = min(ring_time([0, *perm], cost) for perm in itertools.permutations(range(1, 8)))
    found = order_ring(cost)
    assert sorted(found) == list(range(8))
    assert ring_time(found, cost)[0] == pytest.approx(best[0])  # the optimal bottleneck
    assert ring_time(found, cost)[0] < ring_time(list(range(8)), cost)[0] / 1.9  # identity crosses the slow pairs


def test_order_ring_avoids_slow_pairs_on_16_ranks() -> None:
    cost = _racks(16)
    found = order_ring(cost)
    rack = np.arange(16) % 4
    crossings = [(rack[found[i]], rack[found[(i + 1) % 16]]) for i in range(16)]
    assert sum(a != b for a, b in crossings) == 4
    assert not any({a, b} in ({0, 1}, {2, 3}) for a, b in crossings)


def test_ring_order_bad_input() -> None:
    with pytest.raises(ValueError, match="cost"):
        order_ring(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="cost"):
        order_ring(np.array([[0, -1.0], [1.0, 0]]))
    with pytest.raises(ValueError, match="order"):
        ring_time([0, 0, 1], np.ones((3, 3)))


def _steady(bw: float):
    return lambda t: (bw, float("inf"))


def test_transfer_end_piecewise() -> None:
    def bw_at(t: float) -> tuple[float, float]:
        return (10.0, 1.0) if t < 1.0 else (1.0, float("inf"))

    assert transfer_end(0.0, 5.0, bw_at) == pytest.approx(0.5)
    assert transfer_end(0.0, 12.0, bw_at) == pytest.approx(3.0)  # 10 bytes in the first second, 2 at 1 B/s
    assert transfer_end(2.0, 0.0, bw_at) == 2.0
    with pytest.raises(ValueError, match="bw_at"):
        transfer_end(0.0, 1.0, lambda t: (0.0, 1.0))


def test_one_chunk_finishes_after_backward_plus_the_transfer() -> None:
    n, backward, alpha = 1000, 1.0, 0.01
    done, sizes = chunked_all_reduce(n, backward, alpha, _steady(100.0), lambda e: n)
    assert sizes == [n] and done == pytest.approx(backward + alpha + n / 100.0)


def test_chunks_overlap_backward() -> None:
    n, backward, alpha = 1000, 1.0, 1e-4
    done, sizes = chunked_all_reduce(n, backward, alpha, _steady(1e4), lambda e: 100)
    assert sizes == [100] * 10
    assert done == pytest.approx(backward + alpha + 100 / 1e4)  # only the last chunk is left after backward


def test_adaptive_chunk_tracks_bandwidth() -> None:
    alpha, f = 20e-6, 0.1
    chunk_of = adaptive_chunk(alpha, f)
    assert chunk_of(None) == 1 << 20
    assert chunk_of(25e9) == int(alpha * 25e9 * 0.9 / 0.1)  # ~9 alpha of transfer at the estimate
    assert chunk_of(1.0) == 256 << 10 and chunk_of(1e15) == 64 << 20  # clipped
    with pytest.raises(ValueError, match="overhead"):
        adaptive_chunk(alpha, 1.5)


def test_chunked_all_reduce_bad_input() -> None:
    with pytest.raises(ValueError, match="n="):
        chunked_all_reduce(0, 1.0, 0.0, _steady(1.0), lambda e: 1)
    with pytest.raises(ValueError, match="chunk"):
        chunked_all_reduce(10, 1.0, 0.0, _steady(1.0), lambda e: 0)
