"""The 2-D names of the autograd conv / pool stack (re-exports; the stack itself is N-d, one module per family):

    functional_conv.py           conv1d/2d/3d, conv_transpose1d/2d/3d (ConvNdFunction: ndim 2 runs op conv.conv2d)
    functional_pool.py           max/avg/lp pools (2-D floor mode: op conv.max_pool2d, avg through conv.col2im)
    functional_pool_adaptive.py  adaptive pools, max_unpool
    functional_resample.py       interpolate / upsample, unfold / fold, pixel_shuffle

Kernels are chosen by ``tinylearn.backends``; ``backends.use(op, backend=..., version=...)`` pins one (it replaces
the former module-wide ``set_backend``), e.g. ``with backends.use("conv.conv2d", backend="numpy"): ...``.
"""

from __future__ import annotations

from .functional_conv import Conv2dFunction, ConvNdFunction, conv2d
from .functional_pool import (
    AvgPool2dFunction,
    MaxPool2dDirect,
    MaxPool2dFunction,
    _direct_pool_kernels,
    avg_pool2d,
    max_pool2d,
    max_pool2d_im2col,
)

__all__ = [
    "AvgPool2dFunction",
    "Conv2dFunction",
    "ConvNdFunction",
    "MaxPool2dDirect",
    "MaxPool2dFunction",
    "_direct_pool_kernels",
    "avg_pool2d",
    "conv2d",
    "max_pool2d",
    "max_pool2d_im2col",
]
