"""Convolution lowered to GEMM: im2col / col2im (three backends), conv2d forward/backward, pooling, Winograd
F(2x2, 3x3), Conv+BN folding and the tiled-im2col memory lesson. numpy arrays in and out.

    tl.conv.im2col(x, kernel_size, stride=1, padding=0, dilation=1, backend="numpy"|"numba"|"cpp"|None)  [N, C*kh*kw, L]
    tl.conv.col2im(cols, output_size, kernel_size, stride=1, padding=0, dilation=1, backend=...)     [N, C, H, W]
    tl.conv.conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, backend=...)
    tl.conv.winograd_conv2d(x, w, bias=None, padding=0)
    tl.conv.deform_conv2d(x, offset, weight, bias=None, stride=1, padding=0, dilation=1, mask=None)
    tl.conv.fold_batchnorm(conv_w, conv_b, bn_mean, bn_var, bn_gamma, bn_beta, eps) -> (w', b')

The autograd stack (torch signatures, on tl.Tensors; re-exported by tinylearn.nn.functional) is one N-d stack:
    functional_conv: conv1d/2d/3d, conv_transpose1d/2d/3d      functional_pool: max/avg/lp pools 1-d to 3-d
    functional_pool_adaptive: adaptive pools, max_unpool       functional_resample: interpolate, unfold/fold, ...
    (``functional`` / ``functional_nd``: the same names re-exported)
    numpy kernels: convnd.py (3-D im2col/col2im built from the 2-D kernels), poolnd.py (windows, adaptive, resampling)

Layouts are those of torch.nn.functional.unfold / fold / conv2d. numba is imported only when asked for. Every path
with more than one implementation is an op of ``tinylearn.backends``: ``conv.im2col``, ``conv.col2im``,
``conv.conv2d`` / ``conv.conv2d_backward`` (cpp versions auto, v0-v3) and ``conv.max_pool2d`` (on Tensors).
``backend=None`` (the default, keyword-only with ``version``) = the fastest here, or what
``backends.use(op, backend=..., version=...)`` pins; ``backends.versions(op)`` lists them.
"""

from ._params import BACKENDS, conv_out_size, conv_output_size, cpp_available
from .batchnorm_fold import fold_batchnorm
from .conv2d import conv2d, conv2d_backward, conv2d_flops, conv2d_forward
from .deformable import deform_conv2d, deform_conv2d_direct, deform_im2col, sampling_footprint
from .functional_pool import MaxPool2dFunction as _registers_max_pool2d  # noqa: F401  (op conv.max_pool2d)
from .im2col import col2im, im2col
from .pooling import avg_pool2d, avg_pool2d_backward, max_pool2d, max_pool2d_backward
from .reparam import fold_channel_scale, fold_input_affine, fold_linear_chain, linear_chain_cost
from .tiled import conv2d_tiled, im2col_workspace_bytes
from .winograd import MULS_DIRECT_PER_TILE, MULS_WINOGRAD_PER_TILE, winograd_conv2d

__all__ = [
    "BACKENDS",
    "MULS_DIRECT_PER_TILE",
    "MULS_WINOGRAD_PER_TILE",
    "avg_pool2d",
    "avg_pool2d_backward",
    "col2im",
    "conv2d",
    "conv2d_backward",
    "conv2d_flops",
    "conv2d_forward",
    "conv2d_tiled",
    "conv_out_size",
    "conv_output_size",
    "cpp_available",
    "deform_conv2d",
    "deform_conv2d_direct",
    "deform_im2col",
    "fold_batchnorm",
    "fold_channel_scale",
    "fold_input_affine",
    "fold_linear_chain",
    "im2col",
    "im2col_workspace_bytes",
    "linear_chain_cost",
    "max_pool2d",
    "max_pool2d_backward",
    "sampling_footprint",
    "winograd_conv2d",
]
