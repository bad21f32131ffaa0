"""Per-layer (rank, bits) assignment [Q136]: exact bytes, DP optimal vs brute force, greedy never better than DP,
adaptive assignment beats uniform at equal bytes on the measured output KL (digits MLP, several seeds)."""

import numpy as np
import pytest

from tinylearn.compress import mixed_config as mc


def test_variant_bytes_exact():
    assert mc.variant_bytes((10, 64), None, 32) == 10 * 64 * 4 + 40
    # rank 3 at 4 bits: A 10x3 -> 15 B + 10 scales, B 3x64 -> 96 B + 3 scales, bias 40 B
    assert mc.variant_bytes((10, 64), 3, 4) == 15 + 40 + 96 + 12 + 40
    assert mc.variant_bytes((3, 5), None, 4) == 8 + 12 + 12  # 15 nibbles round up to 8 bytes
    assert mc.variant_bytes((3, 5), None, 8) == 15 + 12 + 12


def test_quantize_and_svd_errors():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((12, 20))
    q = mc.quantize_sym(w, 8)
    s = np.abs(w).max(1, keepdims=True) / 127
    assert np.all(np.abs(q - w) <= s / 2 + 1e-12)
    assert len(np.unique(np.rint(mc.quantize_sym(w, 4) / (np.abs(w).max(1, keepdims=True) / 7)))) <= 15
    np.testing.assert_array_equal(mc.compress_weight(w, None, 32), w)
    sv = np.linalg.svd(w, compute_uv=False)
    err = np.linalg.norm(w - mc.compress_weight(w, 5, 32))
    assert err == pytest.approx(np.sqrt(np.sum(sv[5:] ** 2)), rel=1e-9)  # Eckart-Young


def _random_problem(rng, n_layers=3, n_var=4):
    cost = [list(rng.integers(1, 30, n_var)) for _ in range(n_layers)]
    loss = [list(rng.random(n_var)) for _ in range(n_layers)]
    return loss, cost


def test_dp_equals_brute_force_and_greedy_not_better():
    rng = np.random.default_rng(1)
    for _ in range(40):
        loss, cost = _random_problem(rng)
        budget = int(sum(min(c) for c in cost) + rng.integers(0, 40))
        dp, bf, gr = mc.dp_assign(loss, cost, budget), mc.brute_force(loss, cost, budget), mc.greedy_assign(
            loss, cost, budget)  # fmt: skip
        for a in (dp, gr):
            assert sum(cost[i][j] for i, j in enumerate(a)) <= budget
        assert mc.total(loss, dp) == pytest.approx(mc.total(loss, bf), abs=1e-12)
        assert mc.total(loss, dp) <= mc.total(loss, gr) + 1e-12
        if sum(-(-int(min(c)) // 4) for c in cost) <= budget // 4:  # feasible once costs round up to 4-byte cells
            coarse = mc.dp_assign(loss, cost, budget, unit=4)
            assert sum(cost[i][j] for i, j in enumerate(coarse)) <= budget
            assert mc.total(loss, coarse) >= mc.total(loss, dp) - 1e-12
        else:
            with pytest.raises(ValueError, match="budget"):
                mc.dp_assign(loss, cost, budget, unit=4)


def test_greedy_suboptimal_hand_case():
    # greedy takes layer 1's best-ratio upgrade (0.8 / 5 B) and can then afford nothing; DP spends 10 B on layer 0
    loss = [[1.0, 0.3, 0.0], [1.0, 0.2]]
    cost = [[0, 6, 10], [0, 5]]
    assert mc.greedy_assign(loss, cost, 10) == [0, 1]
    assert mc.dp_assign(loss, cost, 10) == [2, 0] == mc.brute_force(loss, cost, 10)
    assert mc.total(loss, [2, 0]) == 1.0 < mc.total(loss, [0, 1]) == pytest.approx(1.2)


def test_bad_arguments_name_the_argument():
    w = np.ones((4, 6))
    with pytest.raises(ValueError, match="bits"):
        mc.quantize_sym(w, 3)
    with pytest.raises(ValueError, match="rank"):
        mc.compress_weight(w, 5, 8)
    with pytest.raises(ValueError, match="budget"):
        mc.dp_assign([[0.0]], [[10]], 5)
    with pytest.raises(ValueError, match="budget"):
        mc.greedy_assign([[0.0]], [[10]], -1)
    with pytest.raises(ValueError, match="unit"):
        mc.dp_assign([[0.0]], [[1]], 5, unit=0)
    with pytest.raises(ValueError, match="beta"):
        mc.MixedConfig([w], [np.zeros(4)], np.ones((2, 6)), beta=-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adaptive_beats_uniform_at_equal_bytes(seed):
    d = mc.train_digits_mlp(seed=seed)
    m = mc.MixedConfig(d["weights"], d["biases"], d["xtr"][:512])
    for frac, bits in [(0.5, 8), (0.25, 8), (0.5, 4), (None, 4), (None, 8)]:
        uni = m.uniform(frac, bits)
        budget = m.bytes_of(uni)
        dp, gr = m.dp(budget), m.greedy(budget)
        assert m.bytes_of(dp) <= budget and m.bytes_of(gr) <= budget
        assert mc.total(m.sens, dp) <= mc.total(m.sens, gr) + 1e-12
        assert mc.total(m.sens, dp) <= mc.total(m.sens, uni) + 1e-12
        # measured joint KL with every layer compressed: adaptive never worse, far better vs uniform low rank
        if frac is None:
            assert m.kl_of(dp) <= m.kl_of(uni) * 1.05 + 1e-9
        else:
            assert m.kl_of(dp) < 0.2 * m.kl_of(uni)
