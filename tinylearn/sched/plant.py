"""The plants the power controllers act on -- a time-stepped MODEL of devices running jobs, never a measurement.

This VM has no GPU and no power, frequency or thermal controls (no RAPL, no cpufreq, no nvidia-smi), so the
controllers of ``power.py`` are exercised on this model, built from ``device_model.DeviceSpec`` (whose parameters
and sources are written down there). Per device, one job (``Workload``) with an arithmetic intensity AI (FLOPs per
byte), a batch size and a per-sample cost; at each time step ``dt`` the plant applies the controller's inputs
(clock, batch, duty, SM share) and the workload's load, and returns what a telemetry daemon would see:

    clock       the requested clock snapped DOWN to the DVFS ladder (``spec.freqs()``), then capped by throttling
    step time   t = overhead + max(b F / (s peak f/f_max), b F / AI / bw)   (roofline of ``step_time_s``, SM share
                s scales the compute roof, ``overhead`` is a fixed per-step host/launch/sync time -- an ASSUMPTION)
    throughput  busy * b / t samples/s, busy = duty * load (the fraction of wall time the device runs steps)
    util        busy * (roofline time / t) * (MEM_SHARE + (1 - MEM_SHARE) * s * compute time / roofline time)
                i.e. the part of dynamic power that follows the SMs scales with the SM share and the compute-bound
                fraction; MEM_SHARE = 0.35 is an ASSUMPTION (memory traffic draws power even at low SM activity)
    power       spec.power_w(f, util) = idle + (tdp - idle) util (f / f_max)^3
    temperature spec.temp_after (first-order RC: T relaxes to T_amb + P R with time constant R C)
    sensor      first-order lag (time constant ``sensor_tau_s``, as board power sensors average over a window) plus
                seeded Gaussian noise ``noise_w``

Throttling (documented, like a GPU's thermal slowdown): while the temperature is above ``spec.throttle_c`` the clock
cap drops one ladder step per time step; once it is ``hysteresis_k`` below, it rises one step per time step.

``FirstOrderPlant`` is the textbook test plant y' = (K u - y) / tau (exact discretisation) for the PID tests.
Both expose ``respond(u, dt) -> measured`` (one input, one output), which ``power.step_response`` drives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._inputs import is_real
from .device_model import DeviceSpec

MEM_SHARE = 0.35


def _pos(v: float, name: str, zero_ok: bool = False) -> float:
    ok = is_real(v) and math.isfinite(v) and (v >= 0 if zero_ok else v > 0)
    if not ok:
        raise ValueError(f"{name}: expected a finite number {'>=' if zero_ok else '>'} 0, got {v!r}")
    return float(v)


def _frac(v: float, name: str) -> float:
    if not (is_real(v) and math.isfinite(v) and 0.0 <= v <= 1.0):
        raise ValueError(f"{name}: expected a number in [0, 1], got {v!r}")
    return float(v)


MAX_STEPS = 1_000_000  # the longest run a controller loop accepts (no accidental hour-long loops)


def as_floats(value: Any, name: str) -> np.ndarray:
    """``value`` as a finite float array, or a ValueError naming ``name`` and showing the value."""
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected numbers, got {value!r}") from None
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: expected finite values, got {value!r}")
    return arr


def check_steps(steps: int, name: str = "steps", low: int = 1) -> int:
    """An int in [low, MAX_STEPS], or a ValueError."""
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or not low <= steps <= MAX_STEPS:
        raise ValueError(f"{name}: expected an int in [{low}, {MAX_STEPS}], got {steps!r}")
    return int(steps)


def check_trace(value: Any, name: str = "load") -> np.ndarray:
    """A 1-D trace of shares in [0, 1] with 2 .. MAX_STEPS entries, or a ValueError."""
    arr = as_floats(value, name)
    if arr.ndim != 1 or not 2 <= len(arr) <= MAX_STEPS or np.any((arr < 0) | (arr > 1)):
        raise ValueError(f"{name}: expected a 1-D trace of 2..{MAX_STEPS} values in [0, 1], got {value!r}")
    return arr


@dataclass(frozen=True)
class Workload:
    """One device's job (MODEL): arithmetic intensity ``ai`` (FLOPs/byte), ``gflops_per_sample``, a fixed per-step
    ``overhead_s`` (ASSUMPTION), the largest batch that fits in memory, and a weight for cluster objectives."""

    name: str
    ai: float
    gflops_per_sample: float = 10.0
    overhead_s: float = 1e-3
    max_batch: int = 1024
    weight: float = 1.0

    def __post_init__(self) -> None:
        _pos(self.ai, "ai")
        _pos(self.gflops_per_sample, "gflops_per_sample")
        _pos(self.overhead_s, "overhead_s", zero_ok=True)
        _pos(self.weight, "weight")
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"max_batch: expected an int >= 1, got {self.max_batch!r}")


def snap_down(spec: DeviceSpec, f_mhz: float) -> float:
    """The highest ladder clock <= ``f_mhz`` (``f_min`` when ``f_mhz`` is below the ladder)."""
    if not math.isfinite(f_mhz):
        raise ValueError(f"f_mhz: expected a finite clock, got {f_mhz!r}")
    ladder = spec.freqs()
    return max([f for f in ladder if f <= f_mhz + 1e-9], default=ladder[0])


def predict(spec: DeviceSpec, w: Workload, f_mhz: float, batch: int, *, sm_share: float = 1.0,
            busy: float = 1.0) -> dict[str, float]:  # fmt: skip
    """MODEL, noise-free and without thermal effects: step time, throughput, util and power at one setting."""
    _frac(busy, "busy")
    if not (is_real(sm_share) and 0.0 < sm_share <= 1.0):
        raise ValueError(f"sm_share: expected a number in (0, 1], got {sm_share!r}")
    if not isinstance(batch, int | np.integer) or not 1 <= batch <= w.max_batch:
        raise ValueError(f"batch: expected an int in [1, {w.max_batch}], got {batch!r}")
    flops = batch * w.gflops_per_sample * 1e9
    compute = spec.step_time_s(flops, 0.0, f_mhz) / sm_share
    memory = flops / w.ai / (spec.mem_bw_gbs * 1e9)
    roof = max(compute, memory)
    step = w.overhead_s + roof
    util = busy * (roof / step) * (MEM_SHARE + (1.0 - MEM_SHARE) * sm_share * compute / roof)
    return {"step_s": step, "throughput": busy * batch / step, "util": util, "power": spec.power_w(f_mhz, util)}


class Plant:
    """MODEL: ``len(devices)`` devices, device i running ``workloads[i]`` (one spec is repeated for all workloads).

    Inputs are set with ``set(...)`` (per device or all) and hold until changed; ``step(dt)`` advances time and
    returns the per-device arrays and totals. ``respond(u, dt)`` is the one-input one-output view used by
    ``step_response``: every device's requested clock := u, returns the measured total power (W)."""

    def __init__(self, devices: DeviceSpec | Sequence[DeviceSpec], workloads: Sequence[Workload], *,
                 batch: int | Sequence[int] = 32, noise_w: float = 0.0, sensor_tau_s: float = 0.0, seed: int = 0,
                 temp0_c: float | None = None, hysteresis_k: float = 3.0) -> None:  # fmt: skip
        if not isinstance(workloads, Sequence) or not workloads or not all(isinstance(w, Workload) for w in workloads):
            raise TypeError(f"workloads: expected a non-empty sequence of Workload, got {workloads!r}")
        n = len(workloads)
        specs = [devices] * n if isinstance(devices, DeviceSpec) else list(devices)
        if len(specs) != n or not all(isinstance(s, DeviceSpec) for s in specs):
            raise ValueError(f"devices: expected a DeviceSpec or {n} of them, got {devices!r}")
        self.specs, self.workloads, self.n = specs, list(workloads), n
        self.noise_w = _pos(noise_w, "noise_w", zero_ok=True)
        self.sensor_tau_s = _pos(sensor_tau_s, "sensor_tau_s", zero_ok=True)
        self.hysteresis_k = _pos(hysteresis_k, "hysteresis_k", zero_ok=True)
        self.rng = np.random.default_rng(seed)
        self.t = 0.0
        self.clock = np.array([s.f_max_mhz for s in specs])
        self.batch = np.zeros(n, dtype=int)
        self.duty = np.ones(n)
        self.sm_share = np.ones(n)
        self.load = np.ones(n)
        self.set(batch=batch)
        if temp0_c is not None and not (isinstance(temp0_c, int | float) and -273.15 < temp0_c < 1e4):
            raise ValueError(f"temp0_c: expected a temperature in C above absolute zero, got {temp0_c!r}")
        self.temp = np.array([s.ambient_c if temp0_c is None else float(temp0_c) for s in specs])
        self.cap_idx = np.array([len(s.freqs()) - 1 for s in specs])
        self.sensed = np.array([s.idle_w for s in specs])
        self.total_sensed = float(self.sensed.sum())

    def _each(self, value: float | Sequence[float], name: str) -> np.ndarray:
        arr = as_floats(value, name)
        if arr.ndim == 0:
            return np.full(self.n, float(arr))
        if arr.shape != (self.n,):
            raise ValueError(f"{name}: expected a scalar or {self.n} values, got {value!r}")
        return arr.copy()

    def check_device(self, i: int, name: str = "device") -> int:
        """``i`` as a device index of this plant, or a ValueError."""
        if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < self.n:
            raise ValueError(f"{name}: expected a device index in [0, {self.n}), got {i!r}")
        return int(i)

    def set(self, *, clock: float | Sequence[float] | None = None, batch: int | Sequence[int] | None = None,
            duty: float | Sequence[float] | None = None, sm_share: float | Sequence[float] | None = None,
            load: float | Sequence[float] | None = None) -> None:  # fmt: skip
        """Set inputs for all devices (a scalar) or per device (a sequence of ``n``); clocks snap down the ladder."""
        if clock is not None:
            c = self._each(clock, "clock")
            self.clock = np.array([snap_down(s, x) for s, x in zip(self.specs, c)])
        if batch is not None:
            b = self._each(batch, "batch")
            for w, x in zip(self.workloads, b):
                if x != int(x) or not 1 <= x <= w.max_batch:
                    raise ValueError(f"batch: expected ints in [1, {w.max_batch}] for {w.name}, got {batch!r}")
            self.batch = b.astype(int)
        for name, val in (("duty", duty), ("load", load)):
            if val is not None:
                a = self._each(val, name)
                if np.any((a < 0) | (a > 1)):
                    raise ValueError(f"{name}: expected values in [0, 1], got {val!r}")
                setattr(self, name, a)
        if sm_share is not None:
            a = self._each(sm_share, "sm_share")
            if np.any((a <= 0) | (a > 1)):
                raise ValueError(f"sm_share: expected values in (0, 1], got {sm_share!r}")
            self.sm_share = a

    def predict(self, i: int, f_mhz: float, batch: int | None = None, sm_share: float = 1.0,
                busy: float = 1.0) -> dict[str, float]:  # fmt: skip
        """Noise-free MODEL of device ``i`` at a setting (what a controller with a perfect model would know)."""
        i = self.check_device(i, "i")
        b = int(self.batch[i]) if batch is None else batch
        return predict(self.specs[i], self.workloads[i], f_mhz, b, sm_share=sm_share, busy=busy)

    def step(self, dt: float) -> dict[str, np.ndarray | float]:
        """Advance ``dt`` seconds; returns per-device arrays (clock, util, throughput, power, measured, temp,
        throttled) and totals (``total_power`` true, ``total_measured`` from the sensors)."""
        dt = _pos(dt, "dt")
        out = {k: np.zeros(self.n) for k in ("clock", "util", "throughput", "power", "measured", "temp")}
        out["throttled"] = np.zeros(self.n, dtype=bool)
        alpha = 1.0 if self.sensor_tau_s == 0 else 1.0 - math.exp(-dt / self.sensor_tau_s)
        for i, (spec, w) in enumerate(zip(self.specs, self.workloads)):
            ladder = spec.freqs()
            if self.temp[i] > spec.throttle_c:
                self.cap_idx[i] = max(0, self.cap_idx[i] - 1)
            elif self.temp[i] < spec.throttle_c - self.hysteresis_k:
                self.cap_idx[i] = min(len(ladder) - 1, self.cap_idx[i] + 1)
            f = min(self.clock[i], ladder[self.cap_idx[i]])
            m = predict(spec, w, f, int(self.batch[i]), sm_share=float(self.sm_share[i]),
                        busy=float(self.duty[i] * self.load[i]))  # fmt: skip
            self.temp[i] = spec.temp_after(self.temp[i], m["power"], dt)
            self.sensed[i] += alpha * (m["power"] - self.sensed[i])
            noise = self.rng.normal(0.0, self.noise_w) if self.noise_w > 0 else 0.0
            out["clock"][i], out["util"][i], out["throughput"][i] = f, m["util"], m["throughput"]
            out["power"][i], out["measured"][i], out["temp"][i] = m["power"], self.sensed[i] + noise, self.temp[i]
            out["throttled"][i] = f < self.clock[i]
        self.t += dt
        out["t"] = self.t
        out["total_power"] = float(out["power"].sum())
        out["total_measured"] = self.total_sensed = float(out["measured"].sum())
        return out

    def respond(self, u: float, dt: float) -> float:
        """SISO view for ``step_response``: all requested clocks := ``u`` (clipped to the ladder), returns the
        measured total power."""
        u = float(as_floats(u, "u")) if np.ndim(u) == 0 else u
        if np.ndim(u) != 0:
            raise ValueError(f"u: expected one clock (MHz), got {u!r}")
        self.set(clock=[min(max(u, s.f_min_mhz), s.f_max_mhz) for s in self.specs])
        return float(self.step(dt)["total_measured"])


class FirstOrderPlant:
    """y' = (gain * u - y) / tau_s, stepped exactly: y <- K u + (y - K u) exp(-dt / tau). A textbook test plant."""

    def __init__(self, gain: float, tau_s: float, y0: float = 0.0) -> None:
        if not (is_real(gain) and math.isfinite(gain) and gain != 0):
            raise ValueError(f"gain: expected a finite non-zero number, got {gain!r}")
        self.gain, self.tau_s, self.y = float(gain), _pos(tau_s, "tau_s"), float(y0)

    def respond(self, u: float, dt: float) -> float:
        target = self.gain * float(u)
        self.y = target + (self.y - target) * math.exp(-_pos(dt, "dt") / self.tau_s)
        return self.y
