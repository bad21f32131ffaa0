"""conv2d as im2col + GEMM, and its backward through col2im (NCHW, groups, depthwise).

With K = (C/g)*kh*kw, L = OH*OW and weights viewed per group as Wg [g, OC/g, K]:

    forward   cols = im2col(x)                       [g, K, N*L]   (the whole batch side by side)
              Y    = Wg @ cols (+ b)                 [g, OC/g, N*L]            one GEMM per group
    backward  dW   = dY @ colsᵀ                      [g, OC/g, K]              (sum over the batch inside the GEMM)
              dX   = col2im(Wgᵀ @ dY)                [N, C, H, W]              (col2im = adjoint of im2col)
              db   = sum over (N, OH, OW) of dY

The batch is folded into the GEMM's N dimension ("KNL" column layout) because one [OC, K] x [K, N*L] GEMM runs
several times faster in OpenBLAS than N separate [OC, K] x [K, L] GEMMs; the price is one transpose of Y.

Depthwise conv is groups = C (K = kh*kw, many tiny GEMMs). A 1x1 / stride-1 / pad-0 conv needs no im2col at all:
the input *is* the column matrix.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._params import as_float_array, check_backend, window_params
from .im2col import col2im_raw, im2col_raw


def _check_conv_args(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, groups: int) -> tuple[int, int]:
    """Validate shapes of x [N,C,H,W], w [OC, C/g, kh, kw], bias [OC] and groups; returns (OC, groups)."""
    if x.ndim != 4:
        raise ValueError(f"x: expected a 4-D [N, C, H, W] array, got shape {x.shape}")
    if w.ndim != 4:
        raise ValueError(f"weight: expected a 4-D [OC, C/groups, kh, kw] array, got shape {w.shape}")
    if isinstance(groups, bool) or not isinstance(groups, int | np.integer) or groups < 1:
        raise ValueError(f"groups: must be a positive int, got {groups!r}")
    groups = int(groups)
    C, OC = x.shape[1], w.shape[0]
    if C % groups != 0:
        raise ValueError(f"groups: input channels {C} (x shape {x.shape}) are not divisible by groups={groups}")
    if OC % groups != 0:
        raise ValueError(f"groups: output channels {OC} (weight shape {w.shape}) are not divisible by groups={groups}")
    if w.shape[1] * groups != C:
        raise ValueError(
            f"weight: shape {w.shape} expects {w.shape[1]}*groups={w.shape[1] * groups} input channels, "
            f"but x shape {x.shape} has {C} (groups={groups})"
        )
    if bias is not None and bias.shape != (OC,):
        raise ValueError(f"bias: expected shape ({OC},) for weight shape {w.shape}, got {bias.shape}")
    return OC, groups


def _is_pointwise(k, s, p, d) -> bool:
    return k == (1, 1) and s == (1, 1) and p == (0, 0)


def _prepare(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: int, backend: str | None):
    check_backend(backend)
    x = as_float_array(x, "x")
    w = as_float_array(w, "weight")
    b = None if bias is None else as_float_array(bias, "bias")
    dt = np.result_type(x.dtype, w.dtype) if b is None else np.result_type(x.dtype, w.dtype, b.dtype)
    x, w = x.astype(dt, copy=False), w.astype(dt, copy=False)
    b = None if b is None else b.astype(dt, copy=False)
    OC, groups = _check_conv_args(x, w, b, groups)
    k, s, p, d, out = window_params(x.shape, (w.shape[2], w.shape[3]), stride, padding, dilation, "x")
    return x, w, b, groups, k, s, p, d, out


def conv_cols(x: np.ndarray, k, s, p, d, out, backend: str | None) -> np.ndarray:
    """Column matrix [C*kh*kw, N*L] of x ("KNL"); a pointwise conv (1x1, stride 1, no padding) only transposes."""
    if _is_pointwise(k, s, p, d):
        N, C, H, W = x.shape
        return np.ascontiguousarray(x.transpose(1, 0, 2, 3)).reshape(C, N * H * W)
    return im2col_raw(x, k, s, p, d, out, backend, layout="KNL")


def conv2d(
    x: Any,
    w: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    backend: str | None = "numpy",
) -> np.ndarray:
    """2-D cross-correlation like ``torch.nn.functional.conv2d`` (NCHW), computed as im2col + GEMM."""
    y, _ = conv2d_forward(x, w, bias, stride, padding, dilation, groups, backend)
    return y


def conv2d_forward(
    x: Any,
    w: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    backend: str | None = "numpy",
) -> tuple[np.ndarray, np.ndarray]:
    """Forward pass returning (y, cols); ``cols`` [C*kh*kw, N*OH*OW] can be reused for dW in the backward pass."""
    x, w, b, g, k, s, p, d, (OH, OW) = _prepare(x, w, bias, stride, padding, dilation, groups, backend)
    N = x.shape[0]
    OC = w.shape[0]
    cols = conv_cols(x, k, s, p, d, (OH, OW), backend)
    if g == 1:
        y2 = w.reshape(OC, -1) @ cols  # [OC, N*L]: one GEMM for the whole batch (BLAS)
    else:
        y2 = np.matmul(w.reshape(g, OC // g, -1), cols.reshape(g, -1, cols.shape[1])).reshape(OC, -1)
    y = np.empty((N, OC, OH, OW), dtype=x.dtype)
    y4 = y2.reshape(OC, N, OH, OW).transpose(1, 0, 2, 3)
    if b is None:
        np.copyto(y, y4)
    else:
        np.add(y4, b[None, :, None, None], out=y)
    return y, cols


def conv2d_backward(
    grad_out: Any,
    x: Any,
    w: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    backend: str | None = "numpy",
    cols: np.ndarray | None = None,
    needs: tuple[bool, bool, bool] = (True, True, True),
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Gradients (dx, dw, db) of ``y = conv2d(x, w, b, ...)`` given dL/dy; entries not in ``needs`` are None.

    dw = sum_n dY·colsᵀ (per group), dx = col2im(Wᵀ·dY), db = dY summed over batch and space.
    ``cols`` (from conv2d_forward) avoids recomputing im2col.
    """
    x, w, _, g, k, s, p, d, (OH, OW) = _prepare(x, w, None, stride, padding, dilation, groups, backend)
    N, C, H, W = x.shape
    OC = w.shape[0]
    dy = as_float_array(grad_out, "grad_out")
    if dy.shape != (N, OC, OH, OW):
        raise ValueError(f"grad_out: expected shape {(N, OC, OH, OW)} (the conv output), got {dy.shape}")
    L = OH * OW
    dyT = np.ascontiguousarray(dy.astype(x.dtype, copy=False).transpose(1, 0, 2, 3)).reshape(g, OC // g, N * L)
    dx = dw = db = None
    if needs[1]:
        if cols is None:
            cols = conv_cols(x, k, s, p, d, (OH, OW), backend)
        # dWᵀ = cols @ dYᵀ: OpenBLAS runs this orientation ~4x faster than dY @ colsᵀ (long K = N*L reduction)
        dw = np.matmul(cols.reshape(g, -1, N * L), dyT.transpose(0, 2, 1)).transpose(0, 2, 1).reshape(w.shape)
    if needs[0]:
        wg = w.reshape(g, OC // g, -1)
        dcols = np.matmul(wg.transpose(0, 2, 1), dyT).reshape(-1, N * L)  # [C*kh*kw, N*L]
        if _is_pointwise(k, s, p, d):
            dx = np.ascontiguousarray(dcols.reshape(C, N, H, W).transpose(1, 0, 2, 3))
        else:
            dx = col2im_raw(dcols, N, C, H, W, k, s, p, d, (OH, OW), backend, layout="KNL")
    if needs[2]:
        db = dyT.sum(axis=2).reshape(OC)
    return dx, dw, db


def conv2d_flops(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> int:
    """Forward multiply-add count x2: 2 * N * OC * OH * OW * (C/g) * kh * kw."""
    k = (w_shape[2], w_shape[3])
    _, _, _, _, (OH, OW) = window_params(tuple(x_shape), k, stride, padding, dilation, "x")
    N = x_shape[0]
    return 2 * N * w_shape[0] * OH * OW * w_shape[1] * k[0] * k[1]


__all__ = ["conv2d", "conv2d_forward", "conv2d_backward", "conv2d_flops", "conv_cols"]
