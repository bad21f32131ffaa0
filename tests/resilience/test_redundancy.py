"""tinylearn.resilience.redundancy (Q191): which layers to protect under a budget — exact knapsack DP and greedy by
ratio, checked against brute force; applied to a real torch MLP's measured per-layer times."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tinylearn.resilience import redundancy as rd


def _case(seed: int, n: int) -> tuple[list[float], list[int], int]:
    rng = np.random.default_rng(seed)
    v = list(rng.uniform(0, 10, n))
    w = [int(x) for x in rng.integers(1, 20, n)]
    return v, w, int(rng.integers(0, sum(w) + 1))


@pytest.mark.parametrize("seed", range(40))
def test_exact_matches_brute_force_and_greedy_is_bounded(seed: int) -> None:
    v, w, b = _case(seed, 1 + seed % 10)
    best, chosen = rd.brute_force(v, w, b)
    ex, ex_set = rd.knapsack_exact(v, w, b)
    assert ex == pytest.approx(best, abs=1e-9)
    assert sum(w[i] for i in ex_set) <= b and sum(v[i] for i in ex_set) == pytest.approx(ex)
    gr, gr_set = rd.greedy_by_ratio(v, w, b)
    assert sum(w[i] for i in gr_set) <= b
    assert best / 2 - 1e-9 <= gr <= best + 1e-9  # the 1/2-approximation


def test_greedy_can_be_suboptimal_and_is_optimal_for_equal_weights() -> None:
    v, w = [6.0, 5.0, 5.0], [6, 5, 5]  # ratios 1, 1, 1 but ... make the first slightly denser
    v[0] = 6.6
    assert rd.greedy_by_ratio(v, w, 10)[0] == pytest.approx(6.6)  # takes the dense one, then nothing fits
    assert rd.knapsack_exact(v, w, 10) == (10.0, [1, 2])
    rng = np.random.default_rng(0)
    v = list(rng.uniform(0, 1, 12))
    assert rd.greedy_by_ratio(v, [3] * 12, 15)[0] == pytest.approx(rd.knapsack_exact(v, [3] * 12, 15)[0])


def test_gcd_reduction_handles_byte_weights() -> None:
    v = [3.0, 4.0, 5.0]
    w = [4096 * 3, 4096 * 4, 4096 * 5]
    assert rd.knapsack_exact(v, w, 4096 * 7) == (7.0, [0, 1])
    assert rd.knapsack_exact(v, w, 4096 * 7 + 5)[0] == 7.0
    assert rd.knapsack_exact([1.0], [0], 0) == (1.0, [0])


# layer costs are measured (the CI's forced scalar path measured costs large enough to round p to 1): run alone
@pytest.mark.timing
def test_choose_redundant_on_a_real_mlp() -> None:
    """c_l measured (torch MLP layers, tinylearn.bench.measure), bytes real, p_l a MODEL; under a 40 % memory budget
    the exact choice removes at least as much expected recompute as greedy, and agrees with brute force."""
    torch.manual_seed(0)
    widths = [256, 1024, 256, 512, 128, 768, 64]
    layers = []
    for a, b in zip(widths, widths[1:], strict=False):
        layers += [torch.nn.Linear(a, b), torch.nn.GELU()]
    x = torch.randn(64, widths[0])
    costs, nbytes = rd.measure_layers(layers, x, repeat=5)
    assert len(costs) == len(nbytes) == len(layers) and all(c > 0 for c in costs)
    assert nbytes[0] == 64 * 1024 * 4
    probs = rd.failure_probabilities(costs, nbytes, rate_per_byte_s=1e-3)
    assert all(0 < p < 1 for p in probs)
    budget = int(0.4 * sum(nbytes))
    ex = rd.choose_redundant(costs, probs, nbytes, budget)
    gr = rd.choose_redundant(costs, probs, nbytes, budget, method="greedy")
    bf = rd.choose_redundant(costs, probs, nbytes, budget, method="brute")
    assert ex["saved"] == pytest.approx(bf["saved"], rel=1e-12)
    assert ex["used"] <= budget and gr["used"] <= budget
    assert ex["saved"] >= gr["saved"] - 1e-15
    assert ex["cost_after"] == pytest.approx(ex["cost_before"] - ex["saved"], rel=1e-9)
    assert 0 < ex["cost_after"] < ex["cost_before"]


def test_failure_probabilities_model() -> None:
    p = rd.failure_probabilities([1.0, 1.0, 1.0], [10, 10, 10], 0.01)
    assert p[0] > p[1] > p[2]  # earlier activations live longer
    assert p[2] == pytest.approx(1 - np.exp(-0.01 * 10 * 2.0))  # last: its own backward only


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="weights"):
        rd.knapsack_exact([1.0, 2.0], [1], 3)
    with pytest.raises(ValueError, match="weights"):
        rd.knapsack_exact([1.0], [1.5], 3)
    with pytest.raises(ValueError, match="budget"):
        rd.greedy_by_ratio([1.0], [1], -1)
    with pytest.raises(ValueError, match="values"):
        rd.knapsack_exact([-1.0], [1], 3)
    with pytest.raises(ValueError, match="probs"):
        rd.expected_recompute_cost([1.0], [1.5])
    with pytest.raises(ValueError, match="method"):
        rd.choose_redundant([1.0], [0.1], [1], 1, method="magic")
    with pytest.raises(ValueError, match="rate_per_byte_s"):
        rd.failure_probabilities([1.0], [1], 0)
