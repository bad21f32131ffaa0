"""Data-free tricks before quantizing weights (Nagel et al., "Data-Free Quantization", 2019).

Cross-layer equalization (CLE) for y = W2 relu(W1 x + b1) + b2: ReLU is positively homogeneous, relu(s z) = s relu(z)
for s > 0, so for any positive per-channel s
    W1' = diag(1/s) W1,  b1' = b1 / s,  W2' = W2 diag(s)          leaves the network function unchanged.
Choosing s_i = sqrt(r1_i / r2_i), with r1_i = max|row i of W1| and r2_i = max|column i of W2|, makes both ranges
equal to sqrt(r1_i r2_i): no channel is left with a tiny range under a per-tensor scale.

Bias correction: quantizing W adds the error E = W_q - W, so the layer's output shifts by E x, whose mean over the
data is E E[x]. Subtracting it from the bias, b' = b - E E[x] (E[x] from calibration data), removes the bias
the rounding introduced (the expectation, not the per-sample noise).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def equalize_scales(w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """s_i = sqrt(r1_i / r2_i) for the channels between W1 [C, in] and W2 [out, C] (1 where a range is zero).

    Conv weights [C, in, kh, kw] / [out, C, kh, kw] take the max over their kernel taps too."""
    for name, w in (("w1", w1), ("w2", w2)):
        if np.ndim(w) < 2:
            raise ValueError(f"{name}: expected a weight with >= 2 dimensions, got shape {np.shape(w)}")
        if not np.all(np.isfinite(w)):
            raise ValueError(f"{name}: contains NaN or Inf")
    r1 = np.abs(w1.reshape(w1.shape[0], -1)).max(1).astype(np.float64)
    r2 = np.abs(w2.reshape(w2.shape[0], w2.shape[1], -1)).max(axis=(0, 2)).astype(np.float64)
    if r1.shape != r2.shape:
        raise ValueError(f"w1/w2: {r1.size} output channels of w1 but {r2.size} input channels of w2")
    ok = (r1 > 0) & (r2 > 0)
    return np.where(ok, np.sqrt(np.where(ok, r1 / np.where(ok, r2, 1.0), 1.0)), 1.0)


def cross_layer_equalize(lin1: Any, lin2: Any, iterations: int = 1) -> np.ndarray:
    """In place on two tinylearn Linear (or Conv2d) modules joined by a ReLU; returns the product of the scales.

    ``iterations`` >= 0 rounds of ``equalize_scales`` (after the first the scales are 1 up to rounding)."""
    for name, mod in (("lin1", lin1), ("lin2", lin2)):
        if getattr(mod, "weight", None) is None:
            raise TypeError(f"{name}: expected a Linear or Conv2d module with a weight, got {type(mod).__name__}")
    if isinstance(iterations, bool) or not isinstance(iterations, int | np.integer) or iterations < 0:
        raise ValueError(f"iterations: expected an int >= 0, got {iterations!r}")
    total = np.ones(lin1.weight.data.shape[0])
    for _ in range(iterations):
        s = equalize_scales(lin1.weight.data, lin2.weight.data)
        shape1 = (-1,) + (1,) * (lin1.weight.data.ndim - 1)
        lin1.weight.data = (lin1.weight.data / s.reshape(shape1)).astype(np.float32)
        if lin1.bias is not None:
            lin1.bias.data = (lin1.bias.data / s).astype(np.float32)
        shape2 = (1, -1) + (1,) * (lin2.weight.data.ndim - 2)
        lin2.weight.data = (lin2.weight.data * s.reshape(shape2)).astype(np.float32)
        total *= s
    return total


def bias_correction(
    weight: np.ndarray, weight_q: np.ndarray, bias: np.ndarray | None, mean_x: np.ndarray
) -> np.ndarray:
    """b' = b - (W_q - W) E[x] for a Linear layer (weight [out, in], mean_x [in])."""
    w = np.asarray(weight, np.float64)
    err = np.asarray(weight_q, np.float64) - w
    mean_x = np.asarray(mean_x, np.float64)
    if mean_x.shape != (w.shape[1],):
        raise ValueError(f"mean_x: expected shape ({w.shape[1]},), got {mean_x.shape}")
    b = np.zeros(w.shape[0]) if bias is None else np.asarray(bias, np.float64)
    return (b - err @ mean_x).astype(np.float32)
