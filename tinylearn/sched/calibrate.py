"""Calibrate the simulator on a real run, then check it reproduces another: the step before any simulated number.

``calibrate(report_or_jobstates)`` reads what the real cluster (``cluster.py``) measured on processes -- each
finished job's ``step_times``, ``start_t`` and ``finish_t`` -- and fits the three parameters of ``sim.Simulator``:

    step_s[key]    the mean step time of a job kind running ALONE past its first ``WARMUP_STEPS`` steps, key =
                   (workload, size, gang) (the mean, not the median: a JCT is a sum of step times, and a shared VM's
                   occasional slow steps belong in it); a step counts as "alone" when less than half of it overlapped
                   another job's run. Step intervals come from ``extra["step_ends"]`` (the real cluster records when
                   it heard of each step), else are rebuilt from the finish time backwards (``finish_t - sum of the
                   later step times``) for jobs that were never preempted. Another job counts as running from its
                   start (process spawn included: a spawning worker slows its neighbour too) to its finish.
    warmup_s[key]  the extra seconds of each of a kind's first ``WARMUP_STEPS`` steps over its steady step (a cold
                   worker: page faults, allocator growth, lazy init; the digits CNN's first step takes ~5x a later
                   one). It matters beyond the seconds: SRPT and SJF order by the mean step MEASURED so far, so a
                   slow first step pushes a job back in the queue -- the simulator sees the same numbers only if it
                   replays the same warm-up.
    interference   the mean of (a step that overlapped another job) / (its kind's alone mean): co-located jobs
                   on this VM's 2 cores share the memory bandwidth and last-level cache (and any other load the VM
                   has), so both slow down. 1.0 when the run has no such pairs.
    startup_s      spawn_s + dispatch_s. spawn_s: the median over jobs of (active time - sum of step times): process
                   spawn, imports and the work the worker does not count as a step; active time = finish - start less
                   the idle pauses the cluster recorded (``extra["pauses"]``; a preempted job without them is left
                   out). dispatch_s:
                   the median over jobs of (start - the moment it could have started: its arrival, or the last finish
                   before its start), the scheduler loop's reaction time -- the simulator reacts instantly, so it is
                   charged to the job's start. ``startup_by_workload`` is the same per workload (a CNN worker
                   imports the nn stack and loads the digits before its first step; a matmul worker only numpy),
                   which ``validate`` hands to the simulator.

``validate(real_jobstates, policy, capacity)`` re-simulates the same jobs (same submission times relative to the
first, same Job objects, same policy type) with those parameters and returns per-job and mean JCT relative errors;
fit on one run and validate on another (a different policy) for an out-of-sample check. The topic's bar: simulated
mean JCT within 15% of the measured one before the simulator is used at scale (the Gavel and Tiresias papers
validate their simulators against physical-cluster runs the same way, reporting errors of a few percent to ~10%).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .device_model import DeviceSpec
from .jobs import Job, JobState
from .policies import Policy
from .sim import Simulator

Key = tuple[str, int, int]
WARMUP_STEPS = 3  # a worker's first steps run cold (page faults, allocator growth, lazy init): fitted apart


def job_key(job: Job) -> Key:
    """The calibration key of a job: (workload, size, gang)."""
    return (job.workload, int(job.size), int(job.gang))


def _states(report_or_jobstates: Any) -> list[JobState]:
    jobs = getattr(report_or_jobstates, "jobs", report_or_jobstates)
    if isinstance(jobs, Mapping):
        jobs = list(jobs.values())
    if not isinstance(jobs, Sequence) or not all(isinstance(j, JobState) for j in jobs):
        raise TypeError(
            f"report_or_jobstates: expected a report with .jobs or a list of JobState, got {report_or_jobstates!r}"
        )
    done = [j for j in jobs if j.state == "done" and j.step_times and j.start_t is not None and j.finish_t is not None]
    if not done:
        raise ValueError(f"report_or_jobstates: no finished job with measured step_times among {len(jobs)} job(s)")
    return done


def step_intervals(js: JobState) -> list[tuple[float, float]] | None:
    """Absolute (start, end) of each step: from ``extra["step_ends"]`` if recorded, else rebuilt backwards from the
    finish time for a never-preempted job; None when it cannot be rebuilt."""
    ends = js.extra.get("step_ends")
    if ends is not None and len(ends) == len(js.step_times):
        return [(float(e) - float(d), float(e)) for e, d in zip(ends, js.step_times, strict=True)]
    if js.preemptions or js.finish_t is None:
        return None
    out, t = [], float(js.finish_t)
    for d in reversed(js.step_times):
        out.append((t - float(d), t))
        t -= float(d)
    return out[::-1]


def active_s(js: JobState) -> float | None:
    """Seconds a job's worker was running (start to finish less the recorded idle pauses ``extra["pauses"]``); None
    for a preempted job without that record (its pauses are unknown)."""
    pauses = js.extra.get("pauses")
    if js.preemptions and (pauses is None or len(pauses) < js.preemptions):
        return None
    return float(js.finish_t) - float(js.start_t) - sum(float(b) - float(a) for a, b in pauses or [])  # type: ignore[arg-type]


def _overlap(a0: float, a1: float, spans: Sequence[tuple[float, float]]) -> float:
    return sum(max(0.0, min(a1, b1) - max(a0, b0)) for b0, b1 in spans)


def _is_runs(x: Any) -> bool:
    """A list of runs (reports or lists of JobState) rather than one run."""
    return isinstance(x, list | tuple) and bool(x) and all(hasattr(r, "jobs") or isinstance(r, list) for r in x)


def calibrate(report_or_jobstates: Any) -> dict[str, Any]:
    """Fit ``step_s`` per job kind, ``interference`` and ``startup_s`` from a real run, or pooled over a list of runs
    (each run's overlaps are computed on its own clock) (see the module docstring).

    Returns ``{"step_s": {key: s}, "interference": f, "startup_s": s, "n_alone": n, "n_shared": n, "keys": [...]}``.
    """
    many = _is_runs(report_or_jobstates)
    runs = [_states(r) for r in report_or_jobstates] if many else [_states(report_or_jobstates)]
    alone: dict[Key, list[tuple[int, float]]] = {}  # (step index, seconds)
    shared: list[tuple[Key, int, float]] = []
    first: list[tuple[Key, int, float, str]] = []  # the first WARMUP_STEPS steps: (key, index, s, alone/shared/?)
    for done in runs:
        # another job "runs" from its start (process spawn included) to its finish
        spans = {id(js): (float(js.start_t), float(js.finish_t)) for js in done}  # type: ignore[arg-type]
        for js in done:
            key = job_key(js.job)
            iv = step_intervals(js)
            others = [spans[id(o)] for o in done if o is not js]
            for i, d in enumerate(js.step_times):
                how = "?"
                if iv is not None and iv[i][1] - iv[i][0] > 0:
                    a0, a1 = iv[i]
                    how = "alone" if _overlap(a0, a1, others) / (a1 - a0) < 0.5 else "shared"
                    if how == "alone":
                        alone.setdefault(key, []).append((i, float(d)))
                    else:
                        shared.append((key, i, float(d)))
                if i < WARMUP_STEPS:
                    first.append((key, i, float(d), how))
    done = [js for run in runs for js in run]

    def steady(xs: list[tuple[int, float]]) -> list[float]:  # past the warm-up, unless the kind never got there
        return [d for i, d in xs if i >= WARMUP_STEPS] or [d for _, d in xs]

    step_s = {k: float(np.mean(steady(v))) for k, v in alone.items()}
    ratios = steady([(i, d / step_s[k]) for k, i, d in shared if k in step_s])
    interference = max(1.0, float(np.mean(ratios))) if ratios else 1.0
    for js in done:  # kinds that never ran alone: their shared mean deflated by the interference
        k = job_key(js.job)
        if k not in step_s:
            pool = steady([(i, d) for kk, i, d in shared if kk == k]) or list(js.step_times)
            step_s[k] = float(np.mean(pool)) / interference
    warm: dict[Key, list[float]] = {}  # extra seconds of step i (i < WARMUP_STEPS) over the kind's steady step
    for k in step_s:
        rows = [[d - step_s[k] * (interference if how == "shared" else 1.0) for kk, ii, d, how in first
                 if kk == k and ii == i] for i in range(WARMUP_STEPS)]  # fmt: skip
        ex = [max(0.0, float(np.mean(r))) if r else 0.0 for r in rows]
        if any(ex):
            warm[k] = ex
    over_wl: dict[str, list[float]] = {}  # per workload: active time not spent in steps (spawn, imports)
    for js in done:
        if (a := active_s(js)) is not None:
            over_wl.setdefault(js.job.workload, []).append(a - sum(js.step_times))
    over = [v for vs in over_wl.values() for v in vs]
    spawn = max(0.0, float(np.median(over))) if over else 0.0
    gaps = []  # dispatch latency: from the moment a job could start (arrival, or the last finish before it) to start
    for run in runs:
        for js in run:
            before = [float(o.finish_t) for o in run if o is not js and float(o.finish_t) <= float(js.start_t)]  # type: ignore[arg-type]
            gaps.append(float(js.start_t) - max([js.submit_t, *before]))  # type: ignore[arg-type]
    dispatch = max(0.0, float(np.median(gaps))) if gaps else 0.0
    return {
        "step_s": step_s,
        "warmup_s": warm,
        "interference": interference,
        "startup_s": spawn + dispatch,
        # per workload: a CNN worker imports the nn stack and loads the digits, a matmul one only numpy
        "startup_by_workload": {wl: max(0.0, float(np.median(v))) + dispatch for wl, v in over_wl.items()},
        "spawn_s": spawn,
        "dispatch_s": dispatch,
        "n_alone": sum(len(v) for v in alone.values()),
        "n_shared": len(shared),
        "keys": sorted(step_s),
    }


def warmup_fn(calib: Mapping[str, Any]) -> Callable[[Job], Sequence[float]]:
    """``warmup_of(job)`` for ``Simulator``: the extra seconds of the job kind's first steps (empty if none)."""
    table: dict[Key, list[float]] = {k: list(v) for k, v in (calib.get("warmup_s") or {}).items()}
    return lambda job: table.get(job_key(job), [])


def step_time_fn(calib: Mapping[str, Any]) -> Callable[[Job, DeviceSpec | None], float]:
    """``step_s_of(job, device)`` for ``Simulator`` from a calibration: the job kind's alone step time (a kind not
    in the calibration: the same workload's median, else ``job.est_step_s``; none of those -> ValueError)."""
    table: dict[Key, float] = dict(calib["step_s"])
    by_wl: dict[str, list[float]] = {}
    for (wl, _, _), s in table.items():
        by_wl.setdefault(wl, []).append(s)

    def step_s_of(job: Job, device: DeviceSpec | None = None) -> float:
        k = job_key(job)
        if k in table:
            return table[k]
        if job.workload in by_wl:
            return float(np.median(by_wl[job.workload]))
        if job.est_step_s is not None:
            return float(job.est_step_s)
        raise ValueError(f"job: no calibrated step time for {k} and no est_step_s (job {job.name!r})")

    return step_s_of


def validate(
    real_jobstates: Any,
    policy: Policy,
    capacity: Mapping[str, float],
    *,
    calib: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Re-simulate a real run's finished jobs (same relative arrivals, same policy) with ``calib`` (default: fitted
    on this same run -- an in-sample check) and compare JCTs.

    Returns ``{"per_job": {name: {"real", "sim", "rel_err"}}, "mean_jct_real", "mean_jct_sim", "mean_rel_err"
    (signed, of the mean JCT), "max_abs_job_err", "calib", "report"}``."""
    done = _states(real_jobstates)
    if not isinstance(policy, Policy):
        raise TypeError(f"policy: expected a tinylearn.sched Policy, got {type(policy).__name__} {policy!r}")
    cal = dict(calibrate(done) if calib is None else calib)
    for k in ("step_s", "interference", "startup_s"):
        if k not in cal:
            raise ValueError(f"calib: missing {k!r} (expected the dict calibrate() returns), got keys {sorted(cal)}")
    t0 = min(js.submit_t for js in done)
    # the real submission order (ties at one arrival time are broken by it, as the real cluster did)
    ordered = sorted(done, key=lambda js: (js.submit_t, js.extra.get("seq", 0)))
    arrivals = [(js.submit_t - t0, js.job) for js in ordered]
    su = cal.get("startup_by_workload") or float(cal["startup_s"])
    if isinstance(su, Mapping):  # a workload the calibration run did not have gets the overall startup
        su = {**{js.job.workload: float(cal["startup_s"]) for js in done}, **su}
    sim = Simulator(capacity, type(policy)() if _fresh_ok(policy) else policy, step_s_of=step_time_fn(cal),
                    interference=float(cal["interference"]), startup_s=su, warmup_of=warmup_fn(cal))  # fmt: skip
    rep = sim.simulate(arrivals)
    sim_jct = rep.jct()
    per_job = {}
    for js in done:
        real = float(js.jct())  # type: ignore[arg-type]
        s = sim_jct[js.name]
        per_job[js.name] = {"real": real, "sim": s, "rel_err": (s - real) / real if real > 0 else math.nan}
    mr = float(np.mean([v["real"] for v in per_job.values()]))
    ms = float(np.mean([v["sim"] for v in per_job.values()]))
    return {
        "per_job": per_job,
        "mean_jct_real": mr,
        "mean_jct_sim": ms,
        "mean_rel_err": (ms - mr) / mr,
        "max_abs_job_err": max(abs(v["rel_err"]) for v in per_job.values()),
        "calib": cal,
        "report": rep,
    }


def _fresh_ok(policy: Policy) -> bool:
    """A stateless policy with a no-argument constructor is re-created (no state carried over from the real run)."""
    try:
        return type(policy) is not Policy and repr(type(policy)()) == repr(policy)
    except TypeError:
        return False
