"""INT4: two's-complement nibble packing and group-wise weight quantization (weight-only int4, GPTQ/AWQ layout).

Packing: element 2i goes to the low nibble of byte i, element 2i+1 to the high nibble; an odd count pads the
last high nibble with 0.  A nibble n in 0..15 decodes to n - 16 if n >= 8 (two's complement), so -8..7 round-trip.

Group-wise: the last axis of w [out, in] is cut into groups of ``group_size`` consecutive values; each group g has
its own scale (and zero point when asymmetric):

    symmetric:  s_g = max|w_g| / qmax (qmax = 2^(b-1) - 1), q = clamp(round(w / s_g), -2^(b-1), qmax), zp = 0
    asymmetric: s_g = (max - min) / (2^b - 1), zp_g = round(-min / s_g), q = clamp(round(w / s_g) + zp_g, 0, 2^b - 1)

(The symmetric divisor is qmax, not (qmax - qmin)/2, so the largest weight maps exactly onto +qmax — the
llama.cpp/GPTQ convention for weights, differing from torch's activation observers.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._inputs import as_array, as_int


def pack_int4(q: Any) -> np.ndarray:
    """Pack int values in [-8, 7] (or uint4 in [0, 15]) along a flattened array: two per byte, low nibble first."""
    qa = np.asarray(q)
    if qa.dtype.kind not in "iu":
        raise TypeError(f"q: expected an integer array, got dtype {qa.dtype}")
    flat = qa.reshape(-1)
    if flat.size and (int(flat.min()) < -8 or int(flat.max()) > 15):  # range check before any narrowing cast
        raise ValueError(
            f"q: values must fit in 4 bits ([-8, 7] signed or [0, 15] unsigned), got range [{flat.min()}, {flat.max()}]"
        )
    flat = flat.astype(np.int16)
    nib = (flat & 0xF).astype(np.uint8)
    if nib.size % 2:
        nib = np.concatenate([nib, np.zeros(1, np.uint8)])
    return (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8)


def unpack_int4(packed: Any, n: int, signed: bool = True) -> np.ndarray:
    """The first ``n`` values stored by pack_int4: int8 in [-8, 7] (``signed=False``: uint8 in [0, 15])."""
    p = np.asarray(packed)
    if p.dtype != np.uint8:
        raise TypeError(f"packed: expected a uint8 array, got dtype {p.dtype}")
    if not isinstance(n, int | np.integer) or n < 0 or n > 2 * p.size:
        raise ValueError(f"n: must be an int in [0, {2 * p.size}] for {p.size} packed bytes, got {n!r}")
    flat = p.reshape(-1)
    out = np.empty(2 * flat.size, np.uint8)
    out[0::2] = flat & 0xF
    out[1::2] = flat >> 4
    out = out[: int(n)]
    if not signed:
        return out
    return (out.astype(np.int8) - ((out >= 8).astype(np.int8) << 4)).astype(np.int8)


def _groups(w: np.ndarray, group_size: int) -> np.ndarray:
    group_size = as_int(group_size, "group_size", min=1)
    if w.ndim < 1:
        raise ValueError("w: need at least 1 dimension, got a scalar")
    if w.shape[-1] % group_size:
        raise ValueError(f"group_size: {group_size} does not divide the last dimension of w with shape {w.shape}")
    return w.reshape(*w.shape[:-1], w.shape[-1] // group_size, group_size)


def quantize_groupwise(
    w: Any, group_size: int = 128, bits: int = 4, symmetric: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, scales, zero_points): q has w's shape (int8 if symmetric else uint8); scales/zero_points have shape
    w.shape[:-1] + (w.shape[-1] // group_size,)."""
    bits = as_int(bits, "bits", min=2, max=8)
    wa = as_array(w, "w", dtypes=("f",)).astype(np.float32)
    if not np.all(np.isfinite(wa)):
        raise ValueError("w: contains NaN or inf")
    g = _groups(wa, group_size)
    eps = np.float32(np.finfo(np.float32).eps)
    if symmetric:
        qmax, qmin = 2 ** (bits - 1) - 1, -(2 ** (bits - 1))
        scale = np.maximum(np.abs(g).max(-1) / np.float32(qmax), eps).astype(np.float32)
        zp = np.zeros(scale.shape, np.int64)
        q = np.clip(np.rint(g / scale[..., None]), qmin, qmax).astype(np.int8)
    else:
        qmax = 2**bits - 1
        lo = np.minimum(g.min(-1), 0).astype(np.float32)
        hi = np.maximum(g.max(-1), 0).astype(np.float32)
        scale = np.maximum((hi - lo) / np.float32(qmax), eps).astype(np.float32)
        zp = np.clip(np.rint(-lo / scale), 0, qmax).astype(np.int64)
        q = np.clip(np.rint(g / scale[..., None]) + zp[..., None], 0, qmax).astype(np.uint8)
    return q.reshape(wa.shape), scale, zp


def dequantize_groupwise(q: Any, scales: Any, zero_points: Any, group_size: int) -> np.ndarray:
    """w_hat = (q - zp_g) * s_g, float32, same shape as q."""
    qa = np.asarray(q)
    g = _groups(qa.astype(np.float32), group_size)
    s = np.asarray(scales, np.float32)
    z = np.asarray(zero_points, np.float32)
    if s.shape != g.shape[:-1] or z.shape != g.shape[:-1]:
        raise ValueError(f"scales/zero_points: expected shape {g.shape[:-1]}, got {s.shape} and {z.shape}")
    return ((g - z[..., None]) * s[..., None]).astype(np.float32).reshape(qa.shape)
