"""The rotate-half RoPE kernel behind ``model.Rope``: op ``inference.rope`` with a numpy reference and the C++ loop.

    forward   y = x * cos + rotate_half(x) * sin        rotate_half([x1, x2]) = [-x2, x1]
    inverse   y = x * cos + R^T(x * sin)                R^T([u1, u2]) = [u2, -u1]   (the backward of forward)

``rope_kernel(x, cos, sin, inverse)`` runs the registry's choice (cpp when tinylearn._C is built, unless a
``backends.use("inference.rope", backend="numpy")`` pin says otherwise) for float32 ``x`` of 1-4 dims with a
unit-stride last dim and cos/sin of one row per position ([T, D]) or one row ([D] / [1, D]); it returns None for
anything else and ``Rope`` runs its own numpy code. The C++ kernel (cpp_src/inference_rope.cpp) reads x through its
strides (q/k are transposed views) and writes y once: [1, 8, 128, 16] 37 us in numpy -> a few us.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends

OP = "inference.rope"


def rope_numpy(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, inverse: bool = False) -> np.ndarray:
    """The reference: cos/sin broadcast against x (same last dim, even)."""
    h = x.shape[-1] // 2
    if inverse:
        u = x * sin
        out = x * cos
        out[..., :h] += u[..., h:]
        out[..., h:] -= u[..., :h]
        return out
    out = x * cos
    out[..., :h] -= x[..., h:] * sin[..., :h]
    out[..., h:] += x[..., :h] * sin[..., h:]
    return out


def _rows(x: np.ndarray, table: np.ndarray) -> np.ndarray | None:
    """``table`` as [T or 1, D] rows for x [..., T, D], or None when it broadcasts some other way."""
    d = x.shape[-1]
    t = x.shape[-2] if x.ndim >= 2 else 1
    if table.ndim == 0 or table.shape[-1] != d or any(n != 1 for n in table.shape[:-2]):
        return None
    rows = table.reshape(-1, d)
    return rows if rows.shape[0] in (1, t) else None


def rope_cpp(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, inverse: bool = False) -> np.ndarray:
    """The C++ kernel; ValueError naming the argument when x / cos / sin do not fit it."""
    if x.dtype != np.float32 or not 1 <= x.ndim <= 4:
        raise ValueError(f"x: expected a float32 array of 1-4 dims, got {x.dtype} with shape {x.shape}")
    c2, s2 = _rows(x, np.asarray(cos)), _rows(x, np.asarray(sin))
    if c2 is None or s2 is None or c2.shape != s2.shape:
        raise ValueError(f"cos, sin: expected [T, D] or [D] rows for x {x.shape}, got {np.shape(cos)}, {np.shape(sin)}")
    return _rope_c(x, c2, s2, inverse)


def _rope_c(x: np.ndarray, c2: np.ndarray, s2: np.ndarray, inverse: bool) -> np.ndarray:
    """The C++ call on checked arguments: float32 x of 1-4 dims, cos / sin as ``_rows``' [T or 1, D] rows."""
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape) if x.ndim < 4 else x  # leading unit dims: a view
    if x4.strides[-1] != x4.itemsize:
        x4 = np.ascontiguousarray(x4)
    return backends.load_C("inference").rope(x4, c2, s2, bool(inverse)).reshape(x.shape)


def rope_kernel(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, inverse: bool) -> np.ndarray | None:
    """The registered kernel's result, or None when the numpy code should run (see the module docstring)."""
    if x.dtype != np.float32 or not 1 <= x.ndim <= 4 or x.shape[-1] % 2 or x.size == 0:
        return None
    if cos.dtype != np.float32 or sin.dtype != np.float32 or backends.resolve(OP)[0] != "cpp":
        return None
    c2, s2 = _rows(x, cos), _rows(x, sin)  # only once the registry has picked the kernel
    if c2 is None or s2 is None or c2.shape != s2.shape:
        return None
    return _rope_c(x, c2, s2, inverse)  # rope_cpp's call, the rows computed once


def _example(rng: Any) -> tuple[tuple, dict]:
    """Conformance input: a transposed [1, 3, 5, 8] view (strided), one cos/sin row per position."""
    x = rng.standard_normal((1, 5, 3, 8)).astype(np.float32).transpose(0, 2, 1, 3)
    ang = rng.standard_normal((5, 8)).astype(np.float32)
    return (x, np.cos(ang), np.sin(ang)), {"inverse": bool(rng.integers(2))}


backends.register(OP, "numpy", rope_numpy, example=_example)
backends.register(OP, "cpp", rope_cpp, available=lambda: backends.C_available("inference"))
