"""Argument handling shared by the autograd conv / pool / resampling Functions (``functional_*.py``) on tl.Tensors.

Unbatched inputs ([C, *spatial]) are accepted like torch: a batch axis is added and removed around the op. The
kernels behind the Functions are chosen by ``tinylearn.backends`` (``backend=None``: the registry's choice, or what
``backends.use(op, backend=..., version=...)`` pins); only dtypes the compiled kernels do not take (float16) are
sent to numpy explicitly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..autograd.tensor import Tensor
from ._params import as_float_array

_SPATIAL = {1: "L", 2: "H, W", 3: "D, H, W"}
_NATIVE = (np.float32, np.float64)
_F = TypeVar("_F", bound=Callable[..., Any])


def as_tensor(x: Any, name: str) -> Tensor:
    """A Tensor (numpy arrays are wrapped); TypeError naming ``name`` otherwise."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        return Tensor(x)
    raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")


def batched(x: Any, nd: int, name: str) -> tuple[Tensor, bool]:
    """(x with a batch axis, whether one was added) for an op over ``nd`` spatial dims; ValueError otherwise."""
    x = as_tensor(x, "input")
    if x.ndim == nd + 2:
        return x, False
    if x.ndim == nd + 1:
        return x.unsqueeze(0), True
    raise ValueError(
        f"input: {name} expects a {nd + 1}-D [C, {_SPATIAL[nd]}] or {nd + 2}-D [N, C, {_SPATIAL[nd]}] tensor, "
        f"got shape {tuple(x.shape)}"
    )


def unbatch(y: Any, squeeze: bool) -> Any:
    """Remove the batch axis ``batched`` added (from every output of a tuple)."""
    if not squeeze:
        return y
    if isinstance(y, tuple):
        return tuple(t.squeeze(0) for t in y)
    return y.squeeze(0)


def backend_for(*arrays: Any) -> str | None:
    """None (the registry's choice, or the pinned one) unless an array has a dtype only numpy takes (float16)."""
    if any(a is not None and a.dtype not in _NATIVE for a in arrays):
        return "numpy"
    return None


def common_dtype(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> tuple:
    """(x, w, b) as float arrays of their common dtype (ints -> float32)."""
    x, w = as_float_array(x, "input"), as_float_array(w, "weight")
    b = None if b is None else as_float_array(b, "bias")
    dt = np.result_type(x.dtype, w.dtype) if b is None else np.result_type(x.dtype, w.dtype, b.dtype)
    return x.astype(dt, copy=False), w.astype(dt, copy=False), None if b is None else b.astype(dt, copy=False)


def per_ndim(pattern: str) -> Callable[[Callable[[int, str], _F]], Callable[[int, str], _F]]:
    """Decorator for the factory of one of torch's 1-d/2-d/3-d functional families (one definition with torch's
    signature for every ndim): the decorated ``maker(nd, name)`` returns the function over ``nd`` spatial dims
    (``name`` is ``pattern`` with ``{nd}`` filled in, for its messages); ``factory(nd, doc)`` returns it named
    ``name`` (``__name__`` / ``__qualname__``) with the docstring ``doc``."""

    def decorate(maker: Callable[[int, str], _F]) -> Callable[[int, str], _F]:
        def factory(nd: int, doc: str) -> _F:
            name = pattern.format(nd=nd)
            fn = maker(nd, name)
            fn.__name__ = fn.__qualname__ = name
            fn.__doc__ = doc
            return fn

        factory.__doc__ = maker.__doc__
        return factory

    return decorate
