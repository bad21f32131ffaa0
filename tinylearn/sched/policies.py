"""Scheduling policies: one interface for the real cluster (``cluster.py``) and the simulator (``sim.py``).

A policy sees the waiting and running ``JobState``s, the free resources and the time, and answers with the jobs to
start now and the running jobs to preempt (a preemptive policy only). Both engines call it at every event (an
arrival, a step boundary, a completion) and apply the answer: they start a job only when its demand fits in the
free resources plus those the preempted jobs release (gang scheduling: a job's whole demand starts at once or not
at all), so a policy cannot over-commit the cluster.

    FIFO            submission order; the head of the queue blocks the rest (no backfill)
    SJF             shortest estimated total service first, non-preemptive (estimate: ``JobState.total_s``)
    SRPT            shortest estimated REMAINING service first, preemptive: at every event the set of jobs with the
                    least ``remaining_s()`` that fits runs; a running job is preempted only when smaller waiting
                    jobs need its resources (ties keep the running job: no thrashing)
    EDF             earliest absolute deadline first (jobs without a deadline last), non-preemptive
    PriorityAging   effective priority = priority + rate * seconds waited (higher first): no starvation
    WeightedUrgency [Q155] a min-heap (``heapq``) on -w / (deadline - now): the job whose SLA weight per second of
                    slack is largest runs first; overdue jobs before all others (by weight), no deadline last
    Backfill        EASY backfilling (Lifka 1995; Slurm's sched/backfill): when the head of the base order is
                    blocked, reserve its earliest start time (the "shadow time", from the running jobs' estimated
                    remaining times); a later job may start now only if it fits now AND either ends before the
                    shadow time or uses only resources the head will not need at that time (the "extra" resources)
    WeightedFair    [Q256] weighted fair sharing between tenants (DRF, Ghodsi et al. NSDI 2011, with weights;
                    Slurm's fair-share factor is also history-based): the next job comes from the tenant with the
                    smallest dominant-resource SERVICE received so far / weight (service = seconds x dominant share,
                    so indivisible 1-core jobs on 2 cores still converge to the weight ratio over time); a per-tenant
                    ``quota`` caps the resources it may hold at once; ``preemptive=True`` evicts the youngest job of
                    the tenant with the largest current dominant share / weight when a waiting tenant would be better
                    off, in the leximin sense of weighted max-min fairness (each eviction strictly improves the
                    sorted pair of weighted shares, so evictions never cycle)

Preemptive policies (SRPT, WeightedFair(preemptive=True)) return jobs to preempt; an engine applies those first
and then starts the returned jobs (whose demands fit in ``free`` plus what the preempted jobs release).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .._inputs import is_real
from .jobs import JobState, fits, take

Free = Mapping[str, float]
Selection = tuple[list[JobState], list[JobState]]


class Policy:
    """Base class: ``select(waiting, running, free, now) -> (to_start, to_preempt)``; subclasses set ``order`` (a
    sort key over waiting jobs) and, for preemptive policies, override ``select``."""

    name = "policy"
    preemptive = False

    def key(self, js: JobState, now: float) -> tuple:
        """Sort key of a waiting job (smaller runs first): submission time, then submission sequence (an engine may
        set ``js.extra["seq"]``), then name."""
        return (js.submit_t, js.extra.get("seq", 0), js.job.name)

    def select(
        self, waiting: Sequence[JobState], running: Sequence[JobState], free: Mapping[str, float], now: float
    ) -> tuple[list[JobState], list[JobState]]:
        """Start jobs in ``key`` order while the next one fits; stop at the first that does not (no backfill)."""
        start, avail = [], dict(free)
        for js in sorted(waiting, key=lambda j: self.key(j, now)):
            if not fits(js.job.demand, avail):
                break
            start.append(js)
            avail = take(avail, js.job.demand)
        return start, []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FIFO(Policy):
    """First in, first out: submission order, head-of-line blocking."""

    name = "fifo"


class SJF(Policy):
    """Shortest (estimated total) job first, non-preemptive."""

    name = "sjf"

    def key(self, js: JobState, now: float) -> tuple:
        return (js.total_s(), js.submit_t, js.job.name)


def _capacity(running: Sequence[JobState], free: Free) -> dict[str, float]:
    """The whole cluster: the free resources plus those the running jobs hold."""
    cap = dict(free)
    for js in running:
        cap = take(cap, js.job.demand, sign=-1)
    return cap


class SRPT(Policy):
    """Shortest remaining processing time, preemptive (see the module docstring)."""

    name = "srpt"
    preemptive = True

    def key(self, js: JobState, now: float) -> tuple:
        return (js.remaining_s(), js.submit_t, js.job.name)

    def select(self, waiting: Sequence[JobState], running: Sequence[JobState], free: Free, now: float) -> Selection:
        """Greedy over waiting + running in remaining-time order on the whole cluster; a running job not chosen
        was displaced by smaller jobs and is preempted."""
        run_ids = {id(j) for j in running}
        both = list(running) + list(waiting)
        # ties: a running job first (0) so equal remaining work never swaps jobs back and forth
        both.sort(key=lambda j: (j.remaining_s(), 0 if id(j) in run_ids else 1, j.submit_t, j.job.name))
        avail, chosen = _capacity(running, free), set()
        for js in both:
            if fits(js.job.demand, avail):
                chosen.add(id(js))
                avail = take(avail, js.job.demand)
        start = [j for j in both if id(j) in chosen and id(j) not in run_ids]
        preempt = [j for j in running if id(j) not in chosen]
        return start, preempt


class EDF(Policy):
    """Earliest (absolute) deadline first; jobs without a deadline last, in submission order."""

    name = "edf"

    def key(self, js: JobState, now: float) -> tuple:
        return (js.deadline_t(), js.submit_t, js.job.name)


class PriorityAging(Policy):
    """Highest effective priority first: ``priority + rate * (now - submit_t)`` (aging prevents starvation)."""

    name = "priority_aging"

    def __init__(self, rate: float = 1.0) -> None:
        if isinstance(rate, bool) or not is_real(rate) or not math.isfinite(rate) or rate < 0:
            raise ValueError(f"rate: expected a finite number >= 0 (priority per second waited), got {rate!r}")
        self.rate = float(rate)

    def effective(self, js: JobState, now: float) -> float:
        return float(js.job.priority) + self.rate * max(0.0, now - js.submit_t)

    def key(self, js: JobState, now: float) -> tuple:
        return (-self.effective(js, now), js.submit_t, js.job.name)

    def __repr__(self) -> str:
        return f"PriorityAging(rate={self.rate})"


class WeightedUrgency(Policy):
    """[Q155] SLA-weighted urgency w / (deadline - now), kept in a min-heap on its negative (see module docstring)."""

    name = "weighted_urgency"

    @staticmethod
    def urgency(js: JobState, now: float) -> tuple[int, float]:
        """(class, -urgency): class 0 = overdue (by weight), 1 = w / slack, 2 = no deadline."""
        dl = js.deadline_t()
        if math.isinf(dl):
            return (2, 0.0)
        slack = dl - now
        if slack <= 0:
            return (0, -float(js.job.weight))
        return (1, -float(js.job.weight) / slack)

    def key(self, js: JobState, now: float) -> tuple:
        return (*self.urgency(js, now), js.submit_t, js.job.name)

    def select(self, waiting: Sequence[JobState], running: Sequence[JobState], free: Free, now: float) -> Selection:
        heap = [(*self.urgency(js, now), js.submit_t, i, js) for i, js in enumerate(waiting)]
        heapq.heapify(heap)
        start, avail = [], dict(free)
        while heap:
            js = heapq.heappop(heap)[-1]
            if not fits(js.job.demand, avail):
                break  # strict urgency order: the most urgent job is not overtaken
            start.append(js)
            avail = take(avail, js.job.demand)
        return start, []


def shadow_time(head: JobState, running: Sequence[JobState], free: Free, now: float) -> tuple[float, dict[str, float]]:
    """EASY backfill's reservation: the earliest time ``head`` fits if the running jobs end at their estimated
    remaining times, and the resources left over at that time once ``head`` has taken its share ("extra")."""
    avail = dict(free)
    if fits(head.job.demand, avail):
        return now, take(avail, head.job.demand)
    for js in sorted(running, key=lambda j: j.remaining_s()):
        avail = take(avail, js.job.demand, sign=-1)
        if fits(head.job.demand, avail):
            return now + js.remaining_s(), take(avail, head.job.demand)
    return math.inf, {}


class Backfill(Policy):
    """EASY backfilling on top of a base order (default FIFO); see the module docstring."""

    name = "backfill"

    def __init__(self, base: Policy | None = None) -> None:
        base = FIFO() if base is None else base
        if not isinstance(base, Policy) or base.preemptive:
            raise ValueError(f"base: expected a non-preemptive Policy, got {base!r}")
        self.base = base

    def key(self, js: JobState, now: float) -> tuple:
        return self.base.key(js, now)

    def select(self, waiting: Sequence[JobState], running: Sequence[JobState], free: Free, now: float) -> Selection:
        order = sorted(waiting, key=lambda j: self.base.key(j, now))
        start, avail, i = [], dict(free), 0
        while i < len(order) and fits(order[i].job.demand, avail):
            start.append(order[i])
            avail = take(avail, order[i].job.demand)
            i += 1
        if i >= len(order):
            return start, []
        head = order[i]
        shadow, extra = shadow_time(head, [*running, *start], avail, now)
        for js in order[i + 1 :]:
            if not fits(js.job.demand, avail):
                continue
            if now + js.remaining_s() <= shadow:
                ok = True  # ends before the reservation
            elif fits(js.job.demand, extra):
                ok = True  # only uses what the head will not need
                extra = take(extra, js.job.demand)
            else:
                ok = False
            if ok:
                start.append(js)
                avail = take(avail, js.job.demand)
        return start, []

    def __repr__(self) -> str:
        return f"Backfill(base={self.base!r})"


def _dominant(demand: Mapping[str, float], cap: Mapping[str, float]) -> float:
    """Dominant share of ``demand``: max over resources of amount / capacity."""
    return max((float(a) / float(cap[r]) for r, a in demand.items() if float(cap.get(r, 0.0)) > 0), default=0.0)


class WeightedFair(Policy):
    """[Q256] Weighted fair sharing between tenants with quotas and optional preemption (see module docstring).

    ``quota``: tenant -> {resource: max amount held at once}. A job's ``weight`` is its tenant's weight. The policy
    is stateful: it remembers every job it has seen, so finished jobs keep counting towards their tenant's service.
    """

    name = "weighted_fair"

    def __init__(self, quota: Mapping[str, Mapping[str, float]] | None = None, preemptive: bool = False) -> None:
        quota = {} if quota is None else quota
        if not isinstance(quota, Mapping):
            raise TypeError(f"quota: expected a dict tenant -> {{resource: amount}}, got {type(quota).__name__}")
        for t, q in quota.items():
            if not isinstance(q, Mapping) or any(
                isinstance(a, bool) or not is_real(a) or not a >= 0 for a in q.values()
            ):
                raise ValueError(f"quota: tenant {t!r} needs a dict of resource -> amount >= 0, got {q!r}")
        self.quota = {t: dict(q) for t, q in quota.items()}
        self.preemptive = bool(preemptive)
        self._seen: dict[int, JobState] = {}
        self._cap: dict[str, float] = {}

    def service(self) -> dict[str, float]:
        """Dominant-resource service per tenant (seconds x dominant share of the cluster) over all seen jobs; a
        running job is charged at least its estimated total when it starts (start-time fair queuing: without the
        charge, two slots freeing at once would both go to the tenant whose new jobs have no service yet)."""
        out: dict[str, float] = {}
        for js in self._seen.values():
            t = js.job.tenant
            s = max(js.attained_s, js.total_s()) if js.state == "running" else js.attained_s
            out[t] = out.get(t, 0.0) + s * _dominant(js.job.demand, self._cap)
        return out

    def _held(self, running: Sequence[JobState]) -> dict[str, dict[str, float]]:
        held: dict[str, dict[str, float]] = {}
        for js in running:
            held[js.job.tenant] = take(held.get(js.job.tenant, {}), js.job.demand, sign=-1)
        return held

    def _within_quota(self, js: JobState, held: Mapping[str, float]) -> bool:
        q = self.quota.get(js.job.tenant)
        return q is None or fits(js.job.demand, take(q, held))

    def select(self, waiting: Sequence[JobState], running: Sequence[JobState], free: Free, now: float) -> Selection:
        for js in [*waiting, *running]:
            self._seen[id(js)] = js
        cap = _capacity(running, free)
        self._cap = {r: max(float(a), self._cap.get(r, 0.0)) for r, a in cap.items()}
        service, held = self.service(), self._held(running)
        queues: dict[str, list[JobState]] = {}
        for js in sorted(waiting, key=lambda j: (j.submit_t, j.job.name)):
            queues.setdefault(js.job.tenant, []).append(js)
        weight = {t: float(q[0].job.weight) for t, q in queues.items()}
        for js in running:
            weight.setdefault(js.job.tenant, float(js.job.weight))
        start, avail = [], dict(free)
        while True:
            ready = [t for t, q in queues.items() if q and self._within_quota(q[0], held.get(t, {}))]
            ready = [t for t in ready if fits(queues[t][0].job.demand, avail)]
            if not ready:
                break
            t = min(ready, key=lambda u: (service.get(u, 0.0) / weight[u], u))
            js = queues[t].pop(0)
            start.append(js)
            avail = take(avail, js.job.demand)
            held[t] = take(held.get(t, {}), js.job.demand, sign=-1)
            service[t] = service.get(t, 0.0) + js.total_s() * _dominant(js.job.demand, self._cap)
        if not self.preemptive:
            return start, []
        return start, self._evict(queues, running, start, avail, held, weight, cap)

    def _evict(
        self,
        queues: dict[str, list[JobState]],
        running: Sequence[JobState],
        start: list[JobState],
        avail: dict[str, float],
        held: dict[str, dict[str, float]],
        weight: dict[str, float],
        cap: Mapping[str, float],
    ) -> list[JobState]:
        """One leximin-improving eviction round: the waiting tenant with the smallest weighted share takes the
        place of the youngest jobs of the tenant with the largest one (the evicted jobs' resources go to it)."""

        def share(t: str) -> float:
            return _dominant(held.get(t, {}), cap) / weight[t]

        waiters = [t for t, q in queues.items() if q and self._within_quota(q[0], held.get(t, {}))]
        if not waiters:
            return []
        t = min(waiters, key=lambda u: (share(u), u))
        js = queues[t][0]
        running_by_age = sorted(running, key=lambda j: -(j.start_t if j.start_t is not None else 0.0))
        victims_t = [u for u in held if u != t and share(u) > share(t)]
        if not victims_t:
            return []
        v = max(victims_t, key=lambda u: (share(u), u))
        victims, freed = [], dict(avail)
        for r in running_by_age:
            if r.job.tenant != v:
                continue
            if fits(js.job.demand, freed):
                break
            victims.append(r)
            freed = take(freed, r.job.demand, sign=-1)
        if not victims or not fits(js.job.demand, freed):
            return []
        new_v = take(held.get(v, {}), {}, 1.0)
        for r in victims:
            new_v = take(new_v, r.job.demand)
        old_pair = sorted([share(t), share(v)])
        new_pair = sorted(
            [
                _dominant(take(held.get(t, {}), js.job.demand, sign=-1), cap) / weight[t],
                _dominant(new_v, cap) / weight[v],
            ]
        )
        if new_pair <= old_pair:
            return []  # no strict leximin improvement: keep the running jobs
        start.append(js)
        return victims

    def __repr__(self) -> str:
        return f"WeightedFair(quota={self.quota!r}, preemptive={self.preemptive})"


POLICIES: dict[str, type[Policy]] = {
    "fifo": FIFO,
    "sjf": SJF,
    "srpt": SRPT,
    "edf": EDF,
    "priority_aging": PriorityAging,
    "weighted_urgency": WeightedUrgency,
    "backfill": Backfill,
    "weighted_fair": WeightedFair,
}


def make_policy(policy: Any) -> Policy:
    """A ``Policy`` instance from an instance or a name in ``POLICIES`` (unknown name -> ValueError)."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str) and policy in POLICIES:
        return POLICIES[policy]()
    raise ValueError(f"policy: expected a Policy or one of {sorted(POLICIES)}, got {policy!r}")
