"""Concurrent-kernel interference [Q228]: measured pairs have the right rows and positive times, the linear model
fits known data exactly, leave-one-out runs, and order_by_interference finds the best pairing (checked against brute
force on a known cost). No timing is asserted."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tinylearn.tune import interference as itf


def test_measure_pairs_rows() -> None:
    ks = itf.default_kernels()[:3]
    rows = itf.measure_pairs(ks, target_s=0.002, repeat=1)
    assert len(rows) == 6  # 3 kernels: 3 self-pairs + 3 distinct pairs
    assert {(r["a"], r["b"]) for r in rows} == {(ks[i].name, ks[j].name) for i in range(3) for j in range(i, 3)}
    for r in rows:
        assert r["alone_a_s"] > 0 and r["pair_a_s"] > 0 and r["slowdown"] > 0
    assert all(k.alone_s is not None and k.alone_s > 0 for k in ks)
    model, x, y = itf.fit_from_rows(ks, rows)
    assert x.shape == (6, len(itf.FEATURES)) and np.isfinite(model.predict(x)).all()
    pairs = itf.order_by_interference(ks, model)
    assert len(pairs) == 2 and pairs[-1][1] == ""  # odd count: one kernel runs alone


def test_pair_features_are_symmetric_and_follow_definitions() -> None:
    a = itf.Kernel("stream", lambda: None, flops=1e6, bytes=8e6, working_set=8e6, alone_s=1e-3)
    b = itf.Kernel("compute", lambda: None, flops=1e9, bytes=1e6, working_set=5e5, alone_s=1e-2)
    fab, fba = itf.pair_features(a, b), itf.pair_features(b, a)
    np.testing.assert_allclose(fab, fba)
    bpf_a, bpf_b = 4.0, 1e-3  # 8 bytes per flop is capped at 4
    gil = itf.GIL_S / 1e-3 + itf.GIL_S / 1e-2
    np.testing.assert_allclose(fab, [bpf_a + bpf_b, bpf_a * bpf_b, (8e6 / 2**20) * (5e5 / 2**20), gil])


def test_linear_model_recovers_a_linear_slowdown() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 3))
    y = 1.0 + x @ np.array([0.5, -0.2, 0.1]) + 0.3
    m = itf.InterferenceModel(ridge=0.0).fit(x, y)
    np.testing.assert_allclose(m.predict(x), y, rtol=1e-9, atol=1e-9)
    loo = itf.loo_error(x, y, ridge=0.0)
    assert loo["model_mae"] < 1e-8 < loo["mean_baseline_mae"]


def test_order_by_interference_is_the_best_matching() -> None:
    ks = [itf.Kernel(f"k{i}", lambda: None, 1.0, 1.0, 1.0) for i in range(6)]
    rng = np.random.default_rng(3)
    table = {frozenset(p): float(v) for p, v in zip(itertools.combinations(range(6), 2), rng.uniform(1, 3, 15))}

    def cost(a: itf.Kernel, b: itf.Kernel) -> float:
        return table[frozenset((int(a.name[1:]), int(b.name[1:])))]

    pairs = itf.order_by_interference(ks, cost)
    assert len(pairs) == 3 and [p[2] for p in pairs] == sorted(p[2] for p in pairs)
    names = [n for p in pairs for n in p[:2]]
    assert sorted(names) == sorted(k.name for k in ks)
    brute = min(sum(table[frozenset(p)] for p in m) for m in itf._matchings(list(range(6))))
    assert sum(p[2] for p in pairs) == pytest.approx(brute)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="^kernels: "):
        itf.measure_pairs(itf.default_kernels()[:1])
    with pytest.raises(ValueError, match="^scale: "):
        itf.default_kernels(0)
    with pytest.raises(ValueError, match="^k: "):
        itf.kernel_features(itf.Kernel("x", lambda: None, 1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="^ridge: "):
        itf.InterferenceModel(ridge=-1)
    with pytest.raises(ValueError, match="^self: "):
        itf.InterferenceModel().predict(np.ones((1, 3)))
    with pytest.raises(ValueError, match="^x: "):
        itf.loo_error(np.ones((2, 3)), np.ones(2))
