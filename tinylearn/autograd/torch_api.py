"""torch's free functions (``tl.sin(x)``, ``tl.einsum(...)``, ``tl.eye(3)``, ``tl.linalg.vector_norm``...) on top
of the Tensor methods, plus the creation functions torch scripts reach for, ``ShapeError``, ``DimError`` and
``OutOfMemoryError``.

``tinylearn.__getattr__`` looks names up here, so ``tl.<name>`` works for everything below.
"""

from __future__ import annotations

import builtins
import operator
import types
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import factory as _f
from .errors import DimError, OutOfMemoryError, ShapeError
from .linalg_breadth import einsum, vector_norm
from .methods_breadth import BreadthMethods
from .methods_movement import MovementMethods
from .tensor import Tensor


def _as_t(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def _method(name: str) -> Any:
    def f(input: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
        return getattr(_as_t(input), name)(*args, **kwargs)

    f.__name__ = name
    f.__doc__ = f"torch.{name}(input, ...) = input.{name}(...)"
    return f


_METHODS = [n for c in (BreadthMethods, MovementMethods) for n in vars(c) if not n.startswith("_")] + [
    "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "abs", "clamp", "clip", "maximum", "minimum", "pow", "matmul",
    "neg", "softmax", "log_softmax", "sum", "mean", "max", "min", "median", "mode", "var", "std", "argmax", "argmin",
    "reshape", "transpose", "permute", "flatten", "unsqueeze", "squeeze", "detach", "clone", "t",
]  # fmt: skip
_SHADOWS = set(dir(builtins))
# wrappers whose names are builtins (abs, all, any, round, int, bool, ...) are served by __getattr__ below, so the
# functions of this module still see the builtins
_WRAPPED = {_n: _method(_n) for _n in _METHODS}
globals().update({k: v for k, v in _WRAPPED.items() if k not in _SHADOWS})


def t(input: Tensor) -> Tensor:  # noqa: A002
    return input.transpose(0, 1) if input.ndim == 2 else input


negative = _WRAPPED["neg"]
absolute = _WRAPPED["abs"]


def is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def numel(x: Tensor) -> int:
    return x.numel()


def addmm(input: Any, mat1: Any, mat2: Any, beta: float = 1, alpha: float = 1) -> Tensor:  # noqa: A002
    return _as_t(input) * beta + (_as_t(mat1) @ mat2) * alpha


def baddbmm(input: Any, batch1: Any, batch2: Any, beta: float = 1, alpha: float = 1) -> Tensor:  # noqa: A002
    return _as_t(input) * beta + _as_t(batch1).bmm(batch2) * alpha


def norm(input: Any, p: Any = "fro", dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    return _as_t(input).norm(p, dim, keepdim)


linalg = types.SimpleNamespace(
    vector_norm=vector_norm,
    norm=lambda x, ord=None, dim=None, keepdim=False: vector_norm(x, 2 if ord is None else ord, dim, keepdim),  # noqa: A006
)


# -- creation -------------------------------------------------------------------------------------------------
def _shape(size: tuple) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], list | tuple):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def _default_dtype(fill: Any, dtype: Any) -> Any:
    if dtype is not None:
        return dtype
    if isinstance(fill, bool):
        return np.bool_
    if isinstance(fill, int):
        return np.int64
    return np.float32


def eye(n: int, m: int | None = None, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return Tensor(np.eye(n, m, dtype=np.dtype(dtype or np.float32)), requires_grad=requires_grad)


def empty(*size: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return _f.zeros(*_shape(size), dtype=dtype, requires_grad=requires_grad)


def full(size: Sequence[int], fill_value: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """torch.full: an int fill gives int64, a bool fill bool, a float fill float32 (unless dtype=)."""
    return _f.full(tuple(size), fill_value, dtype=_default_dtype(fill_value, dtype), requires_grad=requires_grad)


def full_like(x: Tensor, fill_value: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return Tensor(np.full(x.shape, fill_value, np.dtype(dtype or x.dtype)), requires_grad=requires_grad)


def zeros_like(x: Tensor, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return full_like(x, 0, dtype, requires_grad)


def ones_like(x: Tensor, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return full_like(x, 1, dtype, requires_grad)


def empty_like(x: Tensor, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return full_like(x, 0, dtype, requires_grad)


def randn_like(x: Tensor, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return _f.randn(*x.shape, dtype=dtype or x.dtype, requires_grad=requires_grad)


def rand_like(x: Tensor, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return _f.rand(*x.shape, dtype=dtype or x.dtype, requires_grad=requires_grad)


def linspace(start: float, end: float, steps: int, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """torch.linspace; an integer dtype gives torch's values (see ``_int_linspace``), not numpy's floor."""
    try:
        if isinstance(steps, bool):
            raise TypeError
        steps = operator.index(steps)  # ints, numpy ints, 0-d integer tensors; never a truncated float
    except TypeError:
        raise TypeError(f"steps: expected an int, got {type(steps).__name__} {steps!r}") from None
    if steps < 0:
        raise ValueError(f"steps: must be non-negative, got {steps}")
    dt = np.dtype(dtype or np.float32)
    if dt.kind in "iu":
        return Tensor(_int_linspace(start, end, steps, dt), requires_grad=requires_grad)
    return Tensor(np.linspace(start, end, steps, dtype=dt), requires_grad=requires_grad)


def _int_linspace(start: float, end: float, steps: int, dt: np.dtype) -> np.ndarray:
    """torch's CPU kernel for integer linspace: start and end truncated to integers first, a float64 step, the first
    half counted up from start and the second half down from end, each value one fused multiply-add (a single
    rounding: emulated in long double) truncated toward zero. numpy instead floors a float64 linspace."""
    s, e = int(float(start)), int(float(end))
    if steps <= 1:
        return np.full(steps, s).astype(dt)
    ld = np.longdouble
    step = np.float64((e - s) / (steps - 1))
    i = np.arange(steps)
    up = (ld(s) + ld(step) * i.astype(ld)).astype(np.float64)
    down = (ld(e) - ld(step) * (steps - 1 - i).astype(ld)).astype(np.float64)
    return np.trunc(np.where(i < steps // 2, up, down)).astype(np.int64).astype(dt)


def logspace(start: float, end: float, steps: int, base: float = 10.0, dtype: Any = None) -> Tensor:
    return Tensor(np.logspace(start, end, int(steps), base=base).astype(dtype or np.float32))


def randint(low: int, high: int | None = None, size: Sequence[int] = (), dtype: Any = None) -> Tensor:
    """torch.randint(high, size) or randint(low, high, size): int64 in [low, high)."""
    if high is None:
        low, high = 0, low
    if isinstance(high, tuple | list):  # randint(high, size)
        low, high, size = 0, low, high
    if high <= low:
        raise ValueError(f"randint: high {high} must be > low {low}")
    return Tensor(_f.get_rng().integers(low, high, size=tuple(size)).astype(dtype or np.int64))


def randperm(n: int, dtype: Any = None) -> Tensor:
    return Tensor(_f.get_rng().permutation(int(n)).astype(dtype or np.int64))


def normal(mean: float, std: float, size: Sequence[int], dtype: Any = None) -> Tensor:
    return Tensor((_f.get_rng().standard_normal(tuple(size)) * std + mean).astype(dtype or np.float32))


def bernoulli(p: Any) -> Tensor:
    pd = p.data if isinstance(p, Tensor) else np.asarray(p, np.float32)
    return Tensor((_f.get_rng().random(pd.shape) < pd).astype(pd.dtype))


def multinomial(probs: Any, num_samples: int, replacement: bool = False) -> Tensor:
    pd = np.asarray(probs.data if isinstance(probs, Tensor) else probs, np.float64)
    rows = pd.reshape(-1, pd.shape[-1])
    out = [_f.get_rng().choice(rows.shape[1], num_samples, replace=replacement, p=r / r.sum()) for r in rows]
    return Tensor(np.asarray(out, np.int64).reshape(pd.shape[:-1] + (num_samples,)))


def meshgrid(*tensors: Any, indexing: str = "ij") -> tuple:
    if len(tensors) == 1 and isinstance(tensors[0], list | tuple):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        raise ValueError(f"indexing: must be 'ij' or 'xy', got {indexing!r}")
    ts = [_as_t(x) for x in tensors]
    if not ts:
        raise ValueError("tensors: meshgrid expects at least one tensor")
    for i, x in enumerate(ts):
        if x.ndim > 1:
            raise ShapeError(f"tensors: meshgrid expects 0-D or 1-D tensors, tensor {i} has shape {x.shape}")
    n = len(ts)
    swap = indexing == "xy" and n >= 2  # "xy": the first two output dims swapped (a single tensor: nothing to swap)
    shape = tuple(x.numel() for x in ts)
    if swap:
        shape = (shape[1], shape[0]) + shape[2:]
    out = []
    for i, x in enumerate(ts):
        pos = 1 - i if swap and i < 2 else i
        view = [1] * n
        view[pos] = x.numel()
        out.append(x.reshape(*view).expand(*shape))
    return tuple(out)


def where(condition: Any, input: Any = None, other: Any = None) -> Any:  # noqa: A002
    """torch.where(cond, a, b), or torch.where(cond) = cond.nonzero(as_tuple=True)."""
    if input is None and other is None:
        return _as_t(condition).nonzero(as_tuple=True)
    return _f.where(condition, input, other)


__all__ = ["ShapeError", "DimError", "OutOfMemoryError", "einsum", "vector_norm", "linalg", "where", *_METHODS]


def tensor(data: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """torch.tensor: a new leaf (python floats -> float32, ints -> int64, bools -> bool)."""
    arr = np.asarray(data.data if isinstance(data, Tensor) else data)
    if dtype is None and arr.dtype.kind in "iu":
        arr = arr.astype(np.int64)
    return Tensor(arr.copy(), requires_grad=requires_grad, dtype=dtype)


DTYPE_NAMES: dict[str, Any] = {
    "float16": np.dtype(np.float16), "half": np.dtype(np.float16), "float32": np.dtype(np.float32),
    "float": np.dtype(np.float32), "float64": np.dtype(np.float64), "double": np.dtype(np.float64),
    "bfloat16": "bfloat16", "int8": np.dtype(np.int8), "int16": np.dtype(np.int16), "int32": np.dtype(np.int32),
    "int": np.dtype(np.int32), "int64": np.dtype(np.int64), "long": np.dtype(np.int64), "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    """torch's dtype names (tl.float32, tl.long, ...), kept out of the module globals: they shadow builtins."""
    if name in DTYPE_NAMES:
        return DTYPE_NAMES[name]
    if name in _WRAPPED:
        return _WRAPPED[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
