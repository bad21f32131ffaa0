"""Shape and indexing ops: their VJPs move gradient entries back to where the inputs came from.

reshape / view      dx = g.reshape(x.shape)
permute(p)          dx = g.transpose(argsort(p))
expand              dx = unbroadcast(g, x.shape)          (sum over the expanded dims)
x[idx]              dx = zeros; dx[idx] += g              (scatter-ADD: repeated integer indices accumulate)
cat / stack         dx_i = the slice of g that came from x_i
where(c, a, b)      da = g * c,  db = g * (1 - c)         (then unbroadcast)
"""

from __future__ import annotations

import numpy as np

from .dtypes import is_floating
from .errors import DimError, ShapeError
from .function import Function, unbroadcast
from .ops_index import index_add_rows
from .ops_reduce import norm_dim


class Reshape(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
        try:
            return x.reshape(shape)
        except ValueError:
            raise ShapeError(f"reshape: cannot reshape tensor of shape {x.shape} into shape {tuple(shape)}") from None

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.shape)


class Permute(Function):
    @staticmethod
    def forward(ctx, x, perm):
        ctx.perm = perm
        return x.transpose(perm)

    @staticmethod
    def backward(ctx, g):
        inv = [0] * len(ctx.perm)  # the inverse permutation (np.argsort costs more than the op at decode sizes)
        for i, p in enumerate(ctx.perm):
            inv[p] = i
        return g.transpose(inv)


class Expand(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
        try:
            return np.broadcast_to(x, shape)
        except ValueError:
            raise ShapeError(f"expand: tensor of shape {x.shape} cannot be expanded to shape {tuple(shape)}") from None

    @staticmethod
    def backward(ctx, g):
        return unbroadcast(g, ctx.shape)


class Repeat(Function):
    @staticmethod
    def forward(ctx, x, reps):
        if len(reps) < x.ndim:
            raise ShapeError(f"repeat: {len(reps)} repeats given for a tensor of shape {x.shape}")
        ctx.xshape = (1,) * (len(reps) - x.ndim) + x.shape
        ctx.shape, ctx.reps = x.shape, reps
        return np.tile(x, reps)

    @staticmethod
    def backward(ctx, g):
        split = []
        for r, s in zip(ctx.reps, ctx.xshape):
            split += [r, s]
        return g.reshape(split).sum(axis=tuple(range(0, len(split), 2))).reshape(ctx.shape)


def _is_advanced(idx) -> bool:
    if isinstance(idx, np.ndarray | list):
        return True
    if isinstance(idx, tuple):
        return any(isinstance(i, np.ndarray | list) for i in idx)
    return False


class GetItem(Function):
    @staticmethod
    def forward(ctx, x, idx):
        try:
            out = x[idx]
        except IndexError as e:
            raise DimError(f"index: {e} (tensor shape {x.shape})") from None
        ctx.shape, ctx.dtype, ctx.idx, ctx.adv = x.shape, x.dtype, idx, _is_advanced(idx)
        return out

    @staticmethod
    def backward(ctx, g):
        gx = np.zeros(ctx.shape, dtype=g.dtype)
        idx = ctx.idx
        if isinstance(idx, np.ndarray) and idx.dtype.kind in "iu" and idx.size and g.ndim:  # rows of dim 0
            index_add_rows(gx.reshape(ctx.shape[0], -1), idx.reshape(-1) % ctx.shape[0], g.reshape(idx.size, -1))
        elif ctx.adv and not (isinstance(idx, np.ndarray) and idx.dtype == np.bool_):
            np.add.at(gx, idx, g)  # unbuffered: duplicate indices each add their contribution
        else:
            gx[idx] = g
        return gx


class Cat(Function):
    @staticmethod
    def forward(ctx, *xs, dim=0):
        if not xs:
            raise ValueError("cat: expected a non-empty sequence of tensors")
        d = norm_dim(dim, xs[0].ndim)
        for i, x in enumerate(xs):
            if x.ndim != xs[0].ndim or x.shape[:d] + x.shape[d + 1 :] != xs[0].shape[:d] + xs[0].shape[d + 1 :]:
                raise ShapeError(
                    f"cat: tensor {i} has shape {x.shape}, incompatible with shape {xs[0].shape} outside dim {dim}"
                )
        ctx.d = d
        ctx.bounds = np.cumsum([x.shape[d] for x in xs])[:-1]
        return np.concatenate(xs, axis=d)

    @staticmethod
    def backward(ctx, g):
        return tuple(np.split(g, ctx.bounds, axis=ctx.d))


class Stack(Function):
    @staticmethod
    def forward(ctx, *xs, dim=0):
        if not xs:
            raise ValueError("stack: expected a non-empty sequence of tensors")
        for i, x in enumerate(xs):
            if x.shape != xs[0].shape:
                raise ShapeError(f"stack: tensor {i} has shape {x.shape}, expected shape {xs[0].shape}")
        d = norm_dim(dim, xs[0].ndim + 1)
        ctx.d = d
        return np.stack(xs, axis=d)

    @staticmethod
    def backward(ctx, g):
        return tuple(np.moveaxis(g, ctx.d, 0))


class Where(Function):
    @staticmethod
    def forward(ctx, cond, a, b):
        cond = np.asarray(cond, dtype=bool)
        try:
            out = np.where(cond, a, b)
        except ValueError:
            raise ShapeError(
                f"where: shapes cond {cond.shape}, a {np.shape(a)}, b {np.shape(b)} cannot be broadcast"
            ) from None
        if not isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
            out = out.astype(b.dtype, copy=False)
        elif not isinstance(b, np.ndarray) and isinstance(a, np.ndarray):
            out = out.astype(a.dtype, copy=False)
        ctx.save_for_backward(cond)
        ctx.sa, ctx.sb = np.shape(a), np.shape(b)
        return out

    @staticmethod
    def backward(ctx, g):
        (cond,) = ctx.saved_tensors
        _, na, nb = ctx.needs_input_grad
        zero = g.dtype.type(0)
        ga = unbroadcast(np.where(cond, g, zero), ctx.sa) if na else None
        gb = unbroadcast(np.where(cond, zero, g), ctx.sb) if nb else None
        return None, ga, gb


class Clone(Function):
    @staticmethod
    def forward(ctx, x):
        return x.copy()

    @staticmethod
    def backward(ctx, g):
        return g


class Cast(Function):
    @staticmethod
    def forward(ctx, x, dtype):
        ctx.src = x.dtype
        return x.astype(dtype)

    @staticmethod
    def backward(ctx, g):
        return g.astype(ctx.src) if is_floating(ctx.src) else None
