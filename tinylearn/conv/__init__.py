"""Convolution lowered to GEMM: im2col / col2im (three backends), conv2d forward/backward, pooling, Winograd
F(2x2, 3x3), Conv+BN folding and the tiled-im2col memory lesson. numpy arrays in and out.

    tl.conv.im2col(x, kernel_size, stride=1, padding=0, dilation=1, backend="numpy"|"numba"|"cpp"|None)  [N, C*kh*kw, L]
    tl.conv.col2im(cols, output_size, kernel_size, stride=1, padding=0, dilation=1, backend=...)     [N, C, H, W]
    tl.conv.conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, backend=...)
    tl.conv.winograd_conv2d(x, w, bias=None, padding=0)
    tl.conv.fold_batchnorm(conv_w, conv_b, bn_mean, bn_var, bn_gamma, bn_beta, eps) -> (w', b')

n-d breadth (torch signatures, autograd, on tl.Tensors; re-exported by tinylearn.nn.functional):
    functional_nd: conv1d conv3d conv_transpose1d/2d/3d, max/avg_pool1d/3d (ceil_mode, return_indices,
    count_include_pad, divisor_override), max_unpool1d/2d/3d, adaptive_avg/max_pool1d/2d/3d, interpolate
    numpy kernels: convnd.py (3-D im2col/col2im built from the 2-D kernels), poolnd.py (windows, adaptive, resampling)

Layouts are those of torch.nn.functional.unfold / fold / conv2d. numba is imported only when asked for. Backends
dispatch through ``tinylearn.backends`` (ops ``conv.im2col``, ``conv.col2im``); ``backend=None`` = fastest here.
"""

from ._params import BACKENDS, conv_out_size, conv_output_size, cpp_available
from .batchnorm_fold import fold_batchnorm
from .conv2d import conv2d, conv2d_backward, conv2d_flops, conv2d_forward
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
    "fold_batchnorm",
    "fold_channel_scale",
    "fold_input_affine",
    "fold_linear_chain",
    "im2col",
    "im2col_workspace_bytes",
    "linear_chain_cost",
    "max_pool2d",
    "max_pool2d_backward",
    "winograd_conv2d",
]
