"""Failure-risk prediction from node telemetry, triggering proactive migration before the predicted failure.

**Predictor** (``RiskPredictor``). Hardware often degrades before it dies: a GPU runs hotter, its memory reports more
corrected (ECC) errors. Per node and signal the predictor keeps an exponentially weighted moving average
e_t = α·x_t + (1 − α)·e_(t−1) (smooths sensor noise), fits a least-squares line to the last ``window`` EWMA
values, and extrapolates ``horizon`` steps ahead: p = e_t + slope·horizon. The risk is max over signals of
p / limit (1 = the limit is predicted to be reached within the horizon). A node is *armed* when the risk rises
above ``on`` and disarmed only when it falls below ``off`` < ``on`` (hysteresis: a signal hovering at the threshold
does not flap, and each arming is one migration). The rising edge triggers a proactive migration.

**Migration** (``migration_bytes``): moving the suspect rank's optimizer/parameter shard to a hot spare moves exactly
its ZeRO slice; shrinking the job to N − 1 ranks re-slices everything (``parallel.reshard.reshard_plan``) and moves
much more. Both are counted in bytes from the plan.

**Evaluation** (``evaluate_migration``) on ``synthetic_fleet`` — a MODEL, not measured telemetry: healthy nodes with
sensor noise and transient heat spikes (a naive threshold's false positives), failing nodes whose temperature and
corrected-error rate ramp up over a few hundred steps before they die. A trigger is a true positive if it comes
``migration_steps`` or more before the node's failure (and not more than ``max_lead`` before). Lost work without
migration: per failure, the work since the last checkpoint plus the restart; with migration: caught failures cost
only the migration, missed ones as before, and every false positive costs a migration.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..parallel.reshard import reshard_plan

__all__ = ["RiskPredictor", "evaluate_migration", "migration_bytes", "synthetic_fleet"]

SIGNALS = ("temp", "ce")


def _int(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
    return int(v)


def _num(name: str, v: Any, lo: float = 0.0, hi: float = math.inf, lo_open: bool = True) -> float:
    ok = isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or (v <= lo if lo_open else v < lo) or v > hi:
        raise ValueError(f"{name}: expected a finite number in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")
    return float(v)


def synthetic_fleet(
    n_nodes: int = 64, n_steps: int = 2000, fail_frac: float = 0.25, seed: int = 0, spikes_per_node: float = 2.0
) -> dict[str, np.ndarray]:
    """MODEL telemetry: ``temp`` (°C) and ``ce`` (corrected errors per step), both (n_nodes, n_steps), and
    ``fail_step`` (−1 = healthy). Healthy: 60 °C ± 1.5 noise, ce ~ Poisson(0.5), ~``spikes_per_node`` transient
    spikes (+32..40 °C for 2–6 steps: above the limit, briefly). Failing: from ``fail_step − ramp`` (ramp 150–400
    steps) the temperature rises linearly by 30 °C and the ce rate geometrically to ~40; after the failure the node
    reports NaN."""
    n, t_n = _int("n_nodes", n_nodes, 1), _int("n_steps", n_steps, 50)
    frac = _num("fail_frac", fail_frac, 0.0, 1.0, lo_open=False)
    rng = np.random.default_rng(_int("seed", seed, 0))
    temp = 60.0 + 1.5 * rng.standard_normal((n, t_n))
    ce_rate = np.full((n, t_n), 0.5)
    for i in range(n):
        for _ in range(rng.poisson(spikes_per_node)):
            s0, ln = int(rng.integers(0, t_n - 10)), int(rng.integers(2, 7))
            temp[i, s0 : s0 + ln] += rng.uniform(32, 40)
    fail = np.full(n, -1)
    n_fail = int(round(frac * n))
    for i in rng.choice(n, size=n_fail, replace=False):
        tf = int(rng.integers(int(0.4 * t_n), t_n))
        ramp = int(rng.integers(150, 401))
        t = np.arange(t_n)
        prog = np.clip((t - (tf - ramp)) / ramp, 0.0, None)
        temp[i] += 30.0 * prog
        ce_rate[i] *= 80.0**prog
        fail[i] = tf
    ce = rng.poisson(ce_rate).astype(np.float64)
    for i in np.flatnonzero(fail >= 0):
        temp[i, fail[i] :] = np.nan
        ce[i, fail[i] :] = np.nan
    return {"temp": temp, "ce": ce, "fail_step": fail}


class RiskPredictor:
    """EWMA + linear-trend extrapolation per node and signal, thresholded with hysteresis (see the module docstring).

    ``update(values)`` takes {signal: (n_nodes,) array} for one step (NaN = no report: the node's state is held)
    and returns the boolean array of nodes that were *just* armed (the migration triggers).
    """

    def __init__(
        self,
        n_nodes: int,
        limits: dict[str, float] | None = None,
        *,
        alpha: float = 0.05,
        window: int = 60,
        horizon: int = 50,
        on: float = 1.0,
        off: float = 0.9,
    ) -> None:
        self.n_nodes = _int("n_nodes", n_nodes, 1)
        self.limits = {"temp": 90.0, "ce": 15.0} if limits is None else dict(limits)
        for k, v in self.limits.items():
            _num(f"limits[{k!r}]", v)
        self.alpha = _num("alpha", alpha, 0.0, 1.0)
        self.window = _int("window", window, 2)
        self.horizon = _int("horizon", horizon, 0)
        self.on = _num("on", on)
        self.off = _num("off", off, 0.0, self.on)
        self._ewma = {k: np.full(self.n_nodes, np.nan) for k in self.limits}
        self._buf = {k: np.full((self.n_nodes, self.window), np.nan) for k in self.limits}
        self._filled = 0
        self.armed = np.zeros(self.n_nodes, dtype=bool)
        self.risk = np.zeros(self.n_nodes)
        x = np.arange(self.window, dtype=np.float64)
        self._xc = (x - x.mean()) / float(((x - x.mean()) ** 2).sum())  # slope = Σ xc·y

    def update(self, values: dict[str, Any]) -> np.ndarray:
        risk = np.zeros(self.n_nodes)
        for k, lim in self.limits.items():
            if k not in values:
                raise ValueError(f"values: expected a value for signal {k!r}, got keys {sorted(values)}")
            v = np.asarray(values[k], dtype=np.float64)
            if v.shape != (self.n_nodes,):
                raise ValueError(f"values[{k!r}]: expected shape ({self.n_nodes},), got {v.shape}")
            e = self._ewma[k]
            seen = ~np.isnan(v)
            e[seen] = np.where(np.isnan(e[seen]), v[seen], self.alpha * v[seen] + (1 - self.alpha) * e[seen])
            buf = self._buf[k]
            buf[:, :-1] = buf[:, 1:]
            buf[:, -1] = e
            if self._filled + 1 >= self.window:
                slope = np.nan_to_num(buf @ self._xc)
            else:
                slope = np.zeros(self.n_nodes)
            pred = e + np.maximum(slope, 0.0) * self.horizon  # only a rising trend raises the risk
            risk = np.maximum(risk, np.nan_to_num(pred / lim))
        self._filled += 1
        self.risk = risk
        was = self.armed.copy()
        self.armed = np.where(was, risk >= self.off, risk >= self.on)
        return self.armed & ~was


def evaluate_migration(
    fleet: dict[str, np.ndarray],
    predictor: RiskPredictor,
    *,
    ckpt_interval: int = 200,
    restart_steps: int = 20,
    migration_steps: int = 30,
    max_lead: int = 500,
) -> dict[str, Any]:
    """Replay the MODEL ``fleet`` through ``predictor``; score triggers and lost work (in steps of the whole job).

    Returns ``precision``, ``recall``, ``tp``, ``fp``, ``missed``, ``lead`` (steps from trigger to failure, per
    caught node), ``lost_without`` / ``lost_with`` (lost steps without / with proactive migration).
    """
    fail = np.asarray(fleet["fail_step"])
    ci, rs = _int("ckpt_interval", ckpt_interval, 1), _int("restart_steps", restart_steps, 0)
    ms, lead_max = _int("migration_steps", migration_steps, 0), _int("max_lead", max_lead, 1)
    n, t_n = fleet["temp"].shape
    if predictor.n_nodes != n:
        raise ValueError(f"predictor: expected n_nodes={n}, got {predictor.n_nodes}")
    triggers: list[tuple[int, int]] = []
    for t in range(t_n):
        for i in np.flatnonzero(predictor.update({k: fleet[k][:, t] for k in predictor.limits})):
            triggers.append((int(i), t))
    caught: dict[int, int] = {}
    tp = fp = 0
    for i, t in triggers:
        tf = fail[i]
        if tf >= 0 and tf - lead_max <= t <= tf - ms:
            tp += 1
            caught.setdefault(i, tf - t)
        elif tf >= 0 and t > tf - ms:
            continue  # too late to migrate: a miss, not a false alarm
        else:
            fp += 1
    failing = np.flatnonzero(fail >= 0)
    lost_fail = {int(i): int(fail[i]) % ci + rs for i in failing}
    lost_without = float(sum(lost_fail.values()))
    lost_with = float(sum(ms if i in caught else lost_fail[i] for i in lost_fail) + fp * ms)
    return {
        "precision": tp / (tp + fp) if tp + fp else 1.0,
        "recall": len(caught) / len(failing) if len(failing) else 1.0,
        "tp": tp,
        "fp": fp,
        "missed": [int(i) for i in failing if i not in caught],
        "lead": list(caught.values()),
        "lost_without": lost_without,
        "lost_with": lost_with,
        "triggers": triggers,
    }


def migration_bytes(numel: int, world_size: int, suspect_rank: int, itemsize: int = 4, mode: str = "spare") -> int:
    """Bytes moved to evacuate ``suspect_rank`` from a ZeRO-flat state of ``numel`` elements over ``world_size`` ranks.

    ``mode="spare"``: a hot spare takes the suspect's rank: only its slice moves (``reshard_plan(numel, N, N)`` is
    the identity; its transfers from the suspect). ``mode="shrink"``: the job continues on the N − 1 other nodes
    (``reshard_plan(numel, N, N − 1)``, new rank j on the j-th surviving node): every transfer between different
    nodes moves."""
    n = _int("world_size", world_size, 1)
    r = _int("suspect_rank", suspect_rank, 0)
    if r >= n:
        raise ValueError(f"suspect_rank: expected < world_size={n}, got {suspect_rank!r}")
    size = _int("itemsize", itemsize, 1)
    if mode == "spare":
        return sum(tr.length for tr in reshard_plan(numel, n, n) if tr.src_rank == r) * size
    if mode == "shrink":
        if n < 2:
            raise ValueError(f"world_size: shrinking needs >= 2 ranks, got {world_size!r}")
        nodes = [q for q in range(n) if q != r]
        return sum(tr.length for tr in reshard_plan(numel, n, n - 1) if tr.src_rank != nodes[tr.dst_rank]) * size
    raise ValueError(f"mode: expected 'spare' or 'shrink', got {mode!r}")
