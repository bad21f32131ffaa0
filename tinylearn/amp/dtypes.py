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
    """np.dtype for 'bfloat16' / 'float16' (or those dtypes / torch dtypes); ValueError for anything else."""
    if isinstance(dtype, str):
        key = dtype.removeprefix("torch.")
        if key in LOW_DTYPES:
            return LOW_DTYPES[key]
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
        if dt in (bfloat16, float16):
            return dt
    raise ValueError(f"dtype: expected 'bfloat16' or 'float16', got {dtype!r}")


def is_floating(dtype: Any) -> bool:
    """True for numpy floats and the ml_dtypes floats (whose numpy kind is 'V', not 'f')."""
    dt = np.dtype(dtype)
    return dt.kind == "f" or dt == bfloat16


def finfo(dtype: Any) -> Any:
    """np.finfo that also knows bfloat16 (ml_dtypes.finfo)."""
    return ml_dtypes.finfo(np.dtype(dtype))
