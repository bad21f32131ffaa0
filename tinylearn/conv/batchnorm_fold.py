"""Fold an inference-mode BatchNorm into the preceding convolution.

BN(conv(x)) = gamma * (W*x + b - mean) / sqrt(var + eps) + beta. With s = gamma / sqrt(var + eps) per output
channel this is one convolution:

    W' = W * s[:, None, None, None]        b' = (b - mean) * s + beta

Exact in real arithmetic; in floating point the folded conv differs from conv-then-BN by rounding only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._params import as_float_array, as_vector


def fold_batchnorm(
    conv_w: Any, conv_b: Any, bn_mean: Any, bn_var: Any, bn_gamma: Any, bn_beta: Any, eps: float = 1e-5
) -> tuple[np.ndarray, np.ndarray]:
    """(W', b') such that conv2d(x, W', b') == batch_norm(conv2d(x, W, b), mean, var, gamma, beta, eps) (eval)."""
    w = as_float_array(conv_w, "conv_w")
    if w.ndim < 2:
        raise ValueError(f"conv_w: expected a [OC, C/groups, kh, kw] (or [OC, ...]) array, got shape {w.shape}")
    oc = w.shape[0]
    what = f"conv_w shape {w.shape}"
    stats = (("bn_mean", bn_mean), ("bn_var", bn_var), ("bn_gamma", bn_gamma), ("bn_beta", bn_beta))
    vecs = {name: as_vector(v, name, oc, what) for name, v in stats}
    b = np.zeros(oc, dtype=w.dtype) if conv_b is None else as_vector(conv_b, "conv_b", oc, what)
    if not eps >= 0:
        raise ValueError(f"eps: must be non-negative, got {eps}")
    if np.any(vecs["bn_var"] + eps <= 0):
        raise ValueError("bn_var: var + eps must be positive for every channel")
    dt = np.result_type(w.dtype, b.dtype, *(a.dtype for a in vecs.values()))
    var = vecs["bn_var"].astype(np.float64)
    scale = vecs["bn_gamma"].astype(np.float64) / np.sqrt(var + eps)
    w_f = w.astype(np.float64) * scale.reshape((oc,) + (1,) * (w.ndim - 1))
    b_f = (b.astype(np.float64) - vecs["bn_mean"]) * scale + vecs["bn_beta"]
    return w_f.astype(dt), b_f.astype(dt)
