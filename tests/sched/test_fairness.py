"""DRF (the NSDI 2011 example exactly; Pareto efficiency, sharing incentive, envy-freeness up to one task on seeded
random instances; weights) and weighted max-min water-filling (against a bisection on the water level)."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn.sched.fairness import (
    dominant_shares,
    drf_allocate,
    drf_continuous,
    max_fraction_in,
    sharing_incentive_tasks,
    weighted_max_min,
)


def test_drf_paper_example() -> None:
    cap = {"cpu": 9, "mem": 18}
    dem = {"A": {"cpu": 1, "mem": 4}, "B": {"cpu": 3, "mem": 1}}
    assert drf_allocate(cap, dem) == {"A": 3, "B": 2}
    sh = dominant_shares(cap, dem, {"A": 3, "B": 2})
    assert sh["A"] == pytest.approx(2 / 3) and sh["B"] == pytest.approx(2 / 3)


def _random_instance(rng: np.random.Generator) -> tuple[dict, dict, dict]:
    res = ["cpu", "mem", "gpu"][: rng.integers(2, 4)]
    cap = {r: float(rng.integers(10, 60)) for r in res}
    users = [f"u{i}" for i in range(rng.integers(2, 6))]
    dem = {u: {r: float(rng.integers(1, 6)) for r in res} for u in users}
    w = {u: float(rng.choice([1.0, 2.0, 3.0])) for u in users}
    return cap, dem, w


@pytest.mark.parametrize("weighted", [False, True])
def test_drf_properties_random(weighted: bool) -> None:
    rng = np.random.default_rng(7)
    exact_si = 0
    for _ in range(60):
        cap, dem, w = _random_instance(rng)
        weights = w if weighted else None
        n = drf_allocate(cap, dem, weights)
        used = {r: sum(n[u] * d[r] for u, d in dem.items()) for r in cap}
        free = {r: cap[r] - used[r] for r in cap}
        assert all(v >= -1e-9 for v in free.values())  # feasible
        # Pareto efficiency: no user's next task fits in what is left
        assert all(any(d[r] > free[r] + 1e-9 for r in cap) for d in dem.values())
        # sharing incentive: at least the tasks of the static weighted slice, up to the one task that indivisible
        # tasks can leave behind (a tie in progressive filling goes to the user listed first)
        si = sharing_incentive_tasks(cap, dem, weights)
        assert all(n[u] >= si[u] - 1 for u in dem), (cap, dem, n, si)
        exact_si += all(n[u] >= si[u] for u in dem)
    assert exact_si >= 54  # the exact (continuous) property holds in >= 90% of the instances


@pytest.mark.parametrize("weighted", [False, True])
def test_drf_continuous_properties(weighted: bool) -> None:
    rng = np.random.default_rng(11)
    for _ in range(60):
        cap, dem, w = _random_instance(rng)
        if not weighted:
            w = dict.fromkeys(dem, 1.0)
        x = drf_continuous(cap, dem, w)
        used = {r: sum(x[u] * d[r] for u, d in dem.items()) for r in cap}
        assert all(used[r] <= cap[r] * (1 + 1e-9) for r in cap)
        saturated = {r for r in cap if used[r] >= cap[r] * (1 - 1e-9)}
        # Pareto efficiency: every user needs some exhausted resource
        assert all(any(d[r] > 0 for r in saturated) for d in dem.values())
        tot = sum(w.values())
        for i in dem:
            # sharing incentive, exact: at least what the static weighted slice runs
            assert x[i] >= max_fraction_in({r: c * w[i] / tot for r, c in cap.items()}, dem[i]) * (1 - 1e-9)
            # envy-freeness (weighted): j's bundle, scaled by w_i / w_j, runs no more of i's tasks than i has
            for j in dem:
                bundle = {r: x[j] * dem[j][r] * w[i] / w[j] for r in cap}
                assert max_fraction_in(bundle, dem[i]) <= x[i] * (1 + 1e-9), (i, j, cap, dem, x)
        # the discrete allocation is never above the continuous one by more than a task's worth
        n = drf_allocate(cap, dem, w)
        assert sum(n.values()) <= sum(x.values()) + len(dem)


def test_drf_continuous_paper_example() -> None:
    x = drf_continuous({"cpu": 9, "mem": 18}, {"A": {"cpu": 1, "mem": 4}, "B": {"cpu": 3, "mem": 1}})
    assert x == pytest.approx({"A": 3.0, "B": 2.0})


def test_drf_weights_shift_tasks() -> None:
    cap = {"cpu": 12, "mem": 12}
    dem = {"A": {"cpu": 1, "mem": 1}, "B": {"cpu": 1, "mem": 1}}
    assert drf_allocate(cap, dem) == {"A": 6, "B": 6}
    assert drf_allocate(cap, dem, {"A": 2, "B": 1}) == {"A": 8, "B": 4}


def test_drf_bad_input() -> None:
    with pytest.raises(ValueError, match="^capacity"):
        drf_allocate({"cpu": -1}, {"A": {"cpu": 1}})
    with pytest.raises(ValueError, match="^demands"):
        drf_allocate({"cpu": 4}, {"A": {"gpu": 1}})
    with pytest.raises(ValueError, match="^demands.*all-zero"):
        drf_allocate({"cpu": 4}, {"A": {"cpu": 0}})
    with pytest.raises(ValueError, match="^weights"):
        drf_allocate({"cpu": 4}, {"A": {"cpu": 1}}, {"A": 0})


def _water_level(cap: float, dem: dict, w: dict) -> dict:
    lo, hi = 0.0, max(d / w[u] for u, d in dem.items()) + 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if sum(min(dem[u], w[u] * mid) for u in dem) > cap:
            hi = mid
        else:
            lo = mid
    return {u: min(dem[u], w[u] * lo) for u in dem}


def test_weighted_max_min_matches_bisection() -> None:
    rng = np.random.default_rng(3)
    for _ in range(100):
        users = [f"u{i}" for i in range(rng.integers(1, 7))]
        dem = {u: float(rng.uniform(0, 10)) for u in users}
        w = {u: float(rng.uniform(0.5, 3)) for u in users}
        cap = float(rng.uniform(0, 40))
        got = weighted_max_min(cap, dem, w)
        ref = _water_level(cap, dem, w)
        for u in users:
            assert got[u] == pytest.approx(ref[u], abs=1e-6)
            assert got[u] <= dem[u] + 1e-9
        assert sum(got.values()) == pytest.approx(min(cap, sum(dem.values())), abs=1e-6)


def test_weighted_max_min_example_and_bad_input() -> None:
    got = weighted_max_min(10.0, {"a": 2.0, "b": 8.0, "c": 8.0})
    assert got == pytest.approx({"a": 2.0, "b": 4.0, "c": 4.0})
    with pytest.raises(ValueError, match="^capacity"):
        weighted_max_min(float("nan"), {"a": 1.0})
    with pytest.raises(ValueError, match="^demands"):
        weighted_max_min(1.0, {"a": -1.0})
