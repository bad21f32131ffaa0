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
