"""Low-precision float dtypes: float16 (numpy's IEEE half) and bfloat16 (``ml_dtypes``), by name.

float32   s eeeeeeee mmmmmmmmmmmmmmmmmmmmmmm   8-bit exponent, 23-bit mantissa, max 3.4e38
bfloat16  s eeeeeeee mmmmmmm                   same exponent range as float32, 7-bit mantissa (~2-3 digits)
float16   s eeeee mmmmmmmmmm                   5-bit exponent: max 65504, smallest normal 6.1e-5,
                                               smallest subnormal 6.0e-8 (gradients below underflow to 0)
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)

LOW_DTYPES = {"bfloat16": bfloat16, "float16": float16, "half": float16, "bf16": bfloat16, "fp16": float16}


def low_dtype(dtype: Any) -> np.dtype:
    """np.dtype for 'bfloat16' / 'float16' (their aliases, numpy/ml_dtypes dtypes or torch dtypes); ValueError for
    any other dtype, TypeError for something that is no dtype at all."""
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":  # torch.bfloat16 -> 'torch.bfloat16'
        dtype = str(dtype)
    if isinstance(dtype, str):
        key = dtype.removeprefix("torch.")
        if key in LOW_DTYPES:
            return LOW_DTYPES[key]
        raise ValueError(f"dtype: expected 'bfloat16' or 'float16', got {dtype!r}")
    if dtype is None or isinstance(dtype, (bool, int, float, complex)):
        raise TypeError(f"dtype: expected a dtype or a dtype name ('bfloat16' or 'float16'), got {dtype!r}")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"dtype: expected a dtype or a dtype name ('bfloat16' or 'float16'), got {type(dtype).__name__} {dtype!r}"
        ) from None
    if dt in (bfloat16, float16):
        return dt
    raise ValueError(f"dtype: expected 'bfloat16' or 'float16', got {dtype!r}")


def is_floating(dtype: Any) -> bool:
    """True for numpy floats and the ml_dtypes floats (whose numpy kind is 'V', not 'f')."""
    dt = _as_dtype(dtype)
    return dt.kind == "f" or dt == bfloat16


def finfo(dtype: Any) -> Any:
    """np.finfo that also knows bfloat16 (ml_dtypes.finfo)."""
    dt = _as_dtype(dtype)
    if not is_floating(dt):
        raise ValueError(f"dtype: finfo needs a floating dtype, got {dt}")
    return ml_dtypes.finfo(dt)


def _as_dtype(dtype: Any) -> np.dtype:
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        return low_dtype(dtype) if str(dtype) in ("torch.bfloat16", "torch.float16") else np.dtype(str(dtype)[6:])
    if isinstance(dtype, str) and dtype in LOW_DTYPES:
        return LOW_DTYPES[dtype]
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype: expected a dtype, got {type(dtype).__name__} {dtype!r}") from None
