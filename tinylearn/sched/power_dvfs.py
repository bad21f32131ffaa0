"""DVFS policies on the MODEL plant: a clock waveform from arithmetic intensity and temperature trend [Q154], and a
multi-objective (energy, performance, reliability) clock controller [Q243]. Nothing here is measured: this VM has
no frequency or thermal controls; every clock, watt and degree comes from ``plant.Plant`` / ``device_model``.

``frequency_waveform`` [Q154] -- the roofline says a kernel of arithmetic intensity AI below the ridge point
R = peak / bw is memory-bound: its time is B / bw as long as F / (peak f / f_max) <= B / bw, i.e. for every clock
f >= f_knee = f_max AI / R, so clocks down to f_knee cost no time and (P ~ f^3) save energy. The plateau clock is the
lowest ladder clock whose roofline slowdown vs f_max is within ``slowdown_ok``. The temperature trend (least-squares
slope of the last samples, K/s) shifts the start temperature by slope x ``lookahead_s`` (the sensor lags the die);
the plan is then stepped forward on the first-order thermal model: ramp up from ``f_start`` at most ``slew_steps``
ladder steps per time step (voltage regulators and di/dt limit how fast a clock may rise -- the slew is an
ASSUMPTION), hold the plateau, and ramp down one ladder step per time step whenever the predicted temperature would
cross ``throttle_c - margin_k`` -- a gradual descent instead of the hardware throttle's abrupt drop.
``run_schedule`` plays a clock schedule on a one-device plant (throttling on) until a fixed amount of work is done
and reports time, energy and peak temperature, the comparison against the fixed maximum clock.

``MultiObjectiveDVFS`` [Q243] -- inputs: temperature, measured power, load (demand as a share of the work the device
does per second at f_max); output: the ladder clock minimising

    J(f) = w_e P(f) / TDP + w_p (1 - served(f) + slow(f) / 2) + w_r (AF(T(f)) - 1) / (AF(throttle) - 1)

with served(f) = min(1, thr(f) / (load thr(f_max))), slow(f) = 1 - thr(f) / thr(f_max) (each step takes longer:
latency), P(f) the model power at the utilisation the load needs at f plus
a bias learned from the measured power (EWMA), T(f) the temperature after ``horizon_s`` on the thermal model, and the
Arrhenius acceleration factor AF(T) = exp(Ea / k (1 / T_ref - 1 / T)) (T in kelvin): the failure rate relative to
T_ref, so MTBF(T) = MTBF(T_ref) / AF(T). Ea = 0.7 eV is an ASSUMPTION (a value commonly used for silicon wear-out
mechanisms; JEDEC JEP122 tabulates 0.3 -- 1.1 eV by mechanism). Clocks whose predicted temperature exceeds
``throttle_c - 1`` are excluded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .._inputs import is_real
from .device_model import DeviceSpec
from .plant import Plant, Workload, as_floats, check_steps, check_trace, predict

BOLTZMANN_EV = 8.617333262e-5


def temp_slope(temps: float | Sequence[float], dt: float) -> float:
    """The temperature trend in K/s: a float is taken as the slope; a sequence of samples ``dt`` apart gives the
    least-squares slope."""
    if is_real(temps):
        if not math.isfinite(temps):
            raise ValueError(f"temp_trend: expected a finite slope, got {temps!r}")
        return float(temps)
    arr = as_floats(temps, "temp_trend")
    if arr.ndim != 1 or len(arr) < 2:
        raise ValueError(f"temp_trend: expected a slope or >= 2 finite samples, got {temps!r}")
    return float(np.polyfit(np.arange(len(arr)) * dt, arr, 1)[0])


def frequency_waveform(ai: float, temp_trend: float | Sequence[float], spec: DeviceSpec, *, steps: int = 120,
                       dt: float = 0.5, temp_now_c: float | None = None, f_start: float | None = None,
                       slowdown_ok: float = 0.02, margin_k: float = 4.0, lookahead_s: float = 5.0,
                       slew_steps: int = 2, workload: Workload | None = None) -> dict[str, Any]:  # fmt: skip
    """[Q154] A ramp-up / plateau / ramp-down clock schedule (``steps`` x ``dt``) for a kernel of arithmetic
    intensity ``ai`` given the temperature trend (a slope K/s or recent samples ``dt`` apart, the last one being
    the current temperature unless ``temp_now_c`` is given; with a bare slope the default is the ambient).
    ``workload`` (default: 10 GFLOP/sample) is run at batch 256 with its AI replaced by ``ai``. Returns ``clocks``
    (MHz), ``plateau_mhz``, ``predicted_temp``, ``phase`` (per step: up / plateau / down / hold), ``memory_bound``,
    ``ridge_ai`` and the trend ``slope_k_per_s``."""
    if not (is_real(ai) and math.isfinite(ai) and ai > 0):
        raise ValueError(f"ai: expected a finite arithmetic intensity > 0, got {ai!r}")
    if not isinstance(spec, DeviceSpec):
        raise TypeError(f"spec: expected a DeviceSpec, got {type(spec).__name__}")
    steps = check_steps(steps, "steps", 2)
    for name, v in (("f_start", f_start), ("temp_now_c", temp_now_c), ("margin_k", margin_k),
                    ("lookahead_s", lookahead_s), ("slowdown_ok", slowdown_ok)):  # fmt: skip
        if v is not None and not (is_real(v) and math.isfinite(v)):
            raise ValueError(f"{name}: expected a finite number, got {v!r}")
    if workload is not None and not isinstance(workload, Workload):
        raise TypeError(f"workload: expected a Workload, got {type(workload).__name__}")
    if not (is_real(dt) and math.isfinite(dt) and dt > 0):
        raise ValueError(f"dt: expected a finite number > 0, got {dt!r}")
    if not isinstance(slew_steps, int) or slew_steps < 1 or not 0 <= slowdown_ok < 1:
        raise ValueError(f"slew_steps/slowdown_ok: expected int >= 1 and [0, 1), got {slew_steps!r}, {slowdown_ok!r}")
    slope = temp_slope(temp_trend, dt)
    if temp_now_c is None:
        temp_now_c = float(temp_trend[-1]) if not is_real(temp_trend) else spec.ambient_c
    w = Workload("kernel", float(ai), max_batch=4096) if workload is None else replace(workload, ai=float(ai))
    ladder = spec.freqs()
    base = predict(spec, w, spec.f_max_mhz, 256)["step_s"]
    plateau_i = next(i for i, f in enumerate(ladder) if predict(spec, w, f, 256)["step_s"] <= base * (1 + slowdown_ok))
    limit = spec.throttle_c - margin_k
    temp = temp_now_c + max(slope, 0.0) * lookahead_s
    cur = ladder.index(max([f for f in ladder if f <= (f_start or spec.f_min_mhz) + 1e-9], default=ladder[0]))
    clocks, temps, phase, descending = [], [], [], False
    for _ in range(steps):
        want = min(plateau_i, cur + slew_steps)
        while want > 0 and spec.temp_after(temp, predict(spec, w, ladder[want], 256)["power"], dt) > limit:
            want -= 1
        if descending:
            want = min(want, cur)  # once descending, never rise again: up -> plateau -> down
        want = max(want, cur - 1) if want < cur else want  # ramp down one ladder step per time step
        descending = descending or want < cur
        phase.append("up" if want > cur else "down" if want < cur else "plateau" if want == plateau_i else "hold")
        cur = want
        temp = spec.temp_after(temp, predict(spec, w, ladder[cur], 256)["power"], dt)
        clocks.append(ladder[cur])
        temps.append(temp)
    ridge = spec.peak_tflops * 1e12 / (spec.mem_bw_gbs * 1e9)
    return {"clocks": np.asarray(clocks), "plateau_mhz": ladder[plateau_i], "predicted_temp": np.asarray(temps),
            "phase": phase, "memory_bound": ai < ridge, "ridge_ai": ridge, "slope_k_per_s": slope}  # fmt: skip


def run_schedule(spec: DeviceSpec, workload: Workload, clocks: Sequence[float], work_samples: float, dt: float, *,
                 temp0_c: float | None = None, batch: int = 256,
                 max_steps: int = 100_000) -> dict[str, float]:  # fmt: skip
    """Play ``clocks`` (the last one held after the schedule ends) on a one-device MODEL plant with throttling until
    ``work_samples`` samples are done; returns time, energy, peak temperature and throttled steps."""
    sched = as_floats(clocks, "clocks")
    if sched.ndim != 1 or len(sched) < 1:
        raise ValueError(f"clocks: expected a non-empty 1-D schedule, got {clocks!r}")
    if not (is_real(work_samples) and math.isfinite(work_samples) and work_samples > 0):
        raise ValueError(f"work_samples: expected a finite number > 0, got {work_samples!r}")
    check_steps(max_steps, "max_steps")
    plant = Plant(spec, [workload], batch=batch, temp0_c=temp0_c)
    done = energy = 0.0
    peak_t, throttled, k = float(plant.temp[0]), 0, 0
    while done < work_samples:
        if k >= max_steps:
            raise ValueError(f"max_steps: {max_steps} steps did not finish {work_samples!r} samples")
        plant.set(clock=float(sched[min(k, len(sched) - 1)]))
        r = plant.step(dt)
        thr, p = float(r["throughput"][0]), float(r["power"][0])
        frac = min(1.0, (work_samples - done) / (thr * dt)) if thr > 0 else 1.0
        done += thr * dt * frac
        energy += p * dt * frac
        peak_t, throttled, k = max(peak_t, float(r["temp"][0])), throttled + int(r["throttled"][0]), k + 1
    return {"time_s": (k - 1 + frac) * dt, "energy_j": energy, "peak_temp_c": peak_t, "throttled_steps": throttled}


def arrhenius_af(temp_c: float, t_ref_c: float = 60.0, ea_ev: float = 0.7) -> float:
    """Failure-rate acceleration exp(Ea/k (1/T_ref - 1/T)) relative to ``t_ref_c`` (MTBF divides by it)."""
    for name, v in (("temp_c", temp_c), ("t_ref_c", t_ref_c)):
        if not (is_real(v) and -273.15 < v < 1e4):
            raise ValueError(f"{name}: expected a temperature in C above absolute zero, got {v!r}")
    if not (is_real(ea_ev) and 0 < ea_ev < 100):
        raise ValueError(f"ea_ev: expected an activation energy in eV > 0, got {ea_ev!r}")
    return math.exp(ea_ev / BOLTZMANN_EV * (1.0 / (t_ref_c + 273.15) - 1.0 / (temp_c + 273.15)))


class MultiObjectiveDVFS:
    """[Q243] Clock = argmin over the ladder of weighted energy, lost performance and Arrhenius failure rate (see the
    module docstring); ``weights`` maps "energy", "perf", "reliability" to non-negative weights."""

    def __init__(self, weights: dict[str, float], *, ea_ev: float = 0.7, t_ref_c: float = 60.0, horizon_s: float = 10.0,
                 bias_gain: float = 0.3) -> None:  # fmt: skip
        if not isinstance(weights, dict) or set(weights) - {"energy", "perf", "reliability"}:
            raise ValueError(f"weights: expected a dict over energy/perf/reliability, got {weights!r}")
        w = {k: float(weights.get(k, 0.0)) for k in ("energy", "perf", "reliability")}
        if any(not math.isfinite(v) or v < 0 for v in w.values()) or sum(w.values()) == 0:
            raise ValueError(f"weights: expected finite weights >= 0, not all zero, got {weights!r}")
        ok = all(is_real(v) and math.isfinite(v) for v in (ea_ev, t_ref_c, horizon_s, bias_gain))
        if not ok or not ea_ev > 0 or not horizon_s > 0 or not 0 < bias_gain <= 1:
            raise ValueError(f"ea_ev/t_ref_c/horizon_s/bias_gain: expected > 0, finite, > 0, (0, 1], got {ea_ev!r}, "
                             f"{t_ref_c!r}, {horizon_s!r}, {bias_gain!r}")  # fmt: skip
        self.weights, self.ea_ev, self.t_ref_c = w, float(ea_ev), float(t_ref_c)
        self.horizon_s, self.bias_gain, self.bias_w = float(horizon_s), float(bias_gain), 0.0
        self.last: tuple[float, float] | None = None

    def _at(self, spec: DeviceSpec, w: Workload, batch: int, f: float, load: float) -> tuple[float, float, float]:
        """(power, served share, busy) at clock ``f`` for a demand ``load`` (share of the f_max throughput)."""
        full = predict(spec, w, f, batch)["throughput"]
        top = predict(spec, w, spec.f_max_mhz, batch)["throughput"]
        busy = min(1.0, load * top / full)
        served = 1.0 if load == 0 else min(1.0, busy * full / (load * top))
        return predict(spec, w, f, batch, busy=busy)["power"], served, busy

    def choose(self, spec: DeviceSpec, w: Workload, batch: int, temp_c: float, power_w: float, load: float) -> float:
        """One decision from the sensors: learn the power bias at the last clock, then minimise J over the ladder."""
        for name, v in (("temp_c", temp_c), ("power_w", power_w), ("load", load)):
            if not (is_real(v) and math.isfinite(v)):
                raise ValueError(f"{name}: expected a finite number, got {v!r}")
        if not 0 <= load <= 1:
            raise ValueError(f"load: expected a share in [0, 1], got {load!r}")
        if self.last is not None:
            f0, l0 = self.last
            self.bias_w += self.bias_gain * (power_w - self._at(spec, w, batch, f0, l0)[0] - self.bias_w)
        af_max = arrhenius_af(spec.throttle_c, self.t_ref_c, self.ea_ev) - 1.0
        top = predict(spec, w, spec.f_max_mhz, batch)["throughput"]
        best, best_f = math.inf, spec.f_min_mhz
        for f in spec.freqs():
            p, served, _ = self._at(spec, w, batch, f, load)
            p += self.bias_w
            t = spec.temp_after(temp_c, p, self.horizon_s)
            if t > spec.throttle_c - 1.0 and f > spec.f_min_mhz:
                continue
            af = arrhenius_af(t, self.t_ref_c, self.ea_ev)
            slow = 1.0 - predict(spec, w, f, batch)["throughput"] / top
            j = (self.weights["energy"] * p / spec.tdp_w + self.weights["perf"] * (1.0 - served + 0.5 * slow)
                 + self.weights["reliability"] * max(af - 1.0, 0.0) / af_max)  # fmt: skip
            if j < best - 1e-12:
                best, best_f = j, f
        self.last = (best_f, load)
        return best_f

    def run(self, plant: Plant, load: Sequence[float], dt: float, *, fixed_mhz: float | None = None) -> dict[str, Any]:
        """Drive device 0 of ``plant`` through the ``load`` trace (or hold ``fixed_mhz``); returns the series and
        totals: energy, served work share, peak temperature, mean AF (MTBF factor = 1 / mean AF)."""
        trace = check_trace(load)
        if not isinstance(plant, Plant):
            raise TypeError(f"plant: expected a tinylearn.sched.plant.Plant, got {type(plant).__name__}")
        spec, w, batch = plant.specs[0], plant.workloads[0], int(plant.batch[0])
        out: dict[str, list] = {k: [] for k in ("t", "clock", "power", "temp", "served", "af")}
        temp, power = float(plant.temp[0]), float(plant.sensed[0])
        for x in trace:
            f = fixed_mhz if fixed_mhz is not None else self.choose(spec, w, batch, temp, power, float(x))
            plant.set(clock=f)
            applied = min(float(plant.clock[0]), spec.freqs()[int(plant.cap_idx[0])])
            _, served, busy = self._at(spec, w, batch, applied, float(x))
            plant.set(load=busy)
            r = plant.step(dt)
            temp, power = float(r["temp"][0]), float(r["measured"][0])
            for k, v in (("t", r["t"]), ("clock", r["clock"][0]), ("power", r["power"][0]), ("temp", temp),
                         ("served", served), ("af", arrhenius_af(temp, self.t_ref_c, self.ea_ev))):  # fmt: skip
                out[k].append(float(v))
        res: dict[str, Any] = {k: np.asarray(v) for k, v in out.items()}
        demand = np.maximum(trace, 1e-12)
        res.update(energy_j=float(res["power"].sum() * dt), peak_temp_c=float(res["temp"].max()),
                   served_share=float((res["served"] * demand).sum() / demand.sum()),
                   mean_af=float(res["af"].mean()))  # fmt: skip
        return res
