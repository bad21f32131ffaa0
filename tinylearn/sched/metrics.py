"""Scheduling metrics computed from ``JobState``s (real cluster or simulator) and the ``ClusterReport`` they fill.

Definitions (Feitelson & Rudolph's workload metrics; Jain, Chiu & Hawe 1984 for the fairness index):

    JCT (job completion time)  finish - submit, over the jobs that finished ("done"); mean and p99 (numpy linear
                               percentile)
    wait (queueing delay)      first start - submit
    makespan                   last finish - first submission
    throughput                 finished jobs / makespan
    utilisation                busy core-seconds / (cores x makespan); busy = the cores each job held while it
                               ran (from its run segments: start/resume ... pause/stop/done/failed/killed)
    jain                       Jain's index over the jobs' service rates attained / JCT (= 1 / slowdown): 1 when
                               every job progressed at the same rate, 1/n when one job took everything
    jain_tenants               Jain's index over the tenants' service / weight (weighted fair share; 1 = exact)
    weighted_p99_jct_s         p99 over jobs of sla_weight x JCT (the weighted tail that Q155 asks to minimise)
    deadline_misses            finished after their absolute deadline, or never finished, with a deadline
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .jobs import JobState, jain_index

RUN_START = ("start", "resume", "restart")
RUN_END = ("paused", "stopped", "done", "failed", "killed")

Event = tuple[float, str, str, str]


@dataclass
class ClusterReport:
    """Result of one run: the final ``JobState``s, the event log ``(t, kind, job_name, detail)`` and the metrics."""

    jobs: list[JobState]
    events: list[Event]
    makespan_s: float
    mean_jct_s: float
    p99_jct_s: float
    mean_wait_s: float
    utilisation: float
    jain: float
    throughput_jobs_s: float = 0.0
    jain_tenants: float = 1.0
    weighted_p99_jct_s: float = math.nan
    deadline_misses: int = 0
    tenant_service_s: dict[str, float] = field(default_factory=dict)
    policy: str = ""

    def by_name(self) -> dict[str, JobState]:
        return {js.name: js for js in self.jobs}

    def completion_order(self) -> list[str]:
        """Names of the finished jobs in the order they finished."""
        done = [js for js in self.jobs if js.state == "done" and js.finish_t is not None]
        return [js.name for js in sorted(done, key=lambda j: j.finish_t)]  # type: ignore[arg-type, return-value]

    def row(self) -> dict[str, float | str]:
        """The metrics as one table row."""
        return {
            "policy": self.policy,
            "mean JCT s": self.mean_jct_s,
            "p99 JCT s": self.p99_jct_s,
            "mean wait s": self.mean_wait_s,
            "makespan s": self.makespan_s,
            "utilisation": self.utilisation,
            "Jain": self.jain,
        }


def segments(events: Sequence[Event]) -> list[tuple[str, float, float, tuple[int, ...]]]:
    """Run segments (job, t_start, t_end, cores) paired from the event log: a RUN_START event whose detail holds
    ``cores=0,1`` opens one, the job's next RUN_END event closes it (for a Gantt chart and the utilisation)."""
    open_: dict[str, tuple[float, tuple[int, ...]]] = {}
    out = []
    for t, kind, name, detail in sorted(events, key=lambda e: e[0]):
        if kind in RUN_START:
            cores: tuple[int, ...] = ()
            for part in str(detail).split():
                if part.startswith("cores="):
                    cores = tuple(int(c) for c in part[6:].split(",") if c)
            open_[name] = (t, cores)
        elif kind in RUN_END and name in open_:
            t0, cores = open_.pop(name)
            out.append((name, t0, t, cores))
    return out


def _pct(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if xs else math.nan


def summarize(jobs: Sequence[JobState], events: Sequence[Event], cores: int, policy: str = "") -> ClusterReport:
    """All metrics of the module docstring from the final ``jobs`` and the ``events`` of one run."""
    if not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores: expected an int >= 1, got {cores!r}")
    jobs = list(jobs)
    done = [js for js in jobs if js.state == "done" and js.jct() is not None]
    jcts = [js.jct() for js in done]
    waits = [js.wait() for js in jobs if js.wait() is not None]
    ends = [js.finish_t for js in jobs if js.finish_t is not None]
    t0 = min((js.submit_t for js in jobs), default=0.0)
    makespan = max(ends) - t0 if ends else 0.0
    busy = sum((t1 - ta) * max(1, len(c)) for _, ta, t1, c in segments(events))
    rates = [min(1.0, js.attained_s / js.jct()) for js in done if js.jct()]  # type: ignore[operator]
    service: dict[str, float] = {}
    weight: dict[str, float] = {}
    for js in jobs:
        service[js.job.tenant] = service.get(js.job.tenant, 0.0) + js.attained_s * js.job.gang
        weight[js.job.tenant] = float(js.job.weight)
    misses = sum(
        1
        for js in jobs
        if js.job.deadline_s is not None and not (js.state == "done" and (js.finish_t or math.inf) <= js.deadline_t())
    )
    return ClusterReport(
        jobs=jobs,
        events=list(events),
        makespan_s=makespan,
        mean_jct_s=float(np.mean(jcts)) if jcts else math.nan,
        p99_jct_s=_pct(jcts, 99),  # type: ignore[arg-type]
        mean_wait_s=float(np.mean(waits)) if waits else math.nan,
        utilisation=busy / (cores * makespan) if makespan > 0 else 0.0,
        jain=jain_index(rates) if rates else 1.0,
        throughput_jobs_s=len(done) / makespan if makespan > 0 else 0.0,
        jain_tenants=jain_index([service[t] / weight[t] for t in service]) if service else 1.0,
        weighted_p99_jct_s=_pct([js.job.weight * js.jct() for js in done], 99),  # type: ignore[operator]
        deadline_misses=misses,
        tenant_service_s=service,
        policy=policy,
    )
