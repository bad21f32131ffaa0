"""dtype names and the conversion of user data into a Tensor's array (torch's defaults).

Python floats / lists of floats become float32 (torch's default dtype); numpy arrays and numpy scalars keep their
dtype (float64 is what gradcheck uses); torch tensors keep theirs (detached, moved to CPU). A ``dtype=`` argument
(a numpy dtype or one of the names in ``DTYPES``) converts, copying only when it must.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DTYPES: dict[str, type] = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "int64": np.int64,
    "int32": np.int32,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
}


def is_floating(dtype: np.dtype) -> bool:
    """Floating for autograd: numpy floats and ml_dtypes' bfloat16 (whose numpy kind is 'V')."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def as_dtype(dtype: Any) -> np.dtype:
    """A numpy dtype from a dtype, a numpy type or one of the names in ``DTYPES`` ('bfloat16': ml_dtypes)."""
    if dtype in ("bfloat16", "bf16"):
        import ml_dtypes  # imported on first use: keeps ``import tinylearn`` light

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype)


def as_array(data: Any, dtype: Any = None) -> np.ndarray:
    """``data`` (array, scalar, nested list, torch tensor; not a Tensor) as an ndarray with the rules above."""
    if dtype is not None:
        return np.array(data, dtype=as_dtype(dtype), copy=None)
    if isinstance(data, np.ndarray):
        return data
    if isinstance(data, np.generic):
        return np.asarray(data)
    if type(data).__module__.startswith("torch"):  # torch tensors (even requires_grad ones) keep their dtype
        return data.detach().cpu().numpy()
    arr = np.asarray(data)
    if arr.dtype == np.float64:  # python floats / lists of floats -> float32 (torch's default dtype)
        arr = arr.astype(np.float32)
    return arr


def _category(dt: np.dtype) -> int:
    """torch's promotion categories: bool < integer < floating < complex."""
    k = dt.kind
    return 0 if k == "b" else 1 if k in "iu" else 3 if k == "c" else 2


def promote_pair(a: Any, b: Any, true_div: bool = False) -> tuple[Any, Any]:
    """torch's type promotion where numpy's differs, for two operands that are arrays or python scalars:
    an integer/bool tensor meeting a python float or a float tensor becomes that float dtype (float32 for python
    floats), not float64; true division of integers gives float32; a 0-d tensor does not widen a tensor with dims
    of its own category (float32 tensor * 0-d float64 tensor -> float32, as torch). Floats of different widths
    (both with dims) keep numpy's rule."""
    if (
        isinstance(a, np.ndarray)
        and isinstance(b, np.ndarray)
        and a.dtype != b.dtype
        and (a.ndim == 0) != (b.ndim == 0)
    ):
        zero, full = (a, b) if a.ndim == 0 else (b, a)
        if _category(zero.dtype) == _category(full.dtype):
            zero = zero.astype(full.dtype)
            a, b = (zero, full) if a.ndim == 0 else (full, zero)

    def fix(x: Any, other: Any) -> Any:
        if not isinstance(x, np.ndarray) or x.dtype.kind not in "biu":
            return x
        if isinstance(other, np.ndarray) and other.dtype.kind == "f":
            return x.astype(other.dtype)
        if isinstance(other, float) or (
            true_div and (isinstance(other, int) or (isinstance(other, np.ndarray) and other.dtype.kind in "biu"))
        ):
            return x.astype(np.float32)
        return x

    return fix(a, b), fix(b, a)
