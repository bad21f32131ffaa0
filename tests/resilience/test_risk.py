"""tinylearn.resilience.risk (Q177): EWMA + trend risk predictor with hysteresis on MODEL telemetry, proactive
migration (lost work with vs without, precision / recall), migration bytes from reshard_plan."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn.parallel.zero_sharding import shard_bounds
from tinylearn.resilience import risk


@pytest.fixture(scope="module")
def fleets() -> list[dict[str, np.ndarray]]:
    return [risk.synthetic_fleet(seed=s) for s in range(2)]  # MODEL traces


def test_synthetic_fleet_model_shape() -> None:
    f = risk.synthetic_fleet(n_nodes=16, n_steps=500, fail_frac=0.25, seed=3)
    assert f["temp"].shape == f["ce"].shape == (16, 500)
    failing = np.flatnonzero(f["fail_step"] >= 0)
    assert len(failing) == 4
    for i in failing:  # dead after the failure, hot just before it
        tf = f["fail_step"][i]
        assert np.isnan(f["temp"][i, tf:]).all() and not np.isnan(f["temp"][i, :tf]).any()
        assert np.nanmean(f["temp"][i, tf - 20 : tf]) > 80
    healthy = np.flatnonzero(f["fail_step"] < 0)
    assert np.nanmax(f["temp"][healthy]) > 90  # transient spikes above the limit: bait for a naive threshold


def test_predictor_catches_failures_early_with_no_false_alarms(fleets) -> None:
    for f in fleets:
        out = risk.evaluate_migration(f, risk.RiskPredictor(64))
        assert out["recall"] == 1.0 and out["precision"] == 1.0
        assert min(out["lead"]) >= 30  # migrated at least migration_steps before the failure
        assert out["lost_with"] < 0.5 * out["lost_without"]


def test_trend_and_smoothing_matter(fleets) -> None:
    """Without the trend, triggers come later (missed migrations); a raw threshold (no EWMA, no hysteresis) fires on
    every transient spike and loses more work than no migration at all."""
    for f in fleets[:1]:
        ours = risk.evaluate_migration(f, risk.RiskPredictor(64))
        no_trend = risk.evaluate_migration(f, risk.RiskPredictor(64, horizon=0))
        naive = risk.evaluate_migration(f, risk.RiskPredictor(64, alpha=1.0, horizon=0, off=1.0))
        assert no_trend["recall"] < ours["recall"]
        assert np.median(no_trend["lead"]) < np.median(ours["lead"])
        assert naive["fp"] > 50 and naive["precision"] < 0.8
        assert naive["lost_with"] > ours["lost_with"]


def test_hysteresis_prevents_flapping() -> None:
    """A risk that hovers around the threshold arms once with hysteresis, many times without."""
    n = 1
    wave = 90 + 2.0 * np.sin(np.arange(400) / 3.0)  # temp oscillating across the limit 90
    counts = {}
    for off in (0.9, 1.0):
        p = risk.RiskPredictor(n, {"temp": 90.0}, alpha=1.0, horizon=0, off=off)
        counts[off] = sum(int(p.update({"temp": np.array([v])})[0]) for v in wave)
    assert counts[0.9] == 1 and counts[1.0] > 20


def test_trend_extrapolation_arms_before_the_limit() -> None:
    p = risk.RiskPredictor(1, {"temp": 99.5}, alpha=1.0, window=10, horizon=20)
    ramp = 50 + np.arange(60, dtype=float)  # +1 per step; reaches 100 at step 50
    armed_at = next(t for t, v in enumerate(ramp) if p.update({"temp": np.array([v])})[0])
    assert armed_at == 30  # 80 + 1·20 ≥ 99.5 first at step 30: 20 steps (the horizon) before the raw value is


def test_migration_bytes_from_reshard_plan() -> None:
    numel, n = 1_000_003, 8
    s0, s1 = shard_bounds(numel, n, 3)
    assert risk.migration_bytes(numel, n, 3) == (s1 - s0) * 4
    shrink = risk.migration_bytes(numel, n, 3, mode="shrink")
    assert shrink > 2 * risk.migration_bytes(numel, n, 3)  # shrinking re-slices everyone
    assert shrink <= numel * 4
    # independent count, element by element: old owner node vs new owner node (new rank j on the j-th survivor)
    e = np.arange(numel)
    for suspect in (0, 3, n - 1):
        nodes = np.array([q for q in range(n) if q != suspect])
        old = e // -(-numel // n)
        new = nodes[e // -(-numel // (n - 1))]
        assert risk.migration_bytes(numel, n, suspect, mode="shrink") == int((old != new).sum()) * 4


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="off"):
        risk.RiskPredictor(4, on=1.0, off=1.5)
    with pytest.raises(ValueError, match="alpha"):
        risk.RiskPredictor(4, alpha=0.0)
    with pytest.raises(ValueError, match="values"):
        risk.RiskPredictor(4).update({"temp": np.zeros(4)})
    with pytest.raises(ValueError, match="suspect_rank"):
        risk.migration_bytes(100, 4, 4)
    with pytest.raises(ValueError, match="mode"):
        risk.migration_bytes(100, 4, 1, mode="teleport")
    with pytest.raises(ValueError, match="fail_frac"):
        risk.synthetic_fleet(fail_frac=1.5)
