"""Differentiable resampling and layout ops on tl.Tensors (torch signatures): interpolate / upsample, unfold / fold
(im2col / col2im with autograd), pixel_shuffle / pixel_unshuffle.

    interpolate  separable per axis (``poolnd.interp_*``): nearest, nearest-exact, linear/bilinear/trilinear,
                 bicubic (Keys, A=-0.75), area (= adaptive average pooling)
    unfold       im2col (op ``conv.im2col``), backward col2im; fold the reverse
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd.function import Function
from ..autograd.tensor import Tensor
from . import poolnd as P
from ._params import as_float_array
from ._tensor_args import as_tensor, backend_for, batched, unbatch
from .functional_pool_adaptive import AdaptiveAvgPoolFunction
from .im2col import col2im, im2col


class InterpolateFunction(Function):
    @staticmethod
    def forward(ctx, x, out=(1,), scales=(None,), mode="nearest", align_corners=False):
        x = as_float_array(x, "input")
        taps = [
            P.interp_axis(L, O, mode, align_corners, sc, x.dtype)
            for L, O, sc in zip(x.shape[2:], out, scales, strict=True)
        ]
        # small axes: one dense [O, L] matrix per axis and BLAS products (a non-finite input keeps the taps: 0 * inf
        # in the dense product would spread NaN over the whole row)
        mats = P.interp_matrices(taps, x.shape[2:], x.dtype) if np.isfinite(x).all() else None
        ctx.args = (taps, x.shape[2:], mats)
        return P.interp_forward(x, taps) if mats is None else P.interp_forward_dense(x, mats)

    @staticmethod
    def backward(ctx, gy):
        taps, spatial, mats = ctx.args
        if mats is not None and gy.dtype == mats[0].dtype and np.isfinite(gy).all():
            return P.interp_backward_dense(gy, mats)
        return P.interp_backward(gy, spatial, taps)


_LINEAR_DIMS = {"linear": 3, "bilinear": 4, "trilinear": 5}


def interpolate(
    input: Tensor,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> Tensor:
    """torch.nn.functional.interpolate for modes nearest, nearest-exact, linear/bilinear/trilinear, bicubic, area
    (3-D/4-D/5-D input = 1/2/3 spatial dims)."""
    x = as_tensor(input, "input")
    if x.ndim not in (3, 4, 5):
        raise ValueError(f"input: interpolate expects a 3-D, 4-D or 5-D [N, C, *spatial] tensor, got {x.shape}")
    nd = x.ndim - 2
    if mode in _LINEAR_DIMS:
        if _LINEAR_DIMS[mode] != x.ndim:
            raise ValueError(f"mode: {mode!r} needs a {_LINEAR_DIMS[mode]}-D input, got shape {tuple(x.shape)}")
    elif mode == "bicubic":
        if x.ndim != 4:
            raise ValueError(f"mode: 'bicubic' needs a 4-D input, got shape {tuple(x.shape)}")
    elif mode in ("nearest", "nearest-exact", "area"):
        if align_corners is not None:
            raise ValueError(
                "align_corners: can only be set with the interpolating modes linear | bilinear | trilinear, "
                f"got mode={mode!r}"
            )
    else:
        raise ValueError(
            f"mode: unknown mode {mode!r}; expected nearest, nearest-exact, linear, bilinear, bicubic, trilinear, area"
        )
    if antialias:
        raise ValueError("antialias: must be False (antialiased interpolation is not supported)")
    out, scales = P.interp_output_size(tuple(x.shape[2:]), size, scale_factor)
    if recompute_scale_factor:
        scales = [None] * nd
    if mode == "area":
        return AdaptiveAvgPoolFunction.apply(x, output_size=out)
    return InterpolateFunction.apply(
        x,
        out=out,
        scales=tuple(scales),
        mode="linear" if mode in _LINEAR_DIMS else ("cubic" if mode == "bicubic" else mode),
        align_corners=bool(align_corners),
    )


def upsample(
    input: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest", align_corners: bool | None = None
) -> Tensor:
    """Deprecated torch alias of interpolate."""
    return interpolate(input, size, scale_factor, mode, align_corners)


class UnfoldFunction(Function):
    @staticmethod
    def forward(ctx, x, kernel_size=1, dilation=1, padding=0, stride=1):
        x = as_float_array(x, "input")
        be = backend_for(x)
        ctx.args = (x.shape[2:], kernel_size, stride, padding, dilation, be)
        return im2col(x, kernel_size, stride, padding, dilation, backend=be)

    @staticmethod
    def backward(ctx, g):
        size, k, s, p, d, be = ctx.args
        return col2im(np.ascontiguousarray(g), size, k, s, p, d, backend=be)


class FoldFunction(Function):
    @staticmethod
    def forward(ctx, cols, output_size=1, kernel_size=1, dilation=1, padding=0, stride=1):
        cols = as_float_array(cols, "input")
        be = backend_for(cols)
        ctx.args = (kernel_size, stride, padding, dilation, be)
        return col2im(np.ascontiguousarray(cols), output_size, kernel_size, stride, padding, dilation, backend=be)

    @staticmethod
    def backward(ctx, g):
        k, s, p, d, be = ctx.args
        return im2col(np.ascontiguousarray(g), k, s, p, d, backend=be)


def unfold(input: Tensor, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1) -> Tensor:
    """torch.nn.functional.unfold (im2col): [N, C, H, W] -> [N, C*kh*kw, L]; the backward is col2im."""
    x, sq = batched(input, 2, "unfold")
    return unbatch(
        UnfoldFunction.apply(x, kernel_size=kernel_size, dilation=dilation, padding=padding, stride=stride), sq
    )


def fold(
    input: Tensor, output_size: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1
) -> Tensor:
    """torch.nn.functional.fold (col2im, overlaps summed): [N, C*kh*kw, L] -> [N, C, H, W]; the backward is im2col."""
    x = as_tensor(input, "input")
    if x.ndim not in (2, 3):
        raise ValueError(f"input: fold expects a 2-D [C*kh*kw, L] or 3-D [N, C*kh*kw, L] tensor, got {tuple(x.shape)}")
    sq = x.ndim == 2
    x = x.unsqueeze(0) if sq else x
    y = FoldFunction.apply(
        x, output_size=output_size, kernel_size=kernel_size, dilation=dilation, padding=padding, stride=stride
    )
    return unbatch(y, sq)


def _factor(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"{name}: must be a positive int, got {v!r}")
    return int(v)


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """torch.nn.functional.pixel_shuffle: [*, C*r*r, H, W] -> [*, C, H*r, W*r] (a reshape + permute)."""
    x = as_tensor(input, "input")
    r = _factor(upscale_factor, "upscale_factor")
    if x.ndim < 3:
        raise ValueError(f"input: pixel_shuffle expects at least 3 dims [*, C, H, W], got shape {tuple(x.shape)}")
    *lead, C, H, W = x.shape
    if C % (r * r):
        raise ValueError(f"upscale_factor: channels {C} (input shape {tuple(x.shape)}) not divisible by {r}*{r}")
    n = len(lead)
    y = x.reshape(*lead, C // (r * r), r, r, H, W)
    y = y.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return y.reshape(*lead, C // (r * r), H * r, W * r)


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """torch.nn.functional.pixel_unshuffle: [*, C, H*r, W*r] -> [*, C*r*r, H, W] (inverse of pixel_shuffle)."""
    x = as_tensor(input, "input")
    r = _factor(downscale_factor, "downscale_factor")
    if x.ndim < 3:
        raise ValueError(f"input: pixel_unshuffle expects at least 3 dims [*, C, H, W], got shape {tuple(x.shape)}")
    *lead, C, H, W = x.shape
    if H % r or W % r:
        raise ValueError(f"downscale_factor: spatial size {(H, W)} (input shape {tuple(x.shape)}) not divisible by {r}")
    n = len(lead)
    y = x.reshape(*lead, C, H // r, r, W // r, r)
    y = y.permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return y.reshape(*lead, C * r * r, H // r, W // r)


__all__ = [
    "FoldFunction",
    "InterpolateFunction",
    "UnfoldFunction",
    "fold",
    "interpolate",
    "pixel_shuffle",
    "pixel_unshuffle",
    "unfold",
    "upsample",
]
