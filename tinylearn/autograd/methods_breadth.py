"""The broad torch op surface as ``Tensor`` methods (a base mixin of ``TensorMethods``): elementwise math, logical
and bitwise ops, scans, sorting, movement and gather/scatter. The math lives in ops_math.py, ops_scan.py,
ops_movement.py and ops_index.py; this file only maps torch's names and arguments onto those Functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import ops_index as _ix
from . import ops_math as _m
from . import ops_movement as _mv
from . import ops_reduce as _rd
from . import ops_scan as _sc
from . import ops_shape as _sh
from . import tensor as _tensor  # circular: read as _tensor.Tensor at call time
from .dtypes import promote_pair
from .errors import ShapeError, broadcasting


def _t(x: Any) -> Any:
    """Scalars stay Python scalars; arrays/lists become constant Tensors."""
    if isinstance(x, _tensor.Tensor) or type(x) in (int, float, bool):
        return x
    if isinstance(x, np.generic):
        return x.item()
    return _tensor.Tensor(x)


def _d(x: Any) -> Any:
    return x.data if isinstance(x, _tensor.Tensor) else x


def _plain(arr: Any) -> Any:
    return _tensor.Tensor._make(np.asarray(arr), False, None, 0)


def _dim(d: int, nd: int, name: str = "dim") -> int:
    return _rd.norm_dim(d, nd, name)


def _logical_reduce(x: Any, dim: Any, keepdim: bool, f: Any) -> Any:
    """torch.all / torch.any over one dim, a tuple of dims or everything: bool (uint8 stays uint8, as torch)."""
    ax = _rd.norm_axes(dim, x.ndim)
    out = f(x.data, axis=ax, keepdims=keepdim) if x.ndim else f(x.data)
    return _plain(np.asarray(out, np.uint8 if x.data.dtype == np.uint8 else np.bool_))


_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}  # Tensor.scatter(reduce=) -> scatter_reduce's names


def _rounded_div(a: Any, b: Any, mode: str) -> Any:
    """torch.div(a, b, rounding_mode="floor"/"trunc") (not differentiable here) with torch's dtype: an integer
    tensor stays integer with an int divisor and becomes float32 with a python float."""
    a, b = promote_pair(a, b)
    with np.errstate(all="ignore"), broadcasting("div", a, b):
        if mode == "floor":
            return _plain(np.floor_divide(a, b))
        q = np.trunc(np.true_divide(a, b))
    return _plain(q.astype(np.result_type(a, b)) if np.result_type(a, b).kind in "iu" else q)


def _unary(op: str) -> Any:
    def f(self: Any) -> Any:
        return _m.Unary.apply(self, op=op)

    f.__name__ = op
    return f


def split_int_index(idx: Any) -> tuple | None:
    """torch applies integer indices before advanced (array) ones, so ``x[1, :, 3:11:2, d]`` keeps d's dims in
    place, while numpy treats the 1 as advanced too and moves the broadcast dims first. Returns (ints step,
    rest step) when the two orders differ, else None."""
    if not isinstance(idx, tuple) or any(i is None or i is Ellipsis for i in idx):
        return None

    def is_int(i: Any) -> bool:
        return isinstance(i, int | np.integer) and not isinstance(i, bool)

    if not any(is_int(i) for i in idx) or not any(isinstance(i, np.ndarray) and i.ndim > 0 for i in idx):
        return None
    return tuple(i if is_int(i) else slice(None) for i in idx), tuple(i for i in idx if not is_int(i))


class BreadthMethods:
    __slots__ = ()

    # -- elementwise math -------------------------------------------------------------------------------------
    sin, cos, tan = _unary("sin"), _unary("cos"), _unary("tan")
    asin, acos, atan = _unary("asin"), _unary("acos"), _unary("atan")
    arcsin, arccos, arctan = asin, acos, atan
    sinh, cosh, asinh, acosh, atanh = _unary("sinh"), _unary("cosh"), _unary("asinh"), _unary("acosh"), _unary("atanh")
    erf, erfc, exp2, expm1 = _unary("erf"), _unary("erfc"), _unary("exp2"), _unary("expm1")
    log2, log10, log1p = _unary("log2"), _unary("log10"), _unary("log1p")
    rsqrt, reciprocal, square = _unary("rsqrt"), _unary("reciprocal"), _unary("square")
    floor, ceil, trunc, frac, sign = _unary("floor"), _unary("ceil"), _unary("trunc"), _unary("frac"), _unary("sign")
    fix, sgn = trunc, sign

    def round(self, decimals: int = 0) -> Any:
        return _m.Round.apply(self, decimals=decimals)

    def atan2(self, other: Any) -> Any:
        return _m.Atan2.apply(self, _t(other))

    arctan2 = atan2

    def copysign(self, other: Any) -> Any:
        return _m.Copysign.apply(self, _t(other))

    def logaddexp(self, other: Any) -> Any:
        return _m.LogAddExp.apply(self, _t(other))

    def remainder(self, other: Any) -> Any:
        return _m.Remainder.apply(self, _t(other))

    __mod__ = remainder

    def __rmod__(self, other: Any) -> Any:
        return _m.Remainder.apply(_t(other), self)

    def fmod(self, other: Any) -> Any:
        return _m.Remainder.apply(self, _t(other), fmod=True)

    def lerp(self, end: Any, weight: Any) -> Any:
        return _m.Lerp.apply(self, _t(end), _t(weight))

    def floor_divide(self, other: Any) -> Any:
        return _rounded_div(self.data, _d(other), "floor")

    __floordiv__ = floor_divide

    def __rfloordiv__(self, other: Any) -> Any:
        return _rounded_div(_d(other), self.data, "floor")

    # method names of the operators (alpha= as torch: a + alpha * b)
    def add(self, other: Any, alpha: float = 1) -> Any:
        return self + (other if alpha == 1 else _t(other) * alpha)

    def sub(self, other: Any, alpha: float = 1) -> Any:
        return self - (other if alpha == 1 else _t(other) * alpha)

    subtract = sub

    def rsub(self, other: Any, alpha: float = 1) -> Any:
        return _t(other) - self * alpha

    def mul(self, other: Any) -> Any:
        return self * other

    multiply = mul

    def div(self, other: Any, rounding_mode: str | None = None) -> Any:
        if rounding_mode is None:
            return self / other
        if rounding_mode in ("floor", "trunc"):
            return _rounded_div(self.data, _d(other), rounding_mode)
        raise ValueError(f"rounding_mode: must be None, 'trunc' or 'floor', got {rounding_mode!r}")

    divide = true_divide = div

    # casts
    def int(self) -> Any:
        return self.astype(np.int32)

    def bool(self) -> Any:
        return self.astype(np.bool_)

    def short(self) -> Any:
        return self.astype(np.int16)

    def byte(self) -> Any:
        return self.astype(np.uint8)

    def type_as(self, other: Any) -> Any:
        return self.to(other.dtype)

    # -- predicates, logical and bitwise (not differentiable) -------------------------------------------------
    def isnan(self) -> Any:
        return _plain(np.isnan(self.data))

    def isinf(self) -> Any:
        return _plain(np.isinf(self.data))

    def isfinite(self) -> Any:
        return _plain(np.isfinite(self.data))

    def isposinf(self) -> Any:
        return _plain(np.isposinf(self.data) if self.data.dtype.kind == "f" else np.zeros(self.shape, bool))

    def isneginf(self) -> Any:
        return _plain(np.isneginf(self.data) if self.data.dtype.kind == "f" else np.zeros(self.shape, bool))

    def isclose(self, other: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Any:
        with broadcasting("isclose", self.data, _d(other)):
            return _plain(np.isclose(self.data, _d(other), rtol=rtol, atol=atol, equal_nan=equal_nan))

    def allclose(self, other: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
        with broadcasting("allclose", self.data, _d(other)):
            return bool(np.allclose(self.data, _d(other), rtol=rtol, atol=atol, equal_nan=equal_nan))

    def equal(self, other: Any) -> bool:
        return self.shape == np.shape(_d(other)) and bool(np.array_equal(self.data, _d(other)))

    def logical_not(self) -> Any:
        return _plain(np.logical_not(self.data))

    def logical_and(self, other: Any) -> Any:
        with broadcasting("logical_and", self.data, _d(other)):
            return _plain(np.logical_and(self.data, _d(other)))

    def logical_or(self, other: Any) -> Any:
        with broadcasting("logical_or", self.data, _d(other)):
            return _plain(np.logical_or(self.data, _d(other)))

    def logical_xor(self, other: Any) -> Any:
        with broadcasting("logical_xor", self.data, _d(other)):
            return _plain(np.logical_xor(self.data, _d(other)))

    def _bitwise(self, other: Any, ufunc: np.ufunc, name: str) -> Any:
        o = _d(other)
        if self.data.dtype.kind not in "biu" or np.asarray(o).dtype.kind not in "biu":
            raise TypeError(f"{name}: only integer and bool tensors are supported, got dtype {self.data.dtype}")
        with broadcasting(name, self.data, o):
            return _plain(ufunc(self.data, o))

    def bitwise_and(self, other: Any) -> Any:
        return self._bitwise(other, np.bitwise_and, "bitwise_and")

    def bitwise_or(self, other: Any) -> Any:
        return self._bitwise(other, np.bitwise_or, "bitwise_or")

    def bitwise_xor(self, other: Any) -> Any:
        return self._bitwise(other, np.bitwise_xor, "bitwise_xor")

    def bitwise_left_shift(self, other: Any) -> Any:
        return self._bitwise(other, np.left_shift, "bitwise_left_shift")

    def bitwise_right_shift(self, other: Any) -> Any:
        return self._bitwise(other, np.right_shift, "bitwise_right_shift")

    __and__, __or__, __xor__ = bitwise_and, bitwise_or, bitwise_xor
    __lshift__, __rshift__ = bitwise_left_shift, bitwise_right_shift
    __rand__, __ror__, __rxor__ = bitwise_and, bitwise_or, bitwise_xor

    def bitwise_not(self) -> Any:
        if self.data.dtype.kind not in "biu":
            raise TypeError(f"bitwise_not: only integer and bool tensors are supported, got dtype {self.data.dtype}")
        return _plain(np.invert(self.data))

    __invert__ = bitwise_not

    def __abs__(self) -> Any:
        return self.abs()

    # -- reductions, scans, sorting ----------------------------------------------------------------------------
    def all(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:
        return _logical_reduce(self, dim, keepdim, np.all)

    def any(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:
        return _logical_reduce(self, dim, keepdim, np.any)

    def prod(self, dim: int | None = None, keepdim: bool = False, dtype: Any = None) -> Any:
        x = self if dtype is None else self.to(dtype)
        if x.data.dtype.kind in "biu" and dtype is None:
            x = x.astype(np.int64)
        return _sc.Prod.apply(x, dim=dim, keepdim=keepdim)

    def logsumexp(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:
        x = self if self.data.dtype.kind == "f" else self.astype(np.float32)
        return _sc.LogSumExp.apply(x, dim=dim, keepdim=keepdim)

    def std_mean(self, dim: Any = None, keepdim: bool = False, correction: int = 1) -> tuple:
        return self.std(dim, keepdim, correction), self.mean(dim, keepdim)

    def var_mean(self, dim: Any = None, keepdim: bool = False, correction: int = 1) -> tuple:
        return self.var(dim, keepdim, correction), self.mean(dim, keepdim)

    def cumsum(self, dim: int, dtype: Any = None) -> Any:
        return _sc.CumSum.apply(self if dtype is None else self.to(dtype), dim=dim)

    def cumprod(self, dim: int, dtype: Any = None) -> Any:
        return _sc.CumProd.apply(self if dtype is None else self.to(dtype), dim=dim)

    def cummax(self, dim: int) -> Any:
        return _sc.ValuesIndices(*_sc.CumMax.apply(self, dim=dim, sign=1.0))

    def cummin(self, dim: int) -> Any:
        return _sc.ValuesIndices(*_sc.CumMax.apply(self, dim=dim, sign=-1.0))

    def logcumsumexp(self, dim: int) -> Any:
        return _sc.LogCumSumExp.apply(self, dim=dim)

    def sort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> Any:
        return _sc.ValuesIndices(*_sc.Sort.apply(self, dim=dim, descending=descending))

    def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> Any:
        return self.detach().sort(dim, descending).indices

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:  # noqa: A002
        return _sc.ValuesIndices(*_sc.Sort.apply(self, dim=dim, descending=largest, k=int(k)))

    # -- movement ---------------------------------------------------------------------------------------------
    def _slice(self, dim: int, sl: Any) -> Any:
        d = _dim(dim, self.ndim)
        return _sh.GetItem.apply(self, (slice(None),) * d + (sl,))

    def narrow(self, dim: int, start: int, length: int) -> Any:
        d = _dim(dim, self.ndim)
        n = self.shape[d]
        start = start + n if start < 0 else start
        if not (0 <= start <= n and 0 <= length and start + length <= n):
            raise ShapeError(f"narrow: start {start} + length {length} exceeds dim {dim} of size {n}")
        return self._slice(d, slice(start, start + length))

    def split(self, split_size_or_sections: Any, dim: int = 0) -> tuple:
        d = _dim(dim, self.ndim)
        n = self.shape[d]
        if isinstance(split_size_or_sections, int | np.integer):
            s = int(split_size_or_sections)
            if s <= 0:
                raise ValueError(f"split: split_size must be positive, got {s}")
            sizes = [min(s, n - i) for i in range(0, n, s)] or [0]
        else:
            sizes = [int(v) for v in split_size_or_sections]
            if sum(sizes) != n:
                raise ShapeError(f"split: sizes {sizes} do not sum to the size {n} of dim {dim}")
        out, start = [], 0
        for s in sizes:
            out.append(self._slice(d, slice(start, start + s)))
            start += s
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        if chunks <= 0:
            raise ValueError(f"chunk: chunks must be positive, got {chunks}")
        n = self.shape[_dim(dim, self.ndim)]
        return self.split(max(-(-n // chunks), 1), dim)

    def unbind(self, dim: int = 0) -> tuple:
        d = _dim(dim, self.ndim)
        return tuple(_sh.GetItem.apply(self, (slice(None),) * d + (i,)) for i in range(self.shape[d]))

    def flip(self, *dims: Any) -> Any:
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], list | tuple) else dims
        axes = [_dim(d, self.ndim) for d in dims]
        if len(set(axes)) != len(axes):
            raise ValueError(f"dims: a dim appears more than once in {dims}")
        idx = [slice(None)] * self.ndim
        for a in axes if self.ndim else ():  # a 0-d tensor: dim 0 / -1 flip nothing, as torch
            idx[a] = slice(None, None, -1)
        return _sh.GetItem.apply(self, tuple(idx))

    def fliplr(self) -> Any:
        return self.flip(1)

    def flipud(self) -> Any:
        return self.flip(0)

    def roll(self, shifts: Any, dims: Any = None) -> Any:
        if dims is None:
            return _mv.Roll.apply(self.reshape(-1), shifts=shifts, dims=0).reshape(self.shape)
        if isinstance(shifts, list | tuple):
            shifts, dims = tuple(int(s) for s in shifts), tuple(_dim(d, self.ndim) for d in dims)
        else:
            shifts, dims = int(shifts), _dim(dims, self.ndim)
        return _mv.Roll.apply(self, shifts=shifts, dims=dims)

    def tril(self, diagonal: int = 0) -> Any:
        return _mv.Tri.apply(self, diagonal=diagonal, upper=False)

    def triu(self, diagonal: int = 0) -> Any:
        return _mv.Tri.apply(self, diagonal=diagonal, upper=True)

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
        return _mv.Diagonal.apply(self, offset=offset, dim1=dim1, dim2=dim2)

    def diag(self, diagonal: int = 0) -> Any:
        if self.ndim == 1:
            return _mv.DiagEmbed.apply(self, offset=diagonal)
        if self.ndim != 2:
            raise ShapeError(f"diag: input must be 1-D or 2-D, got shape {self.shape}")
        return self.diagonal(diagonal)

    def repeat_interleave(self, repeats: Any, dim: int | None = None) -> Any:
        x = self.reshape(-1) if dim is None else self
        d = 0 if dim is None else _dim(dim, self.ndim)
        idx = np.repeat(np.arange(x.shape[d]), _d(repeats))
        return _sh.GetItem.apply(x, (slice(None),) * d + (idx,))

    def unfold(self, dimension: int, size: int, step: int) -> Any:
        """Sliding windows of ``size`` every ``step`` along ``dimension``; the window becomes a new last dim."""
        d = _dim(dimension, self.ndim)
        n = self.shape[d] if self.ndim else 1
        if size > n or size < 0 or step <= 0:
            raise ValueError(f"unfold: size {size} / step {step} invalid for dim {dimension} of size {n}")
        idx = np.arange(0, n - size + 1, step)[:, None] + np.arange(size)
        return self._slice(d, idx).movedim(d + 1, -1)

    def movedim(self, source: Any, destination: Any) -> Any:
        src = [source] if isinstance(source, int | np.integer) else list(source)
        dst = [destination] if isinstance(destination, int | np.integer) else list(destination)
        if len(src) != len(dst):
            raise ValueError(f"movedim: source {source} and destination {destination} differ in length")
        nd = self.ndim
        src, dst = [_dim(d, nd) for d in src], [_dim(d, nd) for d in dst]
        rest = iter(d for d in range(nd) if d not in src)
        where = dict(zip(dst, src))
        return _sh.Permute.apply(self, tuple(where[i] if i in where else next(rest) for i in range(nd)))

    moveaxis = movedim

    def swapaxes(self, dim0: int, dim1: int) -> Any:
        return self.transpose(dim0, dim1)

    swapdims = swapaxes

    def tile(self, *reps: Any) -> Any:
        reps = tuple(reps[0]) if len(reps) == 1 and isinstance(reps[0], list | tuple) else reps
        reps = (1,) * (self.ndim - len(reps)) + tuple(int(r) for r in reps)
        return self.repeat(*reps)

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Any:
        d = _dim(dim, self.ndim)
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1 :])

    def view_as(self, other: Any) -> Any:
        return self.reshape(other.shape)

    def reshape_as(self, other: Any) -> Any:
        return self.reshape(other.shape)

    # -- indexing ---------------------------------------------------------------------------------------------
    def gather(self, dim: int, index: Any) -> Any:
        return _ix.Gather.apply(self, dim, _d(index))

    def scatter(self, dim: int, index: Any, src: Any = None, value: Any = None, *, reduce: str | None = None) -> Any:
        """torch's Tensor.scatter: src (a tensor or a number) or value= written at index along dim; with
        ``reduce="add"`` / ``"multiply"`` accumulated into self instead (differentiable here; torch is not)."""
        if src is None and value is None:
            raise TypeError("scatter: expected src or value, got neither")
        v = _t(value if src is None else src)
        if reduce is None:
            return _ix.Scatter.apply(self, dim, _d(index), v)
        if reduce not in _SCATTER_REDUCE:
            raise ValueError(f"reduce: must be one of {list(_SCATTER_REDUCE)}, got {reduce!r}")
        return _ix.ScatterReduce.apply(self, dim, _d(index), v, reduce=_SCATTER_REDUCE[reduce], include_self=True)

    def scatter_add(self, dim: int, index: Any, src: Any) -> Any:
        return _ix.Scatter.apply(self, dim, _d(index), _t(src), add=True)

    def scatter_reduce(self, dim: int, index: Any, src: Any, reduce: str, include_self: bool = True) -> Any:
        return _ix.ScatterReduce.apply(self, dim, _d(index), _t(src), reduce=reduce, include_self=include_self)

    def index_select(self, dim: int, index: Any) -> Any:
        idx = np.asarray(_d(index))
        if idx.dtype.kind not in "iu" or idx.ndim > 1:
            raise TypeError(f"index_select: index must be a 1-D integer tensor, got {idx.dtype} shape {idx.shape}")
        return self._slice(dim, idx.reshape(-1))

    def masked_fill(self, mask: Any, value: Any) -> Any:
        m = np.asarray(_d(mask))
        if m.dtype != np.bool_:
            raise TypeError(f"masked_fill: mask must be a bool tensor, got dtype {m.dtype}")
        v = value.item() if isinstance(value, _tensor.Tensor) and value.ndim == 0 else value
        return _sh.Where.apply(m, v, self) if np.ndim(v) == 0 else _sh.Where.apply(m, _t(v), self)

    def masked_select(self, mask: Any) -> Any:
        m = np.asarray(_d(mask), dtype=bool)
        with broadcasting("masked_select", self.data, m):
            shape = np.broadcast_shapes(self.shape, m.shape)
        x = self if self.shape == shape else self.expand(*shape)
        return _sh.GetItem.apply(x, np.broadcast_to(m, shape))

    def nonzero(self, as_tuple: bool = False) -> Any:
        if as_tuple:
            return tuple(_plain(i.astype(np.int64)) for i in np.nonzero(np.atleast_1d(self.data)))
        return _plain(np.argwhere(self.data).astype(np.int64))

    def count_nonzero(self, dim: Any = None) -> Any:
        ax = _rd.norm_axes(dim, self.ndim)
        return _plain(np.asarray(np.count_nonzero(self.data, axis=ax if self.ndim else None), np.int64))

    def new_zeros(self, *size: Any) -> Any:
        size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], list | tuple) else size
        return _plain(np.zeros(size, self.data.dtype))

    def new_ones(self, *size: Any) -> Any:
        size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], list | tuple) else size
        return _plain(np.ones(size, self.data.dtype))

    def new_full(self, size: Sequence[int], fill_value: Any) -> Any:
        return _plain(np.full(tuple(size), fill_value, self.data.dtype))

    def new_tensor(self, data: Any) -> Any:
        return _plain(np.array(_d(data), dtype=self.data.dtype))

    def outer(self, other: Any) -> Any:
        o = _t(other)
        if self.ndim != 1 or np.ndim(_d(o)) != 1:
            raise ShapeError(f"outer: both operands must be 1-D, got shapes {self.shape} and {np.shape(_d(o))}")
        return self.reshape(-1, 1) * o.reshape(1, -1)

    def bmm(self, other: Any) -> Any:
        if self.ndim != 3 or _t(other).ndim != 3:
            raise ShapeError(f"bmm: both operands must be 3-D, got shapes {self.shape} and {np.shape(_d(other))}")
        return self @ other

    def mm(self, other: Any) -> Any:
        if self.ndim != 2 or np.ndim(_d(other)) != 2:
            raise ShapeError(f"mm: both operands must be 2-D, got shapes {self.shape} and {np.shape(_d(other))}")
        return self @ other

    def dot(self, other: Any) -> Any:
        o = _t(other)
        if self.ndim != 1 or np.shape(_d(o)) != self.shape:
            raise ShapeError(
                f"dot: expected two 1-D tensors of one size, got shapes {self.shape} and {np.shape(_d(o))}"
            )
        return (self * o).sum()

    def norm(self, p: Any = "fro", dim: Any = None, keepdim: bool = False) -> Any:
        from .linalg_breadth import vector_norm

        return vector_norm(self, 2 if p in ("fro", None) else p, dim, keepdim)

    def relu6(self) -> Any:
        return self.clip(0.0, 6.0)

    def silu(self) -> Any:
        return self * self.sigmoid()
