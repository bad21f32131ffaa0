"""Online per-kernel power prediction, a DVFS choice from it, and spike pre-throttling [Q131, Q165, Q246].

**Features are real, the power is a MODEL.** ``profile_kernels`` runs tinylearn ops (GEMMs, elementwise ops,
reductions, a convolution; float32 and float64; 1 and 2 threads) under ``tinylearn.profiler.profile`` on this CPU,
and ``kernel_features`` turns each recorded event into the features a GPU power model reads from counters
(instruction-class mix and activity, memory activity, arithmetic intensity, active cores, vector width):

    gemm_act / vector_act / reduce_act   achieved FLOP/s over its class's peak in the sample, put in the op's class
                                         (FMA-heavy GEMM/conv, elementwise vector ALU, reductions/transcendentals)
    mem_act                              achieved bytes/s over the sample's peak (the profiler's byte model)
    log_intensity                        log10(1 + FLOP/byte) / 3
    active_cores                         threads the op could use / cores of this VM (the "active SMs" analogue)
    vector_lanes                         SIMD lanes of a 256-bit register at the op's dtype / 8

This VM has no power sensor (no RAPL, no nvidia-smi), so the "measured" power is ``PowerPlant``, a MODEL: the
device_model board power ``P(f, u) = idle + (tdp - idle) u (f/f_max)^3`` at a utilisation ``u`` that is a linear
mix of the features (the counter-based power models of Isci & Martonosi 2003 and Hong & Kim, ISCA 2010: power =
static + sum over units of access rate x energy per access) plus Gaussian noise of a stated sigma. ``drifted``
changes the mix mid-stream (a hotter, leakier chip; a new memory clock).

Predictors, all updated online with every new "measurement" (the prediction error is backfilled into the model):
``RLSPowerModel`` recursive least squares with forgetting factor lambda (gain k = P x / (lambda + x' P x),
theta += k e, P = (P - k x' P) / lambda; effective memory 1 / (1 - lambda) samples), ``BatchLSPowerModel`` a least
squares refit on the whole history (it averages the two regimes after a drift), ``KernelMeanPowerModel`` the mean
power per kernel name (blind to shapes and threads). [Q131] ``dvfs_clock``: the highest clock on the ladder whose
predicted power fits a cap. [Q165] ``spike_utilisation`` (MODEL pipeline whose attention+GEMM phase spikes once a
period) and ``throttle_run``: each step's clock is chosen from a prediction of that step's power at f_max -- the
last value (reactive throttling: it throttles the step *after* a spike) or ``tinylearn.tune.ar_predict``'s
ARX / LSTM predictors (pre-throttling: the clock drops on the spike step itself).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .._inputs import is_int
from .._threads import cores, limited_threads
from .device_model import A100, DeviceSpec

FEATURES = ("bias", "gemm_act", "vector_act", "reduce_act", "mem_act", "log_intensity", "active_cores",
            "vector_lanes")  # fmt: skip
# MODEL plant coefficients (utilisation contributed per unit of each feature); DRIFT is the changed regime.
PLANT_COEF = (0.05, 0.40, 0.25, 0.20, 0.20, 0.05, 0.10, 0.05)
DRIFT_COEF = (0.10, 0.55, 0.35, 0.30, 0.40, 0.05, 0.10, 0.05)
_GEMM = ("matmul", "linear", "conv", "gemm", "bmm")
_REDUCE = ("softmax", "norm", "sum", "mean", "entropy", "max", "var")


@dataclass
class KernelSample:
    """One profiled op: its name, class, real features (FEATURES order) and its measured self time."""

    name: str
    cls: str
    x: np.ndarray
    self_s: float


def _op_class(name: str, flops: int) -> str:
    low = name.lower()
    if any(k in low for k in _GEMM):
        return "gemm"
    if any(k in low for k in _REDUCE):
        return "reduce"
    return "vector" if flops > 0 else "move"


def profile_kernels(sizes: Sequence[int] = (32, 64, 128), repeat: int = 2, seed: int = 0) -> list:
    """Run tinylearn ops (matmul+GELU+softmax+layer_norm+add+sum forward/backward, conv2d) at each size, float32 and
    float64, 1 and 2 threads, under ``tinylearn.profiler.profile``; returns the recorded events (one warm-up pass
    first). Each event's ``extra["threads"]`` is the thread cap it ran under. Real measurements of this CPU."""
    from ..autograd import Tensor
    from ..nn import functional as fn
    from ..profiler import profile

    if not sizes or not all(is_int(n) and 8 <= n <= 512 for n in sizes):
        raise ValueError(f"sizes: expected ints in [8, 512], got {sizes!r}")
    if not is_int(repeat) or repeat < 1:
        raise ValueError(f"repeat: expected an int >= 1, got {repeat!r}")
    rng = np.random.default_rng(seed)

    def block(n: int, dt: type) -> None:
        x = Tensor(rng.standard_normal((n, n)).astype(dt), requires_grad=True)
        w = Tensor(rng.standard_normal((n, n)).astype(dt), requires_grad=True)
        z = fn.layer_norm(fn.softmax(fn.gelu(x @ w), dim=-1), (n,))
        ((z + x).sum()).backward()
        img = Tensor(rng.standard_normal((2, 3, max(n // 4, 4), max(n // 4, 4))).astype(dt))
        fn.conv2d(img, Tensor(rng.standard_normal((4, 3, 3, 3)).astype(dt)))

    events = []
    for threads in (1, min(2, cores())):
        with limited_threads(threads):
            for dt in (np.float32, np.float64):
                block(sizes[0], dt)  # warm-up: first-call costs stay out of the sample
                with profile() as p:
                    for _ in range(repeat):
                        for n in sizes:
                            block(int(n), dt)
                for e in p.events():
                    e.extra["threads"] = threads
                    events.append(e)
    return events


def kernel_features(events: Sequence) -> list[KernelSample]:
    """Profiler events -> ``KernelSample``s (FEATURES; see the module docstring). Events without a FLOP/byte
    count or with zero self time are skipped; activities are normalised by the 95th-percentile rate of the op's
    class (of all ops for bytes)."""
    keep = [e for e in events if e.flops is not None and e.bytes and e.self_ns > 0]
    if not keep:
        raise ValueError(f"events: none of the {len(events)} events has FLOPs, bytes and self time")
    gf = np.array([e.flops / e.self_ns for e in keep])
    gb = np.array([e.bytes / e.self_ns for e in keep])
    classes = [_op_class(e.name, e.flops) for e in keep]
    peak = {c: max(float(np.percentile(gf[[k == c for k in classes]], 95)), 1e-9) for c in set(classes)}
    peak_b = max(float(np.percentile(gb, 95)), 1e-9)
    out = []
    for e, f, b, cls in zip(keep, gf, gb, classes):
        act = min(1.0, f / peak[cls])
        item = np.dtype(e.dtypes[0]).itemsize if e.dtypes else 4
        x = np.array([1.0, act * (cls == "gemm"), act * (cls == "vector"), act * (cls == "reduce"),
                      min(1.0, b / peak_b), math.log10(1.0 + e.flops / e.bytes) / 3.0,
                      e.extra.get("threads", 1) / cores(), (32 // item) / 8.0])  # fmt: skip
        out.append(KernelSample(e.name, cls, x, e.self_ns * 1e-9))
    return out


@dataclass
class PowerPlant:
    """MODEL "measured" power: ``spec.power_w(f, clip(coef . x, 0, 1)) + N(0, noise_w)`` (no sensor on this VM)."""

    spec: DeviceSpec = A100
    coef: Sequence[float] = PLANT_COEF
    noise_w: float = 3.0

    def __post_init__(self) -> None:
        if len(self.coef) != len(FEATURES):
            raise ValueError(f"coef: expected {len(FEATURES)} coefficients ({FEATURES}), got {len(self.coef)}")
        if not self.noise_w >= 0:
            raise ValueError(f"noise_w: expected >= 0, got {self.noise_w!r}")

    def util(self, x: np.ndarray) -> float:
        return float(np.clip(np.dot(self.coef, x), 0.0, 1.0))

    def power(self, x: np.ndarray, rng: np.random.Generator, f_mhz: float | None = None) -> float:
        f = self.spec.f_max_mhz if f_mhz is None else f_mhz
        return self.spec.power_w(f, self.util(x)) + float(rng.normal(0.0, self.noise_w))

    def drifted(self, coef: Sequence[float] = DRIFT_COEF) -> PowerPlant:
        return PowerPlant(self.spec, coef, self.noise_w)


class RLSPowerModel:
    """Recursive least squares with exponential forgetting (see the module docstring); ``update`` returns the a
    priori error (measured - predicted) and records it in ``errors`` before folding the measurement in."""

    name = "RLS"

    def __init__(self, n_features: int, forgetting: float = 0.99, delta: float = 1e4) -> None:
        if not is_int(n_features) or n_features < 1:
            raise ValueError(f"n_features: expected an int >= 1, got {n_features!r}")
        if not 0.5 < forgetting <= 1.0:
            raise ValueError(f"forgetting: expected a factor in (0.5, 1], got {forgetting!r}")
        if not delta > 0:
            raise ValueError(f"delta: expected > 0, got {delta!r}")
        self.n, self.lam = int(n_features), float(forgetting)
        self.theta = np.zeros(self.n)
        self.P = np.eye(self.n) * float(delta)
        self.errors: list[float] = []

    def _x(self, x: Sequence[float]) -> np.ndarray:
        v = np.asarray(x, dtype=np.float64).ravel()
        if v.shape != (self.n,) or not np.isfinite(v).all():
            raise ValueError(f"x: expected {self.n} finite features, got {np.asarray(x).ravel()[:8]!r}")
        return v

    def predict(self, x: Sequence[float], name: str = "") -> float:
        return float(self.theta @ self._x(x))

    def update(self, x: Sequence[float], y: float, name: str = "") -> float:
        v = self._x(x)
        if not math.isfinite(y):
            raise ValueError(f"y: expected a finite measurement, got {y!r}")
        e = float(y - self.theta @ v)
        px = self.P @ v
        k = px / (self.lam + v @ px)
        self.theta = self.theta + k * e
        self.P = (self.P - np.outer(k, px)) / self.lam
        self.P = 0.5 * (self.P + self.P.T)
        self.errors.append(e)
        return e


class BatchLSPowerModel(RLSPowerModel):
    """Least squares refit on the whole history every ``refit_every`` samples (no forgetting)."""

    name = "batch LS"

    def __init__(self, n_features: int, refit_every: int = 1) -> None:
        super().__init__(n_features, 1.0)
        if not is_int(refit_every) or refit_every < 1:
            raise ValueError(f"refit_every: expected an int >= 1, got {refit_every!r}")
        self.every, self.X, self.y = int(refit_every), [], []

    def update(self, x: Sequence[float], y: float, name: str = "") -> float:
        v = self._x(x)
        e = float(y - self.theta @ v)
        self.X.append(v)
        self.y.append(float(y))
        if len(self.y) % self.every == 0:
            self.theta = np.linalg.lstsq(np.array(self.X), np.array(self.y), rcond=None)[0]
        self.errors.append(e)
        return e


class KernelMeanPowerModel:
    """The mean measured power per kernel name (the global mean for a name not seen yet)."""

    name = "per-kernel mean"

    def __init__(self) -> None:
        self.sums: dict[str, list[float]] = {}
        self.total, self.count = 0.0, 0
        self.errors: list[float] = []

    def predict(self, x: Sequence[float], name: str = "") -> float:
        s = self.sums.get(name)
        if s:
            return s[0] / s[1]
        return self.total / self.count if self.count else 0.0

    def update(self, x: Sequence[float], y: float, name: str = "") -> float:
        e = float(y - self.predict(x, name))
        s = self.sums.setdefault(name, [0.0, 0])
        s[0], s[1] = s[0] + y, s[1] + 1
        self.total, self.count = self.total + y, self.count + 1
        self.errors.append(e)
        return e


@dataclass
class OnlineRun:
    """``online_stream``'s result: per model name, the a priori absolute errors (W, MODEL target) per sample."""

    abs_errors: dict[str, np.ndarray]
    drift_at: int
    y: np.ndarray
    names: list[str] = field(default_factory=list)

    def mae(self, model: str, lo: int, hi: int) -> float:
        return float(np.mean(self.abs_errors[model][lo:hi]))


def online_stream(samples: Sequence[KernelSample], n: int = 600, drift_at: int | None = 300, seed: int = 0,
                  plant: PowerPlant | None = None, forgetting: float = 0.98) -> OnlineRun:  # fmt: skip
    """Replay ``n`` kernels drawn (seeded) from the profiled ``samples``; the MODEL plant gives each one's power
    (its coefficients change to ``DRIFT_COEF`` at ``drift_at``); RLS, batch LS and the per-kernel mean predict each
    sample first, then learn from it."""
    if not samples:
        raise ValueError("samples: expected at least one KernelSample, got none")
    if not is_int(n) or n < 2:
        raise ValueError(f"n: expected an int >= 2, got {n!r}")
    if drift_at is not None and not (is_int(drift_at) and 0 <= drift_at < n):
        raise ValueError(f"drift_at: expected None or an int in [0, {n}), got {drift_at!r}")
    rng = np.random.default_rng(seed)
    plant = plant or PowerPlant()
    after = plant.drifted()
    models = [RLSPowerModel(len(FEATURES), forgetting), BatchLSPowerModel(len(FEATURES)), KernelMeanPowerModel()]
    ys, names = [], []
    for t, i in enumerate(rng.integers(0, len(samples), n)):
        s = samples[i]
        y = (after if drift_at is not None and t >= drift_at else plant).power(s.x, rng)
        for m in models:
            m.update(s.x, y, s.name)
        ys.append(y)
        names.append(s.name)
    errs = {m.name: np.abs(np.array(m.errors)) for m in models}
    return OnlineRun(errs, n if drift_at is None else drift_at, np.array(ys), names)


# ------------------------------------------------------------------------------------------------ DVFS [Q131]
def dvfs_clock(predicted_w: float, spec: DeviceSpec, cap_w: float) -> float:
    """[Q131] The highest clock of ``spec``'s ladder at which a kernel predicted to draw ``predicted_w`` at f_max
    fits ``cap_w`` (power_w's (f/f_max)^3 scaling of the dynamic part); f_min when none fits (MODEL)."""
    if not math.isfinite(predicted_w):
        raise ValueError(f"predicted_w: expected a finite power, got {predicted_w!r}")
    if not cap_w > spec.idle_w:
        raise ValueError(f"cap_w: expected a cap above the idle power {spec.idle_w} W, got {cap_w!r}")
    u = float(np.clip((predicted_w - spec.idle_w) / (spec.tdp_w - spec.idle_w), 0.0, 1.0))
    fits = [f for f in spec.freqs() if spec.power_w(f, u) <= cap_w]
    return fits[-1] if fits else spec.f_min_mhz


# ------------------------------------------------------------------------------------------- spikes [Q165]
def spike_utilisation(n_steps: int = 240, period: int = 8, spike_at: int = 5, base: float = 0.5, spike: float = 1.0,
                      noise: float = 0.02, seed: int = 0) -> np.ndarray:  # fmt: skip
    """MODEL pipeline: per-step utilisation at f_max; step ``spike_at`` of every ``period`` is the attention+GEMM
    phase (``spike``), the others ``base`` with a gentle ramp, plus N(0, noise); clipped to [0.05, 1]."""
    if not is_int(period) or period < 2 or not is_int(spike_at) or not 0 <= spike_at < period:
        raise ValueError(f"period/spike_at: expected period >= 2 and 0 <= spike_at < period, got {period!r}, "
                         f"{spike_at!r}")  # fmt: skip
    if not is_int(n_steps) or n_steps < 2 * period:
        raise ValueError(f"n_steps: expected an int >= 2 * period = {2 * period}, got {n_steps!r}")
    rng = np.random.default_rng(seed)
    phase = np.arange(n_steps) % period
    u = base + 0.1 * phase / period
    u = np.where(phase == spike_at, spike, u) + rng.normal(0.0, noise, n_steps)
    return np.clip(u, 0.05, 1.0)


@dataclass
class ThrottleRun:
    """One controller on the spike pipeline (MODEL): per-step clock, power and time; summary numbers."""

    name: str
    f_mhz: np.ndarray
    power_w: np.ndarray
    step_s: np.ndarray
    over_cap_steps: int
    peak_w: float
    time_lost_s: float


def throttle_run(util: np.ndarray, spec: DeviceSpec, cap_w: float, predict: Callable[[np.ndarray], float] | None,
                 name: str, start: int = 0, flops: float = 2e12, nbytes: float = 3e8) -> ThrottleRun:  # fmt: skip
    """Run the MODEL pipeline from step ``start``: before each step, ``predict(history of f_max-equivalent power)``
    gives that step's power at f_max and ``dvfs_clock`` the clock (``predict=None``: always f_max). The power of a
    throttled step is mapped back to its f_max equivalent through the model before it joins the history. Step time
    is the roofline time of ``flops * (0.5 + u)`` FLOPs and ``nbytes`` bytes at the chosen clock."""
    util = np.asarray(util, dtype=np.float64)
    if not 0 <= start < len(util):
        raise ValueError(f"start: expected an int in [0, {len(util)}), got {start!r}")
    hist = [spec.power_w(spec.f_max_mhz, float(u)) for u in util[:start]]
    fs, ps, ts, lost = [], [], [], 0.0
    for u in util[start:]:
        f = spec.f_max_mhz if predict is None or not hist else dvfs_clock(predict(np.array(hist)), spec, cap_w)
        p = spec.power_w(f, float(u))
        fs.append(f)
        ps.append(p)
        ts.append(spec.step_time_s(flops * (0.5 + u), nbytes, f))
        lost += ts[-1] - spec.step_time_s(flops * (0.5 + u), nbytes)
        scale = (spec.f_max_mhz / f) ** 3
        hist.append(spec.idle_w + (p - spec.idle_w) * scale)
    ps_a = np.array(ps)
    return ThrottleRun(name, np.array(fs), ps_a, np.array(ts), int((ps_a > cap_w + 1e-9).sum()), float(ps_a.max()),
                       float(lost))  # fmt: skip
