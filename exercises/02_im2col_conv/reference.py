"""Reference answers for exercises/02_im2col_conv: thin adapters over tinylearn.conv."""

from __future__ import annotations

import numpy as np

from tinylearn.conv import col2im as _col2im
from tinylearn.conv import conv2d as _conv2d
from tinylearn.conv import conv2d_backward as _conv2d_backward
from tinylearn.conv import conv_output_size as _conv_output_size
from tinylearn.conv import im2col as _im2col
from tinylearn.conv.winograd import input_transform


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    return _conv_output_size(size, kernel, stride, padding, dilation)


def im2col(x: np.ndarray, kernel_size: int, stride: int = 1, padding: int = 0) -> np.ndarray:
    return _im2col(x, kernel_size, stride, padding)


def col2im(
    cols: np.ndarray, output_size: tuple[int, int], kernel_size: int, stride: int = 1, padding: int = 0
) -> np.ndarray:
    return _col2im(cols, output_size, kernel_size, stride, padding)


def conv2d_im2col(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, stride: int = 1, padding: int = 0
) -> np.ndarray:
    return _conv2d(x, w, b, stride, padding)


def conv2d_weight_grad(
    x: np.ndarray, grad_out: np.ndarray, kernel_size: int, stride: int = 1, padding: int = 0
) -> np.ndarray:
    N, C = x.shape[:2]
    OC = grad_out.shape[1]
    w = np.zeros((OC, C, kernel_size, kernel_size), dtype=x.dtype)
    return _conv2d_backward(grad_out, x, w, stride, padding, needs=(False, True, False))[1]


def winograd_input_transform(d: np.ndarray) -> np.ndarray:
    return input_transform(np.asarray(d))
