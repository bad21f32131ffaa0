"""Autograd Functions and torch-signature wrappers: conv1d/conv3d, conv_transpose1d/2d/3d, 1-d/2-d/3-d max/avg
pools (ceil_mode, return_indices, count_include_pad, divisor_override), max_unpool, adaptive pools, interpolate.

The numpy kernels are in ``convnd.py`` (im2col-based conv / transposed conv) and ``poolnd.py`` (windows, adaptive,
interpolation); ``tinylearn.nn.functional`` re-exports the wrappers (via ``tinylearn.nn.functional_spatial``).
Unbatched inputs ([C, *spatial]) are accepted like torch: a batch axis is added and removed around the op.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd.function import Function
from ..autograd.tensor import Tensor
from . import convnd as K
from . import poolnd as P
from ._params import as_float_array, ntuple

_SPATIAL = {1: "L", 2: "H, W", 3: "D, H, W"}


def _tensor(x: Any, name: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        return Tensor(x)
    raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")


def _batched(x: Any, nd: int, name: str) -> tuple[Tensor, bool]:
    x = _tensor(x, "input")
    if x.ndim == nd + 2:
        return x, False
    if x.ndim == nd + 1:
        return x.unsqueeze(0), True
    raise ValueError(
        f"input: {name} expects a {nd + 1}-D [C, {_SPATIAL[nd]}] or {nd + 2}-D [N, C, {_SPATIAL[nd]}] tensor, "
        f"got shape {tuple(x.shape)}"
    )


def _unbatch(y: Any, squeeze: bool) -> Any:
    if not squeeze:
        return y
    if isinstance(y, tuple):
        return tuple(t.squeeze(0) for t in y)
    return y.squeeze(0)


def _be(*arrays: np.ndarray) -> str | None:
    from .functional import _backend_for  # the backend pinned by tinylearn.conv.functional.set_backend

    return _backend_for(*arrays)


def _common(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> tuple:
    x, w = as_float_array(x, "input"), as_float_array(w, "weight")
    b = None if b is None else as_float_array(b, "bias")
    dt = np.result_type(x.dtype, w.dtype) if b is None else np.result_type(x.dtype, w.dtype, b.dtype)
    return x.astype(dt, copy=False), w.astype(dt, copy=False), None if b is None else b.astype(dt, copy=False)


def _same_padding(padding: Any, k: tuple[int, ...], stride: Any, dilation: Any, nd: int) -> tuple:
    """'valid' / 'same' (torch's string padding) -> (symmetric padding, extra right padding) per axis."""
    if padding == "valid":
        return (0,) * nd, (0,) * nd
    if ntuple(stride, nd, "stride") != (1,) * nd:
        raise ValueError(f"padding: padding='same' is not supported for strided convolutions (stride={stride})")
    d = ntuple(dilation, nd, "dilation")
    tot = [d[i] * (k[i] - 1) for i in range(nd)]
    return tuple(t // 2 for t in tot), tuple(t - t // 2 - t // 2 for t in tot)


# ----------------------------------------------------------------------------- convolution
class ConvNdFunction(Function):
    @staticmethod
    def forward(ctx, x, w, b=None, stride=1, padding=0, dilation=1, groups=1, nd=1, name="conv"):
        x0, w0, b0 = x.dtype, w.dtype, None if b is None else b.dtype
        x, w, b = _common(x, w, b)
        extra = (0,) * nd
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"padding: expected an int, a tuple, 'same' or 'valid', got {padding!r}")
            if w.ndim != nd + 2:
                raise ValueError(f"weight: {name} expects a {nd + 2}-D weight, got shape {w.shape}")
            padding, extra = _same_padding(padding, w.shape[2:], stride, dilation, nd)
            if any(extra):
                x = np.pad(x, ((0, 0), (0, 0)) + tuple((0, e) for e in extra))
        geo = K.conv_geometry(
            x.shape, w.shape, None if b is None else b.shape, stride, padding, dilation, groups, nd, name
        )
        be = _be(x, w)
        y, cols = K.conv_nd_forward(x, w, b, *geo, be)
        ctx.save_for_backward(x, w, cols)
        ctx.args = (geo, be, extra, (x0, w0, b0))
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w, cols = ctx.saved_tensors
        geo, be, extra, dts = ctx.args
        needs = ctx.needs_input_grad
        gy = gy.astype(x.dtype, copy=False)
        dx, dw, db = K.conv_nd_backward(gy, x, w, cols, *geo, be, (needs[0], needs[1], len(needs) > 2 and needs[2]))
        if dx is not None and any(extra):
            dx = dx[(Ellipsis,) + tuple(slice(0, x.shape[2 + i] - e) for i, e in enumerate(extra))]
        return tuple(None if g is None else g.astype(dt, copy=False) for g, dt in zip((dx, dw, db), dts, strict=True))


def _conv(nd: int, name: str, input, weight, bias, stride, padding, dilation, groups) -> Tensor:
    x, sq = _batched(input, nd, name)
    y = ConvNdFunction.apply(
        x,
        _tensor(weight, "weight"),
        None if bias is None else _tensor(bias, "bias"),
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        nd=nd,
        name=name,
    )
    return _unbatch(y, sq)


def conv1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """torch.nn.functional.conv1d: input [N, C, L], weight [OC, C/groups, k] (im2col + GEMM)."""
    return _conv(1, "conv1d", input, weight, bias, stride, padding, dilation, groups)


def conv2d_nd(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """conv2d through the n-d path: string padding ('same' / 'valid') and unbatched [C, H, W] input."""
    return _conv(2, "conv2d", input, weight, bias, stride, padding, dilation, groups)


def conv3d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """torch.nn.functional.conv3d: input [N, C, D, H, W], weight [OC, C/groups, kd, kh, kw]."""
    return _conv(3, "conv3d", input, weight, bias, stride, padding, dilation, groups)


class ConvTransposeNdFunction(Function):
    @staticmethod
    def forward(ctx, x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, nd=2, name="c"):
        dts = (x.dtype, w.dtype, None if b is None else b.dtype)
        x, w, b = _common(x, w, b)
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
        be = _be(x, w) if tuple(cols_out) == tuple(geo_out) else "numpy"
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
    x, sq = _batched(input, nd, name)
    y = ConvTransposeNdFunction.apply(
        x,
        _tensor(weight, "weight"),
        None if bias is None else _tensor(bias, "bias"),
        stride=stride,
        padding=padding,
        output_padding=output_padding,
        groups=groups,
        dilation=dilation,
        nd=nd,
        name=name,
    )
    return _unbatch(y, sq)


def conv_transpose1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> Tensor:
    """torch.nn.functional.conv_transpose1d: weight [C_in, C_out/groups, k]; the adjoint of conv1d."""
    return _conv_t(1, "conv_transpose1d", input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> Tensor:
    """torch.nn.functional.conv_transpose2d: weight [C_in, C_out/groups, kh, kw]; the adjoint of conv2d."""
    return _conv_t(2, "conv_transpose2d", input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose3d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> Tensor:
    """torch.nn.functional.conv_transpose3d: weight [C_in, C_out/groups, kd, kh, kw]; the adjoint of conv3d."""
    return _conv_t(3, "conv_transpose3d", input, weight, bias, stride, padding, output_padding, groups, dilation)


# ----------------------------------------------------------------------------- pooling
class MaxPoolNdFunction(Function):
    @staticmethod
    def forward(ctx, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, nd=2):
        x = as_float_array(x, "input")
        k, s, p, d, out, extra = P.pool_geometry(x.shape[2:], kernel_size, stride, padding, dilation, ceil_mode)
        y, idx = P.max_pool_nd(x, k, s, p, d, out, extra)
        ctx.save_for_backward(idx)
        ctx.shape = x.shape
        ctx.mark_non_differentiable(1)
        return y, idx

    @staticmethod
    def backward(ctx, gy, gidx=None):
        (idx,) = ctx.saved_tensors
        return P.scatter_add_flat(gy, idx, ctx.shape)


def _max_pool(nd, name, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    x, sq = _batched(input, nd, name)
    y, idx = MaxPoolNdFunction.apply(
        x, kernel_size, stride=stride, padding=padding, dilation=dilation, ceil_mode=bool(ceil_mode), nd=nd
    )
    return _unbatch((y, idx), sq) if return_indices else _unbatch(y, sq)


def max_pool1d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """torch.nn.functional.max_pool1d (indices index the input's L axis)."""
    return _max_pool(1, "max_pool1d", input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d_nd(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """max_pool2d through the n-d kernels (ceil_mode / return_indices; indices are h*W + w like torch)."""
    return _max_pool(2, "max_pool2d", input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool3d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """torch.nn.functional.max_pool3d (indices are d*H*W + h*W + w)."""
    return _max_pool(3, "max_pool3d", input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


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
    x, sq = _batched(input, nd, name)
    y = AvgPoolNdFunction.apply(
        x,
        kernel_size,
        stride=stride,
        padding=padding,
        ceil_mode=bool(ceil_mode),
        count_include_pad=count_include_pad,
        divisor_override=divisor_override,
    )
    return _unbatch(y, sq)


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


def avg_pool2d_nd(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """avg_pool2d with torch's full signature, through the n-d kernels."""
    return _avg_pool(
        2, "avg_pool2d", input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


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


class MaxUnpoolFunction(Function):
    @staticmethod
    def forward(ctx, x, idx, out):
        N, C = x.shape[:2]
        total = int(np.prod(out))
        flat_idx = idx.reshape(N, C, int(np.prod(idx.shape[2:])))
        if flat_idx.size and (flat_idx.min() < 0 or flat_idx.max() >= total):
            raise ValueError(
                f"indices: values must lie in [0, {total}) for output spatial size {tuple(out)}, got range "
                f"[{int(flat_idx.min())}, {int(flat_idx.max())}]"
            )
        y = np.zeros((N, C, total), dtype=x.dtype)
        np.put_along_axis(y, flat_idx, x.reshape(N, C, int(np.prod(x.shape[2:]))), axis=2)
        ctx.save_for_backward(idx)
        return y.reshape((N, C) + tuple(out))

    @staticmethod
    def backward(ctx, gy):
        (idx,) = ctx.saved_tensors
        return P.gather_flat(gy, idx), None


def _max_unpool(nd, name, input, indices, kernel_size, stride, padding, output_size) -> Tensor:
    x, sq = _batched(input, nd, name)
    idx = indices.data if isinstance(indices, Tensor) else np.asarray(indices)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"indices: expected an integer tensor, got dtype {idx.dtype}")
    if sq:
        idx = idx[None]
    if idx.shape != tuple(x.shape):
        raise ValueError(f"indices: shape {idx.shape} must equal the input shape {tuple(x.shape)}")
    k = ntuple(kernel_size, nd, "kernel_size")
    s = k if stride is None else ntuple(stride, nd, "stride")
    p = ntuple(padding, nd, "padding")
    default = tuple((x.shape[2 + i] - 1) * s[i] - 2 * p[i] + k[i] for i in range(nd))
    if output_size is None:
        out = default
    else:
        osz = tuple(int(v) for v in output_size)
        if len(osz) == nd + 2 or (len(osz) == nd + 1 and sq):
            osz = osz[-nd:]
        out = ntuple(osz, nd, "output_size")
        for i in range(nd):
            if not default[i] - s[i] < out[i] < default[i] + s[i]:
                raise ValueError(
                    f"output_size: {out} must lie strictly between {tuple(v - t for v, t in zip(default, s))} and "
                    f"{tuple(v + t for v, t in zip(default, s))} (default {default})"
                )
    if min(out) < 1:
        raise ValueError(f"output_size: {name} output size {out} is not positive")
    return _unbatch(MaxUnpoolFunction.apply(x, idx, tuple(out)), sq)


def max_unpool1d(
    input: Tensor, indices: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, output_size: Any = None
) -> Tensor:
    """torch.nn.functional.max_unpool1d: scatter input to the max_pool1d indices, zeros elsewhere."""
    return _max_unpool(1, "max_unpool1d", input, indices, kernel_size, stride, padding, output_size)


def max_unpool2d(
    input: Tensor, indices: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, output_size: Any = None
) -> Tensor:
    """torch.nn.functional.max_unpool2d: the partial inverse of max_pool2d(return_indices=True)."""
    return _max_unpool(2, "max_unpool2d", input, indices, kernel_size, stride, padding, output_size)


def max_unpool3d(
    input: Tensor, indices: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, output_size: Any = None
) -> Tensor:
    """torch.nn.functional.max_unpool3d."""
    return _max_unpool(3, "max_unpool3d", input, indices, kernel_size, stride, padding, output_size)


def _adaptive_size(output_size: Any, spatial: tuple[int, ...]) -> tuple[int, ...]:
    nd = len(spatial)
    if isinstance(output_size, int | np.integer) and not isinstance(output_size, bool):
        out = (int(output_size),) * nd
    elif isinstance(output_size, tuple | list) and len(output_size) == nd:
        out = tuple(spatial[i] if v is None else int(v) for i, v in enumerate(output_size))
    else:
        raise TypeError(f"output_size: expected an int or a {nd}-tuple (None keeps a size), got {output_size!r}")
    if min(out) < 1:
        raise ValueError(f"output_size: must be positive, got {out}")
    if min(spatial) < 1:
        raise ValueError(f"input: adaptive pooling needs non-empty spatial dims, got {spatial}")
    return out


class AdaptiveAvgPoolFunction(Function):
    @staticmethod
    def forward(ctx, x, output_size=1):
        x = as_float_array(x, "input")
        out = _adaptive_size(output_size, x.shape[2:])
        mats = [P.adaptive_avg_matrix(L, O, x.dtype) for L, O in zip(x.shape[2:], out, strict=True)]
        ctx.mats = mats
        return P.apply_along(x, mats)

    @staticmethod
    def backward(ctx, gy):
        return P.apply_along(gy, ctx.mats, transpose=True)


class AdaptiveMaxPoolFunction(Function):
    @staticmethod
    def forward(ctx, x, output_size=1):
        x = as_float_array(x, "input")
        y, idx = P.adaptive_max_nd(x, _adaptive_size(output_size, x.shape[2:]))
        ctx.save_for_backward(idx)
        ctx.shape = x.shape
        ctx.mark_non_differentiable(1)
        return y, idx

    @staticmethod
    def backward(ctx, gy, gidx=None):
        (idx,) = ctx.saved_tensors
        return P.scatter_add_flat(gy, idx, ctx.shape)


def _adaptive(nd, name, input, output_size, kind, return_indices=False) -> Any:
    x, sq = _batched(input, nd, name)
    if kind == "avg":
        return _unbatch(AdaptiveAvgPoolFunction.apply(x, output_size=output_size), sq)
    y, idx = AdaptiveMaxPoolFunction.apply(x, output_size=output_size)
    return _unbatch((y, idx), sq) if return_indices else _unbatch(y, sq)


def adaptive_avg_pool1d(input: Tensor, output_size: Any) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool1d: windows [floor(o*L/O), ceil((o+1)*L/O))."""
    return _adaptive(1, "adaptive_avg_pool1d", input, output_size, "avg")


def adaptive_avg_pool2d(input: Tensor, output_size: Any) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool2d (separable: one averaging matrix per axis)."""
    return _adaptive(2, "adaptive_avg_pool2d", input, output_size, "avg")


def adaptive_avg_pool3d(input: Tensor, output_size: Any) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool3d."""
    return _adaptive(3, "adaptive_avg_pool3d", input, output_size, "avg")


def adaptive_max_pool1d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """torch.nn.functional.adaptive_max_pool1d."""
    return _adaptive(1, "adaptive_max_pool1d", input, output_size, "max", return_indices)


def adaptive_max_pool2d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """torch.nn.functional.adaptive_max_pool2d (indices are h*W + w into the input plane)."""
    return _adaptive(2, "adaptive_max_pool2d", input, output_size, "max", return_indices)


def adaptive_max_pool3d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """torch.nn.functional.adaptive_max_pool3d."""
    return _adaptive(3, "adaptive_max_pool3d", input, output_size, "max", return_indices)


# ----------------------------------------------------------------------------- interpolation
class InterpolateFunction(Function):
    @staticmethod
    def forward(ctx, x, out=(1,), scales=(None,), mode="nearest", align_corners=False):
        x = as_float_array(x, "input")
        taps = [
            P.interp_axis(L, O, mode, align_corners, sc, x.dtype)
            for L, O, sc in zip(x.shape[2:], out, scales, strict=True)
        ]
        ctx.args = (taps, x.shape[2:])
        return P.interp_forward(x, taps)

    @staticmethod
    def backward(ctx, gy):
        taps, spatial = ctx.args
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
    x = _tensor(input, "input")
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


# ----------------------------------------------------------------------------- unfold / fold, pixel shuffle, lp pool
class UnfoldFunction(Function):
    @staticmethod
    def forward(ctx, x, kernel_size=1, dilation=1, padding=0, stride=1):
        from .im2col import im2col

        x = as_float_array(x, "input")
        be = _be(x)
        ctx.args = (x.shape[2:], kernel_size, stride, padding, dilation, be)
        return im2col(x, kernel_size, stride, padding, dilation, backend=be)

    @staticmethod
    def backward(ctx, g):
        from .im2col import col2im

        size, k, s, p, d, be = ctx.args
        return col2im(np.ascontiguousarray(g), size, k, s, p, d, backend=be)


class FoldFunction(Function):
    @staticmethod
    def forward(ctx, cols, output_size=1, kernel_size=1, dilation=1, padding=0, stride=1):
        from .im2col import col2im

        cols = as_float_array(cols, "input")
        be = _be(cols)
        ctx.args = (kernel_size, stride, padding, dilation, be)
        return col2im(np.ascontiguousarray(cols), output_size, kernel_size, stride, padding, dilation, backend=be)

    @staticmethod
    def backward(ctx, g):
        from .im2col import im2col

        k, s, p, d, be = ctx.args
        return im2col(np.ascontiguousarray(g), k, s, p, d, backend=be)


def unfold(input: Tensor, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1) -> Tensor:
    """torch.nn.functional.unfold (im2col): [N, C, H, W] -> [N, C*kh*kw, L]; the backward is col2im."""
    x, sq = _batched(input, 2, "unfold")
    return _unbatch(
        UnfoldFunction.apply(x, kernel_size=kernel_size, dilation=dilation, padding=padding, stride=stride), sq
    )


def fold(
    input: Tensor, output_size: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1
) -> Tensor:
    """torch.nn.functional.fold (col2im, overlaps summed): [N, C*kh*kw, L] -> [N, C, H, W]; the backward is im2col."""
    x = _tensor(input, "input")
    if x.ndim not in (2, 3):
        raise ValueError(f"input: fold expects a 2-D [C*kh*kw, L] or 3-D [N, C*kh*kw, L] tensor, got {tuple(x.shape)}")
    sq = x.ndim == 2
    x = x.unsqueeze(0) if sq else x
    y = FoldFunction.apply(
        x, output_size=output_size, kernel_size=kernel_size, dilation=dilation, padding=padding, stride=stride
    )
    return _unbatch(y, sq)


def _factor(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"{name}: must be a positive int, got {v!r}")
    return int(v)


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """torch.nn.functional.pixel_shuffle: [*, C*r*r, H, W] -> [*, C, H*r, W*r] (a reshape + permute)."""
    x = _tensor(input, "input")
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
    x = _tensor(input, "input")
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


def _lp_pool(nd: int, input, norm_type, kernel_size, stride, ceil_mode) -> Tensor:
    x = _tensor(input, "input")
    k = ntuple(kernel_size, nd, "kernel_size")
    pool = {1: avg_pool1d, 2: avg_pool2d_nd, 3: avg_pool3d}[nd]
    out = pool(x ** float(norm_type), k, stride, 0, ceil_mode)
    return (out.sign() * out.abs().relu() * float(np.prod(k))) ** (1.0 / float(norm_type))


def lp_pool1d(input: Tensor, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False) -> Tensor:
    """torch.nn.functional.lp_pool1d: (sum over the window of x**p) ** (1/p)."""
    return _lp_pool(1, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool2d(input: Tensor, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False) -> Tensor:
    """torch.nn.functional.lp_pool2d."""
    return _lp_pool(2, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool3d(input: Tensor, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False) -> Tensor:
    """torch.nn.functional.lp_pool3d."""
    return _lp_pool(3, input, norm_type, kernel_size, stride, ceil_mode)


__all__ = [
    "unfold",
    "pixel_unshuffle",
    "pixel_shuffle",
    "lp_pool3d",
    "lp_pool2d",
    "lp_pool1d",
    "fold",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "avg_pool1d",
    "avg_pool3d",
    "conv1d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "interpolate",
    "max_pool1d",
    "max_pool3d",
    "max_unpool1d",
    "max_unpool2d",
    "max_unpool3d",
    "upsample",
]
