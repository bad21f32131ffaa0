"""Online per-kernel power prediction [Q131, Q165, Q246]: RLS equals the least-squares solution on a stationary
stream, tracks a drift the batch fit averages away, beats a per-kernel mean on real profiled features; the DVFS
choice respects the cap; pre-throttling from an AR prediction removes the spikes that reactive throttling misses
(all power is a MODEL: no sensor on this VM). No timing is asserted."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn.sched import predict as pr
from tinylearn.sched.device_model import A100
from tinylearn.tune.ar_predict import ARPredictor


@pytest.fixture(scope="module")
def samples() -> list[pr.KernelSample]:
    return pr.kernel_features(pr.profile_kernels(sizes=(32, 64), repeat=1))


def test_profiled_features_are_real_and_cover_the_classes(samples: list[pr.KernelSample]) -> None:
    classes = {s.cls for s in samples}
    assert {"gemm", "vector", "reduce"} <= classes
    x = np.array([s.x for s in samples])
    assert x.shape[1] == len(pr.FEATURES)
    assert np.all(x[:, 0] == 1.0) and np.all((x[:, 1:5] >= 0) & (x[:, 1:5] <= 1))
    assert len(set(x[:, pr.FEATURES.index("vector_lanes")])) == 2  # float32 and float64 ops
    assert all(s.self_s > 0 for s in samples)


def test_rls_matches_least_squares_without_forgetting() -> None:
    rng = np.random.default_rng(1)
    X = np.c_[np.ones(200), rng.random((200, 3))]
    y = X @ np.array([50.0, 100.0, -20.0, 30.0]) + rng.normal(0, 1.0, 200)
    m = pr.RLSPowerModel(4, forgetting=1.0, delta=1e8)
    for xi, yi in zip(X, y):
        m.update(xi, float(yi))
    np.testing.assert_allclose(m.theta, np.linalg.lstsq(X, y, rcond=None)[0], rtol=1e-4, atol=1e-3)
    assert abs(m.errors[-1]) < 5.0 and abs(m.errors[0]) > 50.0  # the error before the first update is the raw y


def test_rls_tracks_drift_that_batch_fit_averages(samples: list[pr.KernelSample]) -> None:
    run = pr.online_stream(samples, n=600, drift_at=300, seed=0)
    noise_mae = 3.0 * np.sqrt(2 / np.pi)
    assert run.mae("RLS", 200, 300) < 2 * noise_mae  # converged before the drift
    assert run.mae("RLS", 500, 600) < 2 * noise_mae  # and again after it
    assert run.mae("batch LS", 500, 600) > 2 * run.mae("RLS", 500, 600)
    assert run.mae("per-kernel mean", 100, 300) > 2 * run.mae("RLS", 100, 300)


def test_dvfs_clock_is_highest_that_fits() -> None:
    f = pr.dvfs_clock(400.0, A100, 300.0)
    ladder = A100.freqs()
    assert A100.power_w(f, 1.0) <= 300.0
    assert A100.power_w(ladder[ladder.index(f) + 1], 1.0) > 300.0
    assert pr.dvfs_clock(100.0, A100, 300.0) == A100.f_max_mhz
    assert pr.dvfs_clock(400.0, A100, 61.0) == A100.f_min_mhz


def test_pre_throttle_removes_spikes_that_reactive_misses() -> None:
    u = pr.spike_utilisation(240, period=8, spike_at=5, seed=3)
    start, cap = 96, 320.0
    hist = [A100.power_w(A100.f_max_mhz, float(v)) for v in u[:start]]
    ar = ARPredictor(order=9, exog=()).fit(hist)
    none = pr.throttle_run(u, A100, cap, None, "none", start)
    reactive = pr.throttle_run(u, A100, cap, lambda h: float(h[-1]), "reactive", start)
    pre = pr.throttle_run(u, A100, cap, lambda h: ar.predict_next(h, None, None), "AR", start)
    n_spikes = int(((np.arange(start, 240) % 8) == 5).sum())
    assert none.over_cap_steps == n_spikes and none.time_lost_s == 0.0
    assert reactive.over_cap_steps == n_spikes  # it throttles the step after each spike
    assert reactive.time_lost_s > 0
    assert pre.over_cap_steps == 0 and pre.peak_w <= cap < none.peak_w


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="^forgetting"):
        pr.RLSPowerModel(3, forgetting=0.2)
    with pytest.raises(ValueError, match="^n_features"):
        pr.RLSPowerModel(0)
    with pytest.raises(ValueError, match="^x"):
        pr.RLSPowerModel(3).update([1.0, 2.0], 1.0)
    with pytest.raises(ValueError, match="^cap_w"):
        pr.dvfs_clock(300.0, A100, 10.0)
    with pytest.raises(ValueError, match="^coef"):
        pr.PowerPlant(coef=(1.0,))
    with pytest.raises(ValueError, match="^period"):
        pr.spike_utilisation(100, period=8, spike_at=9)
    with pytest.raises(ValueError, match="^sizes"):
        pr.profile_kernels(sizes=(4,))
    with pytest.raises(ValueError, match="^events"):
        pr.kernel_features([])
    with pytest.raises(ValueError, match="^drift_at"):
        pr.online_stream([pr.KernelSample("a", "gemm", np.ones(8), 1.0)], n=10, drift_at=10)
