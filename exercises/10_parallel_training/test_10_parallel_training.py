"""Checks for exercises/10_parallel_training (run with --impl=reference to see tinylearn's answers pass)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def test_shard_bounds(impl) -> None:
    assert [impl.shard_bounds(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [impl.shard_bounds(8, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert [impl.shard_bounds(2, 4, r) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert impl.shard_bounds(0, 3, 1) == (0, 0)
    with pytest.raises(ValueError):
        impl.shard_bounds(10, 4, 4)


def test_shard_and_consolidate_adam_state(impl) -> None:
    p = torch.nn.Parameter(torch.randn(3, 5, generator=torch.Generator().manual_seed(0)))
    opt = torch.optim.Adam([p], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        (p**2).sum().backward()
        opt.step()
    st = opt.state[p]
    for n in (1, 2, 4, 7):
        shards = [impl.shard_state(st, n, r) for r in range(n)]
        assert sum(s["exp_avg"].numel() for s in shards) == 15
        assert all(s["step"] == st["step"] for s in shards)
        assert shards[0]["exp_avg"].numel() == -(-15 // n)  # ceil(15 / n)
        full = impl.consolidate(shards, (3, 5))
        assert torch.equal(full["exp_avg"], st["exp_avg"]) and torch.equal(full["exp_avg_sq"], st["exp_avg_sq"])
        assert full["exp_avg"].shape == (3, 5)


def test_zero_bytes(impl) -> None:
    psi = 7_500_000_000
    got = [impl.zero_bytes_per_rank(psi, s, 64) / 1e9 for s in range(4)]
    assert got == pytest.approx([120.0, 31.40625, 16.640625, 1.875])
    assert impl.zero_bytes_per_rank(1000, 3, 1) == 16000


def test_one_f_one_b(impl) -> None:
    assert impl.one_f_one_b(2, 3) == [
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)],
    ]
    for p, m in ((1, 3), (3, 2), (4, 8)):
        sched = impl.one_f_one_b(p, m)
        assert len(sched) == p
        for s, ops in enumerate(sched):
            assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
            held = peak = 0
            for kind, mb in ops:
                if kind == "B":
                    assert ops.index(("F", mb)) < ops.index(("B", mb))
                held += 1 if kind == "F" else -1
                peak = max(peak, held)
            assert peak == min(p - s, m)  # 1F1B: stage s holds at most p - s microbatches


def test_bubble(impl) -> None:
    assert impl.bubble(4, 8) == pytest.approx(3 / 11)
    assert impl.bubble(1, 5) == 0
    assert impl.bubble(4, 8, 2) == pytest.approx(3 / 19)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_column_and_row_parallel(impl, n: int) -> None:
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(3, 6, 8, generator=g), torch.randn(12, 8, generator=g), torch.randn(12, generator=g)
    parts, y = impl.column_parallel_forward(x, w, b, n)
    assert len(parts) == n and all(p.shape == (3, 6, 12 // n) for p in parts)
    torch.testing.assert_close(y, F.linear(x, w, b))
    w2, b2 = torch.randn(5, 12, generator=g), torch.randn(5, generator=g)
    parts2, y2 = impl.row_parallel_forward(y, w2, b2, n)
    assert len(parts2) == n and all(p.shape == (3, 6, 5) for p in parts2)
    torch.testing.assert_close(y2, F.linear(y, w2, b2))
    # the bias is added once, after the reduction, not by every rank
    torch.testing.assert_close(sum(parts2) + b2, y2)
