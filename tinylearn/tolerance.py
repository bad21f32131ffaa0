"""The DESIGN.md tolerance table and assert_close (library layer: tinylearn.dist's self-checks use it, and
tinylearn.testing re-exports it for the tests).

Invariant checked: |a - e| <= atol + rtol * |e| elementwise, with (atol, rtol) from the dtype row below;
low-precision inputs are upcast to float32 (float64 stays float64) before the difference is taken. NaNs must
match position for position (equal_nan), infinities must match exactly. Integers/bools: exact equality.

Reductions over more than 1k elements may widen fp32 to 1e-4 / 1e-3 (pass ``reduction_size``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._inputs import as_int as _as_int
from ._inputs import to_numpy as _to_numpy

# dtype name -> (atol, rtol)
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-10, 1e-7),
    "float32": (1e-5, 1e-4),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1e-2),
}
_FP32_WIDE = (1e-4, 1e-3)
_INT_NAMES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"}


def _dtype_name(dtype: Any) -> str:
    """Normalise numpy / torch / string dtypes to a plain name ('float32', 'bfloat16', 'int8', ...)."""
    if dtype is None:
        raise ValueError("dtype: None is not a dtype")
    if isinstance(dtype, str):
        name = dtype
    else:
        name = str(dtype)
        if name.startswith("torch."):
            name = name[len("torch.") :]
        else:
            try:
                name = np.dtype(dtype).name
            except TypeError as e:
                raise ValueError(f"dtype: unknown dtype {dtype!r}") from e
    aliases = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32"}
    name = aliases.get(name, name)
    if name not in TOLERANCES and name not in _INT_NAMES:
        raise ValueError(f"dtype: unknown dtype {dtype!r}; known: {sorted(TOLERANCES) + sorted(_INT_NAMES)}")
    return name


def tolerance(dtype: Any, reduction_size: int | None = None) -> tuple[float, float]:
    """(atol, rtol) for ``dtype``; integer dtypes give (0, 0). fp32 reductions over >1k elements widen."""
    name = _dtype_name(dtype)
    if reduction_size is not None:
        reduction_size = _as_int(reduction_size, "reduction_size", min=0)
    if name in _INT_NAMES:
        return 0.0, 0.0
    if name == "float32" and reduction_size is not None and reduction_size > 1000:
        return _FP32_WIDE
    return TOLERANCES[name]


def to_numpy(x: Any) -> np.ndarray:
    """What an *expected/actual value* is compared as: like ``tinylearn._inputs.to_numpy`` (the input policy), but
    lenient the way a test oracle must be: torch tensors on any device (copied to the host), bf16 upcast to fp32,
    tinygrad Tensors (``.numpy()``)."""
    if type(x).__module__.startswith("torch"):
        t = x.detach().cpu()
        return (t.float() if str(t.dtype) == "torch.bfloat16" else t).numpy()
    if not isinstance(x, np.ndarray) and type(x).__module__.startswith("tinygrad"):
        return np.asarray(x.numpy())
    return _to_numpy(x, "value")


def _src_dtype_name(x: Any) -> str | None:
    mod = type(x).__module__
    if mod.startswith("torch"):
        return _dtype_name(x.dtype)
    try:
        return _dtype_name(to_numpy(x).dtype)
    except ValueError:
        return None


def assert_close(
    actual: Any,
    expected: Any,
    dtype: Any = None,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    reduction_size: int | None = None,
    check_shape: bool = True,
    msg: str = "",
) -> None:
    """Assert ``actual`` matches ``expected`` within the DESIGN.md tolerance for ``dtype``.

    ``dtype`` defaults to the expected value's dtype (a torch bfloat16 tensor counts as bfloat16).
    Explicit ``atol``/``rtol`` override the table. Raises AssertionError with max abs/rel error and where.
    """
    name = _dtype_name(dtype) if dtype is not None else _src_dtype_name(expected)
    if name is None:
        raise ValueError(f"dtype: cannot infer a dtype from expected of type {type(expected).__name__}")
    a = to_numpy(actual)
    e = to_numpy(expected)
    prefix = f"{msg}: " if msg else ""
    if check_shape and a.shape != e.shape:
        raise AssertionError(f"{prefix}shape mismatch: actual {a.shape} vs expected {e.shape}")
    try:
        a_b, e_b = np.broadcast_arrays(a, e)
    except ValueError as err:
        raise AssertionError(f"{prefix}shapes do not broadcast: actual {a.shape} vs expected {e.shape}") from err
    if name in _INT_NAMES:
        if not np.issubdtype(a_b.dtype, np.integer) and a_b.dtype != np.bool_:
            if not np.all(np.isfinite(a_b)) or np.any(a_b != np.round(a_b)):
                raise AssertionError(f"{prefix}expected integers ({name}), got non-integral {a_b.dtype} values")
        bad = a_b.astype(np.int64) != e_b.astype(np.int64)
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            raise AssertionError(
                f"{prefix}{int(bad.sum())}/{bad.size} integer mismatches ({name}, exact); first at {idx}: "
                f"actual {a_b[idx]} vs expected {e_b[idx]}"
            )
        return
    t_atol, t_rtol = tolerance(name, reduction_size)
    atol = t_atol if atol is None else atol
    rtol = t_rtol if rtol is None else rtol
    work = np.float64 if name == "float64" else np.float32
    af = a_b.astype(work)
    ef = e_b.astype(work)
    a_nan, e_nan = np.isnan(af), np.isnan(ef)
    if (a_nan != e_nan).any():
        idx = tuple(int(i) for i in np.argwhere(a_nan != e_nan)[0])
        raise AssertionError(f"{prefix}NaN mismatch at {idx}: actual {af[idx]} vs expected {ef[idx]}")
    a_inf, e_inf = np.isinf(af), np.isinf(ef)
    if (a_inf != e_inf).any() or (af[e_inf] != ef[e_inf]).any():
        idx = tuple(int(i) for i in np.argwhere((a_inf != e_inf) | (e_inf & (af != ef)))[0])
        raise AssertionError(f"{prefix}inf mismatch at {idx}: actual {af[idx]} vs expected {ef[idx]}")
    fin = ~(e_nan | e_inf)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(fin, np.abs(af - ef), 0)
    bound = atol + rtol * np.abs(np.where(fin, ef, 0))
    bad = diff > bound
    if bad.any():
        rel = diff / np.maximum(np.abs(ef), np.finfo(work).tiny)
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff - bound)), diff.shape)) if diff.ndim else ()
        raise AssertionError(
            f"{prefix}{int(bad.sum())}/{bad.size} elements outside tolerance ({name}: atol={atol:g}, rtol={rtol:g}); "
            f"max abs err {float(diff.max()):.3e}, max rel err {float(np.max(np.where(fin, rel, 0))):.3e}; "
            f"worst at {worst}: actual {af[worst]!r} vs expected {ef[worst]!r}"
        )
