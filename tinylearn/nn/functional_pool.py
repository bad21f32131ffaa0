"""nn.MaxPool2d's max pooling: ``tinylearn.conv.functional.max_pool2d``, the one max_pool2d (re-exported here).

The direct C++ kernel (``_C.kernels.maxpool2d_forward/backward``, cpp_src/kernels_maxpool2d.cpp) now lives behind
``tinylearn.conv.functional.max_pool2d`` itself, so ``F.max_pool2d`` and ``nn.MaxPool2d`` take the same path:

    y[n, c, oh, ow] = max over in-bounds taps (oh*s_h - p_h + i*d_h, ow*s_w - p_w + j*d_w) of x[n, c]
    idx             = position h*W + w of the first maximum (row-major taps; a NaN wins, the first one)
    dx[n, c].flat[idx] += dy                       (the gradient goes to the argmax only; overlapping windows add)

Direct path: a 4-D float32/float64 Tensor, floor mode, no ``return_indices``, the C++ extension built and no
other backend pinned with ``backends.use("conv.max_pool2d", backend=...)``; everything else takes the im2col pooling.
``max_pool2d_im2col`` is the im2col rung (pre-issue-18 path) whatever the backend.
"""

from __future__ import annotations

from typing import Any

from ..conv.functional import MaxPool2dDirect, max_pool2d, max_pool2d_im2col
from ..conv.functional import _direct_pool_kernels as _fast_kernels_impl


def _fast_kernels() -> Any:
    """_C.kernels when it has the direct pooling kernels, else None."""
    return _fast_kernels_impl()


__all__ = ["MaxPool2dDirect", "max_pool2d", "max_pool2d_im2col"]
