"""max / average pooling through the same windowing as im2col, backward through col2im.

    windows = im2col view of x padded with -inf (max) or 0 (avg)         [N, C, kh*kw, OH, OW]
    max:  y = max over the window, idx = argmax (first maximum, NaN wins, like torch)
          dx = col2im(one_hot(idx) * dy)                                 (the gradient goes to the argmax only)
    avg:  y = sum over the window / divisor
          divisor = kh*kw                     if count_include_pad (padding zeros count)
                  = number of in-bounds taps  otherwise
          dx = col2im(dy / divisor broadcast over the window)
Floor mode (ceil_mode=False) only here; ceil_mode, return_indices with torch's flat indices and 1-d/3-d pools are in
poolnd.py. padding must be at most half the kernel (torch's rule).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._params import as_float_array, check_backend, pool_params_nd
from .im2col import col2im_raw, pad_nchw, window_view


def _pool_params(shape: tuple[int, ...], kernel_size: Any, stride: Any, padding: Any, dilation: Any = 1):
    """Validated (k, s, p, d, (OH, OW)) of a floor-mode pool over an NCHW ``shape`` (``_params.pool_params_nd``)."""
    shape = tuple(shape)
    if len(shape) != 4:
        raise ValueError(f"x: expected a 4-D [N, C, H, W] array, got shape {shape}")
    return pool_params_nd(shape[2:], kernel_size, stride, padding, dilation, False, "x", lead=shape[:2])[:5]


def _windows(x: np.ndarray, k, s, p, d, out, fill: float) -> np.ndarray:
    """[N, C, kh*kw, OH, OW] copy of every pooling window (padding filled with ``fill``)."""
    N, C = x.shape[:2]
    v = window_view(pad_nchw(x, p, fill), k, s, d, out)
    return v.reshape(N, C, k[0] * k[1], out[0], out[1])


def max_pool2d(
    x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1, return_indices: bool = False
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Max pooling like ``torch.nn.functional.max_pool2d``; with ``return_indices`` also the window argmax
    (index in 0..kh*kw-1 of each window, the thing max_pool2d_backward needs)."""
    x = as_float_array(x, "x")
    k, s, p, d, out = _pool_params(x.shape, kernel_size, stride, padding, dilation)
    win = _windows(x, k, s, p, d, out, -np.inf)
    idx = np.argmax(win, axis=2)
    y = np.take_along_axis(win, idx[:, :, None], axis=2)[:, :, 0]
    return (y, idx) if return_indices else y


def max_pool2d_backward(
    grad_out: Any,
    idx: np.ndarray,
    x_shape: tuple[int, ...],
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    *,
    backend: str | None = None,
) -> np.ndarray:
    """dx: each output gradient is routed to its window's argmax (overlapping windows accumulate via col2im)."""
    check_backend(backend)
    dy = as_float_array(grad_out, "grad_out")
    N, C, H, W = (int(v) for v in x_shape)
    k, s, p, d, out = _pool_params((N, C, H, W), kernel_size, stride, padding, dilation)
    if dy.shape != (N, C) + out or idx.shape != dy.shape:
        raise ValueError(f"grad_out: expected shape {(N, C) + out}, got {dy.shape} (indices {idx.shape})")
    kk = k[0] * k[1]
    dcols = np.zeros((N, C, kk, out[0], out[1]), dtype=dy.dtype)
    np.put_along_axis(dcols, idx[:, :, None], dy[:, :, None], axis=2)
    return col2im_raw(dcols.reshape(N, C * kk, -1), N, C, H, W, k, s, p, d, out, backend)


def _avg_divisor(x_shape, k, s, p, out, count_include_pad: bool, dtype) -> np.ndarray | float:
    if count_include_pad or p == (0, 0):
        return float(k[0] * k[1])
    H, W = x_shape[2], x_shape[3]
    oh = np.arange(out[0]) * s[0] - p[0]
    ow = np.arange(out[1]) * s[1] - p[1]
    rows = np.minimum(oh + k[0], H) - np.maximum(oh, 0)
    cols = np.minimum(ow + k[1], W) - np.maximum(ow, 0)
    return (rows[:, None] * cols[None, :]).astype(dtype)  # [OH, OW]


def avg_pool2d(
    x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, count_include_pad: bool = True
) -> np.ndarray:
    """Average pooling like ``torch.nn.functional.avg_pool2d`` (floor mode, no divisor_override)."""
    x = as_float_array(x, "x")
    k, s, p, d, out = _pool_params(x.shape, kernel_size, stride, padding)
    win = _windows(x, k, s, p, d, out, 0.0)
    return (win.sum(axis=2) / _avg_divisor(x.shape, k, s, p, out, count_include_pad, x.dtype)).astype(x.dtype)


def avg_pool2d_backward(
    grad_out: Any,
    x_shape: tuple[int, ...],
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    count_include_pad: bool = True,
    *,
    backend: str | None = None,
) -> np.ndarray:
    """dx = col2im(dy / divisor copied to every tap of its window)."""
    check_backend(backend)
    dy = as_float_array(grad_out, "grad_out")
    N, C, H, W = (int(v) for v in x_shape)
    k, s, p, d, out = _pool_params((N, C, H, W), kernel_size, stride, padding)
    if dy.shape != (N, C) + out:
        raise ValueError(f"grad_out: expected shape {(N, C) + out}, got {dy.shape}")
    g = (dy / _avg_divisor(x_shape, k, s, p, out, count_include_pad, dy.dtype)).astype(dy.dtype)
    kk = k[0] * k[1]
    dcols = np.broadcast_to(g[:, :, None], (N, C, kk) + out).reshape(N, C * kk, -1)
    return col2im_raw(dcols, N, C, H, W, k, s, p, d, out, backend)
