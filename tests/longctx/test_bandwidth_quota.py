"""Per-layer bandwidth quotas by weighted max-min fair water-filling (Q200): the allocation equals an independent
bisection on the water level, satisfies the fairness conditions (and a perturbed one does not), respects floors and
the cap, beats proportional / equal shares on the importance-weighted served fraction; measured per-layer
all-to-all demands on 2 real ranks vary with the routing locality."""

from __future__ import annotations

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.parallel import bandwidth_quota as BQ


def _bisection(d: np.ndarray, w: np.ndarray, c: float) -> np.ndarray:
    if d.sum() <= c:
        return d.copy()
    lo, hi = 0.0, float((d / w).max())
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.minimum(d, mid * w).sum() < c else (lo, mid)
    return np.minimum(d, hi * w)


@pytest.mark.parametrize("seed", range(6))
def test_water_fill_matches_bisection_and_is_fair(seed: int) -> None:
    rng = np.random.default_rng(seed)
    L = 7
    d = rng.uniform(0, 10, L) * (rng.random(L) > 0.2)
    w = rng.uniform(0.1, 3, L)
    c = float(rng.uniform(0.2, 1.0) * d.sum())
    x, lam = BQ.water_fill(d, w, c)
    np.testing.assert_allclose(x, _bisection(d, w, c), rtol=1e-9, atol=1e-9)
    assert x.sum() == pytest.approx(c)
    assert BQ.is_weighted_max_min_fair(x, d, w, c)
    unmet = np.flatnonzero(x < d - 1e-9)
    np.testing.assert_allclose(x[unmet] / w[unmet], lam)
    i = unmet[0]
    j = next(k for k in range(L) if k != i and x[k] > 0)
    y = x.copy()
    y[i] += 0.05 * x[j]
    y[j] -= 0.05 * x[j]
    assert not BQ.is_weighted_max_min_fair(y, d, w, c)


def test_everything_fits_and_floors() -> None:
    x, lam = BQ.water_fill([1, 2, 3], [1, 1, 1], 10)
    np.testing.assert_array_equal(x, [1, 2, 3])
    assert lam == float("inf")
    x, _ = BQ.water_fill([4, 4, 4], [10, 1, 1], 6, floors=[0, 1, 1])
    assert x[1] >= 1 and x[2] >= 1 and x.sum() == pytest.approx(6)
    assert BQ.is_weighted_max_min_fair(x, [4, 4, 4], [10, 1, 1], 6, floors=[0, 1, 1])
    np.testing.assert_allclose(x, [10 / 3, 4 / 3, 4 / 3])  # above the floors, 4 bytes shared 10:1:1


def test_weighted_served_beats_baselines() -> None:
    d = np.array([8.0, 1.0, 6.0, 2.0])
    w = BQ.layer_weights(load=d, importance=[0.1, 3.0, 1.0, 2.0])
    c = 8.0
    x, _ = BQ.water_fill(d, w, c)
    fair = BQ.quota_report(x, d, w, c)["weighted_served"]
    for base in (BQ.proportional_share(d, c), BQ.equal_share(d, c)):
        assert base.sum() <= c + 1e-9
        assert fair > BQ.quota_report(base, d, w, c)["weighted_served"]
    rep = BQ.quota_report(x, d, w, c, link_bytes_per_s=1.0)
    np.testing.assert_allclose(rep["model_time_s"], d / (x / c))


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="demands"):
        BQ.water_fill([-1.0], [1.0], 1.0)
    with pytest.raises(ValueError, match="weights"):
        BQ.water_fill([1.0, 2.0], [1.0, 0.0], 1.0)
    with pytest.raises(ValueError, match="weights"):
        BQ.water_fill([1.0, 2.0], [1.0], 1.0)
    with pytest.raises(ValueError, match="cap"):
        BQ.water_fill([1.0], [1.0], float("nan"))
    with pytest.raises(ValueError, match="floors"):
        BQ.water_fill([1.0, 1.0], [1.0, 1.0], 1.0, floors=[2.0, 0.0])
    with pytest.raises(ValueError, match="floors"):
        BQ.water_fill([1.0, 1.0], [1.0, 1.0], 1.0, floors=[1.0, 1.0])
    with pytest.raises(ValueError, match="importance"):
        BQ.layer_weights([1.0], [0.0])


def test_measured_demands_follow_locality() -> None:
    res = tl.dist.launch(BQ.measure_layer_demands, 2, [4.0, 0.0, -4.0], 64, 0)
    demand = np.sum([r["bytes"] for r in res], axis=0)
    assert demand[0] < demand[1] < demand[2]
    assert demand[2] > 3 * demand[0]
    w = BQ.layer_weights(demand, [1.0, 1.0, 0.2])
    x, _ = BQ.water_fill(demand, w, 0.5 * demand.sum())
    assert BQ.is_weighted_max_min_fair(x, demand, w, 0.5 * demand.sum())
