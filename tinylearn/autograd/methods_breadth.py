"""The broad torch op surface as ``Tensor`` methods (a base mixin of ``TensorMethods``): elementwise math, logical
and bitwise ops, reductions, scans, sorting and the small matmul / norm aliases. Movement and gather/scatter are the
base mixin ``MovementMethods`` (methods_movement.py). The math lives in ops_math.py, ops_scan.py and ops_reduce.py;
this file only maps torch's names and arguments onto those Functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import ops_math as _m
from . import ops_reduce as _rd
from . import ops_scan as _sc
from .dtypes import promote_pair
from .errors import ShapeError, broadcasting
from .methods_movement import _SCATTER_REDUCE, MovementMethods, _d, _dim, _plain, _t  # noqa: F401  (old paths)


def _logical_reduce(x: Any, dim: Any, keepdim: bool, f: Any) -> Any:
    """torch.all / torch.any over one dim, a tuple of dims or everything: bool (uint8 stays uint8, as torch)."""
    ax = _rd.norm_axes(dim, x.ndim)
    out = f(x.data, axis=ax, keepdims=keepdim) if x.ndim else f(x.data)
    return _plain(np.asarray(out, np.uint8 if x.data.dtype == np.uint8 else np.bool_))


def _rounded_div(a: Any, b: Any, mode: str) -> Any:
    """torch.div(a, b, rounding_mode="floor"/"trunc") (not differentiable here) with torch's dtype: an integer
    tensor stays integer with an int divisor and becomes float32 with a python float."""
    a, b = promote_pair(a, b)
    with np.errstate(all="ignore"), broadcasting("div", a, b):
        if mode == "floor":
            return _plain(np.floor_divide(a, b))
        q = np.trunc(np.true_divide(a, b))
    return _plain(q.astype(np.result_type(a, b)) if np.result_type(a, b).kind in "iu" else q)


def _both_bool(x: Any, other: Any) -> bool:
    """A bool tensor meeting a bool tensor / array / python bool: torch's result (and alpha) is bool."""
    o = _d(other)
    return x.data.dtype == np.bool_ and (isinstance(o, bool | np.bool_) or getattr(o, "dtype", None) == np.bool_)


def _check_alpha(x: Any, other: Any, alpha: Any) -> None:
    """torch's alpha rules for add/sub: a bool alpha only for a bool result, a float alpha not for an integer one."""
    o = _d(other)
    if isinstance(o, float | complex | int | np.integer):
        kind = "i" if isinstance(o, int | np.integer) else "f"
    else:
        kind = np.asarray(o).dtype.kind
    integral = x.data.dtype.kind in "biu" and kind in "biu"
    if isinstance(alpha, bool | np.bool_) and not _both_bool(x, other):
        raise RuntimeError(f"alpha: a bool alpha ({alpha!r}) is only supported for bool results")
    if integral and isinstance(alpha, float | np.floating):
        raise RuntimeError(f"alpha: integral input tensors need an integer alpha, not the float {alpha!r}")


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


class BreadthMethods(MovementMethods):  # movement and indexing: methods_movement.py
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
        _check_alpha(self, other, alpha)
        if _both_bool(self, other):  # torch computes in bool: alpha is cast to bool, the result stays bool
            return self + other if alpha else self + False
        return self + (other if alpha == 1 else _t(other) * alpha)

    def sub(self, other: Any, alpha: float = 1) -> Any:
        _check_alpha(self, other, alpha)
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
