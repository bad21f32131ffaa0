"""Failures of N nodes, and how often to checkpoint: MTBF, survival probability, Young/Daly, expected completion.

**N nodes.** If each node fails independently with exponential lifetimes of mean M (its MTBF, rate 1/M), the first
failure among N nodes is the minimum of N exponentials: exponential with rate N/M, so

    MTBF_cluster = M / N          P(no failure during T) = exp(-N·T / M).

10 000 GPUs whose MTBF is 5 years (MODEL numbers) fail once every ~4.4 h; a 24 h job sees ~5.5 failures and runs
through without one with probability e^-5.5 ≈ 0.4 %. Checkpoint/restart is therefore part of the step, not an option.

**Expected completion time** (exponential failures, rate λ = 1/M_cluster). A segment of L = τ + δ seconds (τ of
work, then a δ-second checkpoint) either finishes (probability e^(-λL)) or fails at t < L, costing t plus a restart
of R seconds, after which it is tried again. With E the expected time of the segment:

    E = e^(-λL)·L + ∫₀ᴸ λe^(-λt)(t + R) dt + (1 − e^(-λL))·E   ⇒   E = (M + R)·(e^(L/M) − 1).

A job of W seconds of work in segments of τ costs Σ over its segments (the last one shorter): the function
``expected_completion_time``. (Daly 2006 lets the restart itself fail and gets M·e^(R/M) in place of M + R; the
factor does not depend on τ, so both give the same optimum.) Minimising (e^((τ+δ)/M) − 1)/τ, the cost per second
of work, gives e^((τ+δ)/M)·(τ/M − 1) + 1 = 0: ``optimal_interval`` solves it exactly (its root lies in (0, M)).

**Approximations.** Expanding e^x to second order gives Young's (1974) τ = sqrt(2δM) (reused from
``tinylearn.parallel.checkpoint_interval.young_daly_interval``, which writes it as sqrt(2C/λ)); Daly's (2006)
higher-order expansion is

    τ = sqrt(2δM)·[1 + ⅓·sqrt(δ/(2M)) + ⅑·(δ/(2M))] − δ   for δ < 2M,   τ = M otherwise,

within a fraction of a percent of the exact optimum while Young's overshoots as δ/M grows (``daly_interval``).

**Check on real timing** (``measure_checkpoint_cost`` + ``monte_carlo_waste``): δ is measured by writing a real
state (e.g. 32 MiB) with ``atomic_write`` (tmp + fsync + rename + fsync dir); the failure times are a MODEL (a
Poisson process, ``parallel.checkpoint_interval.failure_trace``) replayed by ``simulate_checkpointing``; the
interval with the least simulated waste lands near Young/Daly's.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..bench import Timing, measure
from ..parallel.checkpoint_interval import failure_trace, simulate_checkpointing, waste_rate, young_daly_interval
from .atomic import atomic_write

__all__ = [
    "cluster_mtbf",
    "daly_interval",
    "expected_completion_time",
    "expected_failures",
    "measure_checkpoint_cost",
    "monte_carlo_waste",
    "optimal_interval",
    "p_no_failure",
    "young_interval",
    "waste_rate",
]


def _pos(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating) or not math.isfinite(v):
        raise ValueError(f"{name}: expected a finite number > 0, got {v!r}")
    if v <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {v!r}")
    return float(v)


def _nonneg(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating) or not math.isfinite(v):
        raise ValueError(f"{name}: expected a finite number >= 0, got {v!r}")
    if v < 0:
        raise ValueError(f"{name}: expected a number >= 0, got {v!r}")
    return float(v)


def _nodes(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"n_nodes: expected an integer >= 1, got {v!r}")
    return int(v)


def cluster_mtbf(node_mtbf_s: float, n_nodes: int) -> float:
    """MTBF of the first failure among ``n_nodes`` independent exponential nodes: M / N."""
    return _pos("node_mtbf_s", node_mtbf_s) / _nodes(n_nodes)


def p_no_failure(duration_s: float, n_nodes: int, node_mtbf_s: float) -> float:
    """Probability that none of ``n_nodes`` fails during ``duration_s``: exp(-N·T/M)."""
    t = _nonneg("duration_s", duration_s)
    return math.exp(-_nodes(n_nodes) * t / _pos("node_mtbf_s", node_mtbf_s))


def expected_failures(duration_s: float, n_nodes: int, node_mtbf_s: float) -> float:
    """Expected number of failures of ``n_nodes`` nodes in ``duration_s`` (failed nodes replaced): N·T/M."""
    return _nonneg("duration_s", duration_s) * _nodes(n_nodes) / _pos("node_mtbf_s", node_mtbf_s)


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's first-order interval sqrt(2·δ·M) (``young_daly_interval`` with λ = 1/M)."""
    return young_daly_interval(1.0 / _pos("mtbf_s", mtbf_s), _pos("checkpoint_s", checkpoint_s))


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order interval: sqrt(2δM)·[1 + ⅓·sqrt(δ/2M) + ⅑·δ/2M] − δ for δ < 2M, else M."""
    d, m = _pos("checkpoint_s", checkpoint_s), _pos("mtbf_s", mtbf_s)
    if d >= 2 * m:
        return m
    r = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(r) / 3 + r / 9) - d


def optimal_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """The exact minimiser of the expected completion time per second of work, (e^((τ+δ)/M) − 1)/τ: the root of
    e^(x + δ/M)·(x − 1) + 1 = 0 in x = τ/M ∈ (0, 1) (increasing in x, so bisection is exact to float precision)."""
    d, m = _pos("checkpoint_s", checkpoint_s), _pos("mtbf_s", mtbf_s)
    dm = d / m
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if math.exp(mid + dm) * (mid - 1) + 1 < 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return 0.5 * (lo + hi) * m


def expected_completion_time(
    work_s: float, interval_s: float, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0
) -> float:
    """Expected wall time of ``work_s`` seconds of work checkpointed every ``interval_s`` (each segment followed by a
    ``checkpoint_s`` write; the last segment is shorter), failures exponential with mean ``mtbf_s`` (the cluster's),
    each costing the lost segment plus ``restart_s``: Σ_segments (M + R)·(e^((τᵢ + δ)/M) − 1)."""
    w, tau = _pos("work_s", work_s), _pos("interval_s", interval_s)
    d, m, r = _pos("checkpoint_s", checkpoint_s), _pos("mtbf_s", mtbf_s), _nonneg("restart_s", restart_s)
    n_full = math.floor(w / tau * (1 + 1e-12))
    rest = w - n_full * tau
    total = n_full * math.expm1((tau + d) / m)
    if rest > 1e-12 * tau:
        total += math.expm1((rest + d) / m)
    return (m + r) * total


def measure_checkpoint_cost(
    nbytes: int = 32 << 20, directory: str | os.PathLike[str] | None = None, repeat: int = 5
) -> Timing:
    """Time a real checkpoint write: ``nbytes`` of state written with ``atomic_write`` (tmp file, fsync, rename,
    fsync of the directory) into ``directory`` (a fresh temporary directory by default). Returns the
    ``tinylearn.bench.Timing`` (use ``.median`` as δ)."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int | np.integer) or nbytes < 1:
        raise ValueError(f"nbytes: expected an integer >= 1, got {nbytes!r}")
    state = np.random.default_rng(0).integers(0, 256, size=int(nbytes), dtype=np.uint8)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = os.path.join(tmp, "state.bin")
        return measure(lambda: atomic_write(path, memoryview(state)), warmup=1, repeat=repeat, warmup_s=0.0)


def monte_carlo_waste(
    intervals_s: Sequence[float],
    checkpoint_s: float,
    mtbf_s: float,
    work_s: float,
    *,
    n_traces: int = 32,
    restart_s: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """Mean wasted fraction of wall time ((wall − work)/wall) for each interval, over ``n_traces`` MODEL failure
    traces (Poisson, mean gap ``mtbf_s``; the same traces for every interval: common random numbers, so the curve is
    smooth and its argmin meaningful), each replayed by ``simulate_checkpointing``."""
    d, m, w, r = _pos("checkpoint_s", checkpoint_s), _pos("mtbf_s", mtbf_s), _pos("work_s", work_s), restart_s
    if isinstance(n_traces, bool) or not isinstance(n_traces, int) or n_traces < 1:
        raise ValueError(f"n_traces: expected an integer >= 1, got {n_traces!r}")
    ivs = [_pos("intervals_s", i) for i in intervals_s]
    if not ivs:
        raise ValueError("intervals_s: expected at least one interval, got none")
    # horizon: long enough that the trace never runs out before the slowest run ends (bounded by 100x the work)
    worst = max(expected_completion_time(w, i, d, m, _nonneg("restart_s", r)) for i in ivs)
    horizon = min(100 * w, 5 * worst + 20 * m)
    traces = [failure_trace([(horizon, 1.0 / m)], seed=seed + k) for k in range(n_traces)]
    out = np.empty(len(ivs))
    for j, i in enumerate(ivs):
        out[j] = float(np.mean([simulate_checkpointing(i, tr, d, w, r)["waste"] for tr in traces]))
    return out
