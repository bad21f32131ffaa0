"""Index-driven gather/scatter (torch's gather, scatter, scatter_add), forward and VJP side by side.

With P(index, dim) = the full position tuple (index values along dim, the element's own coordinates elsewhere):

gather(x, dim, idx)            y = x[P]                    dx = scatter-ADD of g at P (repeats accumulate)
scatter(x, dim, idx, src)      y = x; y[P] = src           dx = g with the overwritten positions zeroed;  dsrc = g[P]
scatter_add(x, dim, idx, src)  y = x; y[P] += src          dx = g;                                        dsrc = g[P]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends
from .errors import ShapeError
from .function import Function
from .ops_reduce import norm_dim

INDEX_ADD = "autograd.index_add_rows"


def _index_add_numpy(out: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> None:
    """In place: one sparse-dense product S @ rows with S[v, i] = 1 where idx[i] = v (a CSR matrix built from the
    stable sort of idx; each output row sums its rows in their original order), np.add.at for float16 / bf16."""
    if rows.dtype.kind != "f" or rows.dtype.itemsize < 4 or out.ndim != 2:  # float16 / bf16: scipy has no kernel
        np.add.at(out, idx, rows)
        return
    import scipy.sparse as sp

    n = out.shape[0]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(idx, minlength=n), out=indptr[1:])
    s = sp.csr_matrix((np.ones(idx.size, rows.dtype), np.argsort(idx, kind="stable"), indptr), shape=(n, idx.size))
    out += s @ rows


def _cpp_fits(out: Any, rows: Any) -> bool:
    return (
        type(out) is np.ndarray
        and type(rows) is np.ndarray
        and out.ndim == 2
        and out.dtype.char in "fd"
        and rows.dtype == out.dtype
        and out.flags.c_contiguous
        and out.flags.writeable
    )


def index_add_rows(out: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> None:
    """out[idx[i]] += rows[i] for a 1-D integer ``idx`` in [0, len(out)) (repeats accumulate), in place: the result
    of ``np.add.at(out, idx, rows)``. The embedding and integer-array indexing VJPs and MoE's scatter use it. Op
    ``autograd.index_add_rows``: cpp (cpp_src/autograd_index_add.cpp, one pass in index order: bitwise np.add.at's
    sums; float32/float64 C-contiguous ``out``) or numpy (a CSR product, ~50-80 us of set-up for 2048 rows of 64
    floats; np.add.at itself adds one element at a time: 1.1 ms), the registry's choice (``backends.use`` pins)."""
    if idx.size == 0:
        return
    if _cpp_fits(out, rows) and backends.resolve(INDEX_ADD)[0] == "cpp":
        _index_add_kernel(out, idx, rows)
        return
    _index_add_numpy(out, idx, rows)


def _index_add_kernel(out: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> None:
    backends.load_C("autograd").index_add_rows(out, np.asarray(idx, np.int64), rows.reshape(idx.size, -1))


def _index_add_into_copy(inplace: Any) -> Any:
    """The registered (functional) form: a copy of ``out`` with the rows added (the conformance test reuses its
    example's arrays, so the registered functions must not write into them)."""

    def fn(out: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> np.ndarray:
        res = np.array(out, copy=True, order="C")
        if idx.size:
            inplace(res, idx, rows)
        return res

    return fn


def _index_add_cpp(out: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> None:
    if not _cpp_fits(out, rows):
        raise ValueError(f"out, rows: the C++ kernel takes C-contiguous float32/float64 out and rows of its dtype, "
                         f"got {out.dtype} {out.shape} and {rows.dtype} {rows.shape}")  # fmt: skip
    _index_add_kernel(out, idx, rows)


def _index_add_example(rng: Any) -> tuple[tuple, dict]:
    """Conformance input: 40 rows scattered into 9 (repeats, untouched rows), onto a non-zero ``out``."""
    idx = rng.integers(0, 7, 40)
    return (rng.standard_normal((9, 5)).astype(np.float32), idx, rng.standard_normal((40, 5)).astype(np.float32)), {}


backends.register(INDEX_ADD, "numpy", _index_add_into_copy(_index_add_numpy), example=_index_add_example)
backends.register(
    INDEX_ADD, "cpp", _index_add_into_copy(_index_add_cpp), available=lambda: backends.C_available("autograd")
)


def positions(x_shape: tuple[int, ...], dim: int, index: np.ndarray, op: str) -> tuple:
    """Position tuple P for torch's index rules (index may be smaller than x in every dim but dim)."""
    index = np.asarray(index)
    if index.dtype.kind not in "iu":
        raise TypeError(f"{op}: index must be an integer tensor, got dtype {index.dtype}")
    nd = max(len(x_shape), 1)
    if index.ndim != len(x_shape) and not (index.ndim <= 1 and len(x_shape) <= 1):
        raise ShapeError(f"{op}: index has {index.ndim} dims but the input shape {x_shape} has {len(x_shape)}")
    d = norm_dim(dim, nd, "dim")
    shp = x_shape or (1,)
    ix = index.reshape(index.shape or (1,))
    for a, (si, sx) in enumerate(zip(ix.shape, shp)):
        if a != d and si > sx:
            raise ShapeError(f"{op}: index shape {index.shape} exceeds input shape {x_shape} in dim {a}")
    if ix.size and (ix.min() < -shp[d] or ix.max() >= shp[d]):
        raise IndexError(f"{op}: index {int(ix.max())} is out of bounds for dim {d} with size {shp[d]}")
    grid = list(np.indices(ix.shape, sparse=True))
    grid[d] = ix % shp[d]
    return tuple(grid)


class Gather(Function):
    @staticmethod
    def forward(ctx, x, dim, index):
        pos = positions(x.shape, dim, index, "gather")
        ctx.pos, ctx.shape = pos, x.shape
        xs = x.reshape(x.shape or (1,))
        return xs[pos].reshape(np.shape(index))

    @staticmethod
    def backward(ctx, g):
        gx = np.zeros(ctx.shape or (1,), g.dtype)
        np.add.at(gx, ctx.pos, g.reshape(np.broadcast(*ctx.pos).shape))
        return gx.reshape(ctx.shape), None, None


def _src_at(src, pos, dtype):
    """src values for positions P: a tensor src is read at its own leading coordinates, a scalar broadcasts."""
    shape = np.broadcast(*pos).shape
    if np.ndim(src) == 0:
        return np.full(shape, src, dtype)
    src = np.asarray(src)
    if src.ndim != len(shape) or any(a > b for a, b in zip(shape, src.shape)):
        raise ShapeError(f"scatter: src shape {src.shape} is smaller than index shape {shape}")
    return src[tuple(slice(0, s) for s in shape)]


class Scatter(Function):
    @staticmethod
    def forward(ctx, x, dim, index, src, add=False):
        pos = positions(x.shape, dim, index, "scatter_add" if add else "scatter")
        ctx.pos, ctx.add, ctx.src_shape = pos, add, np.shape(src)
        out = x.copy().reshape(x.shape or (1,))
        vals = _src_at(src, pos, x.dtype)
        if add:
            np.add.at(out, pos, vals)
        else:
            out[pos] = vals
        return out.reshape(x.shape)

    @staticmethod
    def backward(ctx, g):
        nx, _, _, ns = ctx.needs_input_grad
        shp = g.shape
        g1 = g.reshape(shp or (1,))
        gx = gs = None
        if nx:
            gx = g1.copy()
            if not ctx.add:
                gx[ctx.pos] = 0
            gx = gx.reshape(shp)
        if ns and len(ctx.src_shape):
            gs = np.zeros(ctx.src_shape, g.dtype)
            sub = g1[ctx.pos]
            gs[tuple(slice(0, s) for s in sub.shape)] = sub
        return gx, None, None, gs


_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "amax": -np.inf, "amin": np.inf}
_UFUNC = {"sum": np.add, "mean": np.add, "prod": np.multiply, "amax": np.maximum, "amin": np.minimum}


class ScatterReduce(Function):
    """torch.scatter_reduce: y = x with src reduced into positions P (sum, prod, mean, amax, amin).

    VJPs: sum  dx = g (0 where replaced: include_self=False), dsrc = g[P];  mean  the same divided by the count;
    amax/amin  g split evenly among the tied maxima (x and every src landing there), as torch;
    prod  dx = g * (product of the other factors at x's position), dsrc likewise (exact with zero factors).
    """

    @staticmethod
    def forward(ctx, x, dim, index, src, reduce="sum", include_self=True):
        if reduce not in _UFUNC:
            raise ValueError(f"reduce: must be one of {list(_UFUNC)}, got {reduce!r}")
        pos = positions(x.shape, dim, index, "scatter_reduce")
        vals = _src_at(src, pos, x.dtype)
        shp = x.shape or (1,)
        out = x.reshape(shp).astype(x.dtype, copy=True)
        touched = np.zeros(shp, bool)
        touched[pos] = True
        if not include_self:
            out[touched] = _IDENTITY[reduce]
        _UFUNC[reduce].at(out, pos, vals)
        count = np.full(shp, 1.0 if include_self else 0.0)
        np.add.at(count, pos, 1.0)
        count = np.maximum(count, 1.0)
        if reduce == "mean":
            out = np.where(touched, out / count, out).astype(x.dtype)
        ctx.save_for_backward(x.reshape(shp), vals, out, count, touched)
        ctx.pos, ctx.reduce, ctx.incl, ctx.src_shape, ctx.shape = pos, reduce, include_self, np.shape(src), x.shape
        return out.reshape(x.shape)

    @staticmethod
    def backward(ctx, g):
        x, vals, out, count, touched = ctx.saved_tensors
        g = g.reshape(out.shape)
        pos, red = ctx.pos, ctx.reduce
        self_in = np.where(touched, ctx.incl, True)  # does x take part at each position
        with np.errstate(all="ignore"):
            if red in ("sum", "mean"):
                scale = 1.0 / count if red == "mean" else np.ones_like(count)
                gx, gs = g * scale * self_in, (g * scale)[pos]
            elif red == "prod":  # d/dv = product of the other factors: exact when some factors are 0
                own = self_in & (x != 0)
                nzp = np.where(own, x, 1).astype(g.dtype)  # product of the non-zero factors at each position
                np.multiply.at(nzp, pos, np.where(vals != 0, vals, 1))
                zc = (self_in & (x == 0)).astype(np.int64)  # number of zero factors at each position
                np.add.at(zc, pos, (vals == 0).astype(np.int64))
                gx = g * _others(x, nzp, zc) * self_in
                gs = g[pos] * _others(vals, nzp[pos], zc[pos])
            else:
                n = (self_in & (x == out)).astype(g.dtype)
                np.add.at(n, pos, (vals == out[pos]).astype(g.dtype))
                gx = g * (self_in & (x == out)) / n
                gs = g[pos] * (vals == out[pos]) / n[pos]
        gx = gx.astype(g.dtype).reshape(ctx.shape)
        gsrc = None
        if ctx.needs_input_grad[3] and len(ctx.src_shape):
            gsrc = np.zeros(ctx.src_shape, g.dtype)
            gsrc[tuple(slice(0, s) for s in gs.shape)] = gs
        return gx, None, None, gsrc


def _others(v, nzp, zc):
    """Product of the factors other than v at its position, from the product of the non-zero factors (nzp) and
    the count of zero factors (zc) there."""
    with np.errstate(all="ignore"):
        return np.where(v != 0, np.where(zc == 0, nzp / np.where(v != 0, v, 1), 0), np.where(zc == 1, nzp, 0))
