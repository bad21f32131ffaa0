"""conv2d / max_pool2d / avg_pool2d for tl.nn.functional, delegating to the im2col implementation in tinylearn.conv.

    conv2d     y = W @ im2col(x) + b;  dW = dY @ colsᵀ, dX = col2im(Wᵀ @ dY), db = sum dY
    max_pool2d y = window max; the gradient goes to the first maximum of each window (like torch)
    avg_pool2d y = window mean (divisor kh*kw, or the in-bounds count when count_include_pad=False)

Output size per spatial dim: floor((H + 2p - d (k - 1) - 1) / s) + 1. The autograd Functions and the kernel
backend switch (``tinylearn.conv.functional.set_backend``) live in tinylearn/conv/functional.py.
"""

from __future__ import annotations

from ..conv.functional import AvgPool2dFunction as AvgPool2dFn  # noqa: F401
from ..conv.functional import Conv2dFunction as Conv2dFn  # noqa: F401
from ..conv.functional import MaxPool2dFunction as MaxPool2dFn  # noqa: F401
from ..conv.functional import avg_pool2d, conv2d, max_pool2d

__all__ = ["conv2d", "max_pool2d", "avg_pool2d"]
