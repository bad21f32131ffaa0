"""Every torch-signature spatial op of the N-d stack in one namespace (re-exports; ``tinylearn.nn.functional``
imports them through ``tinylearn.nn.functional_spatial``). The implementations, one module per family:
``functional_conv.py`` (conv, conv_transpose), ``functional_pool.py`` (max/avg/lp pools),
``functional_pool_adaptive.py`` (adaptive pools, max_unpool), ``functional_resample.py`` (interpolate, unfold/fold,
pixel_shuffle)."""

from __future__ import annotations

from .functional_conv import (
    Conv2dFunction,
    ConvNdFunction,
    ConvTransposeNdFunction,
    conv1d,
    conv2d,
    conv2d_nd,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
)
from .functional_pool import (
    AvgPoolNdFunction,
    MaxPoolNdFunction,
    avg_pool1d,
    avg_pool2d,
    avg_pool2d_nd,
    avg_pool3d,
    lp_pool1d,
    lp_pool2d,
    lp_pool3d,
    max_pool1d,
    max_pool2d,
    max_pool2d_nd,
    max_pool3d,
)
from .functional_pool_adaptive import (
    AdaptiveAvgPoolFunction,
    AdaptiveMaxPoolFunction,
    MaxUnpoolFunction,
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_avg_pool3d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
    adaptive_max_pool3d,
    max_unpool1d,
    max_unpool2d,
    max_unpool3d,
)
from .functional_resample import (
    FoldFunction,
    InterpolateFunction,
    UnfoldFunction,
    fold,
    interpolate,
    pixel_shuffle,
    pixel_unshuffle,
    unfold,
    upsample,
)

__all__ = [
    "unfold",
    "pixel_unshuffle",
    "pixel_shuffle",
    "lp_pool3d",
    "lp_pool2d",
    "lp_pool1d",
    "fold",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "avg_pool1d",
    "avg_pool3d",
    "conv1d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "interpolate",
    "max_pool1d",
    "max_pool3d",
    "max_unpool1d",
    "max_unpool2d",
    "max_unpool3d",
    "upsample",
]

# the classes and 2-D names are importable (``from tinylearn.conv.functional_nd import ConvNdFunction``) but stay
# out of __all__: ``tinylearn.nn.functional`` star-imports the list above
_REEXPORTED = (
    Conv2dFunction,
    ConvNdFunction,
    ConvTransposeNdFunction,
    conv2d,
    conv2d_nd,
    AvgPoolNdFunction,
    MaxPoolNdFunction,
    avg_pool2d,
    avg_pool2d_nd,
    max_pool2d,
    max_pool2d_nd,
    AdaptiveAvgPoolFunction,
    AdaptiveMaxPoolFunction,
    MaxUnpoolFunction,
    FoldFunction,
    InterpolateFunction,
    UnfoldFunction,
)
