"""Pareto front and per-layer bit-width enumeration (tinylearn.quant.pareto, notebook 03 [Q180])."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.quant import pareto as P


def _brute_front(pts: np.ndarray, minimize: list[bool]) -> list[int]:
    c = np.where(minimize, pts, -pts)
    return [i for i in range(len(c)) if not any(np.all(c[j] <= c[i]) and np.any(c[j] < c[i]) for j in range(len(c)))]


def test_pareto_front_matches_brute_force_with_ties_and_mixed_senses():
    rng = np.random.default_rng(0)
    for k in (1, 2, 3, 4):
        pts = rng.integers(0, 4, size=(60, k)).astype(float)  # many ties
        for minimize in ([True] * k, [False] * k, [bool(i % 2) for i in range(k)]):
            front = P.pareto_front(pts, minimize)
            assert front.tolist() == _brute_front(pts, minimize)
            off = np.setdiff1d(np.arange(len(pts)), front)
            assert all(any(P.dominates(pts[j], pts[i], minimize) for j in front) for i in off)
            assert not any(P.dominates(pts[j], pts[i], minimize) for i in front for j in range(len(pts)))


def test_pareto_front_small_cases():
    toy = np.array([[1, 3], [1, 3], [2, 2], [3, 3], [3, 1]])
    assert P.pareto_front(toy).tolist() == [0, 1, 2, 4]  # the duplicate (1, 3) is kept twice
    assert P.pareto_front(toy, False).tolist() == [3]
    assert P.pareto_front(toy, [True, False]).tolist() == [0, 1]
    assert P.pareto_front(np.array([[5.0, 5.0]])).tolist() == [0]
    assert P.pareto_front(np.zeros((0, 2))).tolist() == []
    assert P.pareto_front(np.ones((3, 2))).tolist() == [0, 1, 2]  # all equal: nobody dominates
    assert P.dominates([1, 2], [1, 3]) and not P.dominates([1, 3], [1, 3]) and not P.dominates([0, 4], [1, 3])
    assert P.dominates([1, 4], [1, 3], [True, False])


@pytest.mark.parametrize(
    "args, match",
    [
        (([1, 2, 3],), "points"),
        ((np.array([[1.0, np.nan]]),), "points"),
        ((np.zeros((3, 0)),), "points"),
        ((np.ones((2, 2)), [True]), "minimize"),
        ((np.ones((2, 2)), "yes"), "minimize"),
        ((np.ones((2, 2)), [1, 0]), "minimize"),
    ],
)
def test_pareto_front_bad_input(args, match):
    with pytest.raises((ValueError, TypeError), match=match):
        P.pareto_front(*args)


def test_dominates_bad_input():
    with pytest.raises(ValueError, match="b"):
        P.dominates([1, 2], [1, 2, 3])
    with pytest.raises((ValueError, TypeError), match="a"):
        P.dominates([[1, 2]], [1, 2])
    with pytest.raises(ValueError, match="minimize"):
        P.dominates([1, 2], [1, 2], [True])


def test_enumerate_bit_configs():
    c = P.enumerate_bit_configs(3, (2, 4, 8, 16))
    assert c.shape == (64, 3) and c.dtype == np.int64
    assert [tuple(r) for r in c] == list(itertools.product((2, 4, 8, 16), repeat=3))
    assert P.enumerate_bit_configs(1, [8]).tolist() == [[8]]
    for bad, match in (((0, (2, 4)), "n_layers"), ((2.0, (2, 4)), "n_layers"), ((True, (2,)), "n_layers")):
        with pytest.raises(ValueError, match=match):
            P.enumerate_bit_configs(*bad)
    for widths in ((), (1, 4), (4, 4), (2, 32), "248", (2.0, 4)):
        with pytest.raises(ValueError, match="widths"):
            P.enumerate_bit_configs(2, widths)


def test_bit_cost_model_formulas():
    cm = P.BitCostModel()
    n, m = np.array([72, 1152, 640]), np.array([4608, 18432, 640])
    lat, mem, en = cm.costs(n, m, [8, 8, 8])
    assert mem == 8 * 1864
    # per layer max(MACs * 8 / 1024, bytes / 8): 36 vs 9, 144 vs 144, 5 vs 80
    assert lat == pytest.approx(36 + 144 + 80)
    assert en == pytest.approx(float(np.sum(m * (0.03 + 0.025 * 8) + n * 1.25)))
    # 2-bit codes run on the 4-bit datapath: the compute-bound conv1 is no faster at 2 bits than at 4
    assert cm.costs(n[:1], m[:1], [2])[0] == cm.costs(n[:1], m[:1], [4])[0]
    assert cm.costs(n[2:], m[2:], [2])[0] < cm.costs(n[2:], m[2:], [4])[0]  # the read-bound fc is
    # every cost non-decreasing in each layer's width
    for b in itertools.product((2, 4, 8, 16), repeat=3):
        for layer in range(3):
            wider = list(b)
            wider[layer] = min(16, 2 * b[layer])
            assert all(x <= y for x, y in zip(cm.costs(n, m, b), cm.costs(n, m, wider)))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"datapath_bits": {}}, "datapath_bits"),
        ({"datapath_bits": {8: 4}}, "datapath_bits"),
        ({"lanes_bits": 0}, "lanes_bits"),
        ({"bytes_per_cycle": float("nan")}, "bytes_per_cycle"),
        ({"pj_per_byte": -1.0}, "pj_per_byte"),
    ],
)
def test_bit_cost_model_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        P.BitCostModel(**kwargs)


def test_bit_cost_model_costs_bad_input():
    cm = P.BitCostModel()
    with pytest.raises(ValueError, match="bits"):
        cm.costs([1, 2], [1, 2], [8])
    with pytest.raises(ValueError, match="bits"):
        cm.costs([1], [1], [3])
    with pytest.raises(ValueError, match="params"):
        cm.costs([-1], [1], [8])
    with pytest.raises((ValueError, TypeError), match="bits"):
        cm.costs([1], [1], [8.0])


@pytest.fixture(scope="module")
def digits_cnn():
    from tinylearn.nn.models import DigitsCNN

    tl.manual_seed(0)
    model = DigitsCNN(c1=4, c2=8)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 40)
    return model, X, y


def test_layer_profile(digits_cnn):
    model, X, _ = digits_cnn
    params, macs = P.layer_profile(model, ["features.0", "features.4", "fc"], X)
    assert params.tolist() == [36, 288, 320]
    assert macs.tolist() == [36 * 64, 288 * 16, 320]
    with pytest.raises(ValueError, match="layers"):
        P.layer_profile(model, ["nope"], X)
    with pytest.raises(ValueError, match="layers"):
        P.layer_profile(model, "fc", X)
    with pytest.raises(ValueError, match="layers"):
        P.layer_profile(model, ["features.2"], X)  # a ReLU: no weight
    with pytest.raises(ValueError, match="x"):
        P.layer_profile(model, ["fc"], X[:0])


def test_bit_width_search(digits_cnn):
    model, X, y = digits_cnn
    r = P.bit_width_search(model, ["features.4", "fc"], X, y, (2, 8))
    assert r["configs"].tolist() == [[2, 2], [2, 8], [8, 2], [8, 8]]
    obj, front = r["objectives"], r["front"]
    assert obj.shape == (4, 4) and r["minimize"].tolist() == [True, True, True, False]
    assert obj[:, 1].tolist() == [2 * 288 + 2 * 320, 2 * 288 + 8 * 320, 8 * 288 + 2 * 320, 8 * 288 + 8 * 320]
    assert front.tolist() == _brute_front(obj, [True, True, True, False])
    assert 0 in front  # the unique least-memory configuration
    assert np.all((obj[:, 3] >= 0) & (obj[:, 3] <= 1))


def test_bit_width_search_bad_input(digits_cnn):
    model, X, y = digits_cnn
    with pytest.raises(ValueError, match="y"):
        P.bit_width_search(model, ["fc"], X, y[:5])
    with pytest.raises(ValueError, match="widths"):
        P.bit_width_search(model, ["fc"], X, y, (2, 3))  # 3 is not in the cost model
    with pytest.raises(ValueError, match="cost_model"):
        P.bit_width_search(model, ["fc"], X, y, cost_model="fast")
    with pytest.raises(ValueError, match="layers"):
        P.bit_width_search(model, [], X, y)


def test_exported():
    for name in ("pareto_front", "dominates", "enumerate_bit_configs", "BitCostModel", "layer_profile"):
        assert getattr(tl.quant, name) is getattr(P, name)
    assert tl.quant.bit_width_search is P.bit_width_search
