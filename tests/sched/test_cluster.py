"""The real cluster on this machine's cores: order claims (not times), suspend and checkpoint preemption with a
bitwise-identical result, crash / hang / runtime-limit isolation, bad input. Each run is bounded by ``timeout_s``;
nothing here asserts a duration."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import numpy as np
import pytest

from tinylearn.data.datasets import load_digits
from tinylearn.sched.cluster import Cluster
from tinylearn.sched.jobs import Job
from tinylearn.sched.policies import FIFO, SJF, SRPT
from tinylearn.sched.worker import digest, load_checkpoint


def kinds(report, name: str) -> list[str]:
    return [k for _, k, n, _ in report.events if n == name]


def test_fifo_vs_sjf_completion_order() -> None:
    # one core, four matmul jobs submitted longest first: FIFO keeps submission order, SJF reverses it
    steps = {"j40": 40, "j20": 20, "j10": 10, "j5": 5}
    orders = {}
    for pol in (FIFO(), SJF()):
        c = Cluster(devices={"cpu": 1, "mem_gb": 1.0}, policy=pol)
        for name, n in steps.items():
            c.submit(Job(name, n, est_step_s=0.01, size=64))
        r = c.run(timeout_s=30)
        assert all(js.state == "done" and js.done_steps == js.job.steps for js in r.jobs)
        orders[pol.name] = r.completion_order()
    assert orders["fifo"] == ["j40", "j20", "j10", "j5"]
    assert orders["sjf"] == ["j5", "j10", "j20", "j40"]


def test_srpt_suspends_and_resumes() -> None:
    c = Cluster(devices={"cpu": 1, "mem_gb": 1.0}, policy=SRPT(), preempt="suspend")
    c.submit(Job("long", 150, est_step_s=0.01, size=128))
    c.submit(Job("short", 3, est_step_s=0.01, size=64), at_s=0.3)
    r = c.run(timeout_s=30)
    by = r.by_name()
    assert by["long"].state == "done" and by["short"].state == "done"
    assert ["preempt", "paused", "resume"] == [k for k in kinds(r, "long") if k in ("preempt", "paused", "resume")]
    assert by["long"].preemptions == 1 and r.completion_order() == ["short", "long"]
    assert by["long"].done_steps == 150
    # what calibrate.py reads: when each step was heard of, and the idle pause (paused -> resume) in between
    ev = {k: t for t, k, n, _ in r.events if n == "long" and k in ("paused", "resume")}
    assert len(by["long"].extra["step_ends"]) == len(by["long"].step_times) == 150
    (p0, p1), *rest = by["long"].extra["pauses"]
    assert not rest and (p0, p1) == (ev["paused"], ev["resume"])  # the events' own timestamps


@pytest.mark.timing
def test_next_job_starts_without_waiting_for_the_last_to_exit() -> None:
    # one core, two jobs back to back: the second starts within a scheduler tick of the first's "done", not after the
    # first worker's interpreter teardown, 60-70 ms here (the loop reaps exited workers instead of waiting for them)
    c = Cluster(devices={"cpu": 1, "mem_gb": 1.0}, policy=FIFO())
    c.submit(Job("a", 3, size=64))
    c.submit(Job("b", 3, size=64))
    r = c.run(timeout_s=30)
    by = r.by_name()
    assert by["a"].state == by["b"].state == "done"
    assert 0.0 <= by["b"].start_t - by["a"].finish_t < 0.04, (by["a"].finish_t, by["b"].start_t)


def test_checkpoint_preemption_resumes_bitwise() -> None:
    jobs = [Job("m", 100, est_step_s=0.01, size=128, seed=3), Job("c", 200, workload="cnn", est_step_s=0.01, seed=4)]
    ref = Cluster(policy=FIFO())
    for j in jobs:
        ref.submit(j)
    want = {js.name: js.extra["digest"] for js in ref.run(timeout_s=40).jobs}
    c = Cluster(policy=SRPT(), preempt="checkpoint")
    for j in jobs:
        c.submit(j)
    c.submit(Job("s", 2, est_step_s=0.01, size=64), at_s=0.3, demand={"cpu": 2})  # needs both cores: evicts both
    r = c.run(timeout_s=40)
    by = r.by_name()
    assert all(js.state == "done" for js in r.jobs), [(js.name, js.state, js.error) for js in r.jobs]
    for name in ("m", "c"):
        assert "stopped" in kinds(r, name) and "restart" in kinds(r, name), kinds(r, name)
        assert by[name].extra["digest"] == want[name]  # same final state bit for bit as the uninterrupted run
    assert len(set(want.values())) == 2


def test_crash_hang_and_runtime_limit_leave_others_done() -> None:
    c = Cluster(policy=FIFO(), step_timeout_s=1.0)
    c.submit(Job("crash", 5, workload="crash"))
    c.submit(Job("hang", 5, workload="hang"))
    c.submit(Job("slow", 200, workload="sleep", est_step_s=0.05, max_runtime_s=0.8))
    c.submit(Job("ok1", 5, size=64))
    c.submit(Job("ok2", 5, size=64), at_s=0.2)
    r = c.run(timeout_s=30)
    by = r.by_name()
    assert by["crash"].state == "failed" and "step 2" in by["crash"].error
    assert by["hang"].state == "killed" and "step timeout" in by["hang"].error and by["hang"].done_steps == 1
    assert by["slow"].state == "killed" and "max_runtime_s" in by["slow"].error
    assert by["ok1"].state == "done" and by["ok2"].state == "done"
    assert len(r.jobs) == 5


def test_run_timeout_kills_the_rest_and_loses_nothing() -> None:
    c = Cluster(devices={"cpu": 1, "mem_gb": 1.0})
    c.submit(Job("sleepy", 100, workload="sleep", est_step_s=0.05))
    c.submit(Job("late", 2), at_s=50.0)
    r = c.run(timeout_s=0.6)
    assert {js.name: js.state for js in r.jobs} == {"sleepy": "killed", "late": "killed"}
    assert all("timeout" in js.error for js in r.jobs)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"demand": {"cpu": -1}}, "demand"),
        ({"demand": {"cpu": 3}}, "larger than the whole cluster"),
        ({"demand": {"cpu": 0.5}}, "whole number of cores"),
        ({"demand": {"gpu": 1}}, "does not exist"),
        ({"deadline_s": -1.0}, "deadline_s"),
        ({"deadline_s": 0.0}, "deadline_s"),
        ({"at_s": -2.0}, "at_s"),
    ],
)
def test_bad_submissions_queue_nothing(kw: dict, match: str) -> None:
    c = Cluster()
    c.submit(Job("fine", 1))
    with pytest.raises(ValueError, match=match):
        c.submit(Job("bad", 1), **kw)
    assert [js.name for js in c.queue] == ["fine"]


def test_bad_cluster_arguments() -> None:
    with pytest.raises(ValueError, match="policy"):
        Cluster(policy="lottery")
    with pytest.raises(ValueError, match="preempt"):
        Cluster(preempt="migrate")
    with pytest.raises(ValueError, match="devices"):
        Cluster(devices={"cpu": 999})
    with pytest.raises(ValueError, match="step_timeout_s"):
        Cluster(step_timeout_s=0)
    c = Cluster()
    with pytest.raises(ValueError, match="workload"):
        c.submit(Job("g", 1, workload="llama"))
    c.submit(Job("x", 1))
    with pytest.raises(ValueError, match="name"):
        c.submit(Job("x", 2))
    with pytest.raises(TypeError, match="job"):
        c.submit("x")  # type: ignore[arg-type]
    assert len(c.queue) == 1


def _worker(spec: dict) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tinylearn.sched.worker", json.dumps(spec)]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)


def _read(p: subprocess.Popen, until: str, min_step: int = 0, timeout: float = 20.0) -> dict:
    """Messages of worker ``p`` up to the first ``until`` event at step >= ``min_step`` (bounded wait)."""
    assert p.stdout is not None
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r, _, _ = select.select([p.stdout], [], [], max(0.0, end - time.monotonic()))
        if not r:
            break
        line = p.stdout.readline()
        assert line, "worker exited early"
        m = json.loads(line)
        if m["ev"] == until and m.get("step", 0) >= min_step:
            return m
    p.kill()
    raise AssertionError(f"no {until!r} event within {timeout} s")


@pytest.mark.parametrize("workload", ["matmul", "cnn", "gpt"])
def test_worker_stop_checkpoint_resume_is_bitwise(workload: str, tmp_path) -> None:
    base = {"workload": workload, "steps": 12, "size": 64, "seed": 7, "cores": [0]}
    if workload == "cnn":  # the digits once, as the cluster hands them to its workers
        X, y = load_digits()
        np.savez(tmp_path / "digits.npz", X=X, y=y)
        base["data"] = str(tmp_path / "digits.npz")
    p = _worker({**base, "result": str(tmp_path / "ref.npz")})
    want = _read(p, "done")["digest"]
    p.wait(timeout=10)
    spec = {**base, "ckpt": str(tmp_path / "ck.npz"), "result": str(tmp_path / "out.npz")}
    p = _worker(spec)
    _read(p, "step", min_step=4)  # stopped in the middle of the run, not before its first step
    p.stdin.write(b"stop\n")
    p.stdin.flush()
    stopped = _read(p, "stopped")
    p.wait(timeout=10)
    assert 4 <= stopped["step"] < 12
    step, _, arrays = load_checkpoint(tmp_path / "ck.npz")
    assert step == stopped["step"] and arrays  # step counter + model / workload state in the checkpoint
    p = _worker({**spec, "resume": True})
    ready = _read(p, "ready")
    got = _read(p, "done")["digest"]
    p.wait(timeout=10)
    assert ready["step"] == stopped["step"] and got == want
    _, _, ref = load_checkpoint(tmp_path / "ref.npz")
    _, _, out = load_checkpoint(tmp_path / "out.npz")
    assert all(np.array_equal(ref[k], out[k]) for k in ref) and digest(ref) == want
