"""A discrete-event simulator of a cluster running the SAME policies as the real one -- a MODEL of time and energy.

The simulator replays a list of ``(arrival_s, Job)`` through a ``Policy`` with the interface of ``policies.py``:
the same ``JobState`` objects, the same ``select(waiting, running, free, now) -> (to_start, to_preempt)`` call, the
same gang rule (a job starts only when its whole demand fits; its units are taken and given back together). What the
real cluster (``cluster.py``) measures on processes, the simulator computes:

    events      a heap of (time, sequence number, kind): "arrive" and "step" (a step boundary; the last one is the
                completion). Ties are broken by the sequence number, so a run is deterministic.
    step time   ``job.est_step_s`` or ``step_s_of(job, device)`` (a gang's step is its slowest unit's), times
                ``interference`` when another job runs as the step starts (co-located jobs share memory bandwidth
                and caches; the factor is measured on this VM by ``calibrate.py``; fixed for the whole step), plus
                ``startup_s`` on a job's first step (process spawn and imports on the real cluster; it counts as
                service and in the JCT, not in ``step_times``, as a real worker reports its steps); a dict
                ``{workload: seconds}`` gives each workload its own (a CNN worker imports and loads more than a
                matmul one; a workload not in the dict gets the median of the dict's values), plus
                ``warmup_of(job)[i]`` on step i (a cold worker's first steps; ``calibrate.warmup_fn``).
    ties        jobs arriving at the same time keep their order in the input list (``extra["seq"]``, as the real
                cluster's submission sequence), which FIFO-like policies use to break the tie.
    decisions   ``select`` is called after every batch of events at one time instant whenever a job waits (with an
                empty queue nothing can start, so the call is skipped). Preemption happens at step boundaries only,
                as on the real cluster: a running job the policy wants to preempt mid-step finishes that step, then
                pauses and releases its units; the latest decision wins (a job no longer chosen keeps running).
    energy      MODEL: every busy unit draws ``spec.power_w(f, 1.0)``, every idle unit ``spec.idle_w`` until the
                makespan (``device_model.py``: P = idle + (tdp - idle) u (f/f_max)^3).

Metrics (the fields of the real ``ClusterReport`` where they overlap): JCT = finish - submit (mean, 99th percentile
with linear interpolation), queueing delay = first start - submit, utilisation = busy unit-seconds / (units x
makespan), Jain's index over the finished jobs' service rates attained / JCT (= 1 / slowdown; as in ``metrics.py``),
and in ``extra["jain_tenant_speed"]`` the same over tenants' mean rates.

``single_machine(arrivals, policy)`` is the textbook reference: work-conserving schedules of one unit-speed machine
(FIFO, SJF non-preemptive, SRPT preemptive at any instant -- Schrage 1968 showed SRPT minimises mean flow time on
one machine), computed exactly by its own event loop, not by quantised steps.

Sources: Slurm's scheduler (event-driven, gang allocation of whole nodes), Tiresias (NSDI'19) and Gavel (OSDI'20)
for simulating DL clusters from traces, Schrage & Miller 1966/Schrage 1968 for SRPT.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._inputs import is_real
from .device_model import A100, DeviceSpec
from .jobs import Job, JobState, fits, jain_index, take, validate_job
from .policies import Policy

_EPS = 1e-12


@dataclass
class SimReport:
    """One simulated run (MODEL): the JobStates and an event log ``(t, kind, job_name, detail)``, plus metrics."""

    jobs: list[JobState]
    events: list[tuple[float, str, str, Any]]
    makespan_s: float
    mean_jct_s: float
    p99_jct_s: float
    mean_wait_s: float
    utilisation: float
    jain: float
    energy_j: float
    policy: str = ""
    preemptions: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def jct(self) -> dict[str, float]:
        """Job name -> JCT of every finished job."""
        return {js.name: js.jct() for js in self.jobs if js.jct() is not None}  # type: ignore[misc]

    def row(self) -> dict[str, float]:
        """The metrics as a flat dict (a table row)."""
        keys = ("makespan_s", "mean_jct_s", "p99_jct_s", "mean_wait_s", "utilisation", "jain", "energy_j")
        return {k: float(getattr(self, k)) for k in keys}


def jct_stats(states: Sequence[JobState]) -> tuple[float, float, float]:
    """(mean JCT, p99 JCT, mean wait) over the finished jobs (nan when none finished)."""
    jcts = [js.jct() for js in states if js.state == "done" and js.jct() is not None]
    waits = [js.wait() for js in states if js.wait() is not None]
    if not jcts:
        return math.nan, math.nan, math.nan
    return float(np.mean(jcts)), float(np.percentile(jcts, 99)), float(np.mean(waits)) if waits else math.nan


def job_jain(states: Sequence[JobState]) -> float:
    """Jain's index over the finished jobs' service rates attained / JCT (1 = every job slowed down equally)."""
    rates = [js.attained_s / js.jct() for js in states if js.state == "done" and js.jct()]  # type: ignore[operator]
    return jain_index(rates) if rates else math.nan


def tenant_jain(states: Sequence[JobState]) -> float:
    """Jain's index over tenants' mean normalised speed (attained service / JCT) of their finished jobs."""
    per: dict[str, list[float]] = {}
    for js in states:
        j = js.jct()
        if js.state == "done" and j is not None and j > 0:
            per.setdefault(js.job.tenant, []).append(js.attained_s / j)
    return jain_index([float(np.mean(v)) for v in per.values()]) if per else math.nan


class Simulator:
    """Discrete-event cluster simulator (MODEL); see the module docstring.

    ``devices``: a capacity dict (``{"gpu": 64, "mem_gb": 2560}`` or ``{"cpu": 2}``; the unit resource is "gpu" if
    present, else "cpu", else the first key; ``spec`` gives its power model, default A100 for "gpu", else
    ``DeviceSpec.cpu_core``'s nominal 15 W / 2 W) or a list of
    ``DeviceSpec`` (one per unit: capacity ``{"gpu": len(devices)}``, each unit its own speed and power; a gang runs
    at its slowest unit's pace). ``step_s_of(job, spec) -> seconds`` overrides ``job.est_step_s``.
    """

    def __init__(
        self,
        devices: Mapping[str, float] | Sequence[DeviceSpec],
        policy: Policy,
        *,
        step_s_of: Callable[[Job, DeviceSpec | None], float] | None = None,
        spec: DeviceSpec | None = None,
        f_mhz: float | None = None,
        interference: float = 1.0,
        startup_s: float | Mapping[str, float] = 0.0,
        warmup_of: Callable[[Job], Sequence[float]] | None = None,
    ) -> None:
        if isinstance(devices, Mapping):
            if not devices:
                raise ValueError(f"devices: expected a non-empty capacity dict, got {devices!r}")
            for r, v in devices.items():
                if not is_real(v) or not math.isfinite(float(v)) or float(v) <= 0:
                    raise ValueError(f"devices: capacity {r}={v!r} must be a finite number > 0")
            self.capacity = {str(r): float(v) for r, v in devices.items()}
            self.unit = "gpu" if "gpu" in devices else "cpu" if "cpu" in devices else next(iter(devices))
            self.units: list[DeviceSpec] | None = None
            default = A100 if self.unit == "gpu" else DeviceSpec.cpu_core(1.0)
            self.spec = spec if spec is not None else default
        elif isinstance(devices, Sequence) and devices and all(isinstance(d, DeviceSpec) for d in devices):
            self.units = list(devices)
            self.capacity = {"gpu": float(len(self.units))}
            self.unit = "gpu"
            self.spec = self.units[0]
        else:
            raise TypeError(f"devices: expected a capacity dict or a non-empty list of DeviceSpec, got {devices!r}")
        if not isinstance(policy, Policy):
            raise TypeError(f"policy: expected a tinylearn.sched Policy, got {type(policy).__name__} {policy!r}")
        if step_s_of is not None and not callable(step_s_of):
            raise TypeError(f"step_s_of: expected a callable (job, device) -> seconds, got {step_s_of!r}")
        if warmup_of is not None and not callable(warmup_of):
            raise TypeError(f"warmup_of: expected a callable job -> [extra s of step 0, 1, ...], got {warmup_of!r}")
        if not is_real(interference) or not 1.0 <= float(interference) < 100:
            raise ValueError(f"interference: expected a slowdown factor in [1, 100), got {interference!r}")
        per_wl = dict(startup_s) if isinstance(startup_s, Mapping) else {}
        for v in per_wl.values() if per_wl else [startup_s]:
            if not is_real(v) or not 0.0 <= float(v) < 1e6:
                raise ValueError(f"startup_s: expected seconds >= 0 (or a dict workload -> seconds), got {startup_s!r}")
        if isinstance(startup_s, Mapping) and not per_wl:
            raise ValueError("startup_s: expected a non-empty dict workload -> seconds, got {}")
        self.policy = policy
        self.step_s_of = step_s_of
        self.warmup_of = warmup_of
        self.f_mhz = f_mhz
        self.interference = float(interference)
        self.startup_by_workload = {str(k): float(v) for k, v in per_wl.items()}
        self.startup_s = float(np.median(list(per_wl.values()))) if per_wl else float(startup_s)  # type: ignore[arg-type]
        if f_mhz is not None:
            self.spec.power_w(f_mhz, 0.0)  # validates the clock against the spec's range

    # --------------------------------------------------------------------------------------------- helpers
    def _busy_w(self, spec: DeviceSpec) -> float:
        return spec.power_w(spec.f_max_mhz if self.f_mhz is None else self.f_mhz, 1.0)

    def _base_step(self, job: Job, units: list[int]) -> float:
        if self.step_s_of is None:
            return float(job.est_step_s)  # type: ignore[arg-type]
        specs: list[DeviceSpec | None] = [self.units[u] for u in units] if self.units else [self.spec]
        vals = [float(self.step_s_of(job, s)) for s in specs]
        if not all(math.isfinite(v) and v > 0 for v in vals):
            raise ValueError(f"step_s_of: must return seconds > 0, got {vals} for job {job.name!r}")
        return max(vals)

    # --------------------------------------------------------------------------------------------- the loop
    def simulate(self, jobs_with_arrivals: Sequence[tuple[float, Job]], *, max_events: int = 5_000_000) -> SimReport:
        """Run the trace to completion and return a ``SimReport`` (see the module docstring)."""
        items = list(jobs_with_arrivals) if isinstance(jobs_with_arrivals, Sequence) else None
        if not items:
            raise ValueError(f"jobs_with_arrivals: expected a non-empty list of (arrival_s, Job), got {items!r}")
        names: set[str] = set()
        for it in items:
            if not (isinstance(it, tuple) and len(it) == 2 and is_real(it[0])):
                raise ValueError(f"jobs_with_arrivals: expected (arrival_s, Job) pairs, got {it!r}")
            t, job = it
            if not math.isfinite(float(t)) or float(t) < 0:
                raise ValueError(f"jobs_with_arrivals: arrival time must be finite and >= 0, got {t!r}")
            validate_job(job, self.capacity)
            if self.step_s_of is None and job.est_step_s is None:
                raise ValueError(f"est_step_s: job {job.name!r} has none and no step_s_of was given")
            if job.name in names:
                raise ValueError(f"jobs_with_arrivals: job names must be unique, {job.name!r} repeats")
            names.add(job.name)
        order = sorted(range(len(items)), key=lambda i: (float(items[i][0]), i))
        states = [JobState(items[i][1], submit_t=float(items[i][0]), extra={"seq": i}) for i in order]
        heap: list[tuple[float, int, str, Any]] = []
        seq = 0
        for js in states:
            heapq.heappush(heap, (js.submit_t, seq, "arrive", js))
            seq += 1
        log: list[tuple[float, str, str, Any]] = []
        free = dict(self.capacity)
        free_units = list(range(len(self.units))) if self.units else []
        n_units = len(self.units) if self.units else self.capacity[self.unit]
        unit_busy = [0.0] * len(self.units) if self.units else []
        busy_unit_s = 0.0
        busy_j = 0.0
        waiting: list[JobState] = []
        running: list[JobState] = []
        now, n_ev, preempts = 0.0, 0, 0
        to_pause: set[int] = set()  # running jobs the latest decision preempts (they pause at their next boundary)

        def release(js: JobState) -> None:
            nonlocal free
            running.remove(js)
            free = take(free, js.job.demand, sign=-1)
            if self.units:
                free_units.extend(js.extra.pop("_units"))
                free_units.sort()

        def start_step(js: JobState) -> None:
            nonlocal seq
            base = self._base_step(js.job, js.extra.get("_units", []))
            dt = base * (self.interference if len(running) > 1 else 1.0)
            if self.warmup_of is not None:  # a cold worker's first steps (calibrate.py's warmup_s), looked up once
                warm = js.extra.get("_warm")
                if warm is None:
                    warm = js.extra["_warm"] = self.warmup_of(js.job)
                if js.done_steps < len(warm):
                    dt += float(warm[js.done_steps])
            js.extra["_su"] = 0.0
            if js.done_steps == 0 and not js.extra.get("_started"):
                su = self.startup_by_workload.get(js.job.workload, self.startup_s)
                dt += su
                js.extra["_started"] = True
                js.extra["_su"] = su
            js.extra["_t0"] = now
            js.extra["_tok"] = seq
            heapq.heappush(heap, (now + dt, seq, "step", js))
            seq += 1

        while heap:
            now = heap[0][0]
            changed = False
            boundary: list[JobState] = []
            while heap and heap[0][0] <= now + _EPS:
                _, tok, kind, js = heapq.heappop(heap)
                n_ev += 1
                if n_ev > max_events:
                    raise RuntimeError(f"max_events: the simulation exceeded {max_events} events (a livelock?)")
                if kind == "arrive":
                    waiting.append(js)
                    log.append((now, "arrive", js.name, None))
                    changed = True
                    continue
                if js.extra.get("_tok") != tok or js.state != "running":
                    continue
                dt = now - js.extra["_t0"]
                js.done_steps += 1
                js.attained_s += dt
                js.step_times.append(dt - js.extra["_su"])  # as a worker reports it: startup not in the step
                amt = float(js.job.demand.get(self.unit, 0.0))
                busy_unit_s += dt * amt
                if self.units:
                    for u in js.extra["_units"]:
                        unit_busy[u] += dt
                        busy_j += dt * self._busy_w(self.units[u])
                else:
                    busy_j += dt * amt * self._busy_w(self.spec)
                js.extra["energy_j"] = js.extra.get("energy_j", 0.0) + (
                    dt * sum(self._busy_w(self.units[u]) for u in js.extra["_units"])
                    if self.units
                    else dt * amt * self._busy_w(self.spec)
                )
                lim = js.job.max_runtime_s
                if js.remaining_steps <= 0:
                    js.state, js.finish_t = "done", now
                    release(js)
                    log.append((now, "finish", js.name, None))
                    changed = True
                elif lim is not None and js.attained_s >= float(lim) - _EPS:
                    js.state, js.finish_t, js.error = "killed", now, f"ran past max_runtime_s={lim}"
                    release(js)
                    log.append((now, "kill", js.name, js.error))
                    changed = True
                elif id(js) in to_pause:
                    js.state = "waiting"
                    js.preemptions += 1
                    preempts += 1
                    to_pause.discard(id(js))
                    release(js)
                    waiting.append(js)
                    log.append((now, "preempt", js.name, js.done_steps))
                    changed = True
                else:
                    boundary.append(js)
            if waiting and (changed or boundary):
                to_start, to_preempt = self.policy.select(list(waiting), list(running), dict(free), now)
                run_ids = {id(r) for r in running}
                to_pause = {id(p) for p in to_preempt if id(p) in run_ids}
                for r in [b for b in boundary if id(b) in to_pause]:
                    boundary.remove(r)
                    to_pause.discard(id(r))
                    r.state = "waiting"
                    r.preemptions += 1
                    preempts += 1
                    release(r)
                    waiting.append(r)
                    log.append((now, "preempt", r.name, r.done_steps))
                for js in to_start:
                    if js not in waiting or not fits(js.job.demand, free):
                        continue  # gang rule: all of its demand now, or wait for the next event
                    waiting.remove(js)
                    free = take(free, js.job.demand)
                    if self.units:
                        k = int(math.ceil(float(js.job.demand.get("gpu", 0.0)) - 1e-9))
                        js.extra["_units"], free_units[:] = free_units[:k], free_units[k:]
                    kind = "resume" if js.start_t is not None else "start"
                    js.start_t = now if js.start_t is None else js.start_t
                    js.state = "running"
                    running.append(js)
                    log.append((now, kind, js.name, list(js.extra.get("_units", []))))
                    boundary.append(js)
            elif not waiting:
                to_pause.clear()  # nobody waits for the resources any more: no reason to preempt
            for js in boundary:  # after all starts, so a step's interference sees every job running with it
                start_step(js)
            if not heap and waiting:
                raise RuntimeError(
                    f"policy: {self.policy!r} left {len(waiting)} job(s) waiting on an idle cluster "
                    f"(first: {waiting[0].name!r}); a policy must start a job that fits"
                )
        for js in states:
            for k in ("_t0", "_tok", "_started", "_units", "_su"):
                js.extra.pop(k, None)
        t0 = min(js.submit_t for js in states)
        makespan = max(js.finish_t for js in states if js.finish_t is not None) - t0
        mean_jct, p99, mean_wait = jct_stats(states)
        if self.units:
            idle_j = sum(s.idle_w * max(0.0, makespan - b) for s, b in zip(self.units, unit_busy, strict=True))
        else:
            idle_j = self.spec.idle_w * max(0.0, n_units * makespan - busy_unit_s)
        util = busy_unit_s / (n_units * makespan) if makespan > 0 else 0.0
        unit_j = [b * self._busy_w(s) + s.idle_w * max(0.0, makespan - b)
                  for s, b in zip(self.units or [], unit_busy, strict=True)]  # fmt: skip
        return SimReport(states, log, makespan, mean_jct, p99, mean_wait, util, job_jain(states),
                         busy_j + idle_j, policy=getattr(self.policy, "name", ""), preemptions=preempts,
                         extra={"busy_unit_s": busy_unit_s, "idle_j": idle_j, "busy_j": busy_j,
                                "jain_tenant_speed": tenant_jain(states), "unit_busy_s": unit_busy,
                                "unit_energy_j": unit_j})  # fmt: skip


def simulate(
    jobs_with_arrivals: Sequence[tuple[float, Job]],
    devices: Mapping[str, float] | Sequence[DeviceSpec],
    policy: Policy,
    **kwargs: Any,
) -> SimReport:
    """``Simulator(devices, policy, **kwargs).simulate(jobs_with_arrivals)`` (MODEL)."""
    return Simulator(devices, policy, **kwargs).simulate(jobs_with_arrivals)


SINGLE_MACHINE_POLICIES = ("fifo", "sjf", "srpt")


def single_machine(arrivals: Sequence[tuple[float, float]], policy: str | Policy) -> list[float]:
    """Completion times (input order) of jobs ``(arrival_s, work_s)`` on one unit-speed machine under ``policy``:
    "fifo", "sjf" (non-preemptive shortest job first) or "srpt" (preemptive at any instant). A ``Policy`` object is
    mapped by its ``name``. Ties: earlier arrival, then input order. Exact event loop (no time steps)."""
    name = policy if isinstance(policy, str) else getattr(policy, "name", None)
    if name not in SINGLE_MACHINE_POLICIES:
        raise ValueError(f"policy: expected one of {SINGLE_MACHINE_POLICIES} (or a Policy named so), got {policy!r}")
    jobs = list(arrivals)
    for a in jobs:
        if not (isinstance(a, tuple | list) and len(a) == 2 and all(is_real(x) for x in a)):
            raise ValueError(f"arrivals: expected (arrival_s, work_s) pairs, got {a!r}")
        if not (math.isfinite(a[0]) and a[0] >= 0 and math.isfinite(a[1]) and a[1] > 0):
            raise ValueError(f"arrivals: need arrival_s >= 0 and work_s > 0 (finite), got {a!r}")
    n = len(jobs)
    order = sorted(range(n), key=lambda i: (jobs[i][0], i))
    rem = [float(w) for _, w in jobs]
    done = [math.nan] * n
    t, k, ready, cur = 0.0, 0, [], None  # ready: indices that arrived and are not done
    while k < n or ready or cur is not None:
        if cur is None and not ready:
            t = max(t, float(jobs[order[k]][0]))
        while k < n and jobs[order[k]][0] <= t + _EPS:
            ready.append(order[k])
            k += 1
        if cur is None or name == "srpt":
            if cur is not None:
                ready.append(cur)
            if name == "fifo":
                key = lambda i: (jobs[i][0], i)  # noqa: E731
            elif name == "sjf":
                key = lambda i: (rem[i], jobs[i][0], i)  # noqa: E731
            else:
                key = lambda i: (rem[i], jobs[i][0], i)  # noqa: E731
            cur = min(ready, key=key)
            ready.remove(cur)
        nxt = float(jobs[order[k]][0]) if k < n else math.inf
        if name == "srpt" and t + rem[cur] > nxt + _EPS:
            rem[cur] -= nxt - t
            t = nxt
            continue
        t += rem[cur]
        rem[cur] = 0.0
        done[cur] = t
        cur = None
    return done
