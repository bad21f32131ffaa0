"""The one input policy: every public function that takes a numpy array takes it through ``as_array``.

Accepted wherever a numpy array is: ``np.ndarray`` (returned as is, no copy), ``tl.Tensor`` (its ``.data``), a torch
CPU tensor (``.detach().numpy()``, shares memory), and anything ``np.asarray`` understands (lists, scalars).

Errors, the same in every topic, always naming the argument:

    TypeError   the value is not array-like, or its dtype is not one the function accepts
    ValueError  wrong number of dimensions, a torch tensor on a non-CPU device (shape/value problems)

Integer arguments (sizes, counts, steps, seeds) go through ``as_int`` (or the predicate ``is_int``): the
``operator.index`` rule, so ``np.int64(256)`` and a 0-d integer torch tensor count as 256 like in torch, while bool
(``True`` is not a size), floats (``4.7`` is never truncated) and strings are a TypeError naming the argument.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

# dtype kinds by name, for messages and for ``dtypes=`` shorthands
_KIND_NAMES = {"b": "bool", "i": "signed int", "u": "unsigned int", "f": "float", "c": "complex"}


def _torch_tensor_type() -> type | None:
    torch = sys.modules.get("torch")  # never import torch just to check: if it is not loaded, x is no torch tensor
    return None if torch is None else torch.Tensor


def _tl_tensor_type() -> type | None:
    mod = sys.modules.get("tinylearn")
    return getattr(mod, "Tensor", None)


def to_numpy(x: Any, name: str = "x") -> np.ndarray:
    """numpy view of ``x`` (ndarray, tl.Tensor, torch CPU tensor, array-like); no dtype or shape checks."""
    if isinstance(x, np.ndarray):
        return x
    tl_tensor = _tl_tensor_type()
    if tl_tensor is not None and isinstance(x, tl_tensor):
        return x.data
    torch_tensor = _torch_tensor_type()
    if torch_tensor is not None and isinstance(x, torch_tensor):
        if x.device.type != "cpu":
            raise ValueError(f"{name}: expected a CPU tensor, got a torch tensor on device {x.device}")
        t = x.detach()
        if t.dtype == sys.modules["torch"].bfloat16:
            raise TypeError(f"{name}: torch.bfloat16 has no numpy dtype; convert with .float() first")
        return t.resolve_conj().resolve_neg().numpy()
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name}: expected an array-like (numpy array, tl.Tensor, torch tensor), got {x!r}") from e
    if a.dtype == object:
        raise TypeError(f"{name}: expected a numeric array-like, got {type(x).__name__} (object dtype)")
    return a


def is_float_dtype(dt: np.dtype) -> bool:
    """numpy floats plus the ml_dtypes extension floats (bfloat16, float8_*), whose numpy kind is 'V'."""
    return dt.kind == "f" or (dt.kind == "V" and (dt.name == "bfloat16" or dt.name.startswith("float")))


def _dtype_ok(dt: np.dtype, accepted: Iterable[Any]) -> bool:
    for want in accepted:
        if isinstance(want, str) and len(want) == 1 and want in _KIND_NAMES:
            if dt.kind == want or (want == "f" and is_float_dtype(dt)):
                return True
        elif dt == np.dtype(want):
            return True
    return False


def _describe(accepted: Iterable[Any]) -> str:
    out = []
    for want in accepted:
        if isinstance(want, str) and len(want) == 1 and want in _KIND_NAMES:
            out.append(f"any {_KIND_NAMES[want]}")
        else:
            out.append(str(np.dtype(want)))
    return ", ".join(out)


def as_array(
    x: Any,
    name: str,
    *,
    dtypes: Iterable[Any] | None = None,
    ndim: int | tuple[int, ...] | None = None,
    min_ndim: int | None = None,
) -> np.ndarray:
    """``x`` as a numpy array, checked. ``dtypes``: accepted dtypes or kind codes ("f" float, "i" signed int,
    "u" unsigned, "b" bool, "c" complex); ``ndim``: accepted number(s) of dimensions; ``min_ndim``: a lower bound.
    TypeError for a wrong type/dtype, ValueError for a wrong shape, both naming ``name``."""
    a = to_numpy(x, name)
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if not _dtype_ok(a.dtype, dtypes):
            raise TypeError(f"{name}: expected dtype {_describe(dtypes)}, got {a.dtype}")
    if ndim is not None:
        allowed = (ndim,) if is_int(ndim) else tuple(ndim)
        if a.ndim not in allowed:
            want = " or ".join(f"{n}-D" for n in allowed)
            raise ValueError(f"{name}: expected a {want} array, got shape {a.shape}")
    if min_ndim is not None and a.ndim < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dimensions, got shape {a.shape}")
    return a


FLOATS = ("f",)
INTS = ("i", "u")


def is_int(v: Any) -> bool:
    """True for an integer argument under ``operator.index`` (int, numpy integers, 0-d integer tensors); False for
    bool / numpy bool (a flag is no count), floats, strings and everything else."""
    if isinstance(v, bool | np.bool_):
        return False
    try:
        operator.index(v)
    except TypeError:
        return False
    return True


def is_real(v: Any) -> bool:
    """True for a real number argument: int, float, numpy integers and floats; False for bool / numpy bool, strings,
    arrays and everything else (finiteness is the caller's check)."""
    return isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool | np.bool_)


def as_int(v: Any, name: str, *, min: int | None = None, max: int | None = None) -> int:  # noqa: A002
    """``v`` as a Python int (``is_int`` rule): TypeError naming ``name`` for bool/float/str/...; ValueError when it
    is below ``min`` or above ``max``. ``as_int(np.int64(256), "size", min=1) == 256``."""
    if not is_int(v):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__} {v!r}")
    i = operator.index(v)
    if min is not None and i < min:
        raise ValueError(f"{name}: must be >= {min}, got {i}")
    if max is not None and i > max:
        raise ValueError(f"{name}: must be <= {max}, got {i}")
    return i
