"""[Q261] autoscaling: Holt forecaster, hysteresis, predictive vs reactive on a burst (MODEL), measured cold start."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn.serve.autoscale import (
    Autoscaler,
    HoltForecaster,
    burst_knots,
    measure_cold_start,
    ramp_trace,
    simulate,
)


@pytest.fixture(scope="module")
def cold_start():
    return measure_cold_start(timeout_s=120)


def test_holt_exact_on_linear_ramp():
    f = HoltForecaster(alpha=0.4, beta=0.2)
    for t in range(20):
        f.update(3.0 + 2.5 * t)
        if t >= 1:  # warm-up: two observations fix level and trend
            for h in (1, 2, 7.5):
                assert f.forecast(h) == pytest.approx(3.0 + 2.5 * (t + h), rel=1e-12)
    assert f.trend == pytest.approx(2.5)


def test_holt_tracks_trend_better_than_last_value():
    rng = np.random.default_rng(0)
    f = HoltForecaster()
    xs = 10 + 2.0 * np.arange(60) + rng.normal(0, 1.0, 60)
    errs_holt, errs_naive = [], []
    for i, x in enumerate(xs[:-4]):
        f.update(x)
        if i > 10:
            errs_holt.append(abs(f.forecast(4) - xs[i + 4]))
            errs_naive.append(abs(x - xs[i + 4]))
    assert np.mean(errs_holt) < 0.5 * np.mean(errs_naive)


def test_hysteresis_no_flapping_on_noisy_flat_load():
    mu = 50.0
    tr = ramp_trace([(0, 3.0 * mu)], 200.0, seed=3)  # flat 3 replicas' worth, Poisson noise
    for pred in (False, True):
        pol = Autoscaler(1, 20, 0.7, 1.0, service_rate=mu, slo_s=0.2, interval_s=0.5, predictive=pred)
        res = simulate(tr, pol, 1.0, mu, initial_replicas=5)
        late = [d for d in res.decisions if 20 < d.time < 195]  # steady load: 350 control steps
        assert len(late) <= 0.04 * 350, [(d.time, d.action, d.target) for d in late]
        assert all(5 <= d.target <= 7 for d in late)  # 150 req/s needs ceil(150 / (50 * 0.7)) = 5
    # the same controller without the band (tolerance 0, down_util just below target, no cooldown) flaps
    kw = dict(service_rate=mu, slo_s=0.2, interval_s=0.5)
    thin = Autoscaler(1, 20, 0.7, 1.0, down_util=0.69, cooldown_s=0, tolerance=0, down_latency_frac=10.0, **kw)
    res_thin = simulate(tr, thin, 1.0, mu, initial_replicas=5)
    res_base = simulate(tr, Autoscaler(1, 20, 0.7, 1.0, **kw), 1.0, mu, initial_replicas=5)
    assert len(res_thin.decisions) > 3 * len(res_base.decisions), (len(res_thin.decisions), len(res_base.decisions))


def test_predictive_beats_reactive_on_burst_with_measured_cold_start(cold_start):
    c = cold_start.wall_s
    assert 0 < c < 120
    mu = 40.0 / c  # a replica serves 40 requests per cold start; every time below is in units of c
    knots = burst_knots(1.0 * mu, 30.0 * mu, onset_s=5 * c, tau_s=2 * c, hold_s=5 * c)
    tot = {False: 0, True: 0}
    for seed in range(3):
        tr = ramp_trace(knots, knots[-1][0] + 4 * c, seed=seed)
        res = {}
        for pred in (False, True):
            pol = Autoscaler(1, 80, 0.7, c, service_rate=mu, slo_s=5 / mu, interval_s=c / 4, predictive=pred)
            res[pred] = simulate(tr, pol, c, mu, initial_replicas=2)
            assert np.isfinite(res[pred].latencies).all()  # every request served
            tot[pred] += res[pred].slo_violations
        assert res[True].slo_violations < res[False].slo_violations, (res[False], res[True])
        assert res[True].replica_seconds < 1.5 * res[False].replica_seconds
    assert tot[True] < 0.5 * tot[False]
    assert "MODEL" in repr(res[True])


def test_cold_start_measured_from_real_process(cold_start):
    import os

    assert cold_start.wall_s > 0 and cold_start.pid != os.getpid()
    assert cold_start.import_s > 0 and cold_start.forward_s > 0
    assert cold_start.wall_s >= cold_start.import_s + cold_start.build_s + cold_start.forward_s


def test_cold_start_timeout_and_failure():
    with pytest.raises(TimeoutError, match="timeout_s"):
        measure_cold_start(timeout_s=0.01)
    with pytest.raises(RuntimeError, match="failed"):
        measure_cold_start({"d_model": 63}, timeout_s=60)  # not divisible by n_heads: the child raises


def test_scale_up_on_each_metric():
    mk = dict(service_rate=10.0, slo_s=1.0, interval_s=1.0, predictive=False)
    a = Autoscaler(1, 10, 0.5, 2.0, **mk)
    assert a.observe(0, 0, 0, 0.1, 1.0, 2).target == 4  # util 1.0 at 2 replicas, target 0.5
    b = Autoscaler(1, 10, 0.5, 2.0, **mk)
    assert b.observe(0, 0, 20, 0.1, 0.1, 1).target == 4  # 20 queued / 1 s SLO / (10 * 0.5)
    c = Autoscaler(1, 10, 0.5, 2.0, **mk)
    assert c.observe(0, 0, 0, 5.0, 0.1, 3).target == 4  # p95 breach: one more
    assert c.observe(1, 0, 0, 5.0, 0.1, 3, starting=1).action == "hold"  # already on the way
    d = Autoscaler(1, 3, 0.5, 2.0, **mk)
    assert d.observe(0, 1000, 0, 0.1, 1.0, 3).target == 3  # capped by max_replicas


def test_bad_args():
    mk = dict(service_rate=10.0, slo_s=1.0)
    with pytest.raises(ValueError, match="max_replicas"):
        Autoscaler(3, 2, 0.5, 1.0, **mk)
    with pytest.raises(ValueError, match="min_replicas"):
        Autoscaler(0, 2, 0.5, 1.0, **mk)
    with pytest.raises(ValueError, match="target_util"):
        Autoscaler(1, 2, 1.5, 1.0, **mk)
    with pytest.raises(ValueError, match="cold_start_s"):
        Autoscaler(1, 2, 0.5, -1.0, **mk)
    with pytest.raises(ValueError, match="down_util"):
        Autoscaler(1, 2, 0.5, 1.0, down_util=0.6, **mk)
    with pytest.raises(TypeError, match="service_rate"):
        Autoscaler(1, 2, 0.5, 1.0, service_rate="fast", slo_s=1.0)
    with pytest.raises(ValueError, match="alpha"):
        HoltForecaster(alpha=1.5)
    with pytest.raises(ValueError, match="queue_depth"):
        Autoscaler(1, 2, 0.5, 1.0, **mk).observe(0, 1.0, -1, 0.0, 0.5, 1)
    with pytest.raises(ValueError, match="trace"):
        simulate([2.0, 1.0], Autoscaler(1, 2, 0.5, 1.0, **mk), 1.0, 10.0)
    with pytest.raises(TypeError, match="policy"):
        simulate([1.0], "reactive", 1.0, 10.0)
    with pytest.raises(ValueError, match="rates"):
        ramp_trace([(1.0, 5.0), (0.5, 5.0)], 10.0)
    with pytest.raises(ValueError, match="peak_rate"):
        burst_knots(10.0, 1.0, 1.0, 1.0, 1.0)
    with pytest.raises(TypeError, match="model_kwargs"):
        measure_cold_start([1, 2])
