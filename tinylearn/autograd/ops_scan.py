"""Products, logsumexp, scans (cumulative ops) and sorting, forward and VJP side by side.

prod         y = prod_i x_i          dx_i = g * prod_{j != i} x_j    (exclusive left * right products: exact at 0)
logsumexp    y = log sum e^x         dx = g * e^(x - y)
cumsum       y_j = sum_{i<=j} x_i    dx_i = sum_{j>=i} g_j           (a reversed cumsum)
cumprod      y_j = prod_{i<=j} x_i   dx_i = sum_{j>=i} g_j y_j / x_i (no zeros), else the exact O(n^2) form
cummax/min   values + indices        dx = scatter-add of g into the running argmax
logcumsumexp y_j = log sum_{i<=j} e^x_i   dx_i = sum_{j>=i} g_j e^(x_i - y_j)
sort / topk  values + indices        dx = scatter of g back to the original positions (indices not differentiable)
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .function import Function
from .ops_reduce import _expand_back, _scalar_dims, norm_axes, norm_dim

ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])  # torch.return_types.sort/topk/cummax/...


def _one_dim(dim, nd: int) -> int:
    return norm_dim(dim, nd)


class Prod(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False):
        ctx.shape, ctx.keepdim = x.shape, keepdim
        ctx.dim = None if dim is None else _one_dim(dim, x.ndim)
        ctx.save_for_backward(x)
        if x.ndim == 0:
            return x.copy()
        return np.prod(x, axis=ctx.dim, keepdims=keepdim)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if x.ndim == 0:
            return g
        d = ctx.dim
        xm = x.reshape(-1) if d is None else np.moveaxis(x, d, -1)
        one = np.ones(xm.shape[:-1] + (1,), x.dtype)
        left = np.concatenate([one, np.cumprod(xm, axis=-1)[..., :-1]], axis=-1)
        right = np.flip(np.concatenate([one, np.cumprod(np.flip(xm, -1), axis=-1)[..., :-1]], axis=-1), -1)
        excl = left * right
        if d is None:
            return (g.reshape(()) * excl).reshape(ctx.shape)
        gk = g if ctx.keepdim else np.expand_dims(g, d)
        return np.moveaxis(excl, -1, d) * gk


class LogSumExp(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False):
        axes = norm_axes(dim, x.ndim) if x.ndim or dim is None else _scalar_dims(dim)
        m = np.max(x, axis=axes, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        with np.errstate(divide="ignore"):
            yk = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
        ctx.save_for_backward(x, yk)
        ctx.axes, ctx.keepdim = axes, keepdim
        if keepdim or x.ndim == 0:
            return yk.reshape(x.shape) if x.ndim == 0 else yk
        return np.squeeze(yk, axis=axes) if axes is not None else yk.reshape(())

    @staticmethod
    def backward(ctx, g):
        x, yk = ctx.saved_tensors
        return _expand_back(g, x.shape, ctx.axes, ctx.keepdim) * np.exp(x - yk)


class CumSum(Function):
    @staticmethod
    def forward(ctx, x, dim=0):
        ctx.d = _one_dim(dim, x.ndim) if x.ndim else _scalar_dims(dim)  # 0-d: dim 0 / -1 only, as torch
        if x.ndim == 0:
            return x.copy()
        if x.dtype.kind in "biu":
            x = x.astype(np.int64)
        return np.cumsum(x, axis=ctx.d)

    @staticmethod
    def backward(ctx, g):
        if ctx.d is None:
            return g
        return np.flip(np.cumsum(np.flip(g, ctx.d), axis=ctx.d), ctx.d)


class CumProd(Function):
    @staticmethod
    def forward(ctx, x, dim=0):
        ctx.d = _one_dim(dim, x.ndim) if x.ndim else _scalar_dims(dim)  # 0-d: dim 0 / -1 only, as torch
        if x.ndim == 0:
            return x.copy()
        y = np.cumprod(x.astype(np.int64) if x.dtype.kind in "biu" else x, axis=ctx.d)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        if ctx.d is None:
            return g
        x, y = ctx.saved_tensors
        d = ctx.d
        if (x != 0).all():
            return np.flip(np.cumsum(np.flip(g * y, d), axis=d), d) / x
        xm, gm = np.moveaxis(x, d, -1), np.moveaxis(g, d, -1)
        out = np.empty_like(xm)
        for i in range(xm.shape[-1]):  # d y_j / d x_i = prod_{k <= j, k != i} x_k for j >= i
            xi = xm.copy()
            xi[..., i] = 1
            out[..., i] = (np.cumprod(xi, axis=-1)[..., i:] * gm[..., i:]).sum(-1)
        return np.moveaxis(out, -1, d)


class CumMax(Function):
    """Running max (sign=1) or min (sign=-1) along dim: (values, indices); ties take the later index, as torch."""

    @staticmethod
    def forward(ctx, x, dim=0, sign=1.0):
        d = _one_dim(dim, max(x.ndim, 1))
        xm = np.moveaxis(x.reshape(x.shape or (1,)), d, -1)
        vals = np.empty_like(xm)
        idx = np.empty(xm.shape, np.int64)
        best, bi = (xm[..., 0].copy() if xm.shape[-1] else None), np.zeros(xm.shape[:-1], np.int64)
        for i in range(xm.shape[-1]):  # a zero-size dim: no step, empty values and indices (as torch)
            v = xm[..., i]
            take = (v >= best) if sign > 0 else (v <= best)
            best = np.where(take, v, best)
            bi = np.where(take, i, bi)
            vals[..., i], idx[..., i] = best, bi
        ctx.shape, ctx.d = x.shape, d
        idx_out = np.moveaxis(idx, -1, d).reshape(x.shape)
        ctx.save_for_backward(idx_out)
        ctx.mark_non_differentiable(1)
        return np.moveaxis(vals, -1, d).reshape(x.shape), idx_out

    @staticmethod
    def backward(ctx, g, _gi=None):
        (idx,) = ctx.saved_tensors
        if g.ndim == 0:
            return g
        gx = np.zeros(ctx.shape, g.dtype)
        np.add.at(gx, _along(idx, ctx.d), g)
        return gx


class LogCumSumExp(Function):
    @staticmethod
    def forward(ctx, x, dim=0):
        ctx.d = _one_dim(dim, max(x.ndim, 1))
        if x.ndim == 0:
            return x.copy()
        y = np.logaddexp.accumulate(x, axis=ctx.d)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        if g.ndim == 0:
            return g
        x, y = ctx.saved_tensors
        d = ctx.d
        xm, ym, gm = (np.moveaxis(a, d, -1) for a in (x, y, g))
        out = np.empty_like(xm)
        for i in range(xm.shape[-1]):
            out[..., i] = (gm[..., i:] * np.exp(xm[..., i : i + 1] - ym[..., i:])).sum(-1)
        return np.moveaxis(out, -1, d)


def _along(idx: np.ndarray, d: int) -> tuple:
    """Full index tuple addressing ``idx`` positions along axis d (open grid on the other axes)."""
    grid = list(np.indices(idx.shape, sparse=True))
    grid[d] = idx
    return tuple(grid)


class Sort(Function):
    """(values, indices) of a sort along dim; with ``k``: the first k (torch.topk). Stable for ties."""

    @staticmethod
    def forward(ctx, x, dim=-1, descending=False, k=None):
        ctx.shape = x.shape
        if x.ndim == 0:
            ctx.d = None
            ctx.mark_non_differentiable(1)
            return x.copy(), np.zeros((), np.int64)
        d = _one_dim(dim, x.ndim)
        if k is not None and not 0 <= k <= x.shape[d]:
            raise ValueError(f"topk: k={k} out of range for dim {dim} of size {x.shape[d]} (shape {x.shape})")
        key = x
        if descending:  # stable descending order: sort the negated key (NaN first, as torch puts NaN largest)
            key = -x if x.dtype.kind == "f" else (~x if x.dtype.kind in "iu" else ~x)
            if x.dtype.kind == "f":
                key = np.where(np.isnan(x), -np.inf, key)
        idx = np.argsort(key, axis=d, kind="stable").astype(np.int64)
        if k is not None:
            idx = np.take(idx, np.arange(k), axis=d)
        ctx.d = d
        ctx.save_for_backward(idx)
        ctx.mark_non_differentiable(1)
        return np.take_along_axis(x, idx, axis=d), idx

    @staticmethod
    def backward(ctx, g, _gi=None):
        if ctx.d is None:
            return g
        (idx,) = ctx.saved_tensors
        gx = np.zeros(ctx.shape, g.dtype)
        np.put_along_axis(gx, idx, g, axis=ctx.d)
        return gx
