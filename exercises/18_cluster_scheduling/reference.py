"""Reference answers for exercises/18_cluster_scheduling, bound to tinylearn: preemptive SRPT on one machine is
tinylearn.sched.sim.single_machine's exact event loop, DRF is tinylearn.sched.fairness.drf_allocate (progressive
filling, unweighted), and the PID controller is tinylearn.sched.power.PID (derivative on the measurement,
conditional-integration + clamping anti-windup). Thin adapters keep the exercise's signatures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tinylearn.sched.fairness import drf_allocate
from tinylearn.sched.power import PID
from tinylearn.sched.sim import single_machine


# ------------------------------------------------------------------------------------------ (a) SRPT
def srpt_completion_times(arrivals: Sequence[tuple[float, float]]) -> list[float]:
    if isinstance(arrivals, str | bytes | Mapping) or not isinstance(arrivals, Sequence):
        raise ValueError(f"arrivals: expected a list of (arrival_s, size_s) pairs, got {arrivals!r}")
    return [float(t) for t in single_machine(list(arrivals), "srpt")]


# ------------------------------------------------------------------------------------------ (b) DRF
def drf(capacity: Mapping[str, float], demands: Mapping[str, Mapping[str, float]]) -> dict[str, int]:
    return drf_allocate(capacity, demands)


# ------------------------------------------------------------------------------------------ (c) PID
class PIDController(PID):
    def __init__(self, kp: float, ki: float, kd: float, setpoint: float, out_min: float, out_max: float) -> None:
        super().__init__(kp, ki, kd, setpoint, out_min, out_max)
