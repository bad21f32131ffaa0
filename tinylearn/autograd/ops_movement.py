"""Data-movement ops (roll, tril/triu, pad, diagonal), forward and VJP side by side.

roll(s)          y = x shifted cyclically         dx = roll(g, -s)
tril/triu        y = x * mask                     dx = g * mask
pad              y = x gathered through an index map per padded dim (constant: zeros around a copy)
                 dx = scatter-ADD of g through the same map (reflect/replicate/circular reuse edge elements)
diagonal         y = x[..., i, i + offset]        dx = zeros with g written on that diagonal

Simpler movement ops (flip, narrow, chunk, split, index_select, repeat_interleave, movedim, tile, unflatten) are
compositions of the existing differentiable slicing / permute / reshape / repeat ops (see methods_breadth.py).
"""

from __future__ import annotations

import numpy as np

from .errors import ShapeError
from .function import Function
from .ops_reduce import norm_axes

PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


class Roll(Function):
    @staticmethod
    def forward(ctx, x, shifts, dims):
        ctx.shifts, ctx.dims = shifts, dims
        return np.roll(x, shifts, axis=dims)

    @staticmethod
    def backward(ctx, g):
        neg = tuple(-s for s in ctx.shifts) if isinstance(ctx.shifts, tuple) else -ctx.shifts
        return np.roll(g, neg, axis=ctx.dims)


class Tri(Function):
    @staticmethod
    def forward(ctx, x, diagonal=0, upper=False):
        if x.ndim < 2:
            raise ShapeError(f"{'triu' if upper else 'tril'}: input must have at least 2 dims, got shape {x.shape}")
        n, m = x.shape[-2:]
        mask = np.triu(np.ones((n, m), bool), diagonal) if upper else np.tril(np.ones((n, m), bool), diagonal)
        ctx.mask = mask
        return np.where(mask, x, x.dtype.type(0))

    @staticmethod
    def backward(ctx, g):
        return np.where(ctx.mask, g, g.dtype.type(0))


def pad_maps(shape: tuple[int, ...], pad: tuple[int, ...], mode: str) -> list[tuple[int, np.ndarray]]:
    """(axis, source-index map; -1 = the constant) per padded axis, from torch's order (last dim first: left, right,
    ...). A negative entry crops that side, as torch: circular crops first and wraps the cropped input; constant /
    reflect / replicate pad the whole input first (a reflection reads cells a crop removes) and then crop. An output
    size below 0 is a ValueError."""
    if len(pad) % 2 or len(pad) // 2 > len(shape):
        raise ValueError(f"pad: padding {pad} must have an even length <= 2 * ndim for input shape {shape}")
    maps = []
    for j in range(len(pad) // 2):
        ax = len(shape) - 1 - j
        lo, hi = int(pad[2 * j]), int(pad[2 * j + 1])
        n = shape[ax]
        if n + lo + hi < 0:
            raise ValueError(f"pad: padding {pad} would make dim {ax} (size {n}) {n + lo + hi} long ({mode!r} mode)")
        if mode == "constant" and (-lo > n or -hi > n):  # torch: "narrow(): length must be non-negative"
            raise ValueError(f"pad: cropping ({lo}, {hi}) removes more than the size {n} of dim {ax}")
        if mode == "reflect" and (lo >= n or hi >= n):
            raise ValueError(f"pad: reflect padding ({lo}, {hi}) must be < the input size {n} of dim {ax}")
        if mode == "circular" and (lo > n or hi > n):
            raise ValueError(f"pad: circular padding ({lo}, {hi}) must be <= the input size {n} of dim {ax}")
        grow, cut_lo, cut_hi = (max(lo, 0), max(hi, 0)), max(-lo, 0), max(-hi, 0)
        src = np.arange(n)
        if mode == "circular":  # crop, then wrap the cropped input
            src = src[cut_lo : max(n - cut_hi, cut_lo)]
            if max(grow) > src.size and n + lo + hi:  # torch reads uninitialised cells here
                raise ValueError(
                    f"pad: circular padding ({lo}, {hi}) must be <= the size {src.size} dim {ax} has after cropping"
                )
            idx = np.pad(src, grow, mode="wrap") if n + lo + hi else src[:0]
        else:  # pad the whole input, then crop
            if mode == "constant":
                idx = np.concatenate([np.full(grow[0], -1), src, np.full(grow[1], -1)])
            else:
                idx = np.pad(src, grow, mode=PAD_MODES[mode])
            idx = idx[cut_lo : idx.size - cut_hi]
        maps.append((ax, idx))
    return maps


class Pad(Function):
    @staticmethod
    def forward(ctx, x, pad, mode="constant", value=0.0):
        if mode not in PAD_MODES:
            raise ValueError(f"mode: must be one of {list(PAD_MODES)}, got {mode!r}")
        maps = pad_maps(x.shape, tuple(pad), mode)
        ctx.maps, ctx.shape = maps, x.shape
        y = x
        for ax, idx in maps:
            y = np.take(y, np.maximum(idx, 0), axis=ax)
            if mode == "constant":
                sl = [slice(None)] * y.ndim
                sl[ax] = idx < 0
                y[tuple(sl)] = value
        return y

    @staticmethod
    def backward(ctx, g):
        for ax, idx in reversed(ctx.maps):
            keep = idx >= 0
            gm = np.moveaxis(np.compress(keep, g, axis=ax), ax, 0)
            out = np.zeros((ctx.shape[ax],) + gm.shape[1:], g.dtype)
            ik = idx[keep]
            # scatter-add: the first source of each position is a plain (fast) assignment; only the few extra
            # sources (reflected / replicated / wrapped borders) go through the slow unbuffered np.add.at
            _, first = np.unique(ik, return_index=True)
            out[ik[first]] = gm[first]
            if first.size < ik.size:
                rest = np.setdiff1d(np.arange(ik.size), first, assume_unique=True)
                np.add.at(out, ik[rest], gm[rest])
            g = np.moveaxis(out, 0, ax)
        return g


class Diagonal(Function):
    @staticmethod
    def forward(ctx, x, offset=0, dim1=0, dim2=1):
        d1, d2 = norm_axes((dim1, dim2), x.ndim)
        if d1 == d2:
            raise ValueError(f"diagonal: dim1 and dim2 must differ, got {dim1} and {dim2}")
        ctx.shape, ctx.args = x.shape, (offset, d1, d2)
        return np.diagonal(x, offset, d1, d2).copy()

    @staticmethod
    def backward(ctx, g):
        offset, d1, d2 = ctx.args
        gx = np.zeros(ctx.shape, g.dtype)
        i = np.arange(g.shape[-1])
        np.moveaxis(gx, (d1, d2), (-2, -1))[..., i + max(-offset, 0), i + max(offset, 0)] = g
        return gx


class DiagEmbed(Function):
    """1-D x -> square matrix with x on diagonal ``offset`` (torch.diag of a vector)."""

    @staticmethod
    def forward(ctx, x, offset=0):
        ctx.offset = offset
        return np.diag(x, offset)

    @staticmethod
    def backward(ctx, g):
        return np.diagonal(g, ctx.offset).copy()
