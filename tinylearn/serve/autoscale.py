"""Autoscaling an inference service under bursty load [Q261]: a multi-metric controller, a MEASURED replica cold
start, and a discrete-event MODEL of replicas serving an arrival trace (reactive vs predictive policy).

Controller (``Autoscaler.observe``, called once per control interval with the metrics of the last interval):

    need_util  = ceil(replicas * util / target_util)               utilisation-proportional (Kubernetes HPA rule)
    need_queue = ceil((rate + queue / slo) / (mu * target_util))   capacity to serve arrivals AND drain the backlog
                                                                  within one SLO (mu = per-replica service rate)
    need_slo   = replicas + 1   if p95 > slo                       latency breach: at least one more
    need_pred  = ceil(forecast(cold_start + interval) / (mu * target_util))    predictive only
    up:    target = max(all needs) > provisioned * (1 + tolerance)     any one metric may ask for capacity
           (the SLO signal skips the tolerance; the HPA's default tolerance is 0.1)
    down:  only when every signal agrees: util < down_util, p95 < down_latency_frac * slo, queue == 0, the
           cooldown since the last change has passed, the fused need is below provisioned and the ready replicas'
           load would still fit one fewer at target_util / (1 + tolerance); remove ONE replica
           per decision (hysteresis band [down_util, target_util] + cooldown => no flapping on a noisy flat load)

Forecast: Holt's double exponential smoothing of the per-interval arrival rate,
    level_t = a x_t + (1 - a)(level + trend);  trend_t = b (level_t - level) + (1 - b) trend;  x_{t+h} ~ level + h trend
initialised with level = x_1, trend = x_1 - x_0; on a linear ramp it is exact from the second observation on.
The predictive policy asks now for the replicas the forecast load needs once a replica started now is ready
(cold_start_s later): a reactive threshold policy sees the ramp only after it has overloaded the ready replicas,
and the new replicas arrive cold_start_s after that.

``measure_cold_start`` MEASURES a replica cold start: a fresh Python process imports tinylearn, builds a TinyGPT
and runs its first forward; the wall time from spawn to its answer on stdout (bounded by ``timeout_s``).
``simulate`` is a MODEL (discrete-event simulation, not a measurement): FCFS queue shared by the replicas,
deterministic service time 1/service_rate, replicas ready cold_start_s after the scale-up decision, a removed
replica finishes its request first; it reports SLO violations (latency > slo_s) and replica-seconds (starting
replicas cost money too).
"""

from __future__ import annotations

import heapq
import json
import math
import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _pos(name: str, v: Any, *, zero: bool = False) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a real number, got {type(v).__name__} {v!r}")
    v = float(v)
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero):
        raise ValueError(f"{name}: must be a finite number {'>=' if zero else '>'} 0, got {v!r}")
    return v


def _int(name: str, v: Any, minimum: int) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ValueError(f"{name}: must be an int >= {minimum}, got {v!r}")
    return int(v)


class HoltForecaster:
    """Holt's linear (double exponential) smoothing; ``update(x)`` then ``forecast(h)`` = level + h * trend."""

    def __init__(self, alpha: float = 0.5, beta: float = 0.3) -> None:
        for name, v in (("alpha", alpha), ("beta", beta)):
            if not 0 < _pos(name, v) <= 1:
                raise ValueError(f"{name}: smoothing factor must be in (0, 1], got {v!r}")
        self.alpha, self.beta = float(alpha), float(beta)
        self.level: float | None = None
        self.trend = 0.0
        self.n = 0

    def update(self, x: float) -> None:
        x = _pos("x", x, zero=True)
        if self.level is None:
            self.level = x
        elif self.n == 1:
            self.trend, self.level = x - self.level, x
        else:
            prev = self.level
            self.level = self.alpha * x + (1 - self.alpha) * (prev + self.trend)
            self.trend = self.beta * (self.level - prev) + (1 - self.beta) * self.trend
        self.n += 1

    def forecast(self, h: float = 1.0) -> float:
        """The value ``h`` steps ahead (h may be fractional); 0 before any observation; never negative."""
        h = _pos("h", h, zero=True)
        return 0.0 if self.level is None else max(0.0, self.level + h * self.trend)


@dataclass
class Decision:
    time: float
    target: int
    action: str  # "up", "down" or "hold"
    reason: str


class Autoscaler:
    """Multi-metric scaling controller (see the module docstring). ``predictive=False`` is the reactive policy.

    service_rate: requests/s one replica serves; slo_s: latency objective; interval_s: control period (the
    forecaster counts steps of this length)."""

    def __init__(
        self,
        min_replicas: int,
        max_replicas: int,
        target_util: float,
        cold_start_s: float,
        *,
        service_rate: float,
        slo_s: float,
        interval_s: float = 1.0,
        down_util: float | None = None,
        down_latency_frac: float = 0.5,
        cooldown_s: float | None = None,
        predictive: bool = True,
        tolerance: float = 0.1,
        alpha: float = 0.5,
        beta: float = 0.3,
    ) -> None:
        self.min_replicas = _int("min_replicas", min_replicas, 1)
        self.max_replicas = _int("max_replicas", max_replicas, 1)
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas: {max_replicas} is below min_replicas={min_replicas}")
        self.target_util = _pos("target_util", target_util)
        if self.target_util > 1:
            raise ValueError(f"target_util: must be in (0, 1], got {target_util!r}")
        self.cold_start_s = _pos("cold_start_s", cold_start_s, zero=True)
        self.service_rate = _pos("service_rate", service_rate)
        self.slo_s = _pos("slo_s", slo_s)
        self.interval_s = _pos("interval_s", interval_s)
        self.down_util = 0.6 * self.target_util if down_util is None else _pos("down_util", down_util)
        if self.down_util >= self.target_util:
            raise ValueError(f"down_util: {down_util!r} must be below target_util={target_util} (hysteresis band)")
        self.down_latency_frac = _pos("down_latency_frac", down_latency_frac)
        self.cooldown_s = 4 * self.interval_s if cooldown_s is None else _pos("cooldown_s", cooldown_s, zero=True)
        if not isinstance(predictive, (bool, np.bool_)):
            raise TypeError(f"predictive: expected a bool, got {predictive!r}")
        self.predictive = bool(predictive)
        self.tolerance = _pos("tolerance", tolerance, zero=True)
        self.forecaster = HoltForecaster(alpha, beta)
        self.last_change = -math.inf
        self.decisions: list[Decision] = []

    def _cap(self, n: float) -> int:
        return int(min(self.max_replicas, max(self.min_replicas, math.ceil(n - 1e-9))))

    def observe(
        self,
        t: float,
        arrival_rate: float,
        queue_depth: int,
        p95_latency: float,
        utilization: float,
        ready: int,
        starting: int = 0,
    ) -> Decision:
        """One control step at time ``t``: metrics of the last interval (utilisation of the ``ready`` replicas) and
        the replicas still ``starting``. Returns the Decision (target count of provisioned = ready + starting
        replicas); changes are also appended to ``decisions``."""
        rate = _pos("arrival_rate", arrival_rate, zero=True)
        q = _int("queue_depth", queue_depth, 0)
        p95 = _pos("p95_latency", p95_latency, zero=True)
        util = _pos("utilization", utilization, zero=True)
        ready, starting = _int("ready", ready, 0), _int("starting", starting, 0)
        cur = ready + starting
        self.forecaster.update(rate)
        cap = self.service_rate * self.target_util
        needs = {
            "util": ready * util / self.target_util,
            "queue": (rate + q / self.slo_s) / cap,
            "slo": cur + 1 if p95 > self.slo_s and starting == 0 else 0,  # replicas on the way count as the fix
        }
        if self.predictive:
            h = (self.cold_start_s + self.interval_s) / self.interval_s
            needs["forecast"] = self.forecaster.forecast(h) / cap
        why = max(needs, key=lambda k: needs[k])
        want = self._cap(needs[why])
        band = cur * (1 + self.tolerance) if why != "slo" else cur  # up-side of the hysteresis band
        if (want > cur and needs[why] > band) or cur < self.min_replicas:
            d = Decision(t, max(want, self.min_replicas), "up", f"{why} needs {needs[why]:.2f} > {cur}")
        elif (
            want < cur
            and util < self.down_util
            and p95 < self.down_latency_frac * self.slo_s
            and q == 0
            and util * ready < self.target_util * (cur - 1) / (1 + self.tolerance)  # still fine with one fewer
            and t - self.last_change >= self.cooldown_s
        ):
            d = Decision(t, cur - 1, "down", f"all signals low: util {util:.2f} < {self.down_util:.2f}, need {want}")
        else:
            return Decision(t, cur, "hold", "")
        self.last_change = t
        self.decisions.append(d)
        return d

    def __repr__(self) -> str:
        kind = "predictive" if self.predictive else "reactive"
        return (
            f"Autoscaler({kind}, replicas [{self.min_replicas}, {self.max_replicas}], target_util={self.target_util}, "
            f"cold_start_s={self.cold_start_s:.3g}, slo_s={self.slo_s})"
        )


# -- measured cold start ----------------------------------------------------------------------------------------
_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import tinylearn
from tinylearn.inference import TinyGPT
t1 = time.perf_counter()
np.random.seed(0)
m = TinyGPT(**json.loads(sys.argv[1]))
t2 = time.perf_counter()
logits = m.logits_last(list(range(8)))
t3 = time.perf_counter()
print(json.dumps(dict(import_s=t1 - t0, build_s=t2 - t1, forward_s=t3 - t2, finite=bool(np.isfinite(logits).all()))))
sys.stdout.flush()
"""


@dataclass
class ColdStart:
    """MEASURED: wall_s = spawn -> first answer of a fresh process; the rest are the child's own timings."""

    wall_s: float
    import_s: float
    build_s: float
    forward_s: float
    pid: int
    model: dict[str, Any] = field(default_factory=dict)


def measure_cold_start(model_kwargs: dict[str, Any] | None = None, timeout_s: float = 60.0) -> ColdStart:
    """Spawn a Python subprocess that imports tinylearn, builds a TinyGPT(**model_kwargs) and runs a first forward;
    return the measured wall time until it answers. RuntimeError if it fails, TimeoutError past ``timeout_s``."""
    timeout_s = _pos("timeout_s", timeout_s)
    kw = dict(vocab_size=258, d_model=64, n_heads=4, n_layers=2, max_seq_len=128)
    if model_kwargs is not None:
        if not isinstance(model_kwargs, dict):
            raise TypeError(f"model_kwargs: expected a dict of TinyGPT arguments, got {type(model_kwargs).__name__}")
        kw.update(model_kwargs)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(kw)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        proc.kill()
        proc.communicate()
        raise TimeoutError(f"timeout_s: the replica did not answer within {timeout_s} s") from e
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"cold-start child failed (rc={proc.returncode}): {err.decode()[-400:]}")
    info = json.loads(out.decode().strip().splitlines()[-1])
    if not info.pop("finite"):
        raise RuntimeError("cold-start child produced non-finite logits")
    return ColdStart(wall_s=wall, pid=proc.pid, model=kw, **info)


# -- discrete-event model ---------------------------------------------------------------------------------------
def ramp_trace(rates: Sequence[tuple[float, float]], duration_s: float, seed: int = 0) -> np.ndarray:
    """Poisson arrival times (sorted, seconds) with a piecewise-linear rate through the (time, rate) knots
    (constant past the last knot); generated by thinning. A MODEL input, not measured traffic."""
    pts = np.asarray(rates, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] != 2 or len(pts) < 1 or (pts[:, 1] < 0).any() or (np.diff(pts[:, 0]) <= 0).any():
        raise ValueError(f"rates: expected (time, rate >= 0) knots with increasing times, got {rates!r}")
    duration_s = _pos("duration_s", duration_s)
    rng = np.random.default_rng(_int("seed", seed, 0))
    lam_max = float(pts[:, 1].max())
    if lam_max == 0:
        return np.zeros(0)
    n = rng.poisson(lam_max * duration_s)
    t = np.sort(rng.uniform(0, duration_s, n))
    keep = rng.uniform(0, lam_max, n) < np.interp(t, pts[:, 0], pts[:, 1])
    return t[keep]


def burst_knots(
    base_rate: float, peak_rate: float, onset_s: float, tau_s: float, hold_s: float, n: int = 30
) -> list[tuple[float, float]]:
    """(time, rate) knots of a viral burst: ``base_rate`` until ``onset_s``, exponential growth
    base * exp((t - onset) / tau_s) up to ``peak_rate``, held ``hold_s``, then back to base over 2 tau_s.
    Exponential growth is what defeats a reactive policy: it lags by the cold start, and the load grows by the same
    factor exp(cold_start / tau) in every cold-start window, so target_util headroom never catches up."""
    base, peak = _pos("base_rate", base_rate), _pos("peak_rate", peak_rate)
    if peak < base:
        raise ValueError(f"peak_rate: {peak_rate!r} is below base_rate={base_rate!r}")
    onset, tau, hold = _pos("onset_s", onset_s), _pos("tau_s", tau_s), _pos("hold_s", hold_s, zero=True)
    grow = tau * math.log(peak / base)
    xs = np.linspace(0.0, grow, _int("n", n, 2))
    knots = [(0.0, base)] + [(onset + x, base * math.exp(x / tau)) for x in xs]
    return knots + [(onset + grow + hold + 1e-9, peak), (onset + grow + hold + 2 * tau, base)]


@dataclass
class SimResult:
    """Result of the discrete-event MODEL (``simulate``), not a measurement."""

    latencies: np.ndarray
    slo_violations: int
    replica_seconds: float
    decisions: list[Decision]
    replicas: list[tuple[float, int, int]]  # (t, ready, provisioned) at each control tick

    @property
    def p95(self) -> float:
        return float(np.percentile(self.latencies, 95)) if len(self.latencies) else 0.0

    def __repr__(self) -> str:
        return (
            f"SimResult(MODEL: {len(self.latencies)} requests, {self.slo_violations} SLO violations, "
            f"p95 {self.p95:.3g} s, {self.replica_seconds:.1f} replica-s, {len(self.decisions)} decisions)"
        )


def simulate(
    trace: Any, policy: Autoscaler, cold_start_s: float, service_rate: float, initial_replicas: int | None = None
) -> SimResult:
    """Discrete-event MODEL: replicas serving the arrival times ``trace`` under ``policy`` (an Autoscaler, stepped
    every policy.interval_s). New replicas become ready ``cold_start_s`` after the decision; deterministic service
    time 1/service_rate; FCFS. Runs until every request is served."""
    arr = np.asarray(trace, dtype=np.float64)
    if arr.ndim != 1 or not np.isfinite(arr).all() or (arr < 0).any() or (np.diff(arr) < 0).any():
        raise ValueError("trace: expected a 1-D sorted array of finite arrival times >= 0")
    if not isinstance(policy, Autoscaler):
        raise TypeError(f"policy: expected an Autoscaler, got {type(policy).__name__}")
    cold = _pos("cold_start_s", cold_start_s, zero=True)
    svc = 1.0 / _pos("service_rate", service_rate)
    n0 = policy.min_replicas if initial_replicas is None else _int("initial_replicas", initial_replicas, 1)
    dt = policy.interval_s
    ev: list[tuple[float, int, int, int]] = []  # (time, kind order, seq, payload): 0 finish, 1 ready, 2 arrive, 3 tick
    seq = 0

    def push(t: float, kind: int, payload: int = 0) -> None:
        nonlocal seq
        heapq.heappush(ev, (t, kind, seq, payload))
        seq += 1

    for i, a in enumerate(arr):
        push(float(a), 2, i)
    push(dt, 3)
    idle, busy, starting, to_remove = n0, 0, 0, 0
    queue: deque[int] = deque()
    lat = np.full(len(arr), np.nan)
    done, arrived_win, busy_time_win, lat_win = 0, 0, 0.0, []
    rep_s, last_t = 0.0, 0.0
    busy_since: dict[int, float] = {}
    log: list[tuple[float, int, int]] = []

    def start(t: float, i: int) -> None:
        nonlocal idle, busy
        idle -= 1
        busy += 1
        busy_since[i] = t
        push(t + svc, 0, i)

    while ev:
        t, kind, _, x = heapq.heappop(ev)
        rep_s += (idle + busy + starting) * (t - last_t)
        last_t = t
        if kind == 0:  # finish request x
            busy -= 1
            busy_time_win += t - max(busy_since.pop(x), t - dt)
            lat[x] = t - arr[x]
            lat_win.append(lat[x])
            done += 1
            if to_remove:
                to_remove -= 1
            else:
                idle += 1
        elif kind == 1:  # a replica is ready
            starting -= 1
            idle += 1
        elif kind == 2:
            queue.append(x)
            arrived_win += 1
        else:  # control tick
            ready = idle + busy
            in_service = sum(min(dt, t - s) for s in busy_since.values())
            util = min(1.0, (busy_time_win + in_service) / (dt * max(ready, 1)))
            p95 = float(np.percentile(lat_win, 95)) if lat_win else 0.0
            if queue:  # the oldest waiting request is part of the latency signal
                p95 = max(p95, t - arr[queue[0]])
            prov = ready + starting - to_remove
            d = policy.observe(t, arrived_win / dt, len(queue), p95, util, ready - to_remove, starting)
            for _ in range(d.target - prov):
                starting += 1
                push(t + cold, 1)
            for _ in range(prov - d.target):  # remove idle replicas first, else the next to finish
                if idle > 0 and ready - to_remove > 1:
                    idle -= 1
                elif ready - to_remove > 1:
                    to_remove += 1
            log.append((t, idle + busy - to_remove, idle + busy + starting - to_remove))
            arrived_win, busy_time_win, lat_win = 0, 0.0, []
            busy_since = {i: max(s, t) for i, s in busy_since.items()}
            if done < len(arr):
                push(t + dt, 3)
        while queue and idle > 0:
            start(t, queue.popleft())
    viol = int(np.count_nonzero(lat > policy.slo_s))
    return SimResult(lat, viol, rep_s, list(policy.decisions), log)
