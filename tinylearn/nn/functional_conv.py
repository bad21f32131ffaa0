"""conv2d / max_pool2d / avg_pool2d for tl.nn.functional, delegating to the im2col implementation in tinylearn.conv.

    conv2d     y = W @ im2col(x) + b;  dW = dY @ colsᵀ, dX = col2im(Wᵀ @ dY), db = sum dY
    max_pool2d y = window max; the gradient goes to the first maximum of each window (like torch)
    avg_pool2d y = window mean (divisor kh*kw, or the in-bounds count when count_include_pad=False)

Output size per spatial dim: floor((H + 2p - d (k - 1) - 1) / s) + 1. The autograd Functions and the kernel
backend switch (``tinylearn.conv.functional.set_backend``) live in tinylearn/conv/functional.py.
"""

from __future__ import annotations

from typing import Any

from ..autograd.tensor import Tensor
from ..conv import functional as _cf

Conv2dFn = _cf.Conv2dFunction
MaxPool2dFn = _cf.MaxPool2dFunction
AvgPool2dFn = _cf.AvgPool2dFunction


def conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """2-D cross-correlation like torch.nn.functional.conv2d (x [N, C, H, W], weight [O, C/groups, kh, kw])."""
    return _cf.conv2d(x, weight, bias, stride, padding, dilation, groups)


def max_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    """Max pooling like torch.nn.functional.max_pool2d (floor mode)."""
    return _cf.max_pool2d(x, kernel_size, stride, padding)


def avg_pool2d(
    x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, count_include_pad: bool = True
) -> Tensor:
    """Average pooling like torch.nn.functional.avg_pool2d (floor mode)."""
    return _cf.avg_pool2d(x, kernel_size, stride, padding, count_include_pad)
