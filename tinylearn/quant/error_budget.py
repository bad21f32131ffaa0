"""Splitting a total quantization-error budget across network segments by sensitivity, then picking bit widths.

Model. Quantizing segment i (a group of layers, n_i weights) to b bits leaves a per-weight MSE m_i(b) ~ c_i 4^-b
(each extra bit halves the step). To first order the output error is additive over segments,
E ~ sum_i w_i m_i, with w_i the segment's *sensitivity* (output MSE per unit of weight MSE, measured by
quantizing that segment alone: ``measure_sensitivities``). The storage is sum_i n_i b_i bits.

Allocation (minimise bits at a given budget E = eps; equivalently minimise E at given bits). With
b_i = 1/2 log2(c_i / m_i), the Lagrangian  sum_i n_i/2 log2(c_i/m_i) + lam (sum_i w_i m_i - eps)  is stationary at
    n_i / (2 ln2 m_i) = lam w_i      =>      w_i m_i = eps * n_i / N      (N = sum_i n_i)
so each segment's share of the output error is proportional to its *size*, and its per-weight error bound
m_i = eps n_i / (N w_i) is inversely proportional to its sensitivity: sensitive or small segments get tight bounds
(more bits), large insensitive ones loose bounds (few bits). c_i drops out. ``policy="uniform"`` splits eps into
equal shares w_i m_i = eps / S (the baseline the optimum beats). ``choose_bits`` then rounds to the integer widths
on offer: the smallest width whose *measured* per-weight error meets the bound.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._inputs import as_array, is_int, is_real

POLICIES = ("lagrange", "uniform")


def _positive_vector(v: Any, name: str) -> np.ndarray:
    a = as_array(v, name, dtypes=("f", "i", "u"), ndim=1).astype(np.float64)
    if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"{name}: need a non-empty vector of finite values > 0, got {v!r}")
    return a


def allocate_error_budget(
    budget: float,
    sensitivities: Any,
    sizes: Any,
    policy: str = "lagrange",
    floors: Any = None,
    ceilings: Any = None,
) -> np.ndarray:
    """Per-weight error bounds m_i with sum_i sensitivities[i] * m_i == budget.

    policy "lagrange": w_i m_i = budget * n_i / N (the minimum-bits split, module docstring); "uniform": equal shares.
    ``floors`` / ``ceilings`` (optional, per segment): the errors at the widest / narrowest width on offer. The
    bounds are then the KKT solution with box constraints, m_i = clip(t * n_i / w_i, floor_i, ceil_i) (uniform:
    clip(t / w_i, ...)) with the scalar t found by bisection so that the budget is met: a segment that cannot use
    its share (already at the widest width, or exact enough at the narrowest) hands the rest to the others.
    """
    if not (is_real(budget) and math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget: must be a finite number > 0, got {budget!r}")
    w = _positive_vector(sensitivities, "sensitivities")
    n = _positive_vector(sizes, "sizes")
    if w.shape != n.shape:
        raise ValueError(f"sizes: need one per segment ({w.size}), got {n.size}")
    if policy == "lagrange":
        unit = n / n.sum() / w  # m_i = t * unit_i; t = budget without constraints
    elif policy == "uniform":
        unit = np.full(w.shape, 1.0 / w.size) / w
    else:
        raise ValueError(f"policy: expected one of {POLICIES}, got {policy!r}")
    lo = np.zeros(w.shape) if floors is None else _positive_vector(floors, "floors")
    hi = np.full(w.shape, np.inf) if ceilings is None else _positive_vector(ceilings, "ceilings")
    if lo.shape != w.shape or hi.shape != w.shape:
        raise ValueError(f"floors/ceilings: need one per segment ({w.size}), got {lo.size} and {hi.size}")
    if np.any(lo > hi):
        raise ValueError(f"floors/ceilings: floors must be <= ceilings, got {lo} and {hi}")
    if floors is None and ceilings is None:
        return budget * unit
    if float(np.sum(w * lo)) > budget:
        raise ValueError(f"budget: {budget:.3g} is below the error at the widest widths ({float(np.sum(w * lo)):.3g})")
    if float(np.sum(w * hi)) <= budget:
        return hi.copy()  # every segment is within budget at its narrowest width
    spent = lambda t: float(np.sum(w * np.clip(t * unit, lo, hi)))  # noqa: E731  (non-decreasing in t)
    a, b = 0.0, budget
    while spent(b) < budget:
        b *= 2.0
    for _ in range(200):
        mid = 0.5 * (a + b)
        a, b = (mid, b) if spent(mid) < budget else (a, mid)
    return np.clip(b * unit, lo, hi)


def predicted_bits(budget: float, sensitivities: Any, sizes: Any, coefficients: Any, policy: str = "lagrange") -> float:
    """Total bits sum_i n_i b_i of the continuous solution b_i = 1/2 log2(c_i / m_i) under the error model c_i 4^-b."""
    m = allocate_error_budget(budget, sensitivities, sizes, policy)
    n = _positive_vector(sizes, "sizes")
    c = _positive_vector(coefficients, "coefficients")
    if c.shape != n.shape:
        raise ValueError(f"coefficients: need one per segment ({n.size}), got {c.size}")
    return float(np.sum(n * 0.5 * np.log2(c / m)))


def fake_quantize_bits(w: Any, bits: int, axis: int | None = 0) -> np.ndarray:
    """Symmetric b-bit quantize-dequantize of ``w`` (2 <= bits <= 16): one scale amax / (2^(b-1) - 1) per slice along
    ``axis`` (None: per tensor), round half to even, float32 out."""
    a = as_array(w, "w", dtypes=("f",)).astype(np.float32, copy=False)
    if not (is_int(bits) and 2 <= bits <= 16):
        raise ValueError(f"bits: must be an int in [2, 16], got {bits!r}")
    if axis is not None and not (is_int(axis) and -a.ndim <= axis < a.ndim):
        raise ValueError(f"axis: {axis!r} out of range for w of shape {a.shape}")
    axis = None if axis is None else int(axis)
    qmax = 2 ** (int(bits) - 1) - 1
    if axis is None:
        amax = np.abs(a).max(initial=0.0)
    else:
        red = tuple(d for d in range(a.ndim) if d != axis % a.ndim)
        amax = np.abs(a).max(axis=red, keepdims=True, initial=0.0)
    s = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
    return (np.clip(np.rint(a / s), -qmax, qmax) * s).astype(np.float32)


def _segments(segments: Sequence[Any]) -> list[list[str]]:
    if not isinstance(segments, Sequence) or isinstance(segments, str) or len(segments) == 0:
        raise ValueError(f"segments: need a non-empty list of layer names (or lists of names), got {segments!r}")
    out = [[s] if isinstance(s, str) else list(s) for s in segments]
    if any(len(s) == 0 or not all(isinstance(n, str) for n in s) for s in out):
        raise ValueError(f"segments: every segment must be a non-empty list of layer names, got {segments!r}")
    return out


def _layer(model: Any, name: str) -> Any:
    try:
        mod = model.get_submodule(name)
    except (AttributeError, KeyError) as e:
        raise ValueError(f"segments: no layer {name!r} in the model") from e
    if getattr(mod, "weight", None) is None:
        raise ValueError(f"segments: layer {name!r} ({type(mod).__name__}) has no weight")
    return mod


def segment_sizes(model: Any, segments: Sequence[Any]) -> np.ndarray:
    """Number of weights n_i of each segment."""
    return np.array([sum(_layer(model, n).weight.data.size for n in seg) for seg in _segments(segments)], np.float64)


def weight_error_table(model: Any, segments: Sequence[Any], bits: Sequence[int]) -> np.ndarray:
    """[S, len(bits)] per-weight MSE of each segment's weights quantized per output channel to each width."""
    segs = _segments(segments)
    if len(bits) == 0:
        raise ValueError("bits: need at least one bit width")
    table = np.zeros((len(segs), len(bits)))
    for i, seg in enumerate(segs):
        ws = [_layer(model, n).weight.data for n in seg]
        total = sum(w.size for w in ws)
        for j, b in enumerate(bits):
            table[i, j] = sum(float(np.sum((fake_quantize_bits(w, b).astype(np.float64) - w) ** 2)) for w in ws) / total
    return table


def quantize_segments(model: Any, segments: Sequence[Any], bits: Sequence[int]) -> Any:
    """A deep copy of ``model`` whose segment i's weights are fake-quantized to bits[i] (per output channel)."""
    segs = _segments(segments)
    if len(bits) != len(segs):
        raise ValueError(f"bits: need one width per segment ({len(segs)}), got {len(bits)}")
    m = copy.deepcopy(model)
    for seg, b in zip(segs, bits):
        for n in seg:
            lay = _layer(m, n)
            lay.weight.data = fake_quantize_bits(lay.weight.data, int(b))
    return m


def measure_sensitivities(model: Any, segments: Sequence[Any], X: Any, probe_bits: int = 4) -> np.ndarray:
    """w_i = (output MSE vs the float model when only segment i is quantized to ``probe_bits``) / segment i's
    per-weight MSE at that width: the first-order output error per unit of weight error."""
    from ..nn.training import predict

    segs = _segments(segments)
    Xa = as_array(X, "X", dtypes=("f",))
    ref = predict(model, Xa).astype(np.float64)
    werr = weight_error_table(model, segs, [probe_bits])[:, 0]
    out = np.zeros(len(segs))
    for i in range(len(segs)):
        bits = [16] * len(segs)
        bits[i] = probe_bits
        qm = quantize_segments(model, segs, bits)
        out[i] = float(np.mean((predict(qm, Xa) - ref) ** 2)) / max(werr[i], 1e-30)
    return out


def choose_bits(error_table: Any, bits: Sequence[int], bounds: Any) -> np.ndarray:
    """Per segment, the smallest width in ``bits`` whose measured per-weight error (``error_table[i, j]``) is <=
    bounds[i]; ValueError naming the segment when even the widest misses its bound."""
    t = as_array(error_table, "error_table", dtypes=("f",), ndim=2)
    bnd = as_array(bounds, "bounds", dtypes=("f", "i"), ndim=1).astype(np.float64)
    if t.shape != (bnd.size, len(bits)):
        raise ValueError(f"error_table: expected shape ({bnd.size}, {len(bits)}) (segments x bits), got {t.shape}")
    order = np.argsort(bits)
    out = np.zeros(bnd.size, np.int64)
    for i in range(bnd.size):
        ok = [int(bits[j]) for j in order if t[i, j] <= bnd[i]]
        if not ok:
            raise ValueError(f"bounds: segment {i}'s bound {bnd[i]:.3g} is below its error at every width {list(bits)}")
        out[i] = ok[0]
    return out


def allocate_bits(
    budget: float, sensitivities: Any, sizes: Any, error_table: Any, bits: Sequence[int]
) -> tuple[np.ndarray, float]:
    """Integer widths from ``bits`` meeting sum_i w_i m_i(b_i) <= budget with few total bits sum_i n_i b_i:
    the discrete form of the same stationarity condition (Everett's generalised Lagrange multiplier). For a
    multiplier lam each segment independently takes argmin_b n_i b + lam w_i m_i(b) (m_i from ``error_table``,
    measured); lam is bisected to the smallest value whose choice meets the budget, and the slack the multiplier
    leaves (it reaches only convex-hull points) is spent greedily on narrower widths. Returns (widths, predicted
    error sum_i w_i m_i(b_i))."""
    w = _positive_vector(sensitivities, "sensitivities")
    n = _positive_vector(sizes, "sizes")
    t = as_array(error_table, "error_table", dtypes=("f",), ndim=2).astype(np.float64)
    if w.shape != n.shape or t.shape != (w.size, len(bits)):
        raise ValueError(
            f"error_table/sizes: need {w.size} sizes and a ({w.size}, {len(bits)}) table, got {n.size} and {t.shape}"
        )
    if not (is_real(budget) and math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget: must be a finite number > 0, got {budget!r}")
    bv = np.asarray(bits, np.float64)
    rows = np.arange(w.size)

    def pick(lam: float) -> np.ndarray:
        return np.argmin(n[:, None] * bv[None, :] + lam * w[:, None] * t, axis=1)

    def err(idx: np.ndarray) -> float:
        return float(np.sum(w * t[rows, idx]))

    best = int(np.argmax(bv))
    if float(np.sum(w * t[:, best])) > budget:
        raise ValueError(f"budget: {budget:.3g} is below the error at the widest width ({np.sum(w * t[:, best]):.3g})")
    lo, hi = -40.0, 40.0  # log10 lam
    if err(pick(10.0**hi)) > budget:
        idx = np.full(w.size, best)
    else:
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if err(pick(10.0**mid)) > budget else (lo, mid)
        idx = pick(10.0**hi)
    # the multiplier reaches only the convex hull of each segment's (bits, error) points and leaves slack: spend it
    # greedily, narrowing the segment that saves the most bits per unit of added error while the budget holds
    order = np.argsort(bv)
    rank = np.argsort(order)  # position of each column in increasing-bits order
    while True:
        best_gain, best_i = 0.0, -1
        for i in range(w.size):
            r = rank[idx[i]]
            if r == 0:
                continue
            j = order[r - 1]
            trial = idx.copy()
            trial[i] = j
            added = err(trial) - err(idx)
            if err(trial) <= budget:
                gain = n[i] * (bv[idx[i]] - bv[j]) / max(added, 1e-300)
                if gain > best_gain:
                    best_gain, best_i, best_j = gain, i, j
        if best_i < 0:
            break
        idx[best_i] = best_j
    return bv[idx].astype(np.int64), err(idx)
