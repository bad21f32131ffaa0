"""Synthetic traces: reproducible, and the sample statistics match the stated distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinylearn.sched.traces import DEFAULT_MU, DEFAULT_SIGMA, arrival_rate, gpu_table, synthetic_trace


def test_seed_reproduces():
    a, b = synthetic_trace(200, 64, 0.9, seed=5), synthetic_trace(200, 64, 0.9, seed=5)
    assert a == b
    assert a != synthetic_trace(200, 64, 0.9, seed=6)


def test_arrival_rate_and_durations_match_parameters():
    n, gpus, load = 4000, 64, 0.8
    tr = synthetic_trace(n, gpus, load, seed=1)
    lam = arrival_rate(gpus, load)
    gaps = np.diff([t for t, _ in tr])
    # exponential gaps: mean 1/lam, standard error (1/lam)/sqrt(n)
    assert abs(gaps.mean() - 1 / lam) < 4 * (1 / lam) / math.sqrt(len(gaps))
    logd = np.log([j.steps * j.est_step_s for _, j in tr])
    assert abs(logd.mean() - DEFAULT_MU) < 4 * DEFAULT_SIGMA / math.sqrt(n)
    assert abs(logd.std() - DEFAULT_SIGMA) < 0.1
    sizes, p = gpu_table(gpus)
    g = np.array([j.demand["gpu"] for _, j in tr])
    for s, ps in zip(sizes, p, strict=True):
        assert abs((g == s).mean() - ps) < 4 * math.sqrt(ps * (1 - ps) / n)
    # offered load = lam * E[g] * E[d] / gpus by construction
    assert math.isclose(lam * float((sizes * p).sum()) * math.exp(DEFAULT_MU + DEFAULT_SIGMA**2 / 2) / gpus, load)


def test_fields():
    tr = synthetic_trace(300, 8, 1.0, seed=2, mem_gb_per_gpu=40.0)
    assert tr[0][0] == 0.0 and all(t1 >= t0 for (t0, _), (t1, _) in zip(tr, tr[1:], strict=False))
    for _, j in tr:
        assert j.demand["gpu"] <= 8 and j.demand["mem_gb"] == 40.0 * j.demand["gpu"]
        assert j.priority in (0, 1) and j.tenant in {"t0", "t1", "t2", "t3"}
        assert j.deadline_s is None or j.deadline_s >= 1.5 * j.steps * j.est_step_s - 1e-9
    assert len({j.name for _, j in tr}) == 300


def test_bad_input():
    with pytest.raises(ValueError, match="^load"):
        synthetic_trace(10, 8, -1.0)
    with pytest.raises(TypeError, match="^n_jobs"):
        synthetic_trace(1.5, 8)
    with pytest.raises(ValueError, match="^gpu_probs"):
        synthetic_trace(10, 1, gpu_probs={4: 1.0})
    with pytest.raises(ValueError, match="^sigma"):
        synthetic_trace(10, 8, sigma=float("nan"))
