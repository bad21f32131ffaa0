"""Observers: watch tensors during calibration, then pick (scale, zero_point) — torch.ao.quantization's shape.

    obs = MinMaxObserver(dtype="int8", symmetric=False);  for x in data: obs(x);  scale, zp = obs.calculate_qparams()

Range rules (the clip range [lo, hi] then goes through affine.calculate_qparams, torch's arithmetic):
  MinMax                 lo = min over all x, hi = max over all x                                    (== torch)
  MovingAverageMinMax    lo <- lo + c (min(x) - lo), first batch initialises                          (== torch)
  PerChannelMinMax       the same per slice along ch_axis                                             (== torch)
  Percentile             hi = p-th percentile of |x| (lo = -hi, or 0 when x was never negative)
  MSE                    hi = argmin_t E[(Q_t(x) - x)^2] over a scan of clip thresholds t
  Histogram (KL)         hi = TensorRT entropy calibration: argmin_t KL(P_t || Q_t)
The last three keep a histogram of |x| over [0, amax] (``bins`` bins of equal width, edges[i] = i * amax / bins);
when a later batch raises amax the old counts are re-binned by their bin centres.

KL calibration (TensorRT, "8-bit inference with TensorRT", 2017), for each candidate i (bins [0, i) kept):
  P = hist[:i] with the clipped mass sum(hist[i:]) added to P[i-1];  threshold t = edges[i] (the *upper edge* of
  bin i-1 — using a bin centre or i+1 here is the seed's misalignment);  Q = hist[:i] merged into L levels
  (bin j goes to level floor(j * L / i), so every bin lands in exactly one level) and each level's mass spread
  evenly over its non-empty bins;  KL = sum P log(P/Q) over P > 0 (Q smoothed where 0).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .._inputs import as_array, as_int, is_int
from .affine import qparams_for_range, qrange


class ObserverBase:
    """obs(x) records statistics and returns x unchanged; calculate_qparams() -> (scale, zero_point).

    NaN handling (documented choice, like torch's nan-aware reductions ``nanmin``/``nanmax``): per-tensor observers
    ignore NaN elements only, the finite values of the batch still count; a batch that is all NaN raises ValueError
    (nothing to record). Per-channel observers raise ValueError on any NaN (a channel could be left without data).
    """

    def __init__(self, dtype: str = "int8", symmetric: bool = False) -> None:
        self.quant_min, self.quant_max = qrange(dtype)
        self.dtype, self.symmetric = dtype, bool(symmetric)

    def __call__(self, x: Any) -> Any:
        return self.forward(x)

    def forward(self, x: Any) -> Any:
        a = as_array(x, "x", dtypes=("f", "i", "u", "b")).astype(np.float32, copy=False)
        nan = np.isnan(a)
        if nan.any():
            if nan.all():
                raise ValueError(f"x: every element of the batch (shape {a.shape}) is NaN: nothing to observe")
            if isinstance(self, PerChannelMinMaxObserver):
                raise ValueError(f"x: {int(nan.sum())} NaN element(s) in a per-channel observer's batch")
            a = a[~nan]  # ignore the NaN elements only
        if a.size:
            self._observe(a)
        return x

    def _observe(self, a: np.ndarray) -> None:  # overridden
        raise RuntimeError(f"{type(self).__name__}: no statistics defined")

    def _qparams(self, lo: Any, hi: Any) -> tuple[Any, Any]:
        scale, zp = qparams_for_range(
            lo,
            hi,
            self.quant_min,
            self.quant_max,
            self.symmetric,
            signed=self.dtype.startswith("int"),
            customized_range=self.dtype not in ("int8", "uint8"),
        )
        if np.ndim(lo) == 0:
            return float(scale), int(zp)
        return scale, zp

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dtype={self.dtype!r}, symmetric={self.symmetric})"


class MinMaxObserver(ObserverBase):
    """Running min / max over every observed tensor (torch.ao.quantization.MinMaxObserver)."""

    def __init__(self, dtype: str = "int8", symmetric: bool = False) -> None:
        super().__init__(dtype, symmetric)
        self.min_val, self.max_val = float("inf"), float("-inf")

    def _observe(self, a: np.ndarray) -> None:
        self.min_val = min(self.min_val, float(a.min()))
        self.max_val = max(self.max_val, float(a.max()))

    def calculate_qparams(self) -> tuple[Any, Any]:
        if self.min_val == float("inf"):
            warnings.warn(
                f"{type(self).__name__}: no data observed; returning scale=1.0, zero_point=0 (like torch)", stacklevel=2
            )
            return 1.0, 0
        return self._qparams(np.float32(self.min_val), np.float32(self.max_val))


class MovingAverageMinMaxObserver(MinMaxObserver):
    """min <- min + c * (batch_min - min) (first batch sets it), likewise max; torch's default c = 0.01."""

    def __init__(self, averaging_constant: float = 0.01, dtype: str = "int8", symmetric: bool = False) -> None:
        if not 0.0 < averaging_constant <= 1.0:
            raise ValueError(f"averaging_constant: must be in (0, 1], got {averaging_constant!r}")
        super().__init__(dtype, symmetric)
        self.averaging_constant = float(averaging_constant)

    def _observe(self, a: np.ndarray) -> None:
        lo, hi = np.float32(a.min()), np.float32(a.max())
        if self.min_val == float("inf"):
            self.min_val, self.max_val = float(lo), float(hi)
            return
        c = np.float32(self.averaging_constant)
        self.min_val = float(np.float32(self.min_val) + c * (lo - np.float32(self.min_val)))
        self.max_val = float(np.float32(self.max_val) + c * (hi - np.float32(self.max_val)))


class PerChannelMinMaxObserver(ObserverBase):
    """Running min / max per slice along ``ch_axis`` (torch.ao.quantization.PerChannelMinMaxObserver)."""

    def __init__(
        self, ch_axis: int = 0, dtype: str = "int8", symmetric: bool = False, averaging_constant: float | None = None
    ) -> None:
        super().__init__(dtype, symmetric)
        self.ch_axis = as_int(ch_axis, "ch_axis")
        self.averaging_constant = averaging_constant
        self.min_val: np.ndarray | None = None
        self.max_val: np.ndarray | None = None

    def _observe(self, a: np.ndarray) -> None:
        if not -a.ndim <= self.ch_axis < a.ndim:
            raise ValueError(f"ch_axis: {self.ch_axis} out of range for input of shape {a.shape}")
        m = np.moveaxis(a, self.ch_axis, 0).reshape(a.shape[self.ch_axis], -1)
        lo, hi = m.min(1), m.max(1)
        if self.min_val is None:
            self.min_val, self.max_val = lo, hi
            return
        if lo.shape != self.min_val.shape:
            raise ValueError(
                f"x: {lo.shape[0]} channels along axis {self.ch_axis}, observer saw {self.min_val.shape[0]} before"
            )
        if self.averaging_constant is None:
            self.min_val, self.max_val = np.minimum(self.min_val, lo), np.maximum(self.max_val, hi)
        else:
            c = np.float32(self.averaging_constant)
            self.min_val = (self.min_val + c * (lo - self.min_val)).astype(np.float32)
            self.max_val = (self.max_val + c * (hi - self.max_val)).astype(np.float32)

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        if self.min_val is None:
            warnings.warn("PerChannelMinMaxObserver: no data observed; returning scale=1.0, zero_point=0", stacklevel=2)
            return np.ones(1, np.float32), np.zeros(1, np.int64)
        return self._qparams(self.min_val, self.max_val)


class MovingAveragePerChannelMinMaxObserver(PerChannelMinMaxObserver):
    def __init__(
        self, averaging_constant: float = 0.01, ch_axis: int = 0, dtype: str = "int8", symmetric: bool = False
    ) -> None:
        super().__init__(ch_axis, dtype, symmetric, averaging_constant)


class _AbsHistogramObserver(ObserverBase):
    """Histogram of |x| over [0, amax] with ``bins`` equal bins; subclasses choose the clip threshold."""

    def __init__(self, bins: int = 2048, dtype: str = "int8", symmetric: bool = True) -> None:
        super().__init__(dtype, symmetric)
        if not is_int(bins) or bins < 16:
            raise ValueError(f"bins: must be an int >= 16, got {bins!r}")
        self.bins = int(bins)
        self.hist = np.zeros(bins, np.float64)
        self.amax = 0.0
        self.min_val, self.max_val = float("inf"), float("-inf")

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(0.0, self.amax, self.bins + 1)

    def _observe(self, a: np.ndarray) -> None:
        self.min_val = min(self.min_val, float(a.min()))
        self.max_val = max(self.max_val, float(a.max()))
        ab = np.abs(a.reshape(-1)).astype(np.float64)
        new_amax = float(ab.max())
        if new_amax > self.amax:
            if self.hist.sum() > 0:  # re-bin old counts at their bin centres
                centres = (np.arange(self.bins) + 0.5) * (self.amax / self.bins)
                self.hist = np.histogram(centres, bins=self.bins, range=(0, new_amax), weights=self.hist)[0]
            self.amax = new_amax
        if self.amax == 0.0:
            self.hist[0] += ab.size
            return
        self.hist += np.histogram(ab, bins=self.bins, range=(0, self.amax))[0]

    @property
    def _nonneg(self) -> bool:
        return self.min_val >= 0.0

    def _levels(self) -> int:
        """Number of quantization levels covering [0, threshold]."""
        if self._nonneg and not (self.symmetric and self.dtype.startswith("int")):
            return self.quant_max - self.quant_min + 1
        return self.quant_max + 1 if self.dtype.startswith("int") else (self.quant_max - self.quant_min + 1) // 2

    def threshold(self) -> float:  # overridden
        return self.amax

    def calculate_qparams(self) -> tuple[Any, Any]:
        if self.min_val == float("inf"):
            warnings.warn(f"{type(self).__name__}: no data observed; returning scale=1.0, zero_point=0", stacklevel=2)
            return 1.0, 0
        t = np.float32(self.threshold())
        lo = np.float32(0.0) if self._nonneg else -t
        return self._qparams(lo, t)


class PercentileObserver(_AbsHistogramObserver):
    """Clip at the ``percentile``-th percentile of |x| (e.g. 99.99): robust to a few outliers."""

    def __init__(self, percentile: float = 99.99, bins: int = 2048, dtype: str = "int8", symmetric: bool = True):
        super().__init__(bins, dtype, symmetric)
        if not 0.0 < percentile <= 100.0:
            raise ValueError(f"percentile: must be in (0, 100], got {percentile!r}")
        self.percentile = float(percentile)

    def threshold(self) -> float:
        cdf = np.cumsum(self.hist) / max(self.hist.sum(), 1.0)
        i = int(np.searchsorted(cdf, self.percentile / 100.0 - 1e-12))
        return float(self.edges[min(i + 1, self.bins)])


class MSEObserver(_AbsHistogramObserver):
    """Scan ``n_candidates`` thresholds t in (0, amax] and keep the one minimising the histogram-weighted
    reconstruction error  sum_bins count * (Q_t(centre) - centre)^2  (rounding noise vs clipping trade-off)."""

    def __init__(self, n_candidates: int = 200, bins: int = 2048, dtype: str = "int8", symmetric: bool = True):
        super().__init__(bins, dtype, symmetric)
        self.n_candidates = as_int(n_candidates, "n_candidates", min=1)

    def mse_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(thresholds, expected squared error per element) for the scanned thresholds."""
        centres = (np.arange(self.bins) + 0.5) * (self.amax / self.bins)
        ts = self.amax * np.arange(1, self.n_candidates + 1) / self.n_candidates
        levels = self._levels() - 1  # steps above zero
        steps = ts / levels
        q = np.minimum(np.rint(centres[None, :] / steps[:, None]), levels) * steps[:, None]
        err = ((q - centres[None, :]) ** 2 * self.hist[None, :]).sum(1) / max(self.hist.sum(), 1.0)
        return ts, err

    def threshold(self) -> float:
        if self.amax == 0.0:
            return 0.0
        ts, err = self.mse_curve()
        return float(ts[int(np.argmin(err))])


def kl_threshold(
    hist: Any, edges: Any, num_levels: int = 128, start: int | None = None
) -> tuple[float, int, np.ndarray]:
    """TensorRT entropy calibration on a histogram of |x|: (threshold, bin count i, KL for every candidate i).

    Candidate i keeps bins [0, i) and clips the rest into bin i-1; threshold = edges[i]."""
    h = np.asarray(hist, np.float64)
    e = np.asarray(edges, np.float64)
    nb = h.size
    if e.size != nb + 1:
        raise ValueError(f"edges: need len(hist) + 1 = {nb + 1} edges, got {e.size}")
    num_levels = as_int(num_levels, "num_levels")
    if num_levels < 2 or num_levels > nb:
        raise ValueError(f"num_levels: must be in [2, {nb}] for {nb} bins, got {num_levels}")
    start = num_levels if start is None else max(as_int(start, "start"), num_levels)
    cands = np.arange(start, nb + 1)
    kls = np.full(cands.size, np.inf)
    total_tail = np.concatenate([np.cumsum(h[::-1])[::-1], [0.0]])  # total_tail[i] = sum(h[i:])
    for k, i in enumerate(cands):
        p = h[:i].copy()
        p[i - 1] += total_tail[i]
        if p.sum() == 0:
            continue
        ref = h[:i]
        level = (np.arange(i) * num_levels) // i  # bin j -> level; every bin in exactly one level
        nz = ref > 0
        mass = np.bincount(level, weights=ref, minlength=num_levels)
        cnt = np.bincount(level, weights=nz.astype(np.float64), minlength=num_levels)
        q = np.where(nz, mass[level] / np.maximum(cnt[level], 1.0), 0.0)
        pn = p / p.sum()
        qs = q.sum()
        if qs == 0:
            continue
        qn = q / qs
        mask = pn > 0
        qn = np.where(mask & (qn == 0), 1e-12, qn)
        kls[k] = float(np.sum(pn[mask] * np.log(pn[mask] / qn[mask])))
    best = int(np.argmin(kls))
    i = int(cands[best])
    return float(e[i]), i, kls


class HistogramObserver(_AbsHistogramObserver):
    """Entropy (KL) calibration, TensorRT style, on a 2048-bin histogram of |x| (method="kl" or "entropy").

    Unlike torch's HistogramObserver (which minimises an L2 quantization-error estimate), this is the KL search;
    method="mse" delegates to the MSE scan on the same histogram, method="percentile" to the 99.99th percentile."""

    def __init__(
        self,
        bins: int = 2048,
        method: str = "kl",
        dtype: str = "int8",
        symmetric: bool = True,
        percentile: float = 99.99,
    ) -> None:
        super().__init__(bins, dtype, symmetric)
        if method not in ("kl", "entropy", "mse", "percentile"):
            raise ValueError(f"method: unknown calibration method {method!r}; known: kl, entropy, mse, percentile")
        self.method = method
        self.percentile = percentile
        self.kl_curve: np.ndarray | None = None

    def threshold(self) -> float:
        if self.amax == 0.0:
            return 0.0
        if self.method in ("kl", "entropy"):
            t, _, self.kl_curve = kl_threshold(self.hist, self.edges, self._levels())
            return t
        other: _AbsHistogramObserver = (
            MSEObserver(bins=self.bins, dtype=self.dtype, symmetric=self.symmetric)
            if self.method == "mse"
            else PercentileObserver(self.percentile, bins=self.bins, dtype=self.dtype, symmetric=self.symmetric)
        )
        other.hist, other.amax, other.min_val, other.max_val = self.hist, self.amax, self.min_val, self.max_val
        return other.threshold()
