"""Jobs and their run-time state: the two types every scheduler of ``tinylearn.sched`` reads.

A ``Job`` is what a user submits: a number of *steps* (the boundaries at which it may be paused, preempted or
checkpointed), a resource demand (``{"cpu": cores, "mem_gb": GiB}`` on the real 2-core cluster; ``{"gpu": n,
"mem_gb": ...}`` in the simulator), a priority, an optional deadline (seconds after submission), a tenant and its
weight (fair sharing), the workload it runs, and optionally the user's estimate of one step's time (what SJF/SRPT
order by; the real run measures the true one).

A ``JobState`` is the scheduler's view of one submitted job: when it was submitted, started, finished, how many
steps are done, how much service it has received, how often it was preempted, and its state. Policies
(``policies.py``), the real cluster (``cluster.py``) and the discrete-event simulator (``sim.py``) all read and
write the same fields, so one policy object runs unchanged on real processes and in the simulator.

``validate_job(job, capacity)`` is the single check of a submission: a negative or non-numeric demand, a deadline
that is not in the future, a job larger than the whole cluster, zero steps → ``ValueError`` naming the field and
the offending value (nothing is queued).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._inputs import is_int, is_real

STATES = ("waiting", "running", "paused", "done", "failed", "killed")
WORKLOADS = ("matmul", "cnn", "gpt", "sleep", "crash", "hang")


@dataclass
class Job:
    """One submitted unit of work (see the module docstring)."""

    name: str
    steps: int
    demand: dict[str, float] = field(default_factory=lambda: {"cpu": 1.0})
    priority: int = 0
    deadline_s: float | None = None  # relative to submission; None = no deadline
    tenant: str = "default"
    weight: float = 1.0  # the tenant's share weight (fair sharing); > 0
    workload: str = "matmul"
    est_step_s: float | None = None  # the user's estimate of one step (SJF / SRPT order by it); None = unknown
    max_runtime_s: float | None = None  # a job running longer is killed (others unaffected)
    size: int = 128  # workload size knob (matmul n, CNN batch, ...)
    seed: int = 0

    def __post_init__(self) -> None:
        # a job is checked when it is made (its own fields) and again when it is submitted (against the capacity)
        validate_job(self, {k: math.inf for k in self.demand} if isinstance(self.demand, Mapping) else {})

    @property
    def gang(self) -> int:
        """Processes that must run together (a multi-process job): its whole-core cpu demand, at least 1."""
        return max(1, int(math.ceil(float(self.demand.get("cpu", 1.0)))))


@dataclass(eq=False)
class JobState:
    """The scheduler's record of one submitted job (identity-compared: one object per submission)."""

    job: Job
    submit_t: float
    state: str = "waiting"
    start_t: float | None = None  # first start
    finish_t: float | None = None
    done_steps: int = 0
    attained_s: float = 0.0  # service received so far (seconds of running)
    preemptions: int = 0
    step_times: list[float] = field(default_factory=list)  # measured (real cluster) or simulated seconds per step
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def remaining_steps(self) -> int:
        return self.job.steps - self.done_steps

    def step_estimate(self) -> float:
        """Seconds per step: the mean measured so far, else the user's estimate, else 1.0 (unknown)."""
        if self.step_times:
            return sum(self.step_times) / len(self.step_times)
        return float(self.job.est_step_s) if self.job.est_step_s is not None else 1.0

    def remaining_s(self) -> float:
        """Estimated seconds of service still needed (what SRPT orders by)."""
        return self.remaining_steps * self.step_estimate()

    def total_s(self) -> float:
        """Estimated total service (what SJF orders by): the user's estimate when given, else the running one."""
        return self.job.steps * self.step_estimate()

    def deadline_t(self) -> float:
        """Absolute deadline (inf without one)."""
        return math.inf if self.job.deadline_s is None else self.submit_t + float(self.job.deadline_s)

    def jct(self) -> float | None:
        """Job completion time: finish - submit (None until done)."""
        return None if self.finish_t is None else self.finish_t - self.submit_t

    def wait(self) -> float | None:
        """Queueing delay before the first start."""
        return None if self.start_t is None else self.start_t - self.submit_t


def validate_job(job: Any, capacity: Mapping[str, float]) -> Job:
    """``job`` checked against the cluster's ``capacity`` (see the module docstring); returns it."""
    if not isinstance(job, Job):
        raise TypeError(f"job: expected a tinylearn.sched.Job, got {type(job).__name__}")
    if not isinstance(job.name, str) or not job.name:
        raise ValueError(f"name: a job needs a non-empty name, got {job.name!r}")
    if not is_int(job.steps) or job.steps < 1:
        raise ValueError(f"steps: expected an int >= 1, got {job.steps!r} (job {job.name!r})")
    if not isinstance(job.demand, Mapping) or not job.demand:
        raise ValueError(f"demand: expected a non-empty dict of resource -> amount, got {job.demand!r}")
    for res, amt in job.demand.items():
        if not is_real(amt) or not math.isfinite(float(amt)) or float(amt) < 0:
            raise ValueError(f"demand: {res}={amt!r} must be a finite number >= 0 (job {job.name!r})")
        if res not in capacity:
            raise ValueError(f"demand: resource {res!r} does not exist in this cluster ({sorted(capacity)})")
        if float(amt) > float(capacity[res]):
            raise ValueError(
                f"demand: {res}={amt} is larger than the whole cluster ({res}={capacity[res]}); job {job.name!r} "
                "could never run"
            )
    if job.deadline_s is not None and (not is_real(job.deadline_s) or not float(job.deadline_s) > 0):
        raise ValueError(f"deadline_s: must be in the future (> 0 s after submission), got {job.deadline_s!r}")
    if not is_real(job.weight) or not float(job.weight) > 0:
        raise ValueError(f"weight: expected a number > 0, got {job.weight!r}")
    if job.workload not in WORKLOADS:
        raise ValueError(f"workload: expected one of {WORKLOADS}, got {job.workload!r}")
    if job.est_step_s is not None and (not is_real(job.est_step_s) or not float(job.est_step_s) > 0):
        raise ValueError(f"est_step_s: expected a number > 0 or None, got {job.est_step_s!r}")
    if job.max_runtime_s is not None and (not is_real(job.max_runtime_s) or not float(job.max_runtime_s) > 0):
        raise ValueError(f"max_runtime_s: expected a number > 0 or None, got {job.max_runtime_s!r}")
    if not is_int(job.priority):
        raise ValueError(f"priority: expected an int, got {job.priority!r}")
    return job


def fits(demand: Mapping[str, float], free: Mapping[str, float]) -> bool:
    """Whether ``demand`` fits in ``free`` (every resource; a resource not in ``free`` has none)."""
    return all(float(a) <= float(free.get(r, 0.0)) + 1e-9 for r, a in demand.items())


def take(free: Mapping[str, float], demand: Mapping[str, float], sign: float = 1.0) -> dict[str, float]:
    """``free`` minus ``demand`` (or plus, with ``sign=-1``), as a new dict."""
    out = dict(free)
    for r, a in demand.items():
        out[r] = out.get(r, 0.0) - sign * float(a)
    return out


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one gets everything."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("values: Jain's index of an empty list is undefined")
    if any(x < 0 or not math.isfinite(x) for x in xs):
        raise ValueError(f"values: expected finite non-negative numbers, got {xs}")
    sq = sum(x * x for x in xs)
    return 1.0 if sq == 0 else sum(xs) ** 2 / (len(xs) * sq)
