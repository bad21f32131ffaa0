"""Tests for exercises/18_cluster_scheduling (run on stubs by default, on tinylearn with --impl=reference).

(a) preemptive SRPT on one machine: hand-worked instances, agreement with a unit-step brute force on random integer
instances, the smallest total flow time among FIFO / SJF / SRPT; (b) DRF: the NSDI 2011 example, equal splits,
feasibility, Pareto efficiency and even splits of identical users on random instances; (c) a PID controller: the
P, I and D terms against their definitions, anti-windup after saturation (vs what a wound-up integral would do),
and a closed loop on a first-order plant that settles at the setpoint. Bad input raises ValueError naming the
argument."""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np
import pytest


# ------------------------------------------------------------------------------------------ (a) SRPT
def _unit_step(arrivals: list[tuple[int, int]], rule: str) -> list[float]:
    """Brute force with integer data (all events at integer times): one unit of work per tick."""
    rem = [s for _, s in arrivals]
    done = [math.nan] * len(arrivals)
    cur = None
    t = 0
    while any(math.isnan(d) for d in done):
        ready = [i for i, (a, _) in enumerate(arrivals) if a <= t and rem[i] > 0]
        if not ready:
            t += 1
            continue
        if rule == "srpt" or cur is None or rem[cur] == 0:
            key = {"srpt": lambda i: (rem[i], arrivals[i][0], i), "sjf": lambda i: (rem[i], arrivals[i][0], i),
                   "fifo": lambda i: (arrivals[i][0], i)}[rule]  # fmt: skip
            cur = min(ready, key=key)
        rem[cur] -= 1
        t += 1
        if rem[cur] == 0:
            done[cur] = float(t)
            cur = None
    return done


def test_srpt_hand_worked(impl: ModuleType) -> None:
    assert impl.srpt_completion_times([(0.0, 3.0)]) == [3.0]
    # job 1 preempts job 0 at t=1; job 2 ties job 1's remaining 1 at t=2 and waits (earlier arrival first)
    assert impl.srpt_completion_times([(0, 5), (1, 2), (2, 1)]) == pytest.approx([8.0, 3.0, 4.0])
    assert impl.srpt_completion_times([(2.5, 1.0), (0.0, 1.0)]) == pytest.approx([3.5, 1.0])  # idle gap, input order
    assert impl.srpt_completion_times([]) == []


def test_srpt_matches_brute_force(impl: ModuleType) -> None:
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(1, 9))
        arr = [(int(rng.integers(0, 12)), int(rng.integers(1, 7))) for _ in range(n)]
        assert impl.srpt_completion_times(arr) == pytest.approx(_unit_step(arr, "srpt")), arr


def test_srpt_minimises_total_flow_time(impl: ModuleType) -> None:
    rng = np.random.default_rng(1)
    for _ in range(30):
        arr = [(int(rng.integers(0, 10)), int(rng.integers(1, 8))) for _ in range(6)]
        flow = sum(c - a for c, (a, _) in zip(impl.srpt_completion_times(arr), arr))
        for rule in ("fifo", "sjf"):
            other = sum(c - a for c, (a, _) in zip(_unit_step(arr, rule), arr))
            assert flow <= other + 1e-9


def test_srpt_bad_input(impl: ModuleType) -> None:
    for bad in ([(0.0, 0.0)], [(-1.0, 1.0)], [(0.0, float("inf"))], [(0.0,)], [("a", 1.0)]):
        with pytest.raises(ValueError, match="^arrivals"):
            impl.srpt_completion_times(bad)


# ------------------------------------------------------------------------------------------ (b) DRF
def test_drf_paper_example(impl: ModuleType) -> None:
    got = impl.drf({"cpu": 9, "mem": 18}, {"A": {"cpu": 1, "mem": 4}, "B": {"cpu": 3, "mem": 1}})
    assert got == {"A": 3, "B": 2}


def test_drf_equal_users_split_evenly(impl: ModuleType) -> None:
    got = impl.drf({"cpu": 10, "gpu": 4}, {u: {"cpu": 1, "gpu": 1} for u in ("x", "y")})
    assert got == {"x": 2, "y": 2}
    assert impl.drf({"cpu": 7}, {"x": {"cpu": 1}, "y": {"cpu": 1}}) == {"x": 4, "y": 3}  # tie: listed first


def test_drf_random_feasible_and_pareto(impl: ModuleType) -> None:
    rng = np.random.default_rng(2)
    for _ in range(40):
        cap = {"cpu": float(rng.integers(8, 40)), "mem": float(rng.integers(8, 40))}
        dem = {f"u{i}": {"cpu": float(rng.integers(1, 5)), "mem": float(rng.integers(1, 5))} for i in range(3)}
        n = impl.drf(cap, dem)
        free = {r: cap[r] - sum(n[u] * d[r] for u, d in dem.items()) for r in cap}
        assert all(v >= -1e-9 for v in free.values())
        assert all(any(d[r] > free[r] + 1e-9 for r in cap) for d in dem.values())  # nobody's next task fits
        # with identical task shapes DRF must split evenly (within one task)
        same = impl.drf(cap, {u: dem["u0"] for u in dem})
        assert max(same.values()) - min(same.values()) <= 1


def test_drf_bad_input(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="^capacity"):
        impl.drf({"cpu": 0}, {"A": {"cpu": 1}})
    with pytest.raises(ValueError, match="^capacity"):
        impl.drf({}, {"A": {"cpu": 1}})
    with pytest.raises(ValueError, match="^demands"):
        impl.drf({"cpu": 4}, {"A": {"gpu": 1}})
    with pytest.raises(ValueError, match="^demands"):
        impl.drf({"cpu": 4}, {"A": {"cpu": 0}})
    with pytest.raises(ValueError, match="^demands"):
        impl.drf({"cpu": 4}, {"A": {"cpu": -1}})


# ------------------------------------------------------------------------------------------ (c) PID
def test_pid_terms(impl: ModuleType) -> None:
    p = impl.PIDController(2.0, 0.0, 0.0, setpoint=10.0, out_min=-100.0, out_max=100.0)
    assert p.update(7.0, 0.5) == pytest.approx(6.0)
    assert p.update(40.0, 0.5) == pytest.approx(-60.0)
    assert p.update(-100.0, 0.5) == pytest.approx(100.0)  # clipped
    i = impl.PIDController(0.0, 0.5, 0.0, setpoint=1.0, out_min=-10.0, out_max=10.0)
    outs = [i.update(y, dt) for y, dt in ((0.0, 1.0), (0.0, 2.0), (3.0, 1.0))]
    assert outs == pytest.approx([0.5, 1.5, 0.5])
    d = impl.PIDController(0.0, 0.0, 1.0, setpoint=0.0, out_min=-10.0, out_max=10.0)
    assert d.update(1.0, 0.5) == pytest.approx(0.0)  # no derivative on the first sample
    assert d.update(2.0, 0.5) == pytest.approx(-2.0)  # derivative on the measurement


def test_pid_anti_windup(impl: ModuleType) -> None:
    p = impl.PIDController(0.0, 1.0, 0.0, setpoint=10.0, out_min=-1.0, out_max=1.0)
    for _ in range(100):
        assert p.update(0.0, 1.0) <= 1.0
    # a wound-up integral would be ~1000 and hold the output at out_max for ~100 steps after the error reverses
    out = [p.update(20.0, 1.0) for _ in range(2)]
    assert out[-1] < 1.0


def test_pid_closed_loop_settles(impl: ModuleType) -> None:
    # first-order plant y' = (u - y) / tau, e.g. board power following the clock command
    pid = impl.PIDController(0.5, 2.0, 0.0, setpoint=3.0, out_min=0.0, out_max=10.0)
    y, dt, tau = 0.0, 0.05, 0.5
    for _ in range(400):
        u = pid.update(y, dt)
        assert 0.0 <= u <= 10.0
        y += dt * (u - y) / tau
    assert y == pytest.approx(3.0, rel=0.02)


def test_pid_bad_input(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="^kp"):
        impl.PIDController(-1.0, 0.0, 0.0, 0.0, -1.0, 1.0)
    with pytest.raises(ValueError, match="^out_min"):
        impl.PIDController(1.0, 0.0, 0.0, 0.0, 1.0, 1.0)
    pid = impl.PIDController(1.0, 0.0, 0.0, 0.0, -1.0, 1.0)
    with pytest.raises(ValueError, match="^dt"):
        pid.update(0.0, 0.0)
    with pytest.raises(ValueError, match="^measured"):
        pid.update(float("nan"), 0.1)
