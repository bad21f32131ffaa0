"""Spatial ops beyond conv2d/pool2d (torch.nn.functional names): conv1d/conv3d, conv_transpose*, 1d/3d/adaptive
pools, interpolate. Re-exported by ``tinylearn.nn.functional``."""

from __future__ import annotations

__all__: list[str] = []
