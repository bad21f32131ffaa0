"""Max pooling for ``nn.MaxPool2d``: the direct C++ kernel (``_C.kernels.maxpool2d_forward/backward``) in the common
case, the im2col pooling of tinylearn.conv (``F.max_pool2d``, which stays that function) for everything else.

    y[n, c, oh, ow] = max over in-bounds taps (oh*s_h - p_h + i*d_h, ow*s_w - p_w + j*d_w) of x[n, c]
    idx             = position h*W + w of the first maximum (row-major taps; a NaN wins, the first one)
    dx[n, c].flat[idx] += dy                       (the gradient goes to the argmax only; overlapping windows add)

Fast path: a 4-D float32/float64 Tensor, floor mode, no ``return_indices``, and the C++ extension built. Same
values as the im2col path (tests/test_nn.py compares both and torch); it exists because the im2col path's
``argmax`` over a strided window axis costs ~2 ms per pool of a small CNN's training step (issue 18).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..conv.functional import max_pool2d as _im2col_max_pool2d
from ..conv.pooling import _pool_params

_kernels: Any = None


def _fast_kernels() -> Any:
    """_C.kernels when it has the direct pooling kernels, else None (checked once)."""
    global _kernels
    if _kernels is None:
        k = backends.load_C("kernels") if backends.C_available("kernels") else None
        _kernels = k if k is not None and hasattr(k, "maxpool2d_forward") else False
    return _kernels or None


class MaxPool2dDirect(Function):
    """Max pooling through the direct C++ kernels; saves only the int64 argmax positions for backward."""

    @staticmethod
    def forward(ctx, x, k, s, p, d, out):
        x = np.ascontiguousarray(x)
        y, idx = _fast_kernels().maxpool2d_forward(x, k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1], *out)
        ctx.save_for_backward(idx)
        ctx.hw = x.shape[2:]
        return y

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        return _fast_kernels().maxpool2d_backward(np.ascontiguousarray(g), idx, *ctx.hw), None, None, None, None, None


def max_pool2d(
    x: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """torch.nn.functional.max_pool2d (same signature and argument order); see the module docstring for the path."""
    if (
        ceil_mode
        or return_indices
        or not isinstance(x, Tensor)
        or x.ndim != 4
        or x.dtype not in (np.float32, np.float64)
        or _fast_kernels() is None
    ):
        return _im2col_max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    k, s, p, d, out = _pool_params(x.shape, kernel_size, stride, padding, dilation)
    return MaxPool2dDirect.apply(x, k, s, p, d, out)
