"""Reductions and the softmax family, forward and VJP side by side.

sum      z = sum_i x_i                 dx = g broadcast back over the reduced dims
mean     z = sum_i x_i / n             dx = g / n
var      z = sum_i (x_i - m)^2 / (n - c)   (correction c = 1 by default, like torch)   dx = g * 2 (x - m) / (n - c)
max      full reduction: the gradient is split evenly among tied maxima (torch's x.max());
         max(dim): (values, indices), the gradient goes to the first maximal index along dim (torch's CPU choice;
         NaN propagates and wins, at its first position) -- ``MaxDim`` below
median   median(dim): the lower median (element (n-1)//2 of a stable sort), the gradient goes to its index
mode     mode(dim): the most frequent value (smallest among ties) at its last occurrence; gradient to that index
softmax      y = e^x / sum e^x         dx = y * (g - sum(g * y))
log_softmax  y = x - logsumexp(x)      dx = g - softmax(x) * sum(g)
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import backends
from .errors import ShapeError, dim_error
from .function import Function


def norm_axes(dim: int | Sequence[int] | None, nd: int, name: str = "dim") -> tuple[int, ...] | None:
    if dim is None:
        return None
    if type(dim) is int and -nd <= dim < nd:  # the common case, without the general checks below
        return (dim % nd,)
    if isinstance(dim, int | np.integer) and not isinstance(dim, bool | np.bool_):
        dims: tuple = (dim,)
    elif isinstance(dim, tuple | list):
        dims = tuple(dim)
    else:
        raise TypeError(f"{name}: expected an int or a tuple of ints, got {type(dim).__name__} {dim!r}")
    out = []
    for d in dims:
        if isinstance(d, bool | np.bool_) or not isinstance(d, int | np.integer):
            raise TypeError(f"{name}: expected int entries, got {type(d).__name__} {d!r} in {dim!r}")
        if not -max(nd, 1) <= d < max(nd, 1):
            raise dim_error(name, d, nd)
        d = int(d) % max(nd, 1)
        if d in out:  # numpy: "duplicate value in 'axis'"; torch: RuntimeError naming the dim
            raise ShapeError(f"{name}: dim {d} appears multiple times in the list of dims {dim!r}")
        out.append(d)
    return tuple(out)


def norm_dim(dim: Any, nd: int, name: str = "dim") -> int:
    """One dim (an int in [-nd, nd), a 0-d tensor counting as 1-d like torch) -> its index in [0, nd)."""
    if dim is None or isinstance(dim, tuple | list):
        raise TypeError(f"{name}: expected one int, got {type(dim).__name__} {dim!r}")
    (d,) = norm_axes(dim, nd, name)
    return d


def _scalar_dims(dim: Any) -> None:
    """A 0-d tensor reduces over dim 0 / -1 (or ()) as over nothing, like torch; other dims are out of range."""
    norm_axes(dim, 0)


class ValuesIndicesResult(namedtuple("ValuesIndicesResult", ["values", "indices"])):
    """torch.return_types.max/min/median: a namedtuple ``(values, indices)`` -- ``v, i = x.max(1)``, ``x.max(1)[0]``,
    ``x.max(1).values`` all work as in torch. Other attribute reads (``.sum()``, ``.shape``, ``.backward``) fall
    through to ``values``, so older tinylearn code that used ``x.max(dim)`` as the values tensor keeps working."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.values, name)


def _expand_back(g: np.ndarray, shape: tuple[int, ...], axes: tuple[int, ...] | None, keepdim: bool) -> np.ndarray:
    if axes is None:
        return np.broadcast_to(g.reshape((1,) * len(shape)), shape)
    if not keepdim:
        g = np.expand_dims(g, axes)
    return np.broadcast_to(g, shape)


class Sum(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False):
        ctx.axes = norm_axes(dim, x.ndim) if x.ndim or dim is None else _scalar_dims(dim)
        ctx.shape, ctx.keepdim = x.shape, keepdim
        return np.sum(x, axis=ctx.axes, keepdims=keepdim)

    @staticmethod
    def backward(ctx, g):
        return _expand_back(g, ctx.shape, ctx.axes, ctx.keepdim)


class Mean(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False):
        ctx.axes = norm_axes(dim, x.ndim) if x.ndim or dim is None else _scalar_dims(dim)
        ctx.shape, ctx.keepdim = x.shape, keepdim
        n = x.size if ctx.axes is None else int(np.prod([x.shape[a] for a in ctx.axes]))
        ctx.n = n
        return np.mean(x, axis=ctx.axes, keepdims=keepdim)

    @staticmethod
    def backward(ctx, g):
        return _expand_back(g / ctx.n, ctx.shape, ctx.axes, ctx.keepdim)


class Max(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, sign=1.0):
        if x.size == 0:
            raise ValueError(f"max/min: reduction over an empty tensor of shape {x.shape}")
        if x.ndim == 0:  # dim 0 / -1 of a 0-d tensor: the element itself, like torch
            norm_axes(dim, 0)
            dim = None
        ctx.shape, ctx.keepdim, ctx.dim = x.shape, keepdim, dim
        if dim is None:
            out = x.max() if sign > 0 else x.min()
            # a NaN maximum (NaN propagates) takes the gradient at the NaN element(s), like torch ([0, 1, 0])
            ctx.save_for_backward(np.isnan(x) if np.isnan(out) else x == out)
            return np.asarray(out).reshape((1,) * x.ndim) if keepdim else np.asarray(out)
        d = norm_dim(dim, x.ndim)
        ctx.dim = d
        idx = np.argmax(x, axis=d, keepdims=True) if sign > 0 else np.argmin(x, axis=d, keepdims=True)
        ctx.save_for_backward(idx)
        out = np.take_along_axis(x, idx, axis=d)
        return out if keepdim else np.squeeze(out, axis=d)

    @staticmethod
    def backward(ctx, g):
        (m,) = ctx.saved_tensors
        if ctx.dim is None:
            return (m * (g.reshape(()) / m.sum())).astype(g.dtype, copy=False)
        gx = np.zeros(ctx.shape, dtype=g.dtype)
        gk = g if ctx.keepdim else np.expand_dims(g, ctx.dim)
        np.put_along_axis(gx, m, gk, axis=ctx.dim)
        return gx


class MaxDim(Function):
    """``x.max(dim)`` / ``x.min(dim)`` (sign -1) as two outputs (values, indices); indices are not differentiable.

    VJP: dx = scatter of g into the selected index along dim (zero elsewhere): values = x gathered at indices,
    and the gather's transpose is a scatter.
    """

    @staticmethod
    def forward(ctx, x, dim=0, keepdim=False, sign=1.0, median=False, mode=False):
        what = "median" if median else "mode" if mode else ("max" if sign > 0 else "min")
        if x.ndim == 0:  # dim 0 / -1 of a 0-d tensor: the element itself and index 0, like torch
            norm_axes(dim, 0)
            ctx.d = None
            ctx.mark_non_differentiable(1)
            return x.copy(), np.zeros((), np.int64)
        d = norm_dim(dim, x.ndim)
        if x.shape[d] == 0:
            raise ValueError(f"dim: {what} over dim {dim} of size 0 (input shape {x.shape})")
        if mode:
            idx = _mode_index(x, d)
        elif median:  # lower median of a stable sort; NaN sorts last in numpy, torch propagates it: handle NaN first
            order = np.argsort(x, axis=d, kind="stable")
            k = (x.shape[d] - 1) // 2
            idx = np.take(order, [k], axis=d).astype(np.int64)
            if x.dtype.kind == "f":
                nan = np.isnan(x)
                has = nan.any(axis=d, keepdims=True)
                idx = np.where(has, np.argmax(nan, axis=d, keepdims=True), idx)
        else:
            idx = (np.argmax(x, axis=d, keepdims=True) if sign > 0 else np.argmin(x, axis=d, keepdims=True)).astype(
                np.int64
            )
        vals = np.take_along_axis(x, idx, axis=d)
        ctx.shape, ctx.d, ctx.keepdim = x.shape, d, keepdim
        ctx.save_for_backward(idx)
        ctx.mark_non_differentiable(1)
        if not keepdim:
            vals, idx = np.squeeze(vals, axis=d), np.squeeze(idx, axis=d)
        return vals, idx

    @staticmethod
    def backward(ctx, g, _gi=None):
        if ctx.d is None:
            return g
        (idx,) = ctx.saved_tensors
        gx = np.zeros(ctx.shape, dtype=g.dtype)
        np.put_along_axis(gx, idx, g if ctx.keepdim else np.expand_dims(g, ctx.d), axis=ctx.d)
        return gx


def _mode_index(x: np.ndarray, d: int) -> np.ndarray:
    """Index (keepdims along d) of torch.mode: the most frequent value, the smallest one among equally frequent
    values, at its LAST occurrence along d (torch's CPU choice)."""
    xm = np.moveaxis(x, d, -1)
    lead, n = xm.shape[:-1], xm.shape[-1]
    x2 = xm.reshape(-1, n)
    order = np.argsort(x2, axis=1, kind="stable")
    srt = np.take_along_axis(x2, order, axis=1)
    start = np.ones(srt.shape, bool)
    start[:, 1:] = srt[:, 1:] != srt[:, :-1]
    run = np.cumsum(start, axis=1) - 1  # run id of each sorted position (runs of equal values)
    rows = np.arange(x2.shape[0])[:, None]
    counts = np.zeros(srt.shape, np.int64)
    np.add.at(counts, (np.broadcast_to(rows, run.shape), run), 1)
    best = np.argmax(counts, axis=1)  # first maximal run = smallest value among the most frequent
    in_best = run == best[:, None]
    last = n - 1 - np.argmax(in_best[:, ::-1], axis=1)  # stable sort: the run's last slot has the largest index
    idx = order[np.arange(x2.shape[0]), last].astype(np.int64)
    return np.expand_dims(idx.reshape(lead), d)


class Var(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, correction=1):
        axes = norm_axes(dim, x.ndim)
        n = x.size if axes is None else int(np.prod([x.shape[a] for a in axes]))
        m = np.mean(x, axis=axes, keepdims=True)
        d = x - m
        denom = max(n - correction, 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.sum(d * d, axis=axes, keepdims=keepdim) / x.dtype.type(denom)
        ctx.save_for_backward(d)
        ctx.axes, ctx.keepdim, ctx.denom = axes, keepdim, denom
        return out

    @staticmethod
    def backward(ctx, g):
        (d,) = ctx.saved_tensors
        gk = _expand_back(g, d.shape, ctx.axes, ctx.keepdim)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (gk * d * (2.0 / ctx.denom if ctx.denom else np.inf)).astype(g.dtype, copy=False)


class Softmax(Function):
    """y = e^(x - max) / sum e^(x - max) along dim;  dx = y (g - sum(g y)). float32/float64 arrays run the registered
    C++ kernels ``kernels.softmax`` / ``softmax_backward`` on the rows view (dim moved last), as ``LogSoftmax`` below
    (so ``Tensor.softmax`` is as fast as ``tl.nn.functional.softmax``: measured [1, 2, 512, 128], 0.19 ms numpy ->
    0.02 ms); the numpy code runs for other dtypes, empty input, a numpy pin or no _C build."""

    @staticmethod
    def forward(ctx, x, dim=-1):
        d = norm_dim(dim, x.ndim)
        ctx.d = d
        ctx.rows = None
        if x.ndim and x.size and x.dtype.type in LogSoftmax.KERNEL_DTYPES:
            b, _, kernel = backends.resolve("kernels.softmax")
            if b == "cpp":
                xm = np.moveaxis(x, d, -1)
                y = kernel(np.ascontiguousarray(xm).reshape(-1, xm.shape[-1]))
                ctx.rows = xm.shape
                ctx.save_for_backward(y)
                return np.moveaxis(y.reshape(xm.shape), -1, d)
        e = np.exp(x - x.max(axis=d, keepdims=True))
        e /= e.sum(axis=d, keepdims=True)
        ctx.save_for_backward(e)
        return e

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        if getattr(ctx, "rows", None) is not None:
            kernel = backends.resolve("kernels.softmax_backward", "cpp")[2]
            gm = np.ascontiguousarray(np.moveaxis(g, ctx.d, -1), dtype=y.dtype)
            dx = kernel(y, gm.reshape(y.shape))
            return np.moveaxis(dx.reshape(ctx.rows), -1, ctx.d)
        return y * (g - (g * y).sum(axis=ctx.d, keepdims=True))


class LogSoftmax(Function):
    """y = (x - max) - log sum e^(x - max) along dim;  dx = g - e^y sum(g). float32/float64 arrays run the registered
    C++ kernel ``kernels.log_softmax`` / ``log_softmax_backward`` (cpp_src/kernels_softmax.cpp: three passes per row
    forward, two backward, one exp per element) on the rows view (dim moved last), reached through tinylearn.backends
    (the registry imports tinylearn.kernels on first use: no import edge from autograd). The numpy code below runs for
    other dtypes, empty or 0-d input, a ``backends.use(..., backend="numpy")`` pin or no _C build: the same math as
    tinylearn.kernels.reference.log_softmax, with two full-size arrays."""

    KERNEL_DTYPES = (np.float32, np.float64)

    @staticmethod
    def forward(ctx, x, dim=-1):
        d = norm_dim(dim, x.ndim)
        ctx.d = d
        ctx.rows = None
        if x.size and x.dtype.type in LogSoftmax.KERNEL_DTYPES:
            b, _, kernel = backends.resolve("kernels.log_softmax")
            if b == "cpp":  # the rows view: dim last, C-contiguous (a copy only if it is not already)
                xm = np.moveaxis(x, d, -1)
                y = kernel(np.ascontiguousarray(xm).reshape(-1, xm.shape[-1]))
                ctx.rows = xm.shape
                ctx.save_for_backward(y)
                return np.moveaxis(y.reshape(xm.shape), -1, d)
        out = x - x.max(axis=d, keepdims=True)  # then shifted in place: two full-size arrays, not four
        lse = np.exp(out).sum(axis=d, keepdims=True)
        out -= np.log(lse, out=lse)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        if ctx.rows is not None:
            (y,) = ctx.saved_tensors
            kernel = backends.resolve("kernels.log_softmax_backward", "cpp")[2]
            gm = np.ascontiguousarray(np.moveaxis(g, ctx.d, -1), dtype=y.dtype)
            dx = kernel(y, gm.reshape(y.shape))
            return np.moveaxis(dx.reshape(ctx.rows), -1, ctx.d)
        (out,) = ctx.saved_tensors
        gx = np.exp(out)  # softmax, scaled and subtracted in place
        gx *= g.sum(axis=ctx.d, keepdims=True)
        return np.subtract(g, gx, out=gx)
