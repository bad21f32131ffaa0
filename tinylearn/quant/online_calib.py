"""Online re-calibration of static activation qparams under distribution drift.

A statically quantized activation keeps the (scale, zero_point) fitted offline. When the distribution drifts
upward the clip range is too small and values saturate (error grows with the clipped mass); when it drifts downward
the range is too wide and the rounding step is too coarse. ``OnlineRecalibrator`` watches two cheap statistics per
batch and refits the qparams only when they say so:

    saturation   fraction of elements beyond the clip range by more than half a step (those quantization clipped)
    mse_ratio    MSE with the current qparams / MSE with qparams fitted to this batch's own min/max
                 (1 = the static qparams are as good as a fresh per-batch fit; large = stale in either direction)

The decision is a Schmitt trigger (hysteresis): the alarm turns on when saturation > ``sat_high`` or
mse_ratio > ``ratio_high`` and turns off only when both fall below ``sat_low`` / ``ratio_low``; between the two
thresholds it keeps its state, so metric noise near one threshold cannot toggle it. The qparams are refitted when the
alarm has been on for ``patience`` consecutive batches (a single outlier batch does not move them) and at least
``cooldown`` batches after the previous refit (no oscillation); the new range is the min / max of the last
``patience`` batches (the post-drift data), widened by ``headroom`` (a fraction of the range).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._inputs import as_array, is_int, is_real
from .affine import calculate_qparams, qrange, quantize_dequantize


def saturation_rate(x: Any, scale: float, zero_point: int, dtype: str = "uint8") -> float:
    """Fraction of the elements of ``x`` that (scale, zero_point) clip: beyond the grid's end codes by > scale / 2."""
    qmin, qmax = qrange(dtype)
    a = as_array(x, "x", dtypes=("f", "i", "u")).astype(np.float64, copy=False)
    if a.size == 0:
        raise ValueError(f"x: empty array (shape {a.shape}): no saturation rate")
    if not (is_real(scale) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: must be a finite number > 0, got {scale!r}")
    if not (is_int(zero_point) and qmin <= zero_point <= qmax):
        raise ValueError(f"zero_point: must be an int in [{qmin}, {qmax}], got {zero_point!r}")
    lo = (qmin - int(zero_point) - 0.5) * float(scale)
    hi = (qmax - int(zero_point) + 0.5) * float(scale)
    return float(np.count_nonzero((a < lo) | (a > hi)) / a.size)


def _mse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))


class OnlineRecalibrator:
    """Static per-tensor activation qparams that re-fit themselves when monitoring says they went stale.

    ``calibrate(x)`` fits the initial qparams (min/max, like MinMaxObserver); ``rec(x)`` fake-quantizes a batch with
    the qparams in force, records {step, saturation, mse, mse_ratio, alarm, recalibrated} in ``history`` and, if
    the trigger fires, refits the qparams for the *next* batches (the monitor runs beside the inference path).
    Uncalibrated, the first batch calibrates.
    """

    def __init__(
        self,
        dtype: str = "uint8",
        symmetric: bool = False,
        sat_high: float = 0.01,
        sat_low: float = 0.001,
        ratio_high: float = 4.0,
        ratio_low: float = 2.0,
        patience: int = 2,
        cooldown: int = 4,
        headroom: float = 0.0,
    ) -> None:
        qrange(dtype)
        if not 0.0 <= sat_low <= sat_high <= 1.0:
            raise ValueError(f"sat_low/sat_high: need 0 <= sat_low <= sat_high <= 1, got {sat_low!r}, {sat_high!r}")
        if not 1.0 <= ratio_low <= ratio_high:
            raise ValueError(
                f"ratio_low/ratio_high: need 1 <= ratio_low <= ratio_high, got {ratio_low!r}, {ratio_high!r}"
            )
        if not (is_int(patience) and patience >= 1):
            raise ValueError(f"patience: must be an int >= 1, got {patience!r}")
        if not (is_int(cooldown) and cooldown >= 0):
            raise ValueError(f"cooldown: must be an int >= 0, got {cooldown!r}")
        if not (math.isfinite(headroom) and headroom >= 0):
            raise ValueError(f"headroom: must be a finite number >= 0, got {headroom!r}")
        self.dtype, self.symmetric = dtype, bool(symmetric)
        self.sat_high, self.sat_low = float(sat_high), float(sat_low)
        self.ratio_high, self.ratio_low = float(ratio_high), float(ratio_low)
        self.patience, self.cooldown, self.headroom = int(patience), int(cooldown), float(headroom)
        self.scale: float | None = None
        self.zero_point: int | None = None
        self.history: list[dict[str, Any]] = []
        self.recalibrations: list[int] = []  # steps whose batch triggered a refit
        self._alarm, self._run = False, 0
        self._recent: list[tuple[float, float]] = []
        self._last_refit = -(10**9)

    def _fit(self, lo: float, hi: float) -> None:
        pad = self.headroom * (hi - lo)
        s, z = calculate_qparams(np.float32(lo - pad), np.float32(hi + pad), self.dtype, self.symmetric)
        self.scale, self.zero_point = float(s), int(z)

    def calibrate(self, x: Any) -> tuple[float, int]:
        """Fit (scale, zero_point) to the min / max of ``x`` (a calibration set); resets the trigger."""
        a = as_array(x, "x", dtypes=("f", "i", "u")).astype(np.float32, copy=False)
        if a.size == 0 or not np.all(np.isfinite(a)):
            raise ValueError(f"x: calibration data must be non-empty and finite (shape {a.shape})")
        self._fit(float(a.min()), float(a.max()))
        self._alarm, self._run, self._recent = False, 0, []
        return self.scale, self.zero_point  # type: ignore[return-value]

    def __call__(self, x: Any) -> np.ndarray:
        a = as_array(x, "x", dtypes=("f", "i", "u")).astype(np.float32, copy=False)
        if a.size == 0 or not np.all(np.isfinite(a)):
            raise ValueError(f"x: batch must be non-empty and finite (shape {a.shape})")
        if self.scale is None:
            self.calibrate(a)
        step = len(self.history)
        lo, hi = float(a.min()), float(a.max())
        out = quantize_dequantize(a, self.scale, self.zero_point, self.dtype)
        mse = _mse(out, a)
        s_f, z_f = calculate_qparams(np.float32(lo), np.float32(hi), self.dtype, self.symmetric)
        mse_fresh = _mse(quantize_dequantize(a, s_f, z_f, self.dtype), a)
        ratio = mse / mse_fresh if mse_fresh > 0 else (1.0 if mse == 0 else math.inf)
        sat = saturation_rate(a, self.scale, self.zero_point, self.dtype)  # type: ignore[arg-type]
        if sat > self.sat_high or ratio > self.ratio_high:
            self._alarm = True
        elif sat < self.sat_low and ratio < self.ratio_low:
            self._alarm = False
        self._run = self._run + 1 if self._alarm else 0
        self._recent = (self._recent + [(lo, hi)])[-self.patience :]
        refit = self._run >= self.patience and step - self._last_refit >= self.cooldown
        if refit:
            self._fit(min(r[0] for r in self._recent), max(r[1] for r in self._recent))
            self.recalibrations.append(step)
            self._last_refit, self._alarm, self._run = step, False, 0
        self.history.append(
            {
                "step": step,
                "saturation": sat,
                "mse": mse,
                "mse_ratio": ratio,
                "alarm": self._alarm,
                "recalibrated": refit,
            }
        )
        return out

    def __repr__(self) -> str:
        return (
            f"OnlineRecalibrator(dtype={self.dtype!r}, scale={self.scale}, zero_point={self.zero_point}, "
            f"recalibrations={self.recalibrations})"
        )
