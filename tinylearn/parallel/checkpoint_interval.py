"""Checkpoint interval from the recent failure rate: Young/Daly, and an online gradient-descent tuner.

A job checkpoints every I seconds of work; writing a checkpoint costs C seconds; failures arrive at rate λ (per
second of wall time). Per second of wall time the job wastes (first order in λ·I, Young 1974)

    W(I) = C / I + λ · I / 2          checkpoint overhead + work lost per failure (I/2 on average) × failure rate

(the same quantity per *interval*, times I: C + λ·I²/2, is the question's E written with C/I in place of C — as
printed, E = λ·I²/2 + C/I mixes units and has its minimum at (C/λ)^(1/3), not at Young's point). dW/dI = 0 gives

    I* = sqrt(2 C / λ)   (Young/Daly)       and   W(I*) = sqrt(2 C λ).

``CheckpointTuner`` learns I online: it estimates λ from the failures it observes (counts and exposure time, both
decayed with a half-life, so a node that becomes flaky is noticed) and takes one normalised gradient step on
log I per observation: log I -= lr · (dW/dlog I) / W = lr · (λI/2 − C/I) / (λI/2 + C/I). With x = I/I* the step
is log x -= lr · tanh(log x): a contraction for 0 < lr < 2 (the error shrinks by |1 − lr| per step near I*).
``simulate_checkpointing`` replays a failure trace (``failure_trace``: a Poisson process with piecewise-constant
rate) against a fixed interval or a tuner and measures the wasted fraction of wall time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any


def _pos(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name}: expected a finite number > 0, got {v!r}")
    return float(v)


def waste_rate(interval_s: float, failure_rate: float, checkpoint_s: float) -> float:
    """Wasted fraction of wall time W(I) = C/I + λ·I/2 (first-order model; see the module docstring)."""
    i, lam, c = _pos("interval_s", interval_s), _pos("failure_rate", failure_rate), _pos("checkpoint_s", checkpoint_s)
    return c / i + lam * i / 2


def young_daly_interval(failure_rate: float, checkpoint_s: float) -> float:
    """The interval that minimises ``waste_rate``: I* = sqrt(2 C / λ)."""
    lam, c = _pos("failure_rate", failure_rate), _pos("checkpoint_s", checkpoint_s)
    return math.sqrt(2 * c / lam)


class CheckpointTuner:
    """Online checkpoint interval: λ estimated from observed failures, I moved by gradient steps on W(I).

    ``initial_rate`` is the prior guess of λ, worth ``prior_s`` seconds of observation (it decays like the data);
    ``half_life_s`` sets how fast old observations are forgotten; ``lr`` the step on log I; I is kept within
    [``min_s``, ``max_s``].
    """

    def __init__(
        self,
        checkpoint_s: float,
        initial_interval_s: float,
        *,
        initial_rate: float,
        prior_s: float,
        half_life_s: float,
        lr: float = 0.5,
        min_s: float = 1.0,
        max_s: float = 1e9,
    ) -> None:
        self.checkpoint_s = _pos("checkpoint_s", checkpoint_s)
        self.interval_s = _pos("initial_interval_s", initial_interval_s)
        rate, self._exposure = _pos("initial_rate", initial_rate), _pos("prior_s", prior_s)
        self._failures = rate * self._exposure
        self.half_life_s = _pos("half_life_s", half_life_s)
        if not 0 < _pos("lr", lr) < 2:
            raise ValueError(f"lr: expected 0 < lr < 2 (a contraction), got {lr!r}")
        self.lr = float(lr)
        self.min_s, self.max_s = _pos("min_s", min_s), _pos("max_s", max_s)
        if not self.min_s <= self.interval_s <= self.max_s:
            raise ValueError(f"initial_interval_s: expected within [min_s, max_s], got {initial_interval_s!r}")

    @property
    def failure_rate(self) -> float:
        """The current estimate of λ: decayed failure count / decayed exposure time."""
        return self._failures / self._exposure

    def update(self, failure_rate: float | None = None) -> float:
        """One gradient step on log I toward the minimum of W for ``failure_rate`` (default: the estimate)."""
        lam = self.failure_rate if failure_rate is None else _pos("failure_rate", failure_rate)
        if lam <= 0:  # no failure seen and a zero prior: checkpoint as rarely as allowed
            self.interval_s = self.max_s
            return self.interval_s
        i, c = self.interval_s, self.checkpoint_s
        g = (lam * i / 2 - c / i) / (lam * i / 2 + c / i)  # dW/dlog I, normalised by W: in (-1, 1)
        self.interval_s = min(self.max_s, max(self.min_s, i * math.exp(-self.lr * g)))
        return self.interval_s

    def observe(self, elapsed_s: float, failures: int) -> float:
        """Record ``failures`` in ``elapsed_s`` seconds of wall time, re-estimate λ, step I; returns the new I."""
        dt = _pos("elapsed_s", elapsed_s)
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0:
            raise ValueError(f"failures: expected an int >= 0, got {failures!r}")
        decay = 0.5 ** (dt / self.half_life_s)
        self._failures = self._failures * decay + failures
        self._exposure = self._exposure * decay + dt
        return self.update()


def failure_trace(rates: Sequence[tuple[float, float]], seed: int = 0) -> list[float]:
    """Failure times of a Poisson process whose rate is ``rate`` until ``until_s`` for each (until_s, rate) in
    ``rates`` (increasing until_s); the process stops at the last until_s. Deterministic for a seed."""
    if not rates:
        raise ValueError(f"rates: expected at least one (until_s, rate) pair, got {rates!r}")
    rng, out, t0 = random.Random(seed), [], 0.0
    for until, rate in rates:
        if not until > t0:
            raise ValueError(f"rates: until_s must increase, got {list(rates)!r}")
        _pos("rate", rate)
        t = t0
        while True:
            t += rng.expovariate(rate)
            if t >= until:
                break
            out.append(t)
        t0 = float(until)
    return out


def simulate_checkpointing(
    interval: float | CheckpointTuner | Any,
    failures_s: Sequence[float],
    checkpoint_s: float,
    work_s: float,
    restart_s: float = 0.0,
) -> dict[str, Any]:
    """Run ``work_s`` seconds of useful work: segments of I seconds, each followed by a C-second checkpoint; a
    failure (times ``failures_s``) loses the segment in progress (and its checkpoint) and costs ``restart_s``.

    ``interval``: a fixed I, a ``CheckpointTuner`` (it observes every completed or failed segment), or a callable
    ``t -> I`` (an oracle that knows the true rate). Returns ``wall_s``, ``waste`` ((wall − work)/wall),
    ``n_failures``, and ``history`` [(t, I, λ estimate or None)] at every segment start.
    """
    c, work = _pos("checkpoint_s", checkpoint_s), _pos("work_s", work_s)
    if isinstance(restart_s, bool) or not isinstance(restart_s, int | float) or not restart_s >= 0:
        raise ValueError(f"restart_s: expected a number >= 0, got {restart_s!r}")
    if isinstance(interval, CheckpointTuner):
        tuner, fixed = interval, None
    elif callable(interval):
        tuner, fixed = None, None
    else:
        tuner, fixed = None, _pos("interval", interval)
    fails = sorted(float(f) for f in failures_s)
    t, done, k, n_fail, history = 0.0, 0.0, 0, 0, []
    while done < work:
        i = tuner.interval_s if tuner else (fixed if fixed is not None else float(interval(t)))
        history.append((t, i, tuner.failure_rate if tuner else None))
        seg = min(i, work - done)
        while k < len(fails) and fails[k] < t:  # failures during a restart are absorbed by it
            k += 1
        if k < len(fails) and fails[k] < t + seg + c:
            f = fails[k]
            k += 1
            n_fail += 1
            if tuner:
                tuner.observe(max(f - t, 1e-9), 1)
            t = f + restart_s
        else:
            t += seg + c
            done += seg
            if tuner:
                tuner.observe(seg + c, 0)
    return {"wall_s": t, "waste": (t - work) / t, "n_failures": n_fail, "history": history}
