"""The log-softmax entry points of the kernels dispatcher (``kernels.log_softmax`` / ``log_softmax_backward``,
registered in ops.py): validate, move ``dim`` last, reshape to the kernels' canonical rows [R, C], call one backend
(numpy reference or the C++ kernel of cpp_src/kernels_softmax.cpp). ``tl.nn.functional.log_softmax`` (and so
``cross_entropy``; ``LogSoftmax`` in tinylearn/autograd/ops_reduce.py) calls the same registered kernels directly on
its rows (its arguments are checked by then)."""

from __future__ import annotations

import numpy as np

from .ops import _as_float, _check_dim, _compute_dtype, _kernel, _rows


def log_softmax(x: np.ndarray, dim: int = -1, *, backend: str | None = None) -> np.ndarray:
    """torch.log_softmax along ``dim``: (x - max) - log sum exp(x - max); a fully -inf slice gives NaN (as torch)."""
    x = _as_float(x, "x")
    mod = _kernel("log_softmax", backend)
    ct = _compute_dtype(mod, x.dtype, "x")
    if x.ndim == 0:
        raise ValueError("x: log_softmax needs at least one dimension, got a 0-d array")
    d = _check_dim(dim, x.ndim)
    xm = np.moveaxis(x, d, -1)
    if xm.size == 0:
        return np.empty(x.shape, dtype=x.dtype)
    y = mod(_rows(xm, ct)).reshape(xm.shape)
    return np.moveaxis(y, -1, d).astype(x.dtype, copy=False)


def log_softmax_backward(y: np.ndarray, dy: np.ndarray, dim: int = -1, *, backend: str | None = None) -> np.ndarray:
    """dx = dy - exp(y) * sum(dy, dim) from the forward output ``y``."""
    y, dy = _as_float(y, "y"), _as_float(dy, "dy")
    if y.shape != dy.shape:
        raise ValueError(f"dy: shape {dy.shape} does not match y shape {y.shape}")
    mod = _kernel("log_softmax_backward", backend)
    ct = _compute_dtype(mod, y.dtype, "y")
    if y.ndim == 0:
        raise ValueError("y: log_softmax_backward needs at least one dimension, got a 0-d array")
    d = _check_dim(dim, y.ndim)
    ym, gm = np.moveaxis(y, d, -1), np.moveaxis(dy, d, -1)
    if ym.size == 0:
        return np.empty(y.shape, dtype=y.dtype)
    dx = mod(_rows(ym, ct), _rows(gm, ct)).reshape(ym.shape)
    return np.moveaxis(dx, -1, d).astype(y.dtype, copy=False)
