"""The discrete-event simulator: hand-computed schedules, SRPT's optimality on one machine, conservation, gangs."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tinylearn.sched.device_model import A100, H100
from tinylearn.sched.jobs import Job
from tinylearn.sched.policies import FIFO, POLICIES, SJF, SRPT, Backfill
from tinylearn.sched.sim import SimReport, Simulator, simulate, single_machine
from tinylearn.sched.traces import synthetic_trace

ARR = [(0.0, 3.0), (1.0, 1.0), (2.0, 5.0), (2.5, 0.5)]


def _jobs(arr, quantum=0.5, res="cpu"):
    return [
        (t, Job(f"j{i}", steps=round(w / quantum), demand={res: 1.0}, est_step_s=quantum))
        for i, (t, w) in enumerate(arr)
    ]


def test_single_machine_hand_computed():
    # FIFO: 0-3, 3-4, 4-9, 9-9.5; SJF at t=3 picks 0.5 (arrived 2.5), then 1, then 5
    assert single_machine(ARR, "fifo") == [3.0, 4.0, 9.0, 9.5]
    assert single_machine(ARR, "sjf") == [3.0, 4.5, 9.5, 3.5]
    # SRPT: j0 runs 0-1 (rem 2), j1 preempts 1-2, j0 2-2.5 (rem 1.5), j3 2.5-3, j0 3-4.5, j2 4.5-9.5
    assert single_machine(ARR, "srpt") == [4.5, 2.0, 9.5, 3.0]
    assert single_machine(ARR, SRPT()) == single_machine(ARR, "srpt")


@pytest.mark.parametrize("policy,name", [(FIFO(), "fifo"), (SJF(), "sjf"), (SRPT(), "srpt")])
def test_simulator_matches_single_machine(policy, name):
    # quantum 0.5 divides every arrival and work, so step-boundary preemption equals continuous SRPT here
    rep = Simulator({"cpu": 1}, policy).simulate(_jobs(ARR))
    got = [js.finish_t for js in sorted(rep.jobs, key=lambda j: j.name)]
    assert np.allclose(got, single_machine(ARR, name))
    assert math.isclose(rep.mean_jct_s, float(np.mean([f - a for f, (a, _) in zip(got, ARR, strict=True)])))
    assert (rep.preemptions > 0) == (name == "srpt")


def _mean_flow(arr, done):
    return sum(d - a for d, (a, _) in zip(done, arr, strict=True)) / len(arr)


def _best_nonpreemptive(arr):
    best = math.inf
    for perm in itertools.permutations(range(len(arr))):
        t, done = 0.0, [0.0] * len(arr)
        for i in perm:
            t = max(t, arr[i][0]) + arr[i][1]
            done[i] = t
        best = min(best, _mean_flow(arr, done))
    return best


def test_srpt_optimal_against_brute_force():
    rng = np.random.default_rng(0)
    for n in range(2, 7):
        for _ in range(6):
            arr = [(float(a), float(w)) for a, w in zip(rng.uniform(0, 6, n), rng.uniform(0.2, 4, n), strict=True)]
            srpt = _mean_flow(arr, single_machine(arr, "srpt"))
            assert srpt <= _best_nonpreemptive(arr) + 1e-9
            for p in ("fifo", "sjf"):
                assert srpt <= _mean_flow(arr, single_machine(arr, p)) + 1e-9


def test_conservation_and_energy():
    tr = synthetic_trace(80, 16, 1.0, seed=3, steps=5)
    for pol in (FIFO(), SRPT(), Backfill()):
        rep = simulate(tr, {"gpu": 16}, pol)
        assert isinstance(rep, SimReport) and all(js.state == "done" for js in rep.jobs)
        work = sum(js.job.steps * js.job.est_step_s * js.job.demand["gpu"] for _, js in zip(tr, rep.jobs, strict=True))
        assert math.isclose(rep.extra["busy_unit_s"], work, rel_tol=1e-9)
        assert 0 < rep.utilisation <= 1 + 1e-12
        busy_w, idle_w = A100.power_w(A100.f_max_mhz, 1.0), A100.idle_w
        expect = work * busy_w + (16 * rep.makespan_s - work) * idle_w
        assert math.isclose(rep.energy_j, expect, rel_tol=1e-9)
        for js in rep.jobs:
            assert js.finish_t - js.submit_t >= js.job.steps * js.job.est_step_s - 1e-6
            assert len(js.step_times) == js.job.steps


def test_gangs_never_split_and_units_never_shared():
    units = [A100] * 4 + [H100] * 4
    tr = synthetic_trace(60, 8, 1.2, seed=1, steps=4, gpu_probs={1: 0.4, 2: 0.3, 4: 0.2, 8: 0.1})
    rep = Simulator(units, SRPT()).simulate(tr)
    holder: dict[int, str] = {}
    for _t, kind, name, detail in rep.events:
        if kind in ("start", "resume"):
            job = next(js.job for js in rep.jobs if js.name == name)
            assert len(detail) == int(job.demand["gpu"])  # the whole gang at once
            for u in detail:
                assert u not in holder  # no unit double-booked
                holder[u] = name
        elif kind in ("finish", "preempt", "kill"):
            for u in [u for u, n in holder.items() if n == name]:
                del holder[u]
    assert not holder and all(js.state == "done" for js in rep.jobs)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_unchanged(name):
    tr = synthetic_trace(40, 8, 1.3, seed=4, steps=4, gpu_probs={1: 0.5, 2: 0.3, 4: 0.2}, p_deadline=1.0)
    rep = simulate(tr, [A100] * 4 + [H100] * 4, POLICIES[name]())
    assert all(js.state == "done" and js.done_steps == js.job.steps for js in rep.jobs)
    assert sum(rep.extra["unit_busy_s"]) == pytest.approx(rep.extra["busy_unit_s"])
    assert sum(rep.extra["unit_energy_j"]) == pytest.approx(rep.energy_j)
    held = 0.0
    for _t, kind, name_, _d in sorted(rep.events, key=lambda e: (e[0], e[1] not in ("finish", "preempt"))):
        job = next(js.job for js in rep.jobs if js.name == name_)
        held += job.demand["gpu"] if kind in ("start", "resume") else -job.demand["gpu"] if kind != "arrive" else 0
        assert held <= 8 + 1e-9


def test_interference_startup_and_step_fn():
    jobs = [(0.0, Job("a", 4, {"cpu": 1}, est_step_s=1.0)), (0.0, Job("b", 4, {"cpu": 1}, est_step_s=1.0))]
    rep = Simulator({"cpu": 2}, FIFO(), interference=1.5, startup_s=0.25).simulate(jobs)
    assert rep.jct() == {"a": pytest.approx(6.25), "b": pytest.approx(6.25)}
    assert rep.jobs[0].step_times == pytest.approx([1.5] * 4)  # startup counts in the JCT, not in a step
    assert rep.jobs[0].attained_s == pytest.approx(6.25)
    alone = Simulator({"cpu": 2}, FIFO(), interference=1.5).simulate(jobs[:1])
    assert alone.jct()["a"] == pytest.approx(4.0)
    rep2 = Simulator({"cpu": 2}, FIFO(), step_s_of=lambda job, dev: 0.5).simulate(jobs)
    assert rep2.makespan_s == pytest.approx(2.0)


def test_jain_over_job_rates():
    jobs = [(0.0, Job("a", 2, {"cpu": 1}, est_step_s=1.0)), (0.0, Job("b", 2, {"cpu": 1}, est_step_s=1.0))]
    rep = simulate(jobs, {"cpu": 1}, FIFO())  # rates 2/2 = 1 and 2/4 = 0.5
    assert rep.jain == pytest.approx(1.5**2 / (2 * (1 + 0.25)))
    assert rep.extra["jain_tenant_speed"] == pytest.approx(1.0)  # one tenant


def test_deterministic():
    tr = synthetic_trace(50, 16, 1.1, seed=7, steps=5)
    a, b = simulate(tr, {"gpu": 16}, SRPT()), simulate(tr, {"gpu": 16}, SRPT())
    assert a.events == b.events and a.row() == b.row()


def test_max_runtime_kills_only_that_job():
    jobs = [
        (0.0, Job("long", 10, {"cpu": 1}, est_step_s=1.0, max_runtime_s=3.0)),
        (0.0, Job("ok", 2, {"cpu": 1}, est_step_s=1.0)),
    ]
    rep = simulate(jobs, {"cpu": 1}, FIFO())
    st = {js.name: js.state for js in rep.jobs}
    assert st == {"long": "killed", "ok": "done"}
    assert rep.jct()["ok"] == pytest.approx(5.0)


def test_bad_input():
    j = Job("a", 2, {"cpu": 1}, est_step_s=1.0)
    with pytest.raises(ValueError, match="^devices"):
        Simulator({"cpu": -1}, FIFO())
    with pytest.raises(TypeError, match="^policy"):
        Simulator({"cpu": 1}, "fifo")
    with pytest.raises(ValueError, match="^demand"):
        simulate([(0.0, Job("big", 1, {"cpu": 3}, est_step_s=1.0))], {"cpu": 2}, FIFO())
    with pytest.raises(ValueError, match="^est_step_s"):
        simulate([(0.0, Job("x", 1, {"cpu": 1}))], {"cpu": 2}, FIFO())
    with pytest.raises(ValueError, match="^jobs_with_arrivals"):
        simulate([(-1.0, j)], {"cpu": 2}, FIFO())
    with pytest.raises(ValueError, match="^jobs_with_arrivals"):
        simulate([(0.0, j), (1.0, j)], {"cpu": 2}, FIFO())
    with pytest.raises(ValueError, match="^policy"):
        single_machine([(0.0, 1.0)], "lifo")
    with pytest.raises(ValueError, match="^arrivals"):
        single_machine([(0.0, -1.0)], "fifo")


def test_equal_arrivals_keep_the_input_order_and_startup_per_workload() -> None:
    # FIFO with three jobs arriving together: the input order (the real cluster's submission order) decides, not
    # the names; the 2-core head blocks the rest (head-of-line), as on the real cluster
    jobs = [
        (0.0, Job("zeta", 4, {"cpu": 1}, est_step_s=0.1)),
        (0.0, Job("alpha", 2, {"cpu": 2}, est_step_s=0.1)),
        (0.0, Job("beta", 2, {"cpu": 1}, workload="cnn", est_step_s=0.1)),
    ]
    r = Simulator({"cpu": 2}, FIFO(), startup_s={"matmul": 0.05, "cnn": 0.3}).simulate(jobs)
    by = {js.name: js for js in r.jobs}
    assert by["zeta"].start_t == 0.0 and by["alpha"].start_t > by["zeta"].start_t
    assert by["beta"].start_t >= by["alpha"].finish_t  # FIFO: behind the blocked head
    # startup: per workload, charged once before the first step
    assert math.isclose(by["zeta"].finish_t, 0.05 + 4 * 0.1)
    assert math.isclose(by["beta"].finish_t - by["beta"].start_t, 0.3 + 2 * 0.1)
    with pytest.raises(ValueError, match="startup_s"):
        Simulator({"cpu": 2}, FIFO(), startup_s={"cnn": -1.0})
    with pytest.raises(ValueError, match="startup_s"):
        Simulator({"cpu": 2}, FIFO(), startup_s={})
