"""Power-capping controllers: PID, cluster power-cap allocation, dual-threshold and batch-size control -- on a MODEL.

This VM has no power, frequency or thermal controls, so every controller here acts on ``plant.Plant`` (a MODEL of
GPUs built from ``device_model``) and every watt below is MODEL output, never a measurement.

``PID`` -- the textbook parallel form (Astrom & Hagglund, *Advanced PID Control*, 2006) in discrete time:

    e_k = setpoint - y_k
    u_k = clip(kp e_k + I_k + D_k, out_min, out_max)
    I_k = I_{k-1} + ki e_k dt                      (the integral term is stored, so gain changes are bumpless)
    D_k = -kd (y_k - y_{k-1}) / dt                 (derivative on the measurement: no kick on a setpoint step)

Anti-windup by clamping / conditional integration: the integral is not advanced when the unclipped output is beyond a
limit and the error pushes further into it, and the integral itself is kept inside [out_min, out_max]. Without it
(``anti_windup=False``) the integral keeps growing while the actuator is saturated and the output overshoots when the
loop comes out of saturation. ``step_response`` drives a controller on a one-input one-output plant and reports
settling time (2 % band), overshoot and steady-state error (mean over the last 10 %) from the time series.

``PowerCapAllocator`` [Q126] -- several jobs share a cluster cap (Facebook's Dynamo, ISCA 2016, and CapMaestro, HPCA
2019, cap racks/clusters by adjusting per-server limits, capping fast and uncapping slowly; RAPL enforces a
running-average power limit per socket). Per job a power model is fitted by least squares on the plant's settings
(clock f x SM share, u the resulting utilisation): ``form="linear"`` is the question's P = alpha f + beta u + idle;
``form="activity"`` keeps two coefficients but puts beta on the switching activity u (f / f_max)^3 (dynamic power
~ u f V^2 with V ~ f). Either is shifted up by its largest residual so it upper-bounds the samples. On this MODEL
plant the activity form is exact by construction (the plant uses that law) while the linear form errs by tens of
watts -- on hardware both would be fitted from telemetry, hence the feedback loop. Allocation: per job the
candidates (ladder clock x SM share) on the upper concave hull of (watts, normalised throughput = throughput / the
job's throughput at f_max), greedy by marginal throughput per watt (the water-filling solution of the convex
relaxation), then a fill pass with the leftover watts. Baseline: uniform capping, one clock fraction for all jobs
(the highest whose true total fits). Feedback: a PID on the measured total trims the budget handed to the allocator
so the measured total tracks cap * (1 - margin); a measurement above the cap cuts the budget at once.

``DualThresholdController`` [Q186] -- two coupled PIDs: a fast one on the instantaneous power acting on the clock
(keeps the peak cap; a feed-forward ceiling -- the highest ladder clock whose power scaled from the measurement by the
cubic law fits the peak cap -- stops a quantised clock dithering across it), a slow one on the running average over
``window_s`` acting on duty (the share of time steps are issued; a smaller batch has the same effect) that keeps the
average cap. Coupling rule, stated: the peak loop acts first every step and has priority; while it holds the clock
below f_max the average loop may lower duty but not raise it (its integrator is frozen on positive error), so the two
loops never push in opposite directions; duty is also capped by a RAPL-like allowance -- the largest duty whose power
(linear in duty, scaled for the new clock) keeps the next window average under the cap -- since a PI on a lagging
running average alone overshoots on bursts; if the peak loop is at f_min and the power is still above the peak cap,
duty is cut at once by cap / measured.

``BatchSizeController`` [Q254] -- monitoring + prediction + decision: it fits step time t(b) = t0 + t1 b (so
throughput b / t(b)) and power P(b) = p0 + p1 busy(b), busy = t1 b / t(b), from the samples it observes, picks the
batch with the largest predicted throughput whose predicted power plus a monitored bias (EWMA of measured minus
predicted) is within the budget minus a margin, and re-decides as the bias changes. A Schmitt trigger stops a
flip-flop (the fit's error differs between batches, so the bias learned at one batch misjudges the next): a new
batch must fit with half the margin to spare, the current one stays while it fits within half the margin.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._inputs import is_real
from .plant import Plant, as_floats, check_steps, check_trace, predict, snap_down


def _finite(v: float, name: str) -> float:
    if not (is_real(v) and math.isfinite(v)):
        raise ValueError(f"{name}: expected a finite number, got {v!r}")
    return float(v)


def _positive(v: float, name: str) -> float:
    if _finite(v, name) <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {v!r}")
    return float(v)


def _plant(plant: Any) -> Plant:
    if not isinstance(plant, Plant):
        raise TypeError(f"plant: expected a tinylearn.sched.plant.Plant, got {type(plant).__name__}")
    return plant


class PID:
    """Discrete PID with derivative on the measurement and clamping anti-windup (see the module docstring). Gains are
    >= 0 (direct acting: a larger output raises the measurement, as a higher clock raises power)."""

    def __init__(self, kp: float, ki: float, kd: float, setpoint: float, out_min: float, out_max: float, *,
                 initial: float | None = None, anti_windup: bool = True) -> None:  # fmt: skip
        for name, g in (("kp", kp), ("ki", ki), ("kd", kd)):
            if _finite(g, name) < 0:
                raise ValueError(f"{name}: expected a gain >= 0, got {g!r}")
        if kp == ki == kd == 0:
            raise ValueError(f"kp/ki/kd: at least one gain must be > 0, got {kp!r}, {ki!r}, {kd!r}")
        if not _finite(out_min, "out_min") < _finite(out_max, "out_max"):
            raise ValueError(f"out_min/out_max: expected out_min < out_max, got {out_min!r}, {out_max!r}")
        self.kp, self.ki, self.kd = float(kp), float(ki), float(kd)
        self.setpoint = _finite(setpoint, "setpoint")
        self.out_min, self.out_max, self.anti_windup = float(out_min), float(out_max), bool(anti_windup)
        self.initial = min(max(0.0 if initial is None else _finite(initial, "initial"), out_min), out_max)
        self.reset()

    def reset(self) -> None:
        """Forget the integral and the last measurement; the output restarts at ``initial``."""
        self.integral = self.initial
        self.prev: float | None = None
        self.output = self.initial

    def update(self, measured: float, dt: float) -> float:
        """One control step: the new output for measurement ``measured`` after ``dt`` seconds."""
        y, dt = _finite(measured, "measured"), _positive(dt, "dt")
        e = self.setpoint - y
        p = self.kp * e
        d = 0.0 if self.prev is None else -self.kd * (y - self.prev) / dt
        integral = self.integral + self.ki * e * dt
        if self.anti_windup:
            raw = p + integral + d
            if (raw > self.out_max and e > 0) or (raw < self.out_min and e < 0):
                integral = self.integral
            integral = min(max(integral, self.out_min), self.out_max)
        self.integral, self.prev = integral, y
        self.output = min(max(p + integral + d, self.out_min), self.out_max)
        return self.output


def response_metrics(t: np.ndarray, y: np.ndarray, setpoint: float, start: int = 0, *, y_start: float | None = None,
                     band: float = 0.02) -> dict[str, float]:  # fmt: skip
    """Settling time (last exit from +-``band`` x step around ``setpoint``, from ``t[start]``), overshoot (fraction
    of the step beyond the setpoint) and steady-state error (|mean of the last 10 % - setpoint| / |setpoint|) of the
    response ``y`` after index ``start``; the step is ``setpoint - y_start`` (default ``y[start - 1]`` or ``y[0]``).
    """
    t, y = as_floats(t, "t"), as_floats(y, "y")
    if t.shape != y.shape or t.ndim != 1 or not 0 <= start < len(t) - 1:
        raise ValueError(f"t/y/start: expected equal 1-D series and 0 <= start < {len(t) - 1}, got {start!r}")
    y0 = float(y[max(start - 1, 0)]) if y_start is None else float(y_start)
    step = setpoint - y0
    scale = abs(step) if abs(step) > 1e-12 else max(abs(setpoint), 1e-12)
    seg_t, seg_y = t[start:], y[start:]
    sign = 1.0 if step >= 0 else -1.0
    overshoot = max(0.0, float(np.max(sign * (seg_y - setpoint)))) / scale
    outside = np.nonzero(np.abs(seg_y - setpoint) > band * scale)[0]
    if len(outside) == 0:
        settling = 0.0
    elif outside[-1] == len(seg_y) - 1:
        settling = math.inf
    else:
        settling = float(seg_t[outside[-1] + 1] - t[start])
    tail = seg_y[-max(1, len(seg_y) // 10) :]
    ss = abs(float(tail.mean()) - setpoint) / max(abs(setpoint), 1e-12)
    return {"settling_time_s": settling, "overshoot": overshoot, "steady_state_error": ss}


def step_response(controller: PID, plant: Any, steps: int, dt: float, *, setpoints: Sequence[float] | None = None,
                  disturbance: Sequence[float] | None = None) -> dict[str, Any]:  # fmt: skip
    """Close the loop for ``steps`` steps of ``dt``: u = controller.update(y), y = plant.respond(u) + disturbance.

    ``setpoints`` (optional, one per step) changes the controller's setpoint over time; ``disturbance`` (optional,
    one per step) is added to the measurement (e.g. another load on the same feed). Returns the series (t, y, u,
    setpoint, disturbance) and ``response_metrics`` of the segment after the last setpoint change."""
    steps, dt = check_steps(steps, "steps", 2), _positive(dt, "dt")
    if not isinstance(controller, PID):
        raise TypeError(f"controller: expected a PID, got {type(controller).__name__}")
    if not hasattr(plant, "respond"):
        raise TypeError(f"plant: expected an object with respond(u, dt), got {type(plant).__name__}")
    sp = np.full(steps, controller.setpoint) if setpoints is None else as_floats(setpoints, "setpoints")
    dist = np.zeros(steps) if disturbance is None else as_floats(disturbance, "disturbance")
    for name, arr, raw in (("setpoints", sp, setpoints), ("disturbance", dist, disturbance)):
        if arr.shape != (steps,) or not np.all(np.isfinite(arr)):
            raise ValueError(f"{name}: expected {steps} finite values, got {raw!r}")
    y = float(plant.respond(controller.output, dt))
    ts, ys, us = np.zeros(steps), np.zeros(steps), np.zeros(steps)
    for k in range(steps):
        controller.setpoint = float(sp[k])
        u = controller.update(y, dt)
        y = float(plant.respond(u, dt)) + float(dist[k])
        ts[k], ys[k], us[k] = (k + 1) * dt, y, u
    changes = np.nonzero(np.diff(sp))[0]
    start = int(changes[-1] + 1) if len(changes) else 0
    out: dict[str, Any] = {"t": ts, "y": ys, "u": us, "setpoint": sp, "disturbance": dist, "start": start}
    out.update(response_metrics(ts, ys, float(sp[-1]), start))
    return out


# ------------------------------------------------------------------------------------------------ [Q126]
def fit_power_model(plant: Plant, i: int, shares: Sequence[float] = (0.25, 0.5, 0.75, 1.0), *,
                    form: str = "activity") -> dict[str, Any]:  # fmt: skip
    """Least-squares fit of device ``i``'s power over the ladder x ``shares`` (MODEL samples from ``plant.predict``):
    ``form="linear"``: P - idle = alpha f + beta u (the question's model); ``"activity"``: P - idle = alpha f +
    beta u (f / f_max)^3 (same two coefficients, beta on the switching activity, since dynamic power ~ u f V^2 with
    V ~ f). alpha, beta >= 0; idle is the spec's idle draw (read at rest) raised by the largest residual, so the
    model upper-bounds every sample. Returns the coefficients, the residual and a ``power(f, u)`` function."""
    if form not in ("linear", "activity"):
        raise ValueError(f"form: expected 'linear' or 'activity', got {form!r}")
    spec = _plant(plant).specs[plant.check_device(i, "i")]
    feat = (lambda f, u: (f, u)) if form == "linear" else (lambda f, u: (f, u * (f / spec.f_max_mhz) ** 3))
    rows, target = [], []
    for f in spec.freqs():
        for s in shares:
            m = plant.predict(i, f, sm_share=s)
            rows.append(feat(f, m["util"]))
            target.append(m["power"] - spec.idle_w)
    a, b = np.asarray(rows, dtype=float), np.asarray(target)
    coef = np.clip(np.linalg.lstsq(a, b, rcond=None)[0], 0.0, None)
    resid = b - a @ coef
    al, be, idle = float(coef[0]), float(coef[1]), spec.idle_w + float(resid.max())
    return {"form": form, "alpha": al, "beta": be, "idle": idle, "max_residual_w": float(np.abs(resid).max()),
            "power": lambda f, u: idle + al * feat(f, u)[0] + be * feat(f, u)[1]}  # fmt: skip


def _hull(points: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """Upper concave hull of (watts, value, setting), from the cheapest point, value strictly increasing."""
    pts = sorted(points, key=lambda p: (p[0], -p[1]))
    hull: list[tuple[float, float, Any]] = []
    for p in pts:
        if hull and p[1] <= hull[-1][1]:
            continue
        while len(hull) >= 2:
            (x1, y1, _), (x2, y2, _) = hull[-2], hull[-1]
            if (y2 - y1) * (p[0] - x1) <= (p[1] - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


class PowerCapAllocator:
    """[Q126] Share ``cap_w`` among the plant's jobs: per job a clock and SM share maximising total weighted
    normalised throughput subject to sum P <= cap (model: fitted upper-bound P = alpha f + beta u + idle)."""

    def __init__(self, cap_w: float, *, shares: Sequence[float] = (0.25, 0.5, 0.75, 1.0), margin: float = 0.03) -> None:
        self.cap_w = _positive(cap_w, "cap_w")
        if not shares or not all(is_real(s) and 0 < s <= 1 for s in shares):
            raise ValueError(f"shares: expected SM shares in (0, 1], got {shares!r}")
        if not 0 <= _finite(margin, "margin") < 0.5:
            raise ValueError(f"margin: expected a fraction in [0, 0.5), got {margin!r}")
        self.shares, self.margin = tuple(float(s) for s in shares), float(margin)

    def _candidates(self, plant: Plant, i: int, model: dict[str, Any] | None) -> list[tuple[float, float, Any]]:
        best = plant.predict(i, plant.specs[i].f_max_mhz)["throughput"]
        out = []
        for f in plant.specs[i].freqs():
            for s in self.shares:
                m = plant.predict(i, f, sm_share=s)
                watts = m["power"] if model is None else model["power"](f, m["util"])
                out.append((watts, plant.workloads[i].weight * m["throughput"] / best, (f, s)))
        return out

    def allocate(self, plant: Plant, budget_w: float | None = None, *, model: str = "activity",
                 strict: bool = True) -> dict[str, Any]:  # fmt: skip
        """Greedy allocation under ``budget_w`` (default the cap). ``model`` is a ``fit_power_model`` form
        ("activity" or "linear", both upper bounds) or ``"exact"`` (the plant's own power, an oracle). Returns
        per-job clock, share, model and true power, normalised throughput, and totals. A budget below the lowest
        settings raises (``strict``) or returns the lowest settings."""
        if model not in ("linear", "activity", "exact"):
            raise ValueError(f"model: expected 'linear', 'activity' or 'exact', got {model!r}")
        budget = self.cap_w if budget_w is None else _positive(budget_w, "budget_w")
        _plant(plant)
        fits = [None if model == "exact" else fit_power_model(plant, i, self.shares, form=model)
                for i in range(plant.n)]  # fmt: skip
        cands = [self._candidates(plant, i, fits[i]) for i in range(plant.n)]
        hulls = [_hull(c) for c in cands]
        pos = [0] * plant.n
        used = sum(h[0][0] for h in hulls)
        if used > budget and strict:
            raise ValueError(f"budget_w: {budget:.1f} W is below the {used:.1f} W the jobs draw at their lowest")
        while True:
            best, bi = -1.0, -1
            for i, h in enumerate(hulls):
                if pos[i] + 1 < len(h):
                    dw, dv = h[pos[i] + 1][0] - h[pos[i]][0], h[pos[i] + 1][1] - h[pos[i]][1]
                    if used + dw <= budget and dv / max(dw, 1e-9) > best:
                        best, bi = dv / max(dw, 1e-9), i
            if bi < 0:
                break
            used += hulls[bi][pos[bi] + 1][0] - hulls[bi][pos[bi]][0]
            pos[bi] += 1
        chosen = [h[p] for h, p in zip(hulls, pos)]
        for i in range(plant.n):  # fill pass: spend leftover watts on any better candidate
            for c in sorted(cands[i], key=lambda c: -c[1]):
                if c[1] > chosen[i][1] and used - chosen[i][0] + c[0] <= budget:
                    used += c[0] - chosen[i][0]
                    chosen[i] = c
                    break
        return self._report(plant, [c[2] for c in chosen], [c[0] for c in chosen])

    def uniform(self, plant: Plant) -> dict[str, Any]:
        """Baseline: every job at the same fraction of its f_max (full SM share), the highest whose TRUE total
        power fits the cap (given the exact model, which favours the baseline)."""
        _plant(plant)
        ladder = plant.specs[0].freqs()
        fracs = sorted({f / plant.specs[0].f_max_mhz for f in ladder}, reverse=True)
        for r in fracs:
            sets = [(snap_down(s, max(r * s.f_max_mhz, s.f_min_mhz)), 1.0) for s in plant.specs]
            rep = self._report(plant, sets, [plant.predict(i, f)["power"] for i, (f, _) in enumerate(sets)])
            if rep["true_power_w"] <= self.cap_w:
                return rep
        raise ValueError(f"cap_w: {self.cap_w:.1f} W is below the jobs' power at their lowest clock")

    def _report(self, plant: Plant, settings: list[tuple[float, float]], model_w: list[float]) -> dict[str, Any]:
        rows = []
        for i, (f, s) in enumerate(settings):
            m = plant.predict(i, f, sm_share=s)
            norm = m["throughput"] / plant.predict(i, plant.specs[i].f_max_mhz)["throughput"]
            rows.append({"job": plant.workloads[i].name, "ai": plant.workloads[i].ai, "clock_mhz": f, "sm_share": s,
                         "model_w": model_w[i], "true_w": m["power"], "norm_throughput": norm})  # fmt: skip
        total = float(sum(w.weight * r["norm_throughput"] for w, r in zip(plant.workloads, rows)))
        return {"rows": rows, "settings": settings, "model_power_w": float(sum(model_w)),
                "true_power_w": float(sum(r["true_w"] for r in rows)), "throughput": total}  # fmt: skip

    def run(self, plant: Plant, steps: int, dt: float, *, every: int = 5, kp: float = 0.2, ki: float = 1.0,
            model: str = "activity") -> dict[str, np.ndarray]:  # fmt: skip
        """Closed loop: every ``every`` steps re-allocate with the budget a PID sets from the measured total (the
        PID's setpoint is cap * (1 - margin)); a measured total above the cap cuts the budget at once by the excess
        (fast capping, slow uncapping). Returns the measured/true total power, budget and throughput series."""
        steps, every, dt = check_steps(steps), check_steps(every, "every"), _positive(dt, "dt")
        _plant(plant)
        target = self.cap_w * (1 - self.margin)
        floor = sum(_hull(self._candidates(plant, i, None))[0][0] for i in range(plant.n))
        pid = PID(kp, ki, 0.0, target, floor * 1.01, self.cap_w * 1.5, initial=target)
        out: dict[str, list] = {"t": [], "measured": [], "true": [], "budget": [], "throughput": []}
        budget, y = target, plant.total_sensed
        for k in range(steps):
            if k % every == 0:
                alloc = self.allocate(plant, budget, model=model, strict=False)
                plant.set(clock=[f for f, _ in alloc["settings"]], sm_share=[s for _, s in alloc["settings"]])
            r = plant.step(dt)
            y = float(r["total_measured"])
            budget = pid.update(y, dt)
            if y > self.cap_w:  # fast capping (as Dynamo does): cut at once by the excess, slow PID uncapping after
                budget = pid.integral = max(pid.out_min, min(budget, pid.integral) - (y - target))
            best = [plant.predict(i, plant.specs[i].f_max_mhz)["throughput"] for i in range(plant.n)]
            for key, v in (("t", r["t"]), ("measured", y), ("true", r["total_power"]), ("budget", budget),
                           ("throughput", float(sum(r["throughput"] / np.asarray(best))))):  # fmt: skip
                out[key].append(v)
        return {k: np.asarray(v) for k, v in out.items()}


# ------------------------------------------------------------------------------------------------ [Q186]
class DualThresholdController:
    """[Q186] Fast PID on instantaneous power -> clock (peak cap); slow PID on the ``window_s`` running average ->
    duty (average cap); coupling rule in the module docstring. Gains are per watt of the plant's sensitivity."""

    def __init__(self, avg_cap_w: float, peak_cap_w: float, window_s: float, *, peak_margin: float = 0.03) -> None:
        self.avg_cap_w, self.peak_cap_w = _positive(avg_cap_w, "avg_cap_w"), _positive(peak_cap_w, "peak_cap_w")
        self.window_s = _positive(window_s, "window_s")
        if avg_cap_w > peak_cap_w:
            raise ValueError(f"avg_cap_w: {avg_cap_w!r} is above peak_cap_w={peak_cap_w!r}")
        if not 0 <= _finite(peak_margin, "peak_margin") < 0.5:
            raise ValueError(f"peak_margin: expected a fraction in [0, 0.5), got {peak_margin!r}")
        self.peak_margin = float(peak_margin)

    def run(self, plant: Plant, load: Sequence[float], dt: float, *, control: bool = True) -> dict[str, np.ndarray]:
        """Drive ``plant`` through the ``load`` trace (per step, the share of time work is available, all devices);
        ``control=False`` runs the same trace uncapped. Returns true/measured power, its running average over
        ``window_s`` (time before the run counts as idle, as a RAPL window does), clock, duty and throughput."""
        dt, trace = _positive(dt, "dt"), check_trace(load)
        _plant(plant)
        f_min, f_max = plant.specs[0].f_min_mhz, plant.specs[0].f_max_mhz
        g_clock = sum(3 * (s.tdp_w - s.idle_w) / s.f_max_mhz for s in plant.specs)  # W per MHz near f_max
        g_duty = sum(s.tdp_w - s.idle_w for s in plant.specs)  # W per unit duty
        peak = PID(0.3 / g_clock, 8.0 / g_clock, 0.0, self.peak_cap_w * (1 - self.peak_margin), f_min, f_max,
                   initial=f_max)  # fmt: skip
        avg = PID(0.5 / g_duty, 2.0 / (g_duty * self.window_s), 0.0, self.avg_cap_w, 0.05, 1.0, initial=1.0)
        idle, ladder = sum(s.idle_w for s in plant.specs), plant.specs[0].freqs()
        n_win = max(1, round(self.window_s / dt))
        window: deque[float] = deque(maxlen=n_win)  # true power (reported)
        seen: deque[float] = deque(maxlen=n_win)  # measured power (what the controller acts on)
        out: dict[str, list] = {k: [] for k in ("t", "power", "measured", "average", "clock", "duty", "throughput")}
        clock, duty, y = f_max, 1.0, plant.total_sensed
        for k in range(len(trace)):
            plant.set(load=float(trace[k]), clock=clock, duty=duty)
            r = plant.step(dt)
            y = float(r["total_measured"])
            window.append(float(r["total_power"]))
            seen.append(y)
            pad = idle * (n_win - len(seen))  # before the run the devices were idle (as a RAPL window counts it)
            running, ctl_avg = (sum(window) + pad) / n_win, (sum(seen) + pad) / n_win
            if control:
                # feed-forward ceilings (the measurement scaled by the model's laws): the highest ladder clock whose
                # power, cubic in f, stays under the peak cap (a quantised clock would otherwise dither across it);
                # the largest duty, power linear in duty, that keeps next step's window average under the avg cap
                cur, dyn = float(np.mean(r["clock"])), max(y - idle, 0.0)
                ceiling = max([f for f in ladder if idle + dyn * (f / cur) ** 3 <= self.peak_cap_w], default=f_min)
                clock = min(peak.update(y, dt), ceiling)
                peak.integral = min(peak.integral, ceiling)
                kept = list(seen)[1:] if len(seen) == n_win else list(seen)
                allow = self.avg_cap_w * n_win - sum(kept) - idle * (n_win - 1 - len(kept))
                scale = dyn * (clock / cur) ** 3 / max(duty, 1e-9)
                duty_max = (allow - idle) / scale if scale > 0 else 1.0
                if clock < f_max - 1e-9 and avg.setpoint - ctl_avg > 0:  # coupling: no duty increase while held
                    avg.prev = ctl_avg
                else:
                    duty = avg.update(ctl_avg, dt)
                duty = min(max(min(duty, duty_max), 0.05), 1.0)
                avg.integral = min(avg.integral, duty)
                if clock <= f_min + 1e-9 and y > self.peak_cap_w:
                    duty = max(0.05, duty * self.peak_cap_w / y)
                    avg.integral = min(avg.integral, duty)
            for key, v in (("t", r["t"]), ("power", r["total_power"]), ("measured", y), ("average", running),
                           ("clock", float(np.mean(r["clock"]))), ("duty", float(np.mean(plant.duty))),
                           ("throughput", float(np.sum(r["throughput"])))):  # fmt: skip
                out[key].append(v)
        return {k: np.asarray(v) for k, v in out.items()}


# ------------------------------------------------------------------------------------------------ [Q254]
class BatchSizeController:
    """[Q254] Fit throughput and power vs batch from observed samples, pick the batch that maximises predicted
    throughput under ``power_budget_w`` (minus a margin), correct with the monitored bias of the power prediction."""

    def __init__(self, power_budget_w: float, *, candidates: Sequence[int] = tuple(2**k for k in range(11)),
                 margin: float = 0.02, bias_gain: float = 0.3) -> None:  # fmt: skip
        self.power_budget_w = _positive(power_budget_w, "power_budget_w")
        if not candidates or not all(isinstance(b, int) and b >= 1 for b in candidates):
            raise ValueError(f"candidates: expected batch sizes >= 1, got {candidates!r}")
        if not 0 <= _finite(margin, "margin") < 0.5 or not 0 < _finite(bias_gain, "bias_gain") <= 1:
            raise ValueError(f"margin/bias_gain: expected [0, 0.5) and (0, 1], got {margin!r}, {bias_gain!r}")
        self.candidates, self.margin, self.bias_gain = sorted(set(candidates)), float(margin), float(bias_gain)
        self.samples: list[tuple[int, float, float]] = []
        self.bias_w = 0.0
        self.coef: tuple[float, float, float, float] | None = None

    def observe(self, batch: int, throughput: float, power_w: float) -> None:
        """Record one monitored sample (batch size, samples/s, watts)."""
        if not isinstance(batch, int | np.integer) or batch < 1:
            raise ValueError(f"batch: expected an int >= 1, got {batch!r}")
        self.samples.append((int(batch), _positive(throughput, "throughput"), _positive(power_w, "power_w")))

    def fit(self) -> tuple[float, float, float, float]:
        """(t0, t1, p0, p1) by least squares: step time = t0 + t1 b, power = p0 + p1 * t1 b / (t0 + t1 b)."""
        if len({b for b, _, _ in self.samples}) < 2:
            raise ValueError(f"samples: need observations at >= 2 batch sizes, have {len(self.samples)}")
        b = np.array([s[0] for s in self.samples], dtype=float)
        t = b / np.array([s[1] for s in self.samples])
        t0, t1 = np.linalg.lstsq(np.c_[np.ones_like(b), b], t, rcond=None)[0]
        t0, t1 = max(float(t0), 0.0), max(float(t1), 1e-12)
        busy = t1 * b / (t0 + t1 * b)
        p0, p1 = np.linalg.lstsq(np.c_[np.ones_like(b), busy], [s[2] for s in self.samples], rcond=None)[0]
        self.coef = (t0, t1, float(p0), float(p1))
        return self.coef

    def predict(self, batch: int) -> tuple[float, float]:
        """(throughput, power) the fitted model predicts at ``batch`` (bias not included)."""
        t0, t1, p0, p1 = self.coef if self.coef is not None else self.fit()
        step = t0 + t1 * batch
        return batch / step, p0 + p1 * t1 * batch / step

    def decide(self, current: int | None = None, hysteresis: float = 0.03) -> int:
        """The candidate batch with the largest predicted throughput whose predicted power + bias fits the budget
        minus the margin minus half the margin again (the smallest candidate if none does); ``current`` is kept
        while its predicted power + bias is within the budget minus half the margin and nothing that fits is more
        than ``hysteresis`` faster (a Schmitt trigger: no flip-flop on the bias or sensor noise)."""
        limit, enter = self.power_budget_w * (1 - self.margin), self.power_budget_w * self.margin / 2
        ok = [(self.predict(b)[0], b) for b in self.candidates if self.predict(b)[1] + self.bias_w <= limit - enter]
        stay = current is not None and self.predict(current)[1] + self.bias_w <= limit + enter
        best_thr, best = max(ok) if ok else (0.0, self.candidates[0])
        if stay and best_thr <= self.predict(current)[0] * (1 + hysteresis):
            return current
        return best

    def run(self, plant: Plant, steps: int, dt: float, *, probes: Sequence[int] = (8, 64, 512), device: int = 0,
            budget_change: tuple[int, float] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
        """Online on device ``device``: probe ``probes`` (one step each), fit, then decide every step, observing
        each step's measured power (EWMA bias) and throughput. ``budget_change=(step, watts)`` changes the budget
        mid-run. Returns batch, measured power and throughput series."""
        steps, dt, device = check_steps(steps), _positive(dt, "dt"), _plant(plant).check_device(device)
        if budget_change is not None and not (isinstance(budget_change, tuple) and len(budget_change) == 2):
            raise ValueError(f"budget_change: expected (step, watts), got {budget_change!r}")
        out: dict[str, list] = {k: [] for k in ("t", "batch", "power", "measured", "throughput", "budget")}
        cands = [b for b in self.candidates if b <= plant.workloads[device].max_batch]
        self.candidates = cands or self.candidates[:1]
        plan, b = list(probes), 0
        for k in range(steps):
            if budget_change is not None and k == budget_change[0]:
                self.power_budget_w = _positive(budget_change[1], "budget_change")
            b = plan.pop(0) if plan else self.decide(b if k > len(probes) else None)
            plant.set(batch=[b if i == device else int(plant.batch[i]) for i in range(plant.n)])
            r = plant.step(dt)
            meas, thr = float(r["measured"][device]), float(r["throughput"][device])
            self.observe(b, max(thr, 1e-9), max(meas, 1e-9))
            if not plan:
                self.fit()
                self.bias_w += self.bias_gain * (meas - self.predict(b)[1] - self.bias_w)
            for key, v in (("t", r["t"]), ("batch", b), ("power", r["power"][device]), ("measured", meas),
                           ("throughput", thr), ("budget", self.power_budget_w)):  # fmt: skip
                out[key].append(v)
        return {k: np.asarray(v) for k, v in out.items()}


def best_batch(plant: Plant, device: int, budget_w: float, candidates: Sequence[int]) -> tuple[int, float]:
    """Oracle for comparison: the candidate with the highest noise-free MODEL throughput within ``budget_w``."""
    device = _plant(plant).check_device(device)
    spec, w, f = plant.specs[device], plant.workloads[device], float(plant.clock[device])
    ok = [(predict(spec, w, f, b)["throughput"], b) for b in candidates
          if b <= w.max_batch and predict(spec, w, f, b)["power"] <= budget_w]  # fmt: skip
    if not ok:
        return int(min(candidates)), 0.0
    thr, b = max(ok)
    return b, thr
