"""Tests for exercises/09_llm_inference (run with --impl=reference to check tinylearn's answers)."""

from __future__ import annotations

import numpy as np
import pytest


def test_kv_append_gather(impl) -> None:
    rng = np.random.default_rng(0)
    kc, vc = np.zeros((2, 3, 10, 4), np.float32), np.zeros((2, 3, 10, 4), np.float32)
    k1, v1 = rng.standard_normal((2, 3, 6, 4)), rng.standard_normal((2, 3, 6, 4))
    k2, v2 = rng.standard_normal((2, 3, 1, 4)), rng.standard_normal((2, 3, 1, 4))
    n = impl.kv_append(kc, vc, 0, k1, v1)
    assert n == 6
    n = impl.kv_append(kc, vc, n, k2, v2)
    assert n == 7
    k, v = impl.kv_gather(kc, vc, n)
    assert k.shape == v.shape == (2, 3, 7, 4)
    np.testing.assert_allclose(k, np.concatenate([k1, k2], axis=2), rtol=1e-6)
    np.testing.assert_allclose(v, np.concatenate([v1, v2], axis=2), rtol=1e-6)
    with pytest.raises(ValueError, match="max_len"):
        impl.kv_append(kc, vc, n, k1, v1)


def test_top_p(impl) -> None:
    p = np.array([0.05, 0.5, 0.15, 0.3])
    np.testing.assert_allclose(impl.top_p_filter(p, 0.6), [0, 0.625, 0, 0.375])
    np.testing.assert_allclose(impl.top_p_filter(p, 0.5), [0, 1, 0, 0])  # 0.5 >= 0.5: one token suffices
    np.testing.assert_allclose(impl.top_p_filter(p, 1e-9), [0, 1, 0, 0])  # always at least one token
    np.testing.assert_allclose(impl.top_p_filter(p, 1.0), p)
    q = np.random.default_rng(1).dirichlet(np.ones(50))
    out = impl.top_p_filter(q, 0.9)
    kept = out > 0
    assert abs(out.sum() - 1) < 1e-12 and q[kept].sum() >= 0.9
    assert q[kept].sum() - q[kept].min() < 0.9  # minimal: dropping the least likely kept token falls below p
    assert q[kept].min() >= q[~kept].max()


def test_acceptance_rule(impl) -> None:
    assert impl.accept_draft(0.3, 0.1, 0.999)  # p >= q: always accepted
    assert impl.accept_draft(0.1, 0.4, 0.2) and not impl.accept_draft(0.1, 0.4, 0.3)  # prob 0.25
    p, q = np.array([0.5, 0.2, 0.3]), np.array([0.2, 0.5, 0.3])
    np.testing.assert_allclose(impl.residual_distribution(p, q), [1, 0, 0])
    rng = np.random.default_rng(2)
    for _ in range(10):  # the rule reproduces p exactly
        p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
        acc = np.array([q[x] * (p[x] / q[x] if p[x] < q[x] else 1) for x in range(5)])
        np.testing.assert_allclose(acc + (1 - acc.sum()) * impl.residual_distribution(p, q), p, atol=1e-12)


def test_block_table(impl) -> None:
    assert [impl.blocks_needed(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]
    table = [7, 2, 9]
    assert impl.locate(table, 4, 0) == (7, 0)
    assert impl.locate(table, 4, 5) == (2, 1)
    assert impl.locate(table, 4, 11) == (9, 3)
    with pytest.raises(ValueError):
        impl.locate(table, 4, 12)
    assert impl.kv_bytes_per_token(32, 8, 128, "float32") == 2 * 32 * 8 * 128 * 4  # Llama-3-8B-like: 256 KiB
    assert impl.kv_bytes_per_token(2, 4, 64, "int8") == 2 * 2 * 4 * (64 + 4)
