"""tinylearn.parallel.staleness (Q185): staleness weights, stale-gradient aggregation, DC-ASGD compensation, and
the seeded asynchronous SGD simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tinylearn.parallel as par


def test_staleness_weight_rules() -> None:
    assert [par.staleness_weight(t, "constant") for t in (0, 5)] == [1.0, 1.0]
    assert par.staleness_weight(3, "inverse") == pytest.approx(0.25)
    assert par.staleness_weight(3, "inverse", power=2) == pytest.approx(1 / 16)
    assert par.staleness_weight(2, "exp", decay=0.5) == pytest.approx(math.exp(-1))
    assert [par.staleness_weight(t, "threshold", max_staleness=2) for t in (0, 2, 3)] == [1.0, 1.0, 0.0]
    for rule in ("inverse", "exp"):  # decreasing in tau, 1 when fresh
        ws = [par.staleness_weight(t, rule) for t in range(10)]
        assert ws[0] == 1.0 and all(b < a for a, b in zip(ws, ws[1:], strict=False))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"tau": -1}, "tau"),
        ({"tau": 1.5}, "tau"),
        ({"tau": True}, "tau"),
        ({"tau": 1, "rule": "linear"}, "rule"),
        ({"tau": 1, "rule": "inverse", "power": 0}, "power"),
        ({"tau": 1, "rule": "exp", "decay": -1.0}, "decay"),
        ({"tau": 1, "rule": "exp", "decay": float("nan")}, "decay"),
        ({"tau": 1, "rule": "threshold", "max_staleness": -1}, "max_staleness"),
    ],
)
def test_staleness_weight_bad_input(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        par.staleness_weight(**kwargs)


def test_aggregate_stale_sum_count_and_drop() -> None:
    g = [np.array([1.0, 0.0]), np.array([0.0, 1.0])]
    agg, w = par.aggregate_stale(g, [0, 3], "inverse")
    assert w == [1.0, 0.25] and np.allclose(agg, [0.8, 0.2])
    agg, _ = par.aggregate_stale(g, [0, 3], "inverse", normalize="count")
    assert np.allclose(agg, [0.5, 0.125])
    agg, _ = par.aggregate_stale(g, [4, 7], "constant")  # plain averaging ignores staleness
    assert np.allclose(agg, [0.5, 0.5])
    agg, w = par.aggregate_stale(g, [5, 6], "threshold", max_staleness=4)  # all dropped -> no update
    assert w == [0.0, 0.0] and np.array_equal(agg, [0.0, 0.0])
    agg, _ = par.aggregate_stale([[2.0]], [9], "exp")  # a single gradient keeps its size under "sum"
    assert np.allclose(agg, [2.0])


def test_aggregate_stale_bad_input() -> None:
    with pytest.raises(ValueError, match="grads"):
        par.aggregate_stale([], [])
    with pytest.raises(ValueError, match="staleness"):
        par.aggregate_stale([[1.0]], [0, 1])
    with pytest.raises(ValueError, match="grads"):
        par.aggregate_stale([[1.0], [1.0, 2.0]], [0, 1])
    with pytest.raises(ValueError, match="normalize"):
        par.aggregate_stale([[1.0]], [0], normalize="mean")
    with pytest.raises(ValueError, match="tau"):
        par.aggregate_stale([[1.0]], [-2])


def test_delay_compensate() -> None:
    g, now, then = np.array([2.0, -1.0]), np.array([1.0, 1.0]), np.array([0.0, 3.0])
    assert np.allclose(par.delay_compensate(g, now, then, 0.5), [2.0 + 0.5 * 4 * 1, -1.0 + 0.5 * 1 * -2])
    assert np.allclose(par.delay_compensate(g, now, then, 0.0), g)
    with pytest.raises(ValueError, match="lam"):
        par.delay_compensate(g, now, then, -0.1)
    with pytest.raises(ValueError, match="grad"):
        par.delay_compensate(g, now, [0.0], 0.1)


def test_least_squares_problem() -> None:
    a, b = par.least_squares_problem(64, 5, seed=3)
    a2, b2 = par.least_squares_problem(64, 5, seed=3)
    assert a.shape == (64, 5) and b.shape == (64,) and np.array_equal(a, a2) and np.array_equal(b, b2)
    for kwargs, name in (({"n_samples": 0}, "n_samples"), ({"dim": 0}, "dim"), ({"noise": -1.0}, "noise")):
        with pytest.raises(ValueError, match=name):
            par.least_squares_problem(**kwargs)


def test_simulation_without_delay_is_plain_sgd_and_converges() -> None:
    r = par.simulate_async_sgd("inverse", lr=0.2, steps=150, max_delay=0)
    r0 = par.simulate_async_sgd("constant", lr=0.2, steps=150, max_delay=0)
    assert r["excess"] == r0["excess"] and r["mean_weight"] == 1.0  # no staleness: every rule averages
    assert not r["diverged"] and r["final_excess"] < 1e-3 < r["excess"][0]


def test_staleness_weighting_stabilises_large_lr() -> None:
    plain = par.simulate_async_sgd("constant", lr=0.8, steps=200)
    assert plain["diverged"] and plain["final_excess"] == math.inf
    for rule in ("inverse", "exp"):
        r = par.simulate_async_sgd(rule, lr=0.8, steps=200)
        assert not r["diverged"] and r["final_excess"] < 5e-3 and r["mean_weight"] < 0.5
    # dividing by the count instead of the weight sum also shrinks the step: stable too
    assert par.simulate_async_sgd("inverse", lr=0.8, steps=200, normalize="count")["final_excess"] < 5e-3
    # deterministic: same seed, same trajectory
    a = par.simulate_async_sgd("exp", lr=0.4, steps=50, seed=7)
    assert a["excess"] == par.simulate_async_sgd("exp", lr=0.4, steps=50, seed=7)["excess"]


def test_delay_compensation_runs() -> None:
    plain = par.simulate_async_sgd("constant", lr=0.3, steps=200)["final_excess"]
    dc = par.simulate_async_sgd("constant", lr=0.3, steps=200, compensation=0.3)["final_excess"]
    assert dc < plain


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"lr": 0.0}, "lr"),
        ({"lr": 0.1, "steps": 0}, "steps"),
        ({"lr": 0.1, "n_workers": 0}, "n_workers"),
        ({"lr": 0.1, "max_delay": -1}, "max_delay"),
        ({"lr": 0.1, "batch": 0}, "batch"),
        ({"lr": 0.1, "batch": 300}, "batch"),
        ({"lr": 0.1, "rule": "linear"}, "rule"),
        ({"lr": 0.1, "normalize": "mean"}, "normalize"),
        ({"lr": 0.1, "compensation": -1.0}, "compensation"),
        ({"lr": 0.1, "seed": -1}, "seed"),
    ],
)
def test_simulate_async_sgd_bad_input(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        par.simulate_async_sgd(**kwargs)
