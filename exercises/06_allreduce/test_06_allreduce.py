"""Checks for exercises/06_allreduce (run with --impl=reference to see tinylearn's answers pass)."""

from __future__ import annotations

import math

import pytest
import torch


def test_ring_schedule_small_cases(impl) -> None:
    # p = 3: reduce-scatter steps 0, 1 then all-gather steps 2, 3
    assert [impl.ring_schedule(0, s, 3) for s in range(4)] == [(0, 2), (2, 1), (1, 0), (0, 2)]
    assert [impl.ring_schedule(1, s, 3) for s in range(4)] == [(1, 0), (0, 2), (2, 1), (1, 0)]
    assert impl.ring_schedule(0, 0, 2) == (0, 1) and impl.ring_schedule(0, 1, 2) == (1, 0)
    with pytest.raises(ValueError):
        impl.ring_schedule(0, 4, 3)


def test_ring_schedule_is_a_valid_ring(impl) -> None:
    for p in (2, 4, 5, 8):
        owned_after_rs = []
        for r in range(p):
            for s in range(2 * (p - 1)):
                send, recv = impl.ring_schedule(r, s, p)
                assert recv == impl.ring_schedule((r - 1) % p, s, p)[0]  # left neighbour sends what I receive
                if s + 1 < 2 * (p - 1):
                    assert impl.ring_schedule(r, s + 1, p)[0] == recv  # forwarded at the next step
            owned_after_rs.append(impl.ring_schedule(r, p - 2, p)[1])
        assert sorted(owned_after_rs) == list(range(p))  # every chunk fully reduced on exactly one rank


def test_ring_vs_tree_cost(impl) -> None:
    a, b = 1e-5, 1e-9
    assert impl.ring_cost(1 << 20, 4, a, b) == pytest.approx(6 * a + 1.5 * (1 << 20) * b)
    assert impl.tree_cost(1 << 20, 4, a, b) == pytest.approx(4 * (a + (1 << 20) * b))
    assert impl.tree_cost(1000, 5, a, b) == pytest.approx(6 * (a + 1000 * b))  # ceil(log2 5) = 3 rounds each way
    assert impl.ring_cost(123, 1, a, b) == 0 and impl.tree_cost(123, 1, a, b) == 0
    # small messages: tree (fewer latencies) wins at p = 64; large: ring (fewer bytes) wins
    assert impl.tree_cost(64, 64, a, b) < impl.ring_cost(64, 64, a, b)
    assert impl.ring_cost(1 << 28, 64, a, b) < impl.tree_cost(1 << 28, 64, a, b)


def test_recursive_doubling_partner(impl) -> None:
    assert [impl.recursive_doubling_partner(r, 0, 8) for r in range(8)] == [1, 0, 3, 2, 5, 4, 7, 6]
    assert [impl.recursive_doubling_partner(r, 2, 8) for r in range(8)] == [4, 5, 6, 7, 0, 1, 2, 3]
    assert impl.recursive_doubling_partner(5, 1, 6) is None  # folded away (p2 = 4)
    assert impl.recursive_doubling_partner(3, 1, 6) == 1
    for p in (2, 4, 16):
        for k in range(int(math.log2(p))):
            for r in range(p):
                q = impl.recursive_doubling_partner(r, k, p)
                assert impl.recursive_doubling_partner(q, k, p) == r


def test_assign_buckets(impl) -> None:
    assert impl.assign_buckets([10, 20, 30, 40], 50) == [[3], [2, 1], [0]]
    assert impl.assign_buckets([4, 4, 4, 4], 8) == [[3, 2], [1, 0]]
    assert impl.assign_buckets([100, 1, 1], 50) == [[2, 1], [0]]
    assert impl.assign_buckets([], 10) == []
    with pytest.raises(ValueError):
        impl.assign_buckets([1], 0)


def test_topk_error_feedback(impl) -> None:
    g = torch.tensor([0.1, -3.0, 0.5, 2.0, -0.2])
    idx, vals, res = impl.topk_error_feedback(g, torch.zeros(5), 2)
    order = torch.argsort(idx)
    assert idx[order].tolist() == [1, 3] and vals[order].tolist() == [-3.0, 2.0]
    assert torch.equal(res, torch.tensor([0.1, 0.0, 0.5, 0.0, -0.2]))
    # the residual is added back: 0.5 now wins even though the new gradient is small
    idx, vals, res2 = impl.topk_error_feedback(torch.tensor([0.0, 0.1, 0.0, 0.1, 0.0]), res, 1)
    assert idx.tolist() == [2] and vals.tolist() == [0.5]
    assert torch.allclose(res2, torch.tensor([0.1, 0.1, 0.0, 0.1, -0.2]))
    # nothing is lost: sent + residual == grad + old residual
    torch.manual_seed(0)
    g, r = torch.randn(100), torch.randn(100)
    idx, vals, new = impl.topk_error_feedback(g, r, 10)
    dense = torch.zeros(100)
    dense[idx] = vals
    assert torch.allclose(dense + new, g + r)
