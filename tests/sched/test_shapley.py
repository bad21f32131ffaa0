"""Shapley values: exact against the permutation definition (all n! orders) on 3-4 players, efficiency, symmetry
and dummy axioms, and the permutation-sampling estimate inside its 95% CLT interval (with slack) and its Hoeffding
bound over 40 seeds."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tinylearn.sched.shapley import hoeffding_halfwidth, marginal_range, peak_cost_game, shapley_exact, shapley_mc

PROFILES = {"a": [4, 0, 1, 3], "b": [0, 5, 1, 2], "c": [3, 1, 0, 3], "d": [1, 1, 1, 1]}


def _by_permutations(players: list, v) -> dict:
    phi = dict.fromkeys(players, 0.0)
    perms = list(itertools.permutations(players))
    for order in perms:
        s: frozenset = frozenset()
        for p in order:
            phi[p] += v(s | {p}) - v(s)
            s = s | {p}
    return {p: x / len(perms) for p, x in phi.items()}


@pytest.mark.parametrize("n", [3, 4])
def test_exact_matches_permutation_definition(n: int) -> None:
    players = list(PROFILES)[:n]
    v = peak_cost_game({p: PROFILES[p] for p in players})
    got = shapley_exact(players, v)
    ref = _by_permutations(players, v)
    assert got == pytest.approx(ref)
    assert sum(got.values()) == pytest.approx(v(frozenset(players)))


def test_symmetry_and_dummy() -> None:
    prof = {"x": [2, 1, 0], "y": [2, 1, 0], "z": [0, 0, 0], "w": [0, 2, 2]}
    v = peak_cost_game(prof)
    phi = shapley_exact(list(prof), v)
    assert phi["x"] == pytest.approx(phi["y"])  # interchangeable
    assert phi["z"] == pytest.approx(0.0)  # dummy
    est, se = shapley_mc(list(prof), v, samples=50, seed=1)
    assert est["z"] == 0.0 and se["z"] == 0.0


def test_mc_efficiency_exact_for_any_sample_count() -> None:
    players = list(PROFILES)
    v = peak_cost_game(PROFILES)
    for m in (1, 2, 7):
        est, _ = shapley_mc(players, v, samples=m, seed=m)
        assert sum(est.values()) == pytest.approx(v(frozenset(players)), abs=1e-12)


def test_mc_within_error_bounds_over_seeds() -> None:
    rng = np.random.default_rng(0)
    players = [f"t{i}" for i in range(6)]
    v = peak_cost_game({p: rng.integers(0, 6, size=8).tolist() for p in players})
    exact = shapley_exact(players, v)
    width = marginal_range(players, v)
    m = 200
    hb = hoeffding_halfwidth(width, m, delta=0.05, players=len(players))
    clt_inside, total = 0, 0
    for seed in range(40):
        est, se = shapley_mc(players, v, samples=m, seed=seed)
        for p in players:
            err = abs(est[p] - exact[p])
            assert err <= hb  # Hoeffding + union bound over players: P(any player outside) <= 5% per seed
            clt_inside += err <= 1.96 * se[p] + 1e-12
            total += 1
    # the CLT interval is asymptotic: require >= 90% coverage (nominal 95%, slack for 200 samples)
    assert clt_inside / total >= 0.90, clt_inside / total


def test_bad_input() -> None:
    v = peak_cost_game({"a": [1]})
    with pytest.raises(ValueError, match="^players"):
        shapley_exact(["a", "a"], v)
    with pytest.raises(ValueError, match="^players"):
        shapley_exact([f"p{i}" for i in range(13)], lambda s: 0.0)
    with pytest.raises(ValueError, match="^samples"):
        shapley_mc(["a"], v, samples=0)
    with pytest.raises(ValueError, match="^value_fn"):
        shapley_exact(["a"], lambda s: math.nan)
    with pytest.raises(ValueError, match="^profiles"):
        peak_cost_game({"a": [1, 2], "b": [1]})
    with pytest.raises(ValueError, match="^delta"):
        hoeffding_halfwidth(1.0, 10, delta=0.0)
