"""Ring order on a heterogeneous network: a pipelined ring step lasts as long as its slowest hop.

    cost[i, j] = alpha_ij + (n / p) * beta_ij           # seconds to move one chunk over the hop i -> j
    ring_time(order, cost) -> (2(p-1) * max hop, sum of hops)
    order_ring(cost) -> the order found by greedy nearest neighbour from every start, then 2-opt

Choosing the order is a bottleneck travelling-salesman problem; the heuristic is exact on the small symmetric
cases of notebook 06 §5b and tests/dist/test_dist_planning.py, not in general.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _check_cost(cost: np.ndarray) -> np.ndarray:
    c = np.asarray(cost, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1] or c.shape[0] < 2:
        raise ValueError(f"cost must be a square matrix of at least 2 x 2 hop costs, got shape {c.shape}")
    off = c[~np.eye(len(c), dtype=bool)]
    if np.isnan(off).any() or (off < 0).any():
        raise ValueError("cost: off-diagonal hop costs must be >= 0 and not NaN")
    return c


def ring_time(order: Sequence[int], cost: np.ndarray) -> tuple[float, float]:
    """(time of a pipelined ring all-reduce in this order, sum of its hop costs): 2(p-1) steps, each paced by the
    slowest hop. ``order`` must be a permutation of range(p)."""
    c = np.asarray(cost, dtype=np.float64)
    p = len(order)
    if sorted(int(i) for i in order) != list(range(len(c))):
        raise ValueError(f"order must be a permutation of range({len(c)}), got {list(order)}")
    hops = [float(c[order[i], order[(i + 1) % p]]) for i in range(p)]
    return 2 * (p - 1) * max(hops), sum(hops)


def order_ring(cost: np.ndarray) -> list[int]:
    """A ring order with a small bottleneck hop: greedy nearest neighbour from every start rank (ties to the lower
    rank), each improved by 2-opt segment reversals while (bottleneck time, hop sum) decreases; the best order."""
    c = _check_cost(cost)
    p, best = len(c), None
    for start in range(p):
        order, left = [start], set(range(p)) - {start}
        while left:
            nxt = min(left, key=lambda j: (c[order[-1], j], j))
            order.append(nxt)
            left.remove(nxt)
        improved = True
        while improved:
            improved = False
            for i in range(1, p - 1):
                for j in range(i + 1, p):
                    cand = order[:i] + order[i : j + 1][::-1] + order[j + 1 :]
                    if ring_time(cand, c) < ring_time(order, c):
                        order, improved = cand, True
        if best is None or ring_time(order, c) < ring_time(best, c):
            best = order
    return best
