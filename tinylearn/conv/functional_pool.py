"""Differentiable pooling on tl.Tensors (torch signatures): max / avg / lp pools over 1-3 spatial dims.

One stack for every ndim (numpy kernels in ``poolnd.py``: windows as strided views, ceil_mode, torch's flat indices);
the 2-D floor-mode cases take the registered 2-D kernels:

    max_pool2d  op ``conv.max_pool2d``: cpp = the direct C++ kernel (``_C.kernels.maxpool2d_forward/backward``:
                one pass over each window, int64 argmax positions saved; ``MaxPool2dDirect``), numpy / numba = the
                im2col windows + argmax, dY scattered back through that backend's col2im (``MaxPool2dFunction``)
    avg_pool2d  windows / divisor, dY / divisor spread back through col2im (``AvgPool2dFunction``, op ``conv.col2im``)

``backend=None`` everywhere: the registry's choice (the direct kernel when ``_C.kernels`` has it), or what
``backends.use("conv.max_pool2d", backend=...)`` / ``backends.use("conv.col2im", ...)`` pins. Adaptive pools and
max_unpool are in ``functional_pool_adaptive.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import backends
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from . import poolnd as P
from ._params import as_float_array, as_pool_array, ntuple
from ._tensor_args import as_tensor, backend_for, batched, per_ndim, unbatch
from .im2col import _native_dtype
from .pooling import _pool_params, avg_pool2d_backward, max_pool2d_backward
from .pooling import avg_pool2d as _avg_pool2d
from .pooling import max_pool2d as _max_pool2d


# ----------------------------------------------------------------------------- the 2-D kernels
class MaxPool2dFunction(Function):
    """Max pooling through the im2col windows + argmax; backward scatters dY through col2im on ``backend``
    (None: the registry's choice)."""

    @staticmethod
    def forward(ctx, x, kernel_size, stride=None, padding=0, dilation=1, backend=None):
        y, idx = _max_pool2d(x, kernel_size, stride, padding, dilation, return_indices=True)
        ctx.save_for_backward(idx)
        ctx.args = (x.shape, x.dtype, kernel_size, stride, padding, dilation, backend or backend_for(x))
        return y

    @staticmethod
    def backward(ctx, grad_out):
        (idx,) = ctx.saved_tensors
        shape, dtype, k, s, p, d, be = ctx.args
        return max_pool2d_backward(grad_out, idx, shape, k, s, p, d, backend=be).astype(dtype, copy=False)


def _direct_pool_kernels() -> Any:
    """``_C.kernels`` when it has the direct max-pooling kernels, else None."""
    if not backends.C_available("kernels"):
        return None
    k = backends.load_C("kernels")
    return k if hasattr(k, "maxpool2d_forward") else None


class MaxPool2dDirect(Function):
    """Max pooling through the direct C++ kernels (cpp_src/kernels_maxpool2d.cpp): y and the flat h*W + w argmax
    of each window in one pass, no window copy; only the int64 positions are saved for backward."""

    @staticmethod
    def forward(ctx, x, k, s, p, d, out):
        x = np.ascontiguousarray(x)
        y, idx = backends.load_C("kernels").maxpool2d_forward(x, k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1], *out)
        ctx.save_for_backward(idx)
        ctx.hw = x.shape[2:]
        return y

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        dx = backends.load_C("kernels").maxpool2d_backward(np.ascontiguousarray(g), idx, *ctx.hw)
        return dx, None, None, None, None, None


def _im2col_max_pool(backend: str) -> Any:
    def fn(x: Tensor, k, s, p, d, out) -> Tensor:
        return MaxPool2dFunction.apply(x, k, stride=s, padding=p, dilation=d, backend=backend)

    fn.__name__ = f"max_pool2d_{backend}"
    return fn


def _direct_max_pool(x: Tensor, k, s, p, d, out) -> Tensor:
    return MaxPool2dDirect.apply(x, k, s, p, d, out)


def _example_max_pool(rng: np.random.Generator) -> tuple[tuple, dict]:
    """Overlapping, padded, dilated windows on a float32 [2, 3, 11, 10] input (the conformance test's case)."""
    x = Tensor(rng.standard_normal((2, 3, 11, 10)).astype(np.float32))
    return (x, *_pool_params(x.shape, 3, 2, 1, (1, 2))), {}


# op conv.max_pool2d on a 4-D Tensor with validated (k, s, p, d, out) pairs (floor mode)
backends.register(
    "conv.max_pool2d",
    "numpy",
    _im2col_max_pool("numpy"),
    example=_example_max_pool,
    compared=lambda y: y.numpy(),
)
backends.register("conv.max_pool2d", "numba", _im2col_max_pool("numba"), priority=5, when=_native_dtype)
backends.register(
    "conv.max_pool2d",
    "cpp",
    _direct_max_pool,
    version="direct",
    when=_native_dtype,
    available=lambda: _direct_pool_kernels() is not None,
)


def max_pool2d_im2col(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1) -> Tensor:
    """Max pooling through the im2col windows + argmax (``MaxPool2dFunction``) whatever the backend: the rung
    before the direct kernel (floor mode, 4-D; the same values as ``max_pool2d``)."""
    return MaxPool2dFunction.apply(x, kernel_size, stride=stride, padding=padding, dilation=dilation)


class AvgPool2dFunction(Function):
    @staticmethod
    def forward(ctx, x, kernel_size, stride=None, padding=0, count_include_pad=True):
        ctx.args = (x.shape, x.dtype, kernel_size, stride, padding, count_include_pad, backend_for(x))
        return _avg_pool2d(x, kernel_size, stride, padding, count_include_pad)

    @staticmethod
    def backward(ctx, grad_out):
        shape, dtype, k, s, p, cip, be = ctx.args
        return avg_pool2d_backward(grad_out, shape, k, s, p, cip, backend=be).astype(dtype, copy=False)


# ----------------------------------------------------------------------------- every ndim
class ArgmaxPoolFunction(Function):
    """Base of the max pools that return (y, flat input indices): the indices are saved and not differentiable,
    and dY is scatter-added to them (``forward`` computes them with ``_pool``)."""

    @staticmethod
    def _pool(x: np.ndarray, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        raise TypeError("ArgmaxPoolFunction is a base class: use a subclass that defines _pool")

    @classmethod
    def forward(cls, ctx, x, **kwargs):
        x = as_pool_array(x, "input")  # integer inputs keep their dtype, as torch's max pools
        y, idx = cls._pool(x, **kwargs)
        ctx.save_for_backward(idx)
        ctx.shape = x.shape
        ctx.mark_non_differentiable(1)
        return y, idx

    @staticmethod
    def backward(ctx, gy, gidx=None):
        (idx,) = ctx.saved_tensors
        return P.scatter_add_flat(gy, idx, ctx.shape)


class MaxPoolNdFunction(ArgmaxPoolFunction):
    @staticmethod
    def _pool(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
        k, s, p, d, out, extra = P.pool_geometry(x.shape[2:], kernel_size, stride, padding, dilation, ceil_mode)
        return P.max_pool_nd(x, k, s, p, d, out, extra)


def _max_pool(nd, name, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    x, sq = batched(input, nd, name)
    integer = x.dtype.kind in "iu"  # integer inputs: the n-d numpy kernels, which keep the dtype (the 2-D ones cast)
    if nd == 2 and not ceil_mode and not return_indices and not integer:  # registered 2-D kernels (conv.max_pool2d)
        k, s, p, d, out = _pool_params(x.shape, kernel_size, stride, padding, dilation)
        return unbatch(backends.dispatch("conv.max_pool2d", x, k, s, p, d, out, backend=backend_for(x)), sq)
    y, idx = MaxPoolNdFunction.apply(
        x, kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation, ceil_mode=bool(ceil_mode)
    )
    return unbatch((y, idx), sq) if return_indices else unbatch(y, sq)


@per_ndim("max_pool{nd}d")
def _max_pool_fn(nd: int, name: str) -> Callable[..., Any]:
    """torch.nn.functional.max_pool{nd}d with torch's signature (one definition for every ndim)."""

    def fn(
        input: Tensor,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        ceil_mode: bool = False,
        return_indices: bool = False,
    ) -> Any:
        return _max_pool(nd, name, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    return fn


max_pool1d = _max_pool_fn(1, "torch.nn.functional.max_pool1d (indices index the input's L axis).")
max_pool3d = _max_pool_fn(3, "torch.nn.functional.max_pool3d (indices are d*H*W + h*W + w).")


def max_pool2d(
    x: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """torch.nn.functional.max_pool2d; the gradient flows to the first maximum of each window (like torch).
    Floor mode without indices runs op ``conv.max_pool2d`` (cpp: the direct kernel; numpy/numba: im2col windows);
    ceil_mode / return_indices (flat h*W + w indices, as torch returns them) run the n-d kernels."""
    return _max_pool(2, "max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


class AvgPoolNdFunction(Function):
    @staticmethod
    def forward(
        ctx, x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
    ):
        x = as_float_array(x, "input")
        if divisor_override is not None and (isinstance(divisor_override, bool) or int(divisor_override) == 0):
            raise ValueError(f"divisor_override: must be a non-zero int, got {divisor_override!r}")
        k, s, p, _, out, extra = P.pool_geometry(x.shape[2:], kernel_size, stride, padding, 1, ceil_mode)
        ctx.args = (x.shape, k, s, p, out, extra, bool(count_include_pad), divisor_override)
        return P.avg_pool_nd(x, k, s, p, out, extra, bool(count_include_pad), divisor_override)

    @staticmethod
    def backward(ctx, gy):
        return P.avg_pool_nd_backward(gy, *ctx.args)


def _avg_pool(nd, name, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    x, sq = batched(input, nd, name)
    if nd == 2 and not ceil_mode and divisor_override is None:  # windows + col2im backward (op conv.col2im)
        y = AvgPool2dFunction.apply(x, kernel_size, stride=stride, padding=padding, count_include_pad=count_include_pad)
        return unbatch(y, sq)
    y = AvgPoolNdFunction.apply(
        x,
        kernel_size,
        stride=stride,
        padding=padding,
        ceil_mode=bool(ceil_mode),
        count_include_pad=count_include_pad,
        divisor_override=divisor_override,
    )
    return unbatch(y, sq)


def avg_pool1d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Tensor:
    """torch.nn.functional.avg_pool1d."""
    return _avg_pool(1, "avg_pool1d", input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(
    x: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """torch.nn.functional.avg_pool2d (same argument order); floor mode without divisor_override spreads dY back
    through col2im (op ``conv.col2im``), the rest runs the n-d kernels."""
    return _avg_pool(2, "avg_pool2d", x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def avg_pool3d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """torch.nn.functional.avg_pool3d."""
    return _avg_pool(
        3, "avg_pool3d", input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


max_pool2d_nd = max_pool2d  # the names of the former n-d routes of the 2-D pools
avg_pool2d_nd = avg_pool2d


def _lp_pool(nd: int, input, norm_type, kernel_size, stride, ceil_mode) -> Tensor:
    x = as_tensor(input, "input")
    k = ntuple(kernel_size, nd, "kernel_size")
    pool = {1: avg_pool1d, 2: avg_pool2d, 3: avg_pool3d}[nd]
    out = pool(x ** float(norm_type), k, stride, 0, ceil_mode)
    return (out.sign() * out.abs().relu() * float(np.prod(k))) ** (1.0 / float(norm_type))


@per_ndim("lp_pool{nd}d")
def _lp_pool_fn(nd: int, name: str) -> Callable[..., Tensor]:
    """torch.nn.functional.lp_pool{nd}d with torch's signature (one definition for every ndim)."""

    def fn(input: Tensor, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False) -> Tensor:
        return _lp_pool(nd, input, norm_type, kernel_size, stride, ceil_mode)

    return fn


lp_pool1d = _lp_pool_fn(1, "torch.nn.functional.lp_pool1d: (sum over the window of x**p) ** (1/p).")
lp_pool2d = _lp_pool_fn(2, "torch.nn.functional.lp_pool2d.")
lp_pool3d = _lp_pool_fn(3, "torch.nn.functional.lp_pool3d.")


__all__ = [
    "ArgmaxPoolFunction",
    "AvgPool2dFunction",
    "AvgPoolNdFunction",
    "MaxPool2dDirect",
    "MaxPool2dFunction",
    "MaxPoolNdFunction",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool2d_nd",
    "avg_pool3d",
    "lp_pool1d",
    "lp_pool2d",
    "lp_pool3d",
    "max_pool1d",
    "max_pool2d",
    "max_pool2d_im2col",
    "max_pool2d_nd",
    "max_pool3d",
]
