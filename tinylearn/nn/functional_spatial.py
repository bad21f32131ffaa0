"""Spatial ops beyond conv2d/pool2d (torch.nn.functional names): conv1d/conv3d, conv_transpose*, 1d/3d/adaptive
pools, max_unpool, interpolate. Re-exported by ``tinylearn.nn.functional``; the implementations (autograd Functions
over the im2col kernels) live in ``tinylearn.conv.functional_nd``."""

from __future__ import annotations

from ..conv.functional_nd import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_avg_pool3d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
    adaptive_max_pool3d,
    avg_pool1d,
    avg_pool3d,
    conv1d,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    interpolate,
    max_pool1d,
    max_pool3d,
    max_unpool1d,
    max_unpool2d,
    max_unpool3d,
    upsample,
)

__all__: list[str] = [
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
