"""Autograd Functions for conv2d / max_pool2d / avg_pool2d on tl.Tensors, built on the im2col kernels.

    Conv2d     forward: y = W @ im2col(x) + b  (cols kept for backward)
               backward: dW = dY @ colsᵀ, dX = col2im(Wᵀ @ dY), db = sum dY         (tinylearn.conv.conv2d)
    MaxPool2d  direct C++ kernel (``_C.kernels.maxpool2d_forward/backward``: one pass over each window, int64
               argmax positions saved) for 4-D float32/float64 floor-mode pools when _C is built and the pinned
               backend is None/"cpp"; otherwise im2col windows + argmax, backward scatters dY through col2im
    AvgPool2d  backward spreads dY / divisor over the window through col2im

max_pool2d(ceil_mode=/return_indices=), avg_pool2d(ceil_mode=/divisor_override=) and unbatched inputs go through
the n-d Functions of ``functional_nd`` (conv1d/3d, conv_transpose*, 1-d/3-d/adaptive pools, interpolate).

The im2col/col2im kernels come from ``tinylearn.backends`` (ops ``conv.im2col`` / ``conv.col2im``): by default the
registry's choice for the input (cpp when tinylearn._C is built, numpy for float16 or without it).
``set_backend("numpy"|"numba"|"cpp")`` pins one for these Functions (the torch-signature ``F.conv2d`` has no
``backend=``); ``set_backend(None)`` returns to the registry's choice. Dtypes the compiled kernels do not handle
(float16) still use numpy when a compiled backend is pinned.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ._params import check_backend
from .conv2d import conv2d_backward, conv2d_forward
from .pooling import _pool_params, avg_pool2d_backward, max_pool2d_backward
from .pooling import avg_pool2d as _avg_pool2d
from .pooling import max_pool2d as _max_pool2d

_STATE: dict[str, str | None] = {"backend": None}


def get_backend() -> str | None:
    """The pinned im2col backend of the autograd conv/pool Functions (None: the registry picks per input)."""
    return _STATE["backend"]


def set_backend(backend: str | None) -> None:
    """Pin the im2col/col2im backend used by the autograd conv/pool Functions (None: the registry's choice)."""
    _STATE["backend"] = check_backend(backend)


def _backend_for(*arrays: np.ndarray) -> str | None:
    be = get_backend()
    if be not in (None, "numpy") and any(a is not None and a.dtype not in (np.float32, np.float64) for a in arrays):
        return "numpy"
    return be


class Conv2dFunction(Function):
    @staticmethod
    def forward(ctx, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
        be = _backend_for(x, w)
        y, cols = conv2d_forward(x, w, b, stride, padding, dilation, groups, backend=be)
        ctx.save_for_backward(x, w, cols)
        ctx.args = (stride, padding, dilation, groups, be, None if b is None else b.dtype)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, w, cols = ctx.saved_tensors
        stride, padding, dilation, groups, be, b_dtype = ctx.args
        needs = ctx.needs_input_grad
        dx, dw, db = conv2d_backward(
            grad_out,
            x,
            w,
            stride,
            padding,
            dilation,
            groups,
            backend=be,
            cols=cols,
            needs=(needs[0], needs[1], len(needs) > 2 and needs[2]),
        )
        return (
            None if dx is None else dx.astype(x.dtype, copy=False),
            None if dw is None else dw.astype(w.dtype, copy=False),
            None if db is None else db.astype(b_dtype, copy=False),
        )


class MaxPool2dFunction(Function):
    @staticmethod
    def forward(ctx, x, kernel_size, stride=None, padding=0, dilation=1):
        y, idx = _max_pool2d(x, kernel_size, stride, padding, dilation, return_indices=True)
        ctx.save_for_backward(idx)
        ctx.args = (x.shape, x.dtype, kernel_size, stride, padding, dilation, _backend_for(x))
        return y

    @staticmethod
    def backward(ctx, grad_out):
        (idx,) = ctx.saved_tensors
        shape, dtype, k, s, p, d, be = ctx.args
        return max_pool2d_backward(grad_out, idx, shape, k, s, p, d, backend=be).astype(dtype, copy=False)


_kernels: Any = None


def _direct_pool_kernels() -> Any:
    """_C.kernels when it has the direct max-pooling kernels, else None (checked once)."""
    global _kernels
    if _kernels is None:
        k = backends.load_C("kernels") if backends.C_available("kernels") else None
        _kernels = k if k is not None and hasattr(k, "maxpool2d_forward") else False
    return _kernels or None


class MaxPool2dDirect(Function):
    """Max pooling through the direct C++ kernels (cpp_src/kernels_maxpool2d.cpp): y and the flat h*W + w argmax
    of each window in one pass, no window copy; only the int64 positions are saved for backward."""

    @staticmethod
    def forward(ctx, x, k, s, p, d, out):
        x = np.ascontiguousarray(x)
        y, idx = _direct_pool_kernels().maxpool2d_forward(x, k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1], *out)
        ctx.save_for_backward(idx)
        ctx.hw = x.shape[2:]
        return y

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        dx = _direct_pool_kernels().maxpool2d_backward(np.ascontiguousarray(g), idx, *ctx.hw)
        return dx, None, None, None, None, None


def _use_direct_pool(x: Any) -> bool:
    return (
        isinstance(x, Tensor)
        and x.ndim == 4
        and x.dtype in (np.float32, np.float64)
        and get_backend() in (None, "cpp")
        and _direct_pool_kernels() is not None
    )


class AvgPool2dFunction(Function):
    @staticmethod
    def forward(ctx, x, kernel_size, stride=None, padding=0, count_include_pad=True):
        ctx.args = (x.shape, x.dtype, kernel_size, stride, padding, count_include_pad, _backend_for(x))
        return _avg_pool2d(x, kernel_size, stride, padding, count_include_pad)

    @staticmethod
    def backward(ctx, grad_out):
        shape, dtype, k, s, p, cip, be = ctx.args
        return avg_pool2d_backward(grad_out, shape, k, s, p, cip, backend=be).astype(dtype, copy=False)


def conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """Differentiable conv2d (torch.nn.functional.conv2d semantics) via im2col + GEMM; padding='same'/'valid' and
    unbatched [C, H, W] input go through the n-d path of ``functional_nd`` (same kernels)."""
    if isinstance(padding, str) or (isinstance(x, Tensor) and x.ndim == 3):
        from .functional_nd import conv2d_nd

        return conv2d_nd(x, weight, bias, stride, padding, dilation, groups)
    return Conv2dFunction.apply(x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)


def max_pool2d(
    x: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """Differentiable max pooling (torch.nn.functional.max_pool2d signature); the gradient flows to the first
    maximum of each window (like torch). A 4-D float32/float64 Tensor in floor mode takes the direct C++ kernel
    (``MaxPool2dDirect``) unless a non-cpp backend is pinned (``set_backend``), then the im2col Function.
    ceil_mode / return_indices / unbatched input go through the n-d kernels of ``functional_nd`` (indices are
    flat h*W + w positions, as torch returns them)."""
    if ceil_mode or return_indices or not isinstance(x, Tensor) or x.ndim != 4:
        from .functional_nd import max_pool2d_nd

        return max_pool2d_nd(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    if _use_direct_pool(x):
        k, s, p, d, out = _pool_params(x.shape, kernel_size, stride, padding, dilation)
        return MaxPool2dDirect.apply(x, k, s, p, d, out)
    return max_pool2d_im2col(x, kernel_size, stride, padding, dilation)


def max_pool2d_im2col(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1) -> Tensor:
    """Max pooling through the im2col windows + argmax (``MaxPool2dFunction``) whatever the backend: the rung
    before the direct kernel (floor mode, 4-D; the same values as ``max_pool2d``)."""
    return MaxPool2dFunction.apply(x, kernel_size, stride=stride, padding=padding, dilation=dilation)


def avg_pool2d(
    x: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """Differentiable average pooling with torch.nn.functional.avg_pool2d's signature and argument order.
    ceil_mode, divisor_override and unbatched input go through the n-d kernels of ``functional_nd``."""
    if ceil_mode or divisor_override is not None or not isinstance(x, Tensor) or x.ndim != 4:
        from .functional_nd import avg_pool2d_nd

        return avg_pool2d_nd(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return AvgPool2dFunction.apply(x, kernel_size, stride=stride, padding=padding, count_include_pad=count_include_pad)
