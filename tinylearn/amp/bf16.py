"""float32 -> bfloat16 by bit manipulation: keep the top 16 bits, rounding to nearest, ties to even.

bfloat16 is the upper half of a float32. Dropping the low 16 bits truncates; to round to nearest-even add
0x7FFF plus the lowest *kept* bit before shifting (c10::round_to_nearest_even, which torch uses):

    bits   = float32 bits as uint32
    bias   = 0x7FFF + ((bits >> 16) & 1)      # lsb of the result decides ties: round to the even one
    bf16   = (bits + bias) >> 16              # a carry out of the mantissa bumps the exponent (correctly)
    NaN    -> 0x7FC0 (quiet NaN; adding the bias could turn a NaN payload into Inf)

Overflow comes for free: values above the largest bfloat16 carry into the all-ones exponent = Inf.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._inputs import as_array
from .dtypes import bfloat16

_REAL = ("f", "i", "u", "b")  # what x may hold: real numbers (str, object, complex: TypeError naming x)


def bf16_bits(x: Any) -> np.ndarray:
    """uint16 bfloat16 bit patterns of ``x`` (cast to float32 first), round-to-nearest-even."""
    f = np.array(as_array(x, "x", dtypes=_REAL), dtype=np.float32, order="C", copy=True)
    bits = f.view(np.uint32).astype(np.uint64)
    bias = 0x7FFF + ((bits >> 16) & 1)
    out = ((bits + bias) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), out).astype(np.uint16)


def bf16_bits_to_float32(bits: Any) -> np.ndarray:
    """float32 values of uint16 bfloat16 bit patterns (exact: append 16 zero bits)."""
    b = np.asarray(bits)
    if b.dtype != np.uint16:
        raise TypeError(f"bits: expected a uint16 array, got dtype {b.dtype}")
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_to_bf16(x: Any) -> np.ndarray:
    """float32 array holding ``x`` rounded to the nearest bfloat16 (ties to even)."""
    return bf16_bits_to_float32(bf16_bits(x))


def to_bfloat16(x: Any) -> np.ndarray:
    """An ml_dtypes.bfloat16 array built from our rounding (same bits as ``x.astype(bfloat16)``)."""
    return bf16_bits(x).view(bfloat16)
