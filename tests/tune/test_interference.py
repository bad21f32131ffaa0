"""Concurrent-kernel interference [Q228]: the two worker processes start, run kernels alone and in pairs, and stop
cleanly (also after an error); measured pairs have the right rows and positive times; features follow their
definitions; the linear model fits known data exactly and leave-one-out beats the mean on data with a signal;
order_by_interference finds the best pairing (checked against brute force). No timing is asserted."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from tinylearn.tune import interference as itf


def _small() -> list[itf.Kernel]:
    """Two cheap default kernels (GEMM 192 and the cached GEMM 64), rebuilt by index in the workers."""
    return itf.default_kernels()[:2]


def test_workers_start_run_and_stop() -> None:
    ks = _small()
    with itf.PairWorkers(ks, timeout_s=60) as pw:
        procs = list(pw._procs)
        assert len(procs) == 2 and all(p.is_alive() for p in procs)
        if len(os.sched_getaffinity(0)) >= 2:
            assert pw.cpus == sorted(os.sched_getaffinity(0))[:2]
        assert pw.run(0, 0, 2) > 0 and pw.run(1, 1, 2) > 0
        a, b = pw.run_pair(0, 2, 1, 3)
        assert a > 0 and b > 0 and pw.bandwidth() > 0
    assert all(not p.is_alive() and p.exitcode == 0 for p in procs)


def test_worker_error_is_raised_and_workers_stop() -> None:
    def boom() -> None:
        raise ArithmeticError("boom")

    ks = [*_small(), itf.Kernel("boom", boom, 1.0, 1.0, 1.0)]  # no origin: the forked worker inherits it
    with pytest.raises(RuntimeError, match="boom"), itf.PairWorkers(ks, timeout_s=20) as pw:
        procs = list(pw._procs)
        pw.run(0, 2, 1)
    assert all(not p.is_alive() for p in procs)


def test_measure_pairs_rows() -> None:
    ks = _small()
    rows = itf.measure_pairs(ks, target_s=0.002, repeat=1)
    assert [(r["a"], r["b"]) for r in rows] == [(ks[0].name, ks[0].name), (ks[0].name, ks[1].name),
                                                (ks[1].name, ks[1].name)]  # fmt: skip
    for r in rows:
        assert r["alone_a_s"] > 0 and r["pair_b_s"] > 0 and r["slowdown"] > 0 and r["reps_a"] >= 1
    assert all(k.alone_s is not None and k.alone_s > 0 and k.bw_demand == 0.0 for k in ks)  # both fit L2
    model, x, y = itf.fit_from_rows(ks, rows)
    assert x.shape == (3, len(itf.FEATURES)) and np.isfinite(model.predict(x)).all()
    assert len(itf.order_by_interference(ks, model)) == 1


def test_pair_features_follow_definitions() -> None:
    mib = 2**20
    stream = itf.Kernel("stream", lambda: None, flops=1e6, bytes=64 * mib, working_set=64 * mib, alone_s=1e-2)
    llc = itf.Kernel("llc", lambda: None, flops=1e6, bytes=4 * mib, working_set=4 * mib, alone_s=1e-4)
    cached = itf.Kernel("cached", lambda: None, flops=1e9, bytes=1e5, working_set=1e5, alone_s=1e-3)
    bw = 10e9
    for k in (stream, llc, cached):
        k.bw_demand = itf.bandwidth_demand(k, bw, l2=mib)
    assert stream.bw_demand == pytest.approx(64 * mib / 1e-2 / bw)  # 0.67 of the DRAM bandwidth
    assert llc.bw_demand == 1.0 and cached.bw_demand == 0.0  # clipped; fits L2
    f = itf.pair_features(stream, llc, l2=mib, llc=32 * mib)
    np.testing.assert_allclose(f, [stream.bw_demand, 1.0, 1.0])
    np.testing.assert_allclose(itf.pair_features(llc, stream, l2=mib, llc=32 * mib), f)
    np.testing.assert_allclose(itf.pair_features(llc, llc, l2=mib, llc=32 * mib), [1.0, 1.0, 0.0])
    np.testing.assert_allclose(itf.pair_features(cached, stream, l2=mib, llc=32 * mib), [0.0, 0.0, 0.0])


def test_linear_model_recovers_a_linear_slowdown() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 3))
    y = 1.0 + x @ np.array([0.5, -0.2, 0.1]) + 0.3
    m = itf.InterferenceModel(ridge=0.0).fit(x, y)
    np.testing.assert_allclose(m.predict(x), y, rtol=1e-9, atol=1e-9)
    loo = itf.loo_error(x, y, ridge=0.0)
    assert loo["model_mae"] < 1e-8 < loo["mean_baseline_mae"]
    noisy = y + 0.05 * rng.standard_normal(20)
    loo = itf.loo_error(x, noisy)  # default ridge, a real signal plus noise: still far better than the mean
    assert loo["model_mae"] < 0.5 * loo["mean_baseline_mae"]


def test_constant_feature_is_harmless() -> None:
    x = np.array([[0.0, 1.0], [0.5, 1.0], [1.0, 1.0], [0.2, 1.0]])
    y = 1.0 + 0.4 * x[:, 0]
    np.testing.assert_allclose(itf.InterferenceModel(ridge=0.0).fit(x, y).predict(x), y, atol=1e-9)


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
    odd = itf.order_by_interference(ks[:5], cost)
    assert len(odd) == 3 and odd[-1][1] == "" and odd[-1][2] == 1.0  # odd count: one kernel runs alone


def test_bad_input() -> None:
    ks = _small()
    no_origin = itf.Kernel("x", lambda: None, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="^kernels: "):
        itf.measure_pairs(ks[:1])
    with pytest.raises(ValueError, match="^repeat: "):
        itf.measure_pairs(ks, repeat=0)
    with pytest.raises(ValueError, match="^target_s: "):
        itf.measure_pairs(ks, target_s=-1.0)
    with pytest.raises(ValueError, match="^stat: "):
        itf.measure_pairs(ks, stat="mean")
    with pytest.raises(ValueError, match="^start_method: "):
        itf.PairWorkers(ks, start_method="spawn")
    with pytest.raises(ValueError, match="^clock: "):
        itf.PairWorkers(ks, clock="gpu")
    with pytest.raises(ValueError, match="^timeout_s: "):
        itf.PairWorkers(ks, timeout_s=0)
    with pytest.raises(ValueError, match="^kernels: "):
        itf.PairWorkers([ks[0], no_origin], start_method="forkserver")
    with pytest.raises(ValueError, match="^scale: "):
        itf.default_kernels(0)
    with pytest.raises(ValueError, match="^k: "):
        itf.kernel_features(no_origin)
    with pytest.raises(ValueError, match="^dram_bw: "):
        itf.bandwidth_demand(itf.Kernel("y", lambda: None, 1.0, 1.0, 1.0, alone_s=1.0), 0.0)
    with pytest.raises(ValueError, match="^ridge: "):
        itf.InterferenceModel(ridge=-1)
    with pytest.raises(ValueError, match="^self: "):
        itf.InterferenceModel().predict(np.ones((1, 3)))
    with pytest.raises(ValueError, match="^x: "):
        itf.loo_error(np.ones((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match="^rows: "):
        itf.fit_from_rows(ks, [{"a": "nope", "b": ks[0].name, "slowdown": 1.0}])
    with itf.PairWorkers(ks) as pw:
        with pytest.raises(ValueError, match="^i: "):
            pw.run(0, 7, 1)
        with pytest.raises(ValueError, match="^reps: "):
            pw.run_pair(0, 0, 1, 1)
        with pytest.raises(ValueError, match="^w: "):
            pw.run(2, 0, 1)
