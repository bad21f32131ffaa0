"""Temperature prediction and heat-aware migration on a MODEL multi-GPU node [Q182].

Everything here is a MODEL (this VM has no thermal sensors or clock controls): each device follows
``device_model``'s first-order RC stage, ``T(t + dt) = T_ss + (T - T_ss) exp(-dt / RC)`` with
``T_ss = T_amb + P R``, at the power ``P = spec.power_w(f, u)`` of the jobs it runs (u = the sum of their
utilisations, at most 1). Uneven cooling = a different thermal resistance R per device (``uneven_node``: the RC time
constant is kept at 30 s, so C = 30 / R).

Throttling (the hardware's own reaction, as nvidia-smi's "HW slowdown" reports it): while ``T >= throttle_c`` the
clock drops one DVFS step per second; once ``T < throttle_c - hysteresis`` it climbs back one step per second. A job's
progress rate is ``util * f / f_max`` (compute-bound work).

``TempPredictor(window)``: a least-squares line through the last ``window`` (t, T) samples, extrapolated ``k``
seconds ahead (exact on a linear ramp; on the RC curve it over-predicts the rise, which errs on the side of moving
early). ``heat_aware_migration(devices, jobs, horizon_s)``: every device whose predicted temperature crosses
``throttle_c`` within the horizon gives its hottest job (largest utilisation) to the coolest other device with a
free slot whose steady temperature with that job added stays below ``throttle_c - margin``; the job then pauses for
``pause_s`` (state transfer: a checkpoint of its weights and optimizer state over the interconnect) and is frozen
for ``cooldown_s`` so it cannot ping-pong. ``simulate_node`` compares it with no migration: throttled
device-seconds, work done (throughput) and the temperature traces. Anchors: thermal-aware scheduling in data
centres (Moore et al., "Making Scheduling Cool", USENIX ATC 2005) and GPU thermal throttling documented in
nvidia-smi (clocks_throttle_reasons.hw_thermal_slowdown).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from .._inputs import is_int
from .device_model import A100, DeviceSpec


class TempPredictor:
    """Linear-trend extrapolation over the last ``window`` samples (see the module docstring)."""

    def __init__(self, window: int = 10) -> None:
        if not is_int(window) or window < 2:
            raise ValueError(f"window: expected an int >= 2, got {window!r}")
        self.window = int(window)
        self.ts: deque[float] = deque(maxlen=self.window)
        self.temps: deque[float] = deque(maxlen=self.window)

    def update(self, t: float, temp_c: float) -> None:
        if not (math.isfinite(t) and math.isfinite(temp_c)):
            raise ValueError(f"t/temp_c: expected finite numbers, got {t!r}, {temp_c!r}")
        if self.ts and t <= self.ts[-1]:
            raise ValueError(f"t: expected times to increase, got {t!r} after {self.ts[-1]!r}")
        self.ts.append(float(t))
        self.temps.append(float(temp_c))

    @property
    def slope(self) -> float:
        """K per second of the fitted line (0 with fewer than two samples)."""
        if len(self.ts) < 2:
            return 0.0
        t = np.array(self.ts) - self.ts[-1]
        y = np.array(self.temps)
        tc = t - t.mean()
        return float((tc * (y - y.mean())).sum() / (tc * tc).sum())

    def predict(self, ahead_s: float) -> float:
        """The fitted line's value ``ahead_s`` seconds after the last sample."""
        if not ahead_s >= 0:
            raise ValueError(f"ahead_s: expected >= 0, got {ahead_s!r}")
        if not self.ts:
            raise ValueError("self: update() the predictor with at least one sample before predict()")
        t = np.array(self.ts) - self.ts[-1]
        y = np.array(self.temps)
        return float(y.mean() + self.slope * (ahead_s - t.mean()))


@dataclass
class ThermalJob:
    name: str
    util: float  # fraction of a device at f_max

    def __post_init__(self) -> None:
        if not 0 < self.util <= 1:
            raise ValueError(f"util: expected a utilisation in (0, 1], got {self.util!r} (job {self.name!r})")


@dataclass
class DeviceState:
    """One MODEL device: its spec, slots, temperature, clock, the jobs on it and its temperature predictor."""

    spec: DeviceSpec
    capacity: int = 2
    temp_c: float | None = None  # None: the idle steady state
    f_mhz: float | None = None  # None: f_max
    jobs: list[str] = field(default_factory=list)
    predictor: TempPredictor = field(default_factory=TempPredictor)

    def __post_init__(self) -> None:
        if not is_int(self.capacity) or self.capacity < 1:
            raise ValueError(f"capacity: expected an int >= 1, got {self.capacity!r}")
        if self.temp_c is None:
            self.temp_c = self.spec.steady_temp_c(self.spec.idle_w)
        if self.f_mhz is None:
            self.f_mhz = self.spec.f_max_mhz

    def util(self, jobs: Mapping[str, ThermalJob], paused: Mapping[str, float] | None = None, now: float = 0.0,
             extra: float = 0.0) -> float:  # fmt: skip
        run = [jobs[j].util for j in self.jobs if paused is None or paused.get(j, -1.0) <= now]
        return min(1.0, sum(run) + extra)


@dataclass(frozen=True)
class Migration:
    t: float
    job: str
    src: int
    dst: int
    predicted_c: float


def heat_aware_migration(
    devices: Sequence[DeviceState], jobs: Mapping[str, ThermalJob], horizon_s: float, now: float = 0.0,
    margin_c: float = 3.0, frozen: Sequence[str] = (),
) -> list[Migration]:  # fmt: skip
    """[Q182] The moves for this instant (nothing is changed): see the module docstring. At most one move per hot
    device, never onto a full device (slots are counted including the moves already planned here)."""
    if not horizon_s >= 0:
        raise ValueError(f"horizon_s: expected >= 0, got {horizon_s!r}")
    for d in devices:
        unknown = [j for j in d.jobs if j not in jobs]
        if unknown:
            raise ValueError(f"jobs: device {d.spec.name!r} runs {unknown[0]!r}, which is not in jobs")
    load = [len(d.jobs) for d in devices]
    extra = [0.0] * len(devices)
    moves = []
    pred = [d.predictor.predict(horizon_s) if d.predictor.ts else d.temp_c for d in devices]
    for i in sorted(range(len(devices)), key=lambda k: -pred[k]):
        d = devices[i]
        if pred[i] < d.spec.throttle_c:
            continue
        movable = [j for j in d.jobs if j not in frozen]
        if not movable:
            continue
        job = max(movable, key=lambda j: jobs[j].util)
        for k in sorted(range(len(devices)), key=lambda k: devices[k].temp_c):
            c = devices[k]
            if k == i or load[k] >= c.capacity:
                continue
            u = c.util(jobs, extra=extra[k] + jobs[job].util)
            if c.spec.steady_temp_c(c.spec.power_w(c.spec.f_max_mhz, u)) >= c.spec.throttle_c - margin_c:
                continue
            moves.append(Migration(now, job, i, k, pred[i]))
            load[k] += 1
            load[i] -= 1
            extra[k] += jobs[job].util
            break
    return moves


def uneven_node(thermal_r: Sequence[float] = (0.18, 0.16, 0.12, 0.10, 0.08, 0.07), spec: DeviceSpec = A100,
                tau_s: float = 30.0) -> list[DeviceSpec]:  # fmt: skip
    """MODEL devices that differ only in cooling: thermal resistance R (K/W) each, RC = ``tau_s``."""
    if not thermal_r or not all(r > 0 for r in thermal_r):
        raise ValueError(f"thermal_r: expected positive resistances, got {thermal_r!r}")
    return [replace(spec, name=f"{spec.name}#{i}(R={r:g})", thermal_r_k_per_w=r, thermal_c_j_per_k=tau_s / r)
            for i, r in enumerate(thermal_r)]  # fmt: skip


@dataclass
class NodeRun:
    """``simulate_node``'s result (MODEL): traces per second and the totals compared."""

    policy: str
    t: np.ndarray
    temps: np.ndarray  # [T, devices]
    freqs: np.ndarray  # [T, devices]
    loads: np.ndarray  # [T, devices] jobs placed
    migrations: list[Migration]
    throttled_s: float  # device-seconds below f_max
    work: float  # sum over jobs of util * f / f_max * dt (device-seconds of f_max work)


def simulate_node(specs: Sequence[DeviceSpec], jobs: Sequence[ThermalJob], placement: Mapping[str, int],
                  policy: str = "none", duration_s: float = 300.0, dt_s: float = 1.0, horizon_s: float = 20.0,
                  window: int = 10, capacity: int = 2, pause_s: float = 5.0, cooldown_s: float = 60.0,
                  hysteresis_c: float = 2.0) -> NodeRun:  # fmt: skip
    """MODEL node: ``jobs`` placed by ``placement`` (job name -> device index) run for ``duration_s``; ``policy``
    "none" or "migrate" (``heat_aware_migration`` every step). See the module docstring for every rule."""
    if policy not in ("none", "migrate"):
        raise ValueError(f"policy: expected 'none' or 'migrate', got {policy!r}")
    if not (dt_s > 0 and duration_s >= dt_s):
        raise ValueError(f"dt_s/duration_s: expected 0 < dt_s <= duration_s, got {dt_s!r}, {duration_s!r}")
    byname = {j.name: j for j in jobs}
    if len(byname) != len(jobs) or set(placement) != set(byname):
        raise ValueError(f"placement: expected one device per job {sorted(byname)}, got {dict(placement)!r}")
    devs = [DeviceState(s, capacity, predictor=TempPredictor(window)) for s in specs]
    for name, k in placement.items():
        if not (is_int(k) and 0 <= k < len(devs)):
            raise ValueError(f"placement: job {name!r} on device {k!r}, expected an index in [0, {len(devs)})")
        devs[k].jobs.append(name)
    if any(len(d.jobs) > capacity for d in devs):
        raise ValueError(f"placement: more than capacity={capacity} jobs on one device: {dict(placement)!r}")
    paused: dict[str, float] = {}
    moved_at: dict[str, float] = {}
    ts, temps, freqs, loads, migs = [], [], [], [], []
    throttled = work = 0.0
    for step in range(int(round(duration_s / dt_s))):
        now = step * dt_s
        for d in devs:
            d.predictor.update(now, d.temp_c)
        if policy == "migrate":
            frozen = [j for j, t in moved_at.items() if now - t < cooldown_s]
            for m in heat_aware_migration(devs, byname, horizon_s, now, frozen=frozen):
                devs[m.src].jobs.remove(m.job)
                devs[m.dst].jobs.append(m.job)
                paused[m.job], moved_at[m.job] = now + pause_s, now
                migs.append(m)
        for d in devs:
            sp = d.spec
            ladder = sp.freqs()
            i = min(range(len(ladder)), key=lambda k: abs(ladder[k] - d.f_mhz))
            if d.temp_c >= sp.throttle_c:
                i = max(0, i - 1)
            elif d.temp_c < sp.throttle_c - hysteresis_c:
                i = min(len(ladder) - 1, i + 1)
            d.f_mhz = ladder[i]
            u = d.util(byname, paused, now)
            work += u * d.f_mhz / sp.f_max_mhz * dt_s
            throttled += dt_s if d.f_mhz < sp.f_max_mhz else 0.0
            d.temp_c = sp.temp_after(d.temp_c, sp.power_w(d.f_mhz, u), dt_s)
        ts.append(now)
        temps.append([d.temp_c for d in devs])
        freqs.append([d.f_mhz for d in devs])
        loads.append([len(d.jobs) for d in devs])
    return NodeRun(policy, np.array(ts), np.array(temps), np.array(freqs), np.array(loads), migs, throttled, work)
