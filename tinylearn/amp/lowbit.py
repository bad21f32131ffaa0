"""4-bit float (FP4 E2M1, the OCP MX element format) and 2-bit integers, with straight-through fake-quant.

FP4 E2M1: 1 sign, 2 exponent (bias 1), 1 mantissa bit, no Inf/NaN. The 8 magnitudes, by code 0..7:

    code  000  001  010  011  100  101  110  111
    value 0    0.5  1    1.5  2    3    4    6      (001 is the subnormal 0.5 = 2^0 * 0.5)

Encoding rounds to the nearest magnitude, ties to the even code (mantissa bit 0), and saturates at +-6
(MX spec, section 5.3: conversions to FP4 are saturating). Same codes as ``ml_dtypes.float4_e2m1fn``.

INT2: signed two's complement {-2, -1, 0, 1}, q = clamp(round_half_even(x / scale), -2, 1).

Fake-quant x -> dequant(quant(x)) in the forward, straight-through estimator (STE) in the backward: the gradient
passes unchanged where x was inside the representable range and is zero where it was clipped (as
torch.fake_quantize_per_tensor_affine does).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._inputs import as_array
from ..autograd import Function, Tensor
from .args import positive_real

FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
FP4_MAX = 6.0
_FP4_MID = (FP4_VALUES[1:] + FP4_VALUES[:-1]) / 2  # decision boundaries between neighbouring codes
INT2_MIN, INT2_MAX = -2, 1


def fp4_encode(x: Any) -> np.ndarray:
    """uint8 FP4 E2M1 codes (low 4 bits: sign<<3 | magnitude code), round-to-nearest-even, saturating."""
    a = np.asarray(as_array(x, "x", dtypes=("f", "i", "u", "b")), dtype=np.float32)
    if np.isnan(a).any():
        raise ValueError("x: FP4 E2M1 has no NaN encoding, got NaN input")
    mag = np.abs(a)
    idx = np.searchsorted(_FP4_MID, mag, side="left")  # mid[i-1] < mag <= mid[i]  ->  i
    tie = (idx < len(_FP4_MID)) & (mag == _FP4_MID[np.minimum(idx, len(_FP4_MID) - 1)]) & (idx % 2 == 1)
    code = (idx + tie).astype(np.uint8)
    return code | (np.signbit(a).astype(np.uint8) << 3)


def fp4_decode(codes: Any) -> np.ndarray:
    """float32 values of FP4 E2M1 codes."""
    c = np.asarray(codes)
    if c.dtype.kind not in "iu" or (c.size and (c.min() < 0 or c.max() > 15)):
        raise ValueError(f"codes: expected integer FP4 codes in [0, 15], got dtype {c.dtype}")
    mag = FP4_VALUES[c & 7]
    return np.where(c & 8, -mag, mag).astype(np.float32)


def fp4_round(x: Any) -> np.ndarray:
    """``x`` rounded to the nearest FP4 E2M1 value (float32)."""
    return fp4_decode(fp4_encode(x))


def int2_quantize(x: Any, scale: float) -> np.ndarray:
    """int8 array of INT2 codes in [-2, 1]: clamp(round_half_even(x / scale))."""
    s = np.float32(positive_real(scale, "scale"))
    a = np.asarray(as_array(x, "x", dtypes=("f", "i", "u", "b")), dtype=np.float32)
    if np.isnan(a).any():
        raise ValueError("x: INT2 has no NaN encoding, got NaN input")
    return np.clip(np.rint(a / s), INT2_MIN, INT2_MAX).astype(np.int8)


class _FakeQuantSTE(Function):
    @staticmethod
    def forward(ctx, x, fmt, scale):
        s = np.float32(scale)
        if fmt == "fp4":
            y = fp4_round(x / s) * s
            keep = np.abs(x / s) <= FP4_MAX
        else:
            q = np.rint(x / s)
            y = np.clip(q, INT2_MIN, INT2_MAX) * s
            keep = (q >= INT2_MIN) & (q <= INT2_MAX)
        ctx.save_for_backward(keep)
        return y.astype(x.dtype)

    @staticmethod
    def backward(ctx, g):
        (keep,) = ctx.saved_tensors
        return g * keep, None, None


def fake_quant_fp4(x: Tensor, scale: float = 1.0) -> Tensor:
    """scale * fp4_round(x / scale), STE gradient (zero outside +-6*scale)."""
    return _FakeQuantSTE.apply(_tensor(x), "fp4", positive_real(scale, "scale"))


def fake_quant_int2(x: Tensor, scale: float) -> Tensor:
    """scale * clamp(round(x / scale), -2, 1), STE gradient (zero where clamped)."""
    return _FakeQuantSTE.apply(_tensor(x), "int2", positive_real(scale, "scale"))


def _tensor(x: Any) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"x: expected a tinylearn Tensor, got {type(x).__name__}")
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
        raise TypeError(f"x: expected a floating Tensor, got dtype {x.dtype}")
    return x


def absmax_scale(x: Any, fmt: str) -> float:
    """Per-tensor scale mapping max|x| onto the largest magnitude of ``fmt`` ('fp4' -> 6, 'int2' -> 2)."""
    top = {"fp4": FP4_MAX, "int2": 2.0}.get(fmt) if isinstance(fmt, str) else None
    if top is None:
        raise ValueError(f"fmt: expected 'fp4' or 'int2', got {fmt!r}")
    a = np.asarray(as_array(x, "x", dtypes=("f", "i", "u", "b")), dtype=np.float32)
    if not np.isfinite(a).all():
        raise ValueError(f"x: absmax_scale needs finite values, got {'NaN' if np.isnan(a).any() else 'Inf'} input")
    m = float(np.abs(a).max(initial=0.0))
    return m / top if m > 0 else 1.0
