"""tinylearn.resilience.failure_math (Q207): MTBF of N nodes, survival probability, expected completion time with
checkpoints and restarts, Young / Daly / exact intervals, and a Monte-Carlo check with a measured checkpoint cost."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinylearn.parallel.checkpoint_interval import CheckpointTuner, failure_trace, simulate_checkpointing
from tinylearn.resilience import failure_math as fm


def test_cluster_mtbf_and_survival() -> None:
    year = 365 * 24 * 3600.0
    assert fm.cluster_mtbf(5 * year, 10_000) == pytest.approx(5 * year / 10_000)
    assert fm.cluster_mtbf(100.0, 1) == 100.0
    day = 24 * 3600.0
    p = fm.p_no_failure(day, 10_000, 5 * year)
    assert p == pytest.approx(math.exp(-10_000 * day / (5 * year)))
    assert 0.003 < p < 0.005  # ~0.4 %: the docstring's number
    assert fm.expected_failures(day, 10_000, 5 * year) == pytest.approx(-math.log(p))
    ps = [fm.p_no_failure(day, n, 5 * year) for n in (1, 10, 100, 1000)]
    assert all(a > b for a, b in zip(ps, ps[1:], strict=False))  # decreasing in N
    assert fm.p_no_failure(0.0, 7, 1.0) == 1.0


def test_survival_matches_min_of_exponentials() -> None:
    """P(no failure in T) = P(min of N exponentials > T): sampled."""
    rng = np.random.default_rng(0)
    n, m, t = 8, 100.0, 10.0
    first = rng.exponential(m, size=(200_000, n)).min(axis=1)
    assert np.mean(first > t) == pytest.approx(fm.p_no_failure(t, n, m), abs=0.005)
    assert first.mean() == pytest.approx(fm.cluster_mtbf(m, n), rel=0.02)


@pytest.mark.parametrize("dm", [1e-4, 1e-3, 1e-2, 0.1, 0.5])
def test_daly_is_closer_to_the_exact_optimum_than_young(dm: float) -> None:
    m = 3600.0
    d = dm * m
    exact = fm.optimal_interval(d, m)
    young, daly = fm.young_interval(d, m), fm.daly_interval(d, m)
    assert 0 < exact < m
    # the exact root satisfies the stationarity condition
    x = exact / m
    assert abs(math.exp(x + dm) * (x - 1) + 1) < 1e-9
    assert abs(daly - exact) <= abs(young - exact)
    assert abs(daly - exact) / exact < 0.01  # Daly within 1 %
    assert young >= exact  # Young overshoots

    def cost(tau: float) -> float:  # expected wall time per second of work (one whole segment)
        return fm.expected_completion_time(tau, tau, d, m) / tau

    assert cost(exact) <= cost(daly) * (1 + 1e-9) and cost(exact) <= cost(young) * (1 + 1e-9)
    assert cost(exact) < cost(exact * 1.1) and cost(exact) < cost(exact / 1.1)


def test_daly_large_checkpoint_cost_is_mtbf() -> None:
    assert fm.daly_interval(3.0, 1.0) == 1.0
    assert fm.young_interval(2.0, 1.0) == pytest.approx(2.0)


def test_expected_completion_matches_simulation() -> None:
    """Analytic (M + R)·Σ(e^((τᵢ+δ)/M) − 1) vs simulate_checkpointing over MODEL Poisson traces."""
    work, tau, d, m, r = 20.0, 0.3, 0.02, 1.0, 0.05
    walls = [
        simulate_checkpointing(tau, failure_trace([(500.0, 1 / m)], seed=k), d, work, r)["wall_s"] for k in range(300)
    ]
    se = np.std(walls) / math.sqrt(len(walls))
    analytic = fm.expected_completion_time(work, tau, d, m, r)
    assert abs(np.mean(walls) - analytic) < 4 * se
    # no failures (M huge): exactly work + one checkpoint per segment (the last one shorter)
    assert fm.expected_completion_time(1.0, 0.3, 0.01, 1e12) == pytest.approx(1.0 + 4 * 0.01, rel=1e-6)


def test_monte_carlo_optimum_with_measured_checkpoint_cost(tmp_path) -> None:
    """C measured (a real 8 MiB atomic_write with fsync); failures a MODEL with M = 100·C. The interval with the
    least simulated waste is within a factor 1.5 of Young's and Daly's."""
    timing = fm.measure_checkpoint_cost(8 << 20, tmp_path, repeat=3)
    c = timing.median
    assert c > 0 and timing.min <= c <= timing.max
    m = 100 * c
    young, daly = fm.young_interval(c, m), fm.daly_interval(c, m)
    grid = np.geomspace(0.25, 4, 13) * young
    waste = fm.monte_carlo_waste(grid, c, m, 30 * m, n_traces=24, seed=1)
    best = grid[int(np.argmin(waste))]
    assert 1 / 1.5 < best / young < 1.5 and 1 / 1.5 < best / daly < 1.5
    assert waste[0] > waste.min() and waste[-1] > waste.min()  # a U: both ends worse
    # the simulated waste at the best interval is close to the first-order sqrt(2C/M)
    assert waste.min() == pytest.approx(math.sqrt(2 * c / m), rel=0.35)
    # parallel.checkpoint_interval's online CheckpointTuner, started 10x too long with a 10x too optimistic failure
    # rate, learns lambda from the MODEL trace and ends within 25 % of Young's interval for the measured C
    tuner = CheckpointTuner(c, 10 * young, initial_rate=1 / (10 * m), prior_s=m, half_life_s=50 * m, min_s=1e-6)
    simulate_checkpointing(tuner, failure_trace([(10_000 * m, 1 / m)], seed=3), c, 200 * m)
    assert tuner.interval_s == pytest.approx(young, rel=0.25)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: fm.young_interval(0.0, 10.0), "checkpoint_s"),
        (lambda: fm.daly_interval(-1.0, 10.0), "checkpoint_s"),
        (lambda: fm.optimal_interval(1.0, 0.0), "mtbf_s"),
        (lambda: fm.daly_interval(1.0, -5.0), "mtbf_s"),
        (lambda: fm.cluster_mtbf(10.0, 0), "n_nodes"),
        (lambda: fm.p_no_failure(1.0, 0, 10.0), "n_nodes"),
        (lambda: fm.p_no_failure(1.0, 2.5, 10.0), "n_nodes"),
        (lambda: fm.cluster_mtbf(0.0, 3), "node_mtbf_s"),
        (lambda: fm.expected_completion_time(10.0, 1.0, 0.0, 5.0), "checkpoint_s"),
        (lambda: fm.expected_completion_time(10.0, 1.0, 0.1, 5.0, -1.0), "restart_s"),
        (lambda: fm.monte_carlo_waste([1.0], 0.1, 10.0, 10.0, n_traces=0), "n_traces"),
        (lambda: fm.measure_checkpoint_cost(0), "nbytes"),
        (lambda: fm.young_interval(float("nan"), 10.0), "checkpoint_s"),
    ],
)
def test_bad_input_names_the_argument(call, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        call()
