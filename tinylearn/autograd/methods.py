"""The differentiable method surface of ``Tensor`` (torch's names), each a thin call into a ``Function``.

``TensorMethods`` is a mixin: ``Tensor`` (tensor.py) holds the state (data, grad, graph links, hooks, in-place
updates) and inherits these operators, elementwise maps, reductions and shape ops. The math lives in
ops_elementwise.py, ops_reduce.py, ops_shape.py and linalg.py.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import linalg as _la
from . import ops_elementwise as _ew
from . import ops_reduce as _rd
from . import ops_shape as _sh
from . import tensor as _tensor  # circular (Tensor subclasses this mixin): read as _tensor.Tensor at call time
from .errors import ShapeError, broadcasting
from .methods_breadth import BreadthMethods, split_int_index

if TYPE_CHECKING:
    from .tensor import Tensor


class TensorMethods(BreadthMethods):  # the broad torch surface: methods_breadth.py
    __slots__ = ()

    # -- operators (implemented in ops_*.py as Functions) ---------------------------------------------------
    def __add__(self, other: Any) -> Tensor:
        return _ew.Add.apply(self, _lift(other))

    __radd__ = __add__

    def __sub__(self, other: Any) -> Tensor:
        return _ew.Sub.apply(self, _lift(other))

    def __rsub__(self, other: Any) -> Tensor:
        return _ew.Sub.apply(_lift(other), self)

    def __mul__(self, other: Any) -> Tensor:
        return _ew.Mul.apply(self, _lift(other))

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Tensor:
        return _ew.Div.apply(self, _lift(other))

    def __rtruediv__(self, other: Any) -> Tensor:
        return _ew.Div.apply(_lift(other), self)

    def __pow__(self, other: Any) -> Tensor:
        if self.data.dtype == np.bool_ and isinstance(other, bool | np.bool_):  # torch: bool ** bool stays bool
            return _tensor.Tensor(self.data.copy() if other else np.ones_like(self.data))
        return _ew.Pow.apply(self, _lift(other))

    def __rpow__(self, other: Any) -> Tensor:
        return _ew.Pow.apply(_lift(other), self)

    def __matmul__(self, other: Any) -> Tensor:
        return _la.MatMul.apply(self, other if isinstance(other, TensorMethods) else _tensor.Tensor(other))

    def __rmatmul__(self, other: Any) -> Tensor:
        return _la.MatMul.apply(_tensor.Tensor(other), self)

    def __neg__(self) -> Tensor:
        return _ew.Neg.apply(self)

    def __getitem__(self, idx: Any) -> Tensor:
        idx = _unwrap_index(idx)
        two = split_int_index(idx)  # torch's dim order for mixed int / array indexing (methods_breadth.py)
        if two is not None:
            return _sh.GetItem.apply(_sh.GetItem.apply(self, two[0]), two[1])
        return _sh.GetItem.apply(self, idx)

    # comparisons: plain (non-differentiable) bool tensors
    def __lt__(self, o: Any) -> Tensor:
        with broadcasting("lt", self.data, _val(o)):
            return self._make(self.data < _val(o), False, None, 0)

    def __le__(self, o: Any) -> Tensor:
        with broadcasting("le", self.data, _val(o)):
            return self._make(self.data <= _val(o), False, None, 0)

    def __gt__(self, o: Any) -> Tensor:
        with broadcasting("gt", self.data, _val(o)):
            return self._make(self.data > _val(o), False, None, 0)

    def __ge__(self, o: Any) -> Tensor:
        with broadcasting("ge", self.data, _val(o)):
            return self._make(self.data >= _val(o), False, None, 0)

    def __eq__(self, o: Any) -> Tensor:
        with broadcasting("eq", self.data, _val(o)):
            return self._make(self.data == _val(o), False, None, 0)

    def __ne__(self, o: Any) -> Tensor:
        with broadcasting("ne", self.data, _val(o)):
            return self._make(self.data != _val(o), False, None, 0)

    # elementwise
    def neg(self) -> Tensor:
        return _ew.Neg.apply(self)

    def exp(self) -> Tensor:
        return _ew.Exp.apply(self)

    def log(self) -> Tensor:
        return _ew.Log.apply(self)

    def sqrt(self) -> Tensor:
        return _ew.Sqrt.apply(self)

    def tanh(self) -> Tensor:
        return _ew.Tanh.apply(self)

    def sigmoid(self) -> Tensor:
        return _ew.Sigmoid.apply(self)

    def relu(self) -> Tensor:
        return _ew.ReLU.apply(self)

    def gelu(self, approximate: str = "none") -> Tensor:
        return _ew.GELU.apply(self, approximate=approximate)

    def abs(self) -> Tensor:
        return _ew.Abs.apply(self)

    def clip(self, min: float | None = None, max: float | None = None) -> Tensor:  # noqa: A002
        return _ew.Clip.apply(self, min=min, max=max)

    clamp = clip

    def maximum(self, other: Any) -> Tensor:
        return _ew.Maximum.apply(self, _lift(other))

    def minimum(self, other: Any) -> Tensor:
        return _ew.Minimum.apply(self, _lift(other))

    def pow(self, other: Any) -> Tensor:
        return self.__pow__(other)

    def matmul(self, other: Any) -> Tensor:
        return self.__matmul__(other)

    def softmax(self, dim: int = -1) -> Tensor:
        return _rd.Softmax.apply(self, dim=dim)

    def log_softmax(self, dim: int = -1) -> Tensor:
        return _rd.LogSoftmax.apply(self, dim=dim)

    # reductions
    def sum(self, dim: int | Sequence[int] | None = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
        x = self if dtype is None else self.to(dtype)
        if dtype is None and x.data.dtype.kind in "biu":  # torch sums bool/int tensors in int64
            x = x.astype(np.int64) if x.data.dtype != np.int64 else x
        return _rd.Sum.apply(x, dim=dim, keepdim=keepdim)

    def mean(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        return _rd.Mean.apply(self, dim=dim, keepdim=keepdim)

    def max(self, dim: Any = None, keepdim: bool = False) -> Any:
        """``x.max()``: 0-d tensor; ``x.max(dim, keepdim)``: (values, indices); ``x.max(other)``: elementwise."""
        return _max_min(self, dim, keepdim, 1.0)

    def min(self, dim: Any = None, keepdim: bool = False) -> Any:
        """``x.min()``: 0-d tensor; ``x.min(dim, keepdim)``: (values, indices); ``x.min(other)``: elementwise."""
        return _max_min(self, dim, keepdim, -1.0)

    def median(self, dim: int | None = None, keepdim: bool = False) -> Any:
        """torch.median: the lower median ((n-1)//2-th smallest). No dim: 0-d tensor of the flattened input; with
        dim: (values, indices). NaN propagates."""
        if dim is None:
            return _rd.MaxDim.apply(self.reshape(-1), dim=0, median=True)[0]
        return _rd.ValuesIndicesResult(*_rd.MaxDim.apply(self, dim=_dim_arg(dim), keepdim=keepdim, median=True))

    def mode(self, dim: int = -1, keepdim: bool = False) -> Any:
        """torch.mode: (values, indices) of the most frequent value along dim (the smallest among equally frequent
        ones), indices at its last occurrence."""
        return _rd.ValuesIndicesResult(*_rd.MaxDim.apply(self, dim=_dim_arg(dim), keepdim=keepdim, mode=True))

    def var(
        self, dim: int | Sequence[int] | None = None, keepdim: bool = False, correction: int = 1, unbiased: Any = None
    ) -> Tensor:
        if unbiased is not None:
            correction = 1 if unbiased else 0
        return _rd.Var.apply(self, dim=dim, keepdim=keepdim, correction=correction)

    def std(self, dim: int | Sequence[int] | None = None, keepdim: bool = False, correction: int = 1) -> Tensor:
        return self.var(dim, keepdim, correction).sqrt()

    def argmax(self, dim: int | None = None, keepdim: bool = False) -> Tensor:
        return _arg_max_min(self, dim, keepdim, np.argmax)

    def argmin(self, dim: int | None = None, keepdim: bool = False) -> Tensor:
        return _arg_max_min(self, dim, keepdim, np.argmin)

    # shape
    def reshape(self, *shape: Any) -> Tensor:
        return _sh.Reshape.apply(self, _shape_arg(shape))

    def view(self, *shape: Any) -> Tensor:
        if len(shape) == 1 and not isinstance(shape[0], int | np.integer | tuple | list):  # view(dtype): bits
            return self._make(self.data.view(np.dtype(shape[0])), False, None, 0)
        return _sh.Reshape.apply(self, _shape_arg(shape))

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        nd = self.data.ndim
        perm = list(range(nd))
        d0, d1 = _norm_dim(dim0, nd, "dim0"), _norm_dim(dim1, nd, "dim1")
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return _sh.Permute.apply(self, tuple(perm))

    def permute(self, *dims: Any) -> Tensor:
        dims = _shape_arg(dims, "dims")
        nd = self.data.ndim
        if sorted(_norm_dim(d, nd, "dims") for d in dims) != list(range(nd)):
            raise ShapeError(f"dims: {dims} is not a permutation of the {nd} dims of shape {self.shape}")
        return _sh.Permute.apply(self, tuple(_norm_dim(d, nd, "dims") for d in dims))

    @property
    def T(self) -> Tensor:  # noqa: N802
        return _sh.Permute.apply(self, tuple(range(self.data.ndim - 1, -1, -1)))

    @property
    def mT(self) -> Tensor:  # noqa: N802
        return self.transpose(-2, -1)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        nd = self.data.ndim
        if nd == 0:
            return self.reshape(1)
        s, e = _norm_dim(start_dim, nd, "start_dim"), _norm_dim(end_dim, nd, "end_dim")
        if s > e:
            raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {self.shape}")
        shp = self.shape
        return self.reshape(shp[:s] + (int(np.prod(shp[s : e + 1])),) + shp[e + 1 :])

    def unsqueeze(self, dim: int) -> Tensor:
        d = _norm_dim(dim, self.data.ndim + 1, "dim")
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def squeeze(self, dim: int | None = None) -> Tensor:
        shp = self.shape
        if dim is None:
            return self.reshape(tuple(s for s in shp if s != 1))
        d = _norm_dim(dim, self.data.ndim, "dim")
        if shp[d] != 1:
            return self
        return self.reshape(shp[:d] + shp[d + 1 :])

    def expand(self, *sizes: Any) -> Tensor:
        sizes = _shape_arg(sizes, "sizes")
        shp = self.shape
        if len(sizes) < len(shp):
            raise ShapeError(f"expand: sizes {sizes} have fewer dims than the tensor's shape {shp}")
        lead = len(sizes) - len(shp)
        target = tuple(shp[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(sizes))
        return _sh.Expand.apply(self, target)

    def expand_as(self, other: Tensor) -> Tensor:
        return self.expand(*other.shape)

    def repeat(self, *reps: Any) -> Tensor:
        reps = _shape_arg(reps, "reps")
        return _sh.Repeat.apply(self, reps)


def _lift(x: Any) -> Any:
    """Scalars stay Python scalars (keeps the tensor's dtype); arrays become constant Tensors."""
    t = type(x)
    if t is float or t is int or isinstance(x, TensorMethods):
        return x
    if isinstance(x, np.generic | bool):
        return x.item() if isinstance(x, np.generic) else x
    return _tensor.Tensor(x)


def _val(x: Any) -> Any:
    return x.data if isinstance(x, TensorMethods) else x


def _unwrap_index(idx: Any) -> Any:
    if isinstance(idx, TensorMethods):
        return idx.data
    if isinstance(idx, tuple):
        return tuple(i.data if isinstance(i, TensorMethods) else i for i in idx)
    if isinstance(idx, list):
        return np.asarray(idx)
    return idx


def _shape_arg(shape: tuple, name: str = "shape") -> tuple[int, ...]:
    """``f(2, 3)`` / ``f((2, 3))`` / ``f([2, 3])`` -> ``(2, 3)``; every entry must be an int (numpy integers and
    other ``__index__`` types ok, bool and float not: ``2.5`` is an error, never truncated)."""
    if len(shape) == 1 and isinstance(shape[0], tuple | list):
        shape = tuple(shape[0])
    out = []
    for i, s in enumerate(shape):
        try:
            if isinstance(s, bool | np.bool_):
                raise TypeError
            out.append(operator.index(s))
        except TypeError:
            raise TypeError(f"{name}: entry {i} is {type(s).__name__} {s!r} in {shape!r}; expected ints") from None
    return tuple(out)


def _dim_arg(dim: Any) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int | np.integer):
        raise TypeError(f"dim: expected an int, got {type(dim).__name__} {dim!r}")
    return int(dim)


def _max_min(x: Any, dim: Any, keepdim: bool, sign: float) -> Any:
    if isinstance(dim, TensorMethods | np.ndarray):  # torch.max(input, other): elementwise
        return x.maximum(dim) if sign > 0 else x.minimum(dim)
    if dim is None:
        return _rd.Max.apply(x, dim=None, keepdim=keepdim, sign=sign)
    return _rd.ValuesIndicesResult(*_rd.MaxDim.apply(x, dim=_dim_arg(dim), keepdim=keepdim, sign=sign))


def _arg_max_min(x: Any, dim: Any, keepdim: bool, f: Any) -> Any:
    if dim is None:
        return x._make(np.asarray(f(x.data), dtype=np.int64), False, None, 0)
    d = _norm_dim(dim, x.data.ndim, "dim")
    data = x.data.reshape(1) if x.data.ndim == 0 else x.data
    out = np.asarray(f(data, axis=d, keepdims=keepdim and x.data.ndim > 0), dtype=np.int64)
    return x._make(out.reshape(()) if x.data.ndim == 0 else out, False, None, 0)


def _norm_dim(d: int, nd: int, name: str) -> int:
    return _rd.norm_dim(d, nd, name)
