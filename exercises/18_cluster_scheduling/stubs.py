"""Exercises for notebook 18 (cluster scheduling, fairness and power). Replace each ``raise NotImplementedError``
with your code, then run

    pytest exercises/18_cluster_scheduling                  # your answers
    pytest exercises/18_cluster_scheduling --impl=reference

Each stub's NotImplementedError names the library code its reference answer (reference.py) uses. Bad input raises
ValueError whose message starts with the argument's name (``"arrivals: ..."``) and shows the offending value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def srpt_completion_times(arrivals: Sequence[tuple[float, float]]) -> list[float]:
    """Completion times of jobs ``(arrival_s, size_s)`` on ONE unit-speed machine under preemptive Shortest
    Remaining Processing Time: at every instant the machine runs the arrived, unfinished job with the least
    remaining work (ties: earlier arrival, then earlier in the list); a newly arrived shorter job preempts at once.
    Return the completion times in INPUT order (``[]`` for no jobs). Exact: advance from event to event (arrivals
    and completions), no fixed time step.

    Bad input: an entry that is not a pair of real numbers, a negative or non-finite arrival, a size that is not
    > 0 and finite -> ValueError("arrivals: ...").
    """
    raise NotImplementedError("reference solution: tinylearn.sched.sim.single_machine(arrivals, 'srpt')")


def drf(capacity: Mapping[str, float], demands: Mapping[str, Mapping[str, float]]) -> dict[str, int]:
    """Dominant Resource Fairness (Ghodsi et al., NSDI 2011) by progressive filling: ``{user: tasks}``.

    ``capacity`` = {resource: amount}; ``demands`` = {user: {resource: amount per task}}. A user's dominant share
    is max over resources of (its tasks x per-task amount / capacity). Repeat: among the users whose next task
    still fits in the remaining capacity, give one task to the one with the smallest dominant share (ties: the user
    listed first in ``demands``); stop when no user's next task fits. The paper's example: capacity <9 CPU, 18 GB>,
    A <1 CPU, 4 GB>, B <3 CPU, 1 GB> -> {"A": 3, "B": 2}.

    Bad input: empty ``capacity`` or an amount that is not finite and > 0 -> ValueError("capacity: ...");
    empty ``demands``, an unknown resource, a negative amount, or a user whose demand is all zero ->
    ValueError("demands: ...").
    """
    raise NotImplementedError("reference solution: tinylearn.sched.fairness.drf_allocate")


class PIDController:
    """Discrete PID controller with clamping anti-windup, e.g. a GPU power cap setting the clock.

    ``update(measured, dt)`` with e = setpoint - measured:

        P = kp e
        I = I_prev + ki e dt                 (I starts at 0, clipped into [out_min, out_max])
        D = -kd (measured - measured_prev) / dt   (derivative on the measurement; 0 on the first update)
        output = clip(P + I + D, out_min, out_max)

    Anti-windup: if the unclipped P + I + D is above out_max while e > 0 (or below out_min while e < 0), keep the
    previous I instead (do not integrate further into saturation); then clip I itself into [out_min, out_max].

    Bad input: a negative or non-finite gain -> ValueError("kp: ...") (resp. "ki", "kd"); all gains zero ->
    ValueError("kp/ki/kd: ..."); out_min >= out_max -> ValueError("out_min/out_max: ..."); in ``update``: a
    non-finite measurement -> ValueError("measured: ..."), dt not > 0 -> ValueError("dt: ...").
    """

    def __init__(self, kp: float, ki: float, kd: float, setpoint: float, out_min: float, out_max: float) -> None:
        raise NotImplementedError("reference solution: tinylearn.sched.power.PID")

    def update(self, measured: float, dt: float) -> float:
        raise NotImplementedError("reference solution: tinylearn.sched.power.PID.update")
