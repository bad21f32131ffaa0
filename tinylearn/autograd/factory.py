"""Tensor factories and the global RNG (``manual_seed``), plus cat / stack / where as free functions.

All random factories draw from one ``np.random.Generator`` reset by ``manual_seed(seed)`` so runs repeat.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import ShapeError
from .methods import _shape_arg
from .ops_shape import Cat, Stack, Where
from .tensor import Tensor

_MAX_NUMEL = np.iinfo(np.intp).max

_rng = np.random.default_rng(0)


def manual_seed(seed: int) -> np.random.Generator:
    """Reseed the generator behind randn/rand/Dropout/init; returns it."""
    global _rng
    if not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    _rng = np.random.default_rng(int(seed))
    return _rng


def get_rng() -> np.random.Generator:
    return _rng


def _dt(dtype: Any) -> np.dtype:
    return np.dtype(np.float32 if dtype is None else dtype)


def _check_shape(shape: Any) -> tuple[int, ...]:
    """The one gate every creation op's shape goes through: entries must be non-negative ints (numpy integers ok;
    bool and float are errors, never truncated)."""
    if isinstance(shape, int | np.integer) and not isinstance(shape, bool | np.bool_):
        shape = (shape,)
    if not isinstance(shape, tuple | list):
        raise TypeError(f"shape: expected a tuple of ints, got {type(shape).__name__} {shape!r}")
    shape = _shape_arg(tuple(shape))
    if any(s < 0 for s in shape):
        raise ValueError(f"shape: negative dimension in shape {shape}")
    if math.prod(shape) > _MAX_NUMEL:  # numpy would say "Maximum allowed dimension exceeded", naming nothing
        raise ValueError(f"shape: {shape} has {math.prod(shape)} elements, more than an array can hold ({_MAX_NUMEL})")
    return shape


def zeros(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return Tensor(np.zeros(_check_shape(_shape_arg(shape)), _dt(dtype)), requires_grad=requires_grad)


def ones(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return Tensor(np.ones(_check_shape(_shape_arg(shape)), _dt(dtype)), requires_grad=requires_grad)


def full(shape: Sequence[int], fill_value: float, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return Tensor(np.full(_check_shape(shape), fill_value, _dt(dtype)), requires_grad=requires_grad)


def zeros_like(t: Tensor, requires_grad: bool = False) -> Tensor:
    return Tensor(np.zeros_like(t.data), requires_grad=requires_grad)


def ones_like(t: Tensor, requires_grad: bool = False) -> Tensor:
    return Tensor(np.ones_like(t.data), requires_grad=requires_grad)


def randn(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    arr = _rng.standard_normal(_check_shape(_shape_arg(shape)), dtype=np.float64).astype(_dt(dtype))
    return Tensor(arr, requires_grad=requires_grad)


def rand(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    arr = _rng.random(_check_shape(_shape_arg(shape))).astype(_dt(dtype))
    return Tensor(arr, requires_grad=requires_grad)


def _arange_bound(name: str, v: Any) -> Any:
    if isinstance(v, Tensor) and v.data.ndim == 0:
        v = v.item()
    if isinstance(v, bool | np.bool_) or not isinstance(v, int | float | np.integer | np.floating):
        raise TypeError(f"{name}: expected a real number, got {type(v).__name__} {v!r}")
    if not np.isfinite(v):
        raise ValueError(f"{name}: must be finite, got {v!r}")
    return v


def arange(start: float, end: float | None = None, step: float = 1, dtype: Any = None) -> Tensor:
    """Like torch.arange: integer arguments give int64, any float argument gives float32."""
    if end is None:
        start, end = 0, start
    start, end, step = (_arange_bound(n, v) for n, v in (("start", start), ("end", end), ("step", step)))
    if step == 0:
        raise ValueError("step: must be non-zero")
    size = math.ceil((end - start) / step)
    # torch raises for a range against the step's sign (numpy returns an empty array, or fails to allocate)
    if (end < start) if step > 0 else (end > start):
        raise ShapeError(
            f"end: upper bound and lower bound inconsistent with step sign: start={start!r}, end={end!r}, step={step!r}"
        )
    if size > _MAX_NUMEL:
        raise ShapeError(f"end: invalid size {size} (possible overflow): start={start!r}, end={end!r}, step={step!r}")
    if dtype is None:
        dtype = np.int64 if all(isinstance(v, int | np.integer) for v in (start, end, step)) else np.float32
    return Tensor(np.arange(start, end, step).astype(dtype))


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return Cat.apply(*[t if isinstance(t, Tensor) else Tensor(t) for t in tensors], dim=dim)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return Stack.apply(*[t if isinstance(t, Tensor) else Tensor(t) for t in tensors], dim=dim)


def where(condition: Any, a: Any = None, b: Any = None) -> Any:
    """Elementwise ``a if condition else b`` (broadcasting); gradients flow to a and b, never to condition.

    With the condition alone: its nonzero indices as a tuple (torch.where(cond))."""
    cond = condition.data if isinstance(condition, Tensor) else np.asarray(condition)
    if a is None and b is None:
        return Tensor(cond).nonzero(as_tuple=True)
    if isinstance(a, np.ndarray):
        a = Tensor(a)
    if isinstance(b, np.ndarray):
        b = Tensor(b)
    return Where.apply(cond, a, b)
