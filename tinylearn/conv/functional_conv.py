"""Differentiable convolutions on tl.Tensors (torch signatures): conv1d / conv2d / conv3d and conv_transpose1d/2d/3d.

One autograd Function per family, any number of spatial dims (torch's ``_ConvNd`` pattern):

    ConvNdFunction           y = W @ cols(x) + b;  dW = dY @ colsᵀ, dX = col2im(Wᵀ @ dY), db = sum dY
        ndim 2 (conv2d):     the registered 2-D kernels, op ``conv.conv2d`` / ``conv.conv2d_backward``
                             (``tinylearn.conv.conv2d``: cpp auto/v0..v3, numpy, numba; the cols are kept for dW);
                             the backward runs the (backend, version) the forward resolved
        ndim 1, 3:           the 3-D column matrix built from the 2-D ``conv.im2col`` kernel (``convnd.py``)
    ConvTransposeNdFunction  the adjoint of conv: y = col2im(Wᵀ @ x) + b (``convnd.py``)

padding='same' / 'valid' (torch's string padding; 'same' with an even dilated kernel pads one more cell at the right
end) and unbatched [C, *spatial] inputs are handled here for every ndim. Kernels are chosen by
``tinylearn.backends``: ``backends.use("conv.conv2d", backend=..., version=...)`` pins the 2-D one,
``backends.use("conv.im2col" / "conv.col2im", ...)`` those of the other ndims.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import backends
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from . import convnd as K
from ._params import ntuple
from ._tensor_args import as_tensor, backend_for, batched, common_dtype, per_ndim, unbatch
from .conv2d import conv2d_backward, conv2d_forward


def _same_padding(padding: Any, k: tuple[int, ...], stride: Any, dilation: Any, nd: int) -> tuple:
    """'valid' / 'same' (torch's string padding) -> (symmetric padding, extra right padding) per axis."""
    if padding == "valid":
        return (0,) * nd, (0,) * nd
    if ntuple(stride, nd, "stride") != (1,) * nd:
        raise ValueError(f"padding: padding='same' is not supported for strided convolutions (stride={stride})")
    d = ntuple(dilation, nd, "dilation")
    tot = [d[i] * (k[i] - 1) for i in range(nd)]
    return tuple(t // 2 for t in tot), tuple(t - t // 2 - t // 2 for t in tot)


class ConvNdFunction(Function):
    @staticmethod
    def forward(ctx, x, w, b=None, stride=1, padding=0, dilation=1, groups=1, nd=2, name="conv2d"):
        dts = (x.dtype, w.dtype, None if b is None else b.dtype)
        x, w, b = common_dtype(x, w, b)
        extra = (0,) * nd
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"padding: expected an int, a tuple, 'same' or 'valid', got {padding!r}")
            if w.ndim != nd + 2:
                raise ValueError(f"weight: {name} expects a {nd + 2}-D weight, got shape {w.shape}")
            padding, extra = _same_padding(padding, w.shape[2:], stride, dilation, nd)
            if any(extra):
                x = np.pad(x, ((0, 0), (0, 0)) + tuple((0, e) for e in extra))
        be, ver = backend_for(x, w), None
        if nd == 2:  # the registered 2-D kernels (conv.conv2d), which validate with their own messages
            # the forward's (backend, version) also runs the backward: a pin of conv.conv2d governs both passes
            be, ver, _ = backends.resolve("conv.conv2d", be, None, (x,))
            y, cols = conv2d_forward(x, w, b, stride, padding, dilation, groups, backend=be, version=ver)
            geo: tuple = (stride, padding, dilation, groups)
        else:
            geo = K.conv_geometry(
                x.shape, w.shape, None if b is None else b.shape, stride, padding, dilation, groups, nd, name
            )
            y, cols = K.conv_nd_forward(x, w, b, *geo, be)
        ctx.save_for_backward(x, w, cols)
        ctx.args = (nd, geo, be, ver, extra, dts)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w, cols = ctx.saved_tensors
        nd, geo, be, ver, extra, dts = ctx.args
        n = ctx.needs_input_grad
        needs = (n[0], n[1], len(n) > 2 and n[2])
        gy = gy.astype(x.dtype, copy=False)
        if nd == 2:
            dx, dw, db = conv2d_backward(gy, x, w, *geo, backend=be, version=ver, cols=cols, needs=needs)
        else:
            dx, dw, db = K.conv_nd_backward(gy, x, w, cols, *geo, be, needs)
        if dx is not None and any(extra):
            dx = dx[(Ellipsis,) + tuple(slice(0, x.shape[2 + i] - e) for i, e in enumerate(extra))]
        return tuple(None if g is None else g.astype(dt, copy=False) for g, dt in zip((dx, dw, db), dts, strict=True))


Conv2dFunction = ConvNdFunction  # the 2-D name of the one conv Function (ndim 2 runs the registered 2-D kernels)


def _apply(function: type, nd: int, name: str, input, weight, bias, **geometry: Any) -> Tensor:
    """One conv-like Function on ``input`` with or without its batch dimension (torch accepts both)."""
    x, sq = batched(input, nd, name)
    w, b = as_tensor(weight, "weight"), None if bias is None else as_tensor(bias, "bias")
    return unbatch(function.apply(x, w, b, **geometry, nd=nd, name=name), sq)


def _conv(nd: int, name: str, input, weight, bias, stride, padding, dilation, groups) -> Tensor:
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    return _apply(ConvNdFunction, nd, name, input, weight, bias, **geometry)


@per_ndim("conv{nd}d")
def _conv_fn(nd: int, name: str) -> Callable[..., Tensor]:
    """torch.nn.functional.conv{nd}d with torch's signature (one definition for every ndim)."""

    def fn(
        input: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
    ) -> Tensor:
        return _conv(nd, name, input, weight, bias, stride, padding, dilation, groups)

    return fn


conv1d = _conv_fn(1, "torch.nn.functional.conv1d: input [N, C, L], weight [OC, C/groups, k] (im2col + GEMM).")
conv3d = _conv_fn(3, "torch.nn.functional.conv3d: input [N, C, D, H, W], weight [OC, C/groups, kd, kh, kw].")


def conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """torch.nn.functional.conv2d: input [N, C, H, W] (or [C, H, W]), weight [OC, C/groups, kh, kw]; padding may be
    'same' / 'valid'. Runs the registered 2-D kernels (op ``conv.conv2d``)."""
    return _conv(2, "conv2d", x, weight, bias, stride, padding, dilation, groups)


conv2d_nd = conv2d  # the name of conv2d's former n-d route (string padding, unbatched input)


class ConvTransposeNdFunction(Function):
    @staticmethod
    def forward(ctx, x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, nd=2, name="c"):
        dts = (x.dtype, w.dtype, None if b is None else b.dtype)
        x, w, b = common_dtype(x, w, b)
        g, k, s, p, d, size, cols_out, geo_out = K.conv_transpose_geometry(
            x.shape,
            w.shape,
            None if b is None else b.shape,
            stride,
            padding,
            output_padding,
            dilation,
            groups,
            nd,
            name,
        )
        # the compiled col2im derives the window count from the geometry: output_padding >= stride needs numpy
        be = backend_for(x, w) if tuple(cols_out) == tuple(geo_out) else "numpy"
        y = K.conv_transpose_nd_forward(x, w, b, g, k, s, p, d, size, cols_out, be)
        ctx.save_for_backward(x, w)
        ctx.args = ((g, k, s, p, d, cols_out), be, dts)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        geo, be, dts = ctx.args
        needs = ctx.needs_input_grad
        grads = K.conv_transpose_nd_backward(
            gy.astype(x.dtype, copy=False), x, w, *geo, be, (needs[0], needs[1], len(needs) > 2 and needs[2])
        )
        return tuple(None if g is None else g.astype(dt, copy=False) for g, dt in zip(grads, dts, strict=True))


def _conv_t(nd, name, input, weight, bias, stride, padding, output_padding, groups, dilation) -> Tensor:
    geometry = {"stride": stride, "padding": padding, "output_padding": output_padding}
    return _apply(ConvTransposeNdFunction, nd, name, input, weight, bias, **geometry, groups=groups, dilation=dilation)


@per_ndim("conv_transpose{nd}d")
def _conv_transpose_fn(nd: int, name: str) -> Callable[..., Tensor]:
    """torch.nn.functional.conv_transpose{nd}d with torch's signature (one definition for every ndim)."""

    def fn(
        input: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        dilation: Any = 1,
    ) -> Tensor:
        return _conv_t(nd, name, input, weight, bias, stride, padding, output_padding, groups, dilation)

    return fn


conv_transpose1d = _conv_transpose_fn(
    1, "torch.nn.functional.conv_transpose1d: weight [C_in, C_out/groups, k]; the adjoint of conv1d."
)
conv_transpose2d = _conv_transpose_fn(
    2, "torch.nn.functional.conv_transpose2d: weight [C_in, C_out/groups, kh, kw]; the adjoint of conv2d."
)
conv_transpose3d = _conv_transpose_fn(
    3, "torch.nn.functional.conv_transpose3d: weight [C_in, C_out/groups, kd, kh, kw]; the adjoint of conv3d."
)


__all__ = [
    "Conv2dFunction",
    "ConvNdFunction",
    "ConvTransposeNdFunction",
    "conv1d",
    "conv2d",
    "conv2d_nd",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
]
