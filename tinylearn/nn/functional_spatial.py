"""Spatial ops beyond conv2d/pool2d (torch.nn.functional names): conv1d/conv3d, conv_transpose*, 1d/3d/adaptive
pools, max_unpool, interpolate. Re-exported by ``tinylearn.nn.functional``; the implementations (autograd Functions
over the im2col kernels) live in ``tinylearn.conv``, and the one list of the names is ``functional_nd.__all__``."""

from __future__ import annotations

from ..conv import functional_nd as _nd
from ..conv.functional_nd import *  # noqa: F403  (exactly the names of _nd.__all__)

__all__: list[str] = list(_nd.__all__)
