"""Exercises for notebook 02 (im2col convolution). Replace each ``raise NotImplementedError`` with your code.

Run the tests:  pytest exercises/02_im2col_conv            (your stubs)
                pytest exercises/02_im2col_conv --impl=reference   (tinylearn's answers)

Conventions: NCHW arrays, torch.nn.functional.unfold layout for columns:
    cols[n, (c*kh + i)*kw + j, oh*OW + ow] = xpad[n, c, oh*s + i, ow*s + j]

Each stub's NotImplementedError names the library function its reference answer (reference.py) calls.
"""

from __future__ import annotations

import numpy as np


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """Output length of a convolution along one axis (torch's floor formula).

    Raise ValueError (mentioning "kernel") when the dilated kernel does not fit in the padded input.
    """
    raise NotImplementedError("reference solution: tinylearn/conv/_params.py:conv_output_size")


def im2col(x: np.ndarray, kernel_size: int, stride: int = 1, padding: int = 0) -> np.ndarray:
    """x [N, C, H, W] -> cols [N, C*k*k, OH*OW] in F.unfold's layout (square kernel, zero padding).

    Hint: pad, then either loop over the k*k kernel offsets (copy a strided slab per offset) or build a 6-D view
    with numpy.lib.stride_tricks.as_strided. No Python loop over output pixels.
    """
    raise NotImplementedError("reference solution: tinylearn/conv/im2col.py:im2col")


def col2im(
    cols: np.ndarray, output_size: tuple[int, int], kernel_size: int, stride: int = 1, padding: int = 0
) -> np.ndarray:
    """The adjoint of im2col: cols [N, C*k*k, L] -> x [N, C, H, W], adding overlapping contributions (F.fold)."""
    raise NotImplementedError("reference solution: tinylearn/conv/im2col.py:col2im")


def conv2d_im2col(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, stride: int = 1, padding: int = 0
) -> np.ndarray:
    """conv2d (groups=1, square kernel) as im2col + one matrix multiply: y = W.reshape(OC, -1) @ cols (+ b)."""
    raise NotImplementedError("reference solution: tinylearn/conv/conv2d.py:conv2d")


def conv2d_weight_grad(
    x: np.ndarray, grad_out: np.ndarray, kernel_size: int, stride: int = 1, padding: int = 0
) -> np.ndarray:
    """dL/dW [OC, C, k, k] of y = conv2d(x, W) given dL/dy [N, OC, OH, OW]:  dW = sum_n dY_n @ cols_nᵀ."""
    raise NotImplementedError("reference solution: tinylearn/conv/conv2d.py:conv2d_backward")


def winograd_input_transform(d: np.ndarray) -> np.ndarray:
    """Bᵀ d B for F(2x2, 3x3) (Lavin & Gray); d is [..., 4, 4] (any leading dims), returns the same shape.

    Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
    """
    raise NotImplementedError("reference solution: tinylearn/conv/winograd.py:input_transform")
