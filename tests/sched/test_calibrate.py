"""Calibration from hand-made JobStates (no processes): step times, interference, startup; validation errors."""

from __future__ import annotations

import pytest

from tinylearn.sched.calibrate import calibrate, job_key, step_intervals, validate
from tinylearn.sched.jobs import Job, JobState
from tinylearn.sched.policies import FIFO, SJF


def _js(name, submit, start, steps, pre=0.1, size=128):
    """A finished job that ran contiguously: a startup of ``pre`` s, then its step times."""
    job = Job(name, len(steps), {"cpu": 1}, workload="matmul", size=size)
    js = JobState(job, submit_t=submit, state="done", start_t=start, done_steps=len(steps), step_times=list(steps))
    js.finish_t = start + pre + sum(steps)
    js.attained_s = sum(steps)
    return js


def _run():
    # "a" alone 0..1.1 (steps 0.1); "b" and "c" together from 2.0 (steps 0.125: 1.25x slower)
    return [
        _js("a", 0.0, 0.0, [0.1] * 10),
        _js("b", 2.0, 2.0, [0.125] * 8),
        _js("c", 2.0, 2.0, [0.125] * 8),
    ]


def test_step_intervals_rebuilt_backwards():
    js = _js("a", 0.0, 1.0, [0.5, 0.25], pre=0.2)
    assert step_intervals(js) == [(pytest.approx(1.2), pytest.approx(1.7)), (pytest.approx(1.7), pytest.approx(1.95))]
    js.preemptions = 1
    assert step_intervals(js) is None
    js.extra["step_ends"] = [3.0, 4.0]
    assert step_intervals(js) == [(2.5, 3.0), (3.75, 4.0)]


def test_calibrate_recovers_parameters():
    cal = calibrate(_run())
    assert cal["step_s"][job_key(_run()[0].job)] == pytest.approx(0.1)
    assert cal["interference"] == pytest.approx(1.25)
    assert cal["startup_s"] == pytest.approx(0.1)
    assert cal["n_alone"] == 10 and cal["n_shared"] == 16


def test_validate_reproduces_the_run():
    out = validate(_run(), FIFO(), {"cpu": 2})
    for name, row in out["per_job"].items():
        assert row["rel_err"] == pytest.approx(0.0, abs=1e-9), name
    assert abs(out["mean_rel_err"]) < 1e-9


def test_validate_out_of_sample_with_other_sizes():
    cal = calibrate(_run())
    # a second run, 1 core: a then b serialised (FIFO), no overlap, so no interference
    run2 = [_js("a2", 0.0, 0.0, [0.1] * 5), _js("b2", 0.0, 0.6, [0.1] * 5)]
    out = validate(run2, SJF(), {"cpu": 1}, calib=cal)
    assert out["per_job"]["a2"]["sim"] == pytest.approx(0.6)
    assert out["per_job"]["b2"]["sim"] == pytest.approx(1.2)
    assert abs(out["mean_rel_err"]) < 1e-9


def test_kind_never_alone_is_deflated():
    run = _run()
    other = [_js("d", 2.0, 2.0, [0.25] * 4, size=256), _js("e", 2.0, 2.0, [0.125] * 8)]
    cal = calibrate([run[0], *other])
    assert cal["interference"] == pytest.approx(1.25)
    assert cal["step_s"][job_key(other[0].job)] == pytest.approx(0.2)


def test_bad_input():
    with pytest.raises(TypeError, match="^report_or_jobstates"):
        calibrate([1, 2])
    unfinished = JobState(Job("x", 1), submit_t=0.0)
    with pytest.raises(ValueError, match="^report_or_jobstates"):
        calibrate([unfinished])
    with pytest.raises(ValueError, match="^calib"):
        validate(_run(), FIFO(), {"cpu": 2}, calib={"step_s": {}})
    with pytest.raises(TypeError, match="^policy"):
        validate(_run(), "fifo", {"cpu": 2})


def test_pooled_runs_keep_their_own_clocks():
    run1 = [_js("a", 0.0, 0.0, [0.1] * 10)]  # alone
    run2 = [_js("b", 0.0, 0.0, [0.125] * 8), _js("c", 0.0, 0.0, [0.125] * 8)]  # together
    cal = calibrate([run1, run2])
    assert cal["n_alone"] == 10 and cal["n_shared"] == 16
    assert cal["interference"] == pytest.approx(1.25)
    naive = calibrate(run1 + run2)  # one clock: "a" would overlap b and c
    assert naive["n_alone"] == 0


def test_dispatch_latency_is_charged_to_startup():
    a = _js("a", 0.0, 0.0, [0.1] * 9)  # finishes at 1.0
    b = _js("b", 0.0, 1.05, [0.1] * 4)  # waited for a's core, started 50 ms after a finished
    cal = calibrate([a, b])
    assert cal["dispatch_s"] == pytest.approx(0.025)  # median of 0 (a) and 0.05 (b)
    assert cal["spawn_s"] == pytest.approx(0.1)
    assert cal["startup_s"] == pytest.approx(0.125)


def test_warmup_steps_fitted_apart_and_replayed():
    # one job alone: a cold first step of 0.5 s, then 0.1 s steps; the steady step ignores the cold one
    js = _js("a", 0.0, 0.0, [0.5, 0.1, 0.1, 0.1, 0.1, 0.1])
    cal = calibrate([js])
    k = job_key(js.job)
    assert cal["step_s"][k] == pytest.approx(0.1)
    assert cal["warmup_s"][k] == [pytest.approx(0.4), pytest.approx(0.0), pytest.approx(0.0)]
    out = validate([js], FIFO(), {"cpu": 1})
    assert out["per_job"]["a"]["sim"] == pytest.approx(js.jct())
    no_warm = validate([js], FIFO(), {"cpu": 1}, calib={**cal, "warmup_s": {}})
    assert no_warm["per_job"]["a"]["sim"] == pytest.approx(js.jct() - 0.4)


def test_pauses_make_a_preempted_job_count_for_startup():
    js = _js("a", 0.0, 0.0, [0.1] * 4, pre=0.3)
    js.preemptions = 1
    assert calibrate([js])["spawn_s"] == 0.0  # no record of the pause: left out
    js.finish_t += 2.0  # paused 2 s between steps 2 and 3
    js.extra["pauses"] = [(0.5, 2.5)]
    js.extra["step_ends"] = [0.4, 0.5, 2.6, 2.7]
    cal = calibrate([js])
    assert cal["spawn_s"] == pytest.approx(0.3)
    assert cal["startup_by_workload"]["matmul"] == pytest.approx(0.3)
