"""Metrics from hand-made JobStates and event logs: JCT stats, wait, makespan, utilisation, Jain, deadlines."""

from __future__ import annotations

import math

import pytest

from tinylearn.sched.jobs import Job, JobState
from tinylearn.sched.metrics import segments, summarize


def done(name: str, submit: float, start: float, finish: float, **kw) -> JobState:
    js = JobState(Job(name, 1, **kw), submit_t=submit, state="done", start_t=start, finish_t=finish)
    js.attained_s = finish - start
    return js


def test_summary_numbers() -> None:
    a = done("a", 0.0, 0.0, 2.0, deadline_s=1.0, weight=3.0)
    b = done("b", 0.0, 2.0, 4.0, tenant="t2")
    ev = [
        (0.0, "start", "a", "cores=0"),
        (2.0, "done", "a", ""),
        (2.0, "start", "b", "cores=0"),
        (4.0, "done", "b", ""),
    ]
    r = summarize([a, b], ev, cores=2, policy="fifo")
    assert r.makespan_s == 4.0 and r.mean_jct_s == 3.0 and r.mean_wait_s == 1.0
    assert r.p99_jct_s == pytest.approx(2.0 + 0.99 * 2.0)
    assert r.utilisation == pytest.approx(4.0 / (2 * 4.0))  # one core busy of two
    assert r.deadline_misses == 1  # a: deadline 1 s, finished at 2 s
    assert r.jain == pytest.approx((1.0 + 0.5) ** 2 / (2 * (1.0 + 0.25)))  # rates 2/2 and 2/4
    assert r.weighted_p99_jct_s == pytest.approx(6.0 - 0.01 * 2.0)  # w*JCT: 6 and 4
    assert r.completion_order() == ["a", "b"]
    assert r.tenant_service_s == {"default": 2.0, "t2": 2.0}
    assert r.jain_tenants == pytest.approx((2 / 3 + 2) ** 2 / (2 * ((2 / 3) ** 2 + 4)))  # service / weight: 2/3, 2


def test_segments_pair_start_and_end_with_cores() -> None:
    ev = [
        (0.0, "start", "a", "cores=0,1 pid=1"),
        (1.0, "paused", "a", "step=3"),
        (2.0, "resume", "a", "cores=1"),
        (3.0, "done", "a", ""),
    ]
    assert segments(ev) == [("a", 0.0, 1.0, (0, 1)), ("a", 2.0, 3.0, (1,))]


def test_unfinished_jobs_and_bad_cores() -> None:
    js = JobState(Job("k", 1, deadline_s=5.0), submit_t=0.0, state="killed", finish_t=1.0)
    r = summarize([js], [], cores=1)
    assert math.isnan(r.mean_jct_s) and r.deadline_misses == 1
    with pytest.raises(ValueError, match="cores"):
        summarize([js], [], cores=0)
