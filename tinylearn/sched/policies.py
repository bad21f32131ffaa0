"""Scheduling policies: one interface for the real cluster (``cluster.py``) and the simulator (``sim.py``).

A policy sees the waiting and running ``JobState``s, the free resources and the time, and answers with the jobs to
start now and the running jobs to preempt (a preemptive policy only). Both engines call it at every event (an
arrival, a step boundary, a completion) and apply the answer: they start a job only when its demand fits in the
free resources plus those the preempted jobs release (gang scheduling: a job's whole demand starts at once or not
at all), so a policy cannot over-commit the cluster.

    FIFO            submission order; the head of the queue blocks the rest (no backfill)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .jobs import JobState, fits, take


class Policy:
    """Base class: ``select(waiting, running, free, now) -> (to_start, to_preempt)``; subclasses set ``order`` (a
    sort key over waiting jobs) and, for preemptive policies, override ``select``."""

    name = "policy"
    preemptive = False

    def key(self, js: JobState, now: float) -> tuple:
        """Sort key of a waiting job (smaller runs first)."""
        return (js.submit_t, js.job.name)

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
