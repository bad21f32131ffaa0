"""Sparsity schedules: AGP (automated gradual pruning, Zhu & Gupta 2017), one-shot, constant.

AGP: starting at step t0 and every Δt (= ``frequency``) steps over n = (end_step - t0) / Δt updates,

    s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (n Δt))^3        for t in {t0, t0 + Δt, ..., t0 + n Δt}

so sparsity *rises* from s_i at t0 to s_f at end_step: fast at first (the network has many redundant weights),
slowly at the end (each remaining weight matters more). Here ``__call__(step)``:

- clamps: step < start_step -> s_i; step >= end_step -> s_f;
- updates only every ``frequency`` steps: between updates the value of the last update step
  t0 + floor((step - t0) / Δt) * Δt is held (a piecewise-constant staircase);
- ``should_update(step)`` is True on the steps where a pruning step should run (t0, t0 + Δt, ..., and end_step).

(A frequent mistake, also in the seed's reference answer, is the inverted form s_i + (s_f - s_i)(1 - p)^3 which
starts at s_f and *decreases*.)
"""

from __future__ import annotations

import numbers

from .._inputs import is_int


def _check_fraction(name: str, v: float) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0.0 <= float(v) <= 1.0:
        raise ValueError(f"{name}: expected a sparsity in [0, 1], got {v!r}")
    return float(v)


def _check_int(name: str, v: int, low: int) -> int:
    if not is_int(v) or v < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {v!r}")
    return int(v)


def _step(step: int) -> int:
    """The training step as a Python int (numpy ints and 0-d int tensors too); TypeError for bool/float/str."""
    if not is_int(step):
        raise TypeError(f"step: expected an int, got {type(step).__name__} {step!r}")
    return int(step)


class AGPSchedule:
    """``AGPSchedule(initial_sparsity, final_sparsity, start_step, end_step, frequency)(step) -> float``."""

    def __init__(
        self, initial_sparsity: float, final_sparsity: float, start_step: int, end_step: int, frequency: int = 1
    ) -> None:
        self.initial_sparsity = _check_fraction("initial_sparsity", initial_sparsity)
        self.final_sparsity = _check_fraction("final_sparsity", final_sparsity)
        if self.final_sparsity < self.initial_sparsity:
            raise ValueError(
                f"final_sparsity: must be >= initial_sparsity={initial_sparsity} (AGP only adds sparsity), "
                f"got {final_sparsity}"
            )
        self.start_step = _check_int("start_step", start_step, 0)
        self.end_step = _check_int("end_step", end_step, 0)
        if self.end_step <= self.start_step:
            raise ValueError(f"end_step: must be > start_step={start_step}, got {end_step}")
        self.frequency = _check_int("frequency", frequency, 1)

    def __call__(self, step: int) -> float:
        step = _step(step)
        t0, t_end = self.start_step, self.end_step
        if step < t0:
            return self.initial_sparsity
        if step >= t_end:
            return self.final_sparsity
        t = t0 + ((step - t0) // self.frequency) * self.frequency  # last update step
        p = (t - t0) / (t_end - t0)
        si, sf = self.initial_sparsity, self.final_sparsity
        return sf + (si - sf) * (1.0 - p) ** 3

    def should_update(self, step: int) -> bool:
        """True at t0, t0 + Δt, ... (< end_step) and at end_step."""
        step = _step(step)
        if step == self.end_step:
            return True
        return self.start_step <= step < self.end_step and (step - self.start_step) % self.frequency == 0

    def __repr__(self) -> str:
        return (
            f"AGPSchedule(initial_sparsity={self.initial_sparsity}, final_sparsity={self.final_sparsity}, "
            f"start_step={self.start_step}, end_step={self.end_step}, frequency={self.frequency})"
        )


class OneShotSchedule:
    """Sparsity 0 before ``step``, ``sparsity`` from ``step`` on (prune once, then fine-tune)."""

    def __init__(self, sparsity: float, step: int = 0) -> None:
        self.sparsity = _check_fraction("sparsity", sparsity)
        self.step = _check_int("step", step, 0)

    def __call__(self, step: int) -> float:
        return self.sparsity if _step(step) >= self.step else 0.0

    def should_update(self, step: int) -> bool:
        return _step(step) == self.step


def amount_to_reach(current_sparsity: float, target_sparsity: float) -> float:
    """Fraction of the *remaining* weights to prune so that the total goes from current to target.

    Iterative pruning composes masks (PruningContainer): each call's float amount applies to what is left, so
    going from s_c to s_t prunes (s_t - s_c) / (1 - s_c) of the survivors.
    """
    sc = _check_fraction("current_sparsity", current_sparsity)
    st = _check_fraction("target_sparsity", target_sparsity)
    if st <= sc:
        return 0.0
    if sc >= 1.0:
        return 0.0
    return min(1.0, (st - sc) / (1.0 - sc))
