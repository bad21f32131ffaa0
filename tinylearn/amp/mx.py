"""MX block scaling (OCP Microscaling Formats spec v1.0): 32 elements share one power-of-two scale.

For each block V_1..V_k (k = 32, along ``axis``), spec section 6.3:

    shared_exp = floor(log2(max_i |V_i|)) - emax_elem          # emax_elem: exponent of the element format's
    X          = 2^shared_exp   (stored as E8M0: 8-bit biased    #   largest normal (FP4 E2M1: 2, FP8 E4M3: 8,
                 exponent, clamped to [-127, 127])              #   INT8: 0 -- 1.xx fixed point, scale 2^-6)
    P_i        = quantize_elem(V_i / X)      saturating at the element format's max magnitude
    decode     V_i ~ X * P_i

The largest element lands in [2^emax, 2^(emax+1)), i.e. near the top of the element range; values above the
element max (e.g. 7.9 for FP4 whose max is 6) saturate -- the price of a power-of-two scale. Storage: k
elements of b bits + 8 bits of scale per block = b + 8/32 bits per element (MXFP4: 4.25 bits).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .._inputs import as_array
from .args import as_int, is_int
from .lowbit import fp4_round

MX_FORMATS = {  # name -> (emax_elem, max magnitude, bits)
    "fp4_e2m1": (2, 6.0, 4),
    "fp8_e4m3": (8, 448.0, 8),
    "int8": (0, 127 / 64, 8),
}


_MAX_PADDED = 1 << 26  # elements: zero-padding beyond this (and beyond 2x the data) is a mistaken block_size


def _check_fmt(fmt: Any) -> None:
    if not isinstance(fmt, str) or fmt not in MX_FORMATS:
        raise ValueError(f"fmt: expected one of {sorted(MX_FORMATS)}, got {fmt!r}")


def _axis(axis: Any, ndim: int) -> int:
    """``axis`` normalised into [0, ndim) (IndexError naming it when out of range, like torch's dim errors)."""
    axis = as_int(axis, "axis")
    if not -ndim <= axis < ndim:
        raise IndexError(f"axis: expected an axis in [{-ndim}, {ndim}) for {ndim}-D x, got {axis}")
    return axis % ndim


def _elem_round(v: np.ndarray, fmt: str) -> np.ndarray:
    _, vmax, _ = MX_FORMATS[fmt]
    v = np.clip(v, -vmax, vmax)  # saturating conversion
    if fmt == "fp4_e2m1":
        return fp4_round(v)
    if fmt == "fp8_e4m3":
        return v.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return np.clip(np.rint(v * 64), -128, 127).astype(np.float32) / 64  # MXINT8: two's complement * 2^-6


def _blocks(x: np.ndarray, block_size: int, axis: int) -> tuple[np.ndarray, int]:
    x = np.moveaxis(x, axis, -1)
    n = x.shape[-1]
    pad = (-n) % block_size
    if pad:
        x = np.concatenate([x, np.zeros((*x.shape[:-1], pad), x.dtype)], axis=-1)
    return x.reshape(*x.shape[:-1], -1, block_size), n


def mx_quantize(x: Any, fmt: str = "fp4_e2m1", block_size: int = 32, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(shared exponents int16 [..., n_blocks], element values float32 [..., n_blocks, block_size]).

    The blocked axis is moved last and zero-padded to a multiple of ``block_size``."""
    _check_fmt(fmt)
    if not is_int(block_size) or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    block_size = int(block_size)
    a = np.asarray(as_array(x, "x", dtypes=("f", "i", "u")), dtype=np.float32)
    if a.ndim == 0:
        raise ValueError("x: expected at least 1 dimension, got a scalar")
    axis = _axis(axis, a.ndim)
    if a.shape[axis] == 0:
        raise ValueError(f"x: the blocked axis {axis} is empty (shape {a.shape})")
    padded = -(-a.shape[axis] // block_size) * block_size * (a.size // a.shape[axis])
    if padded > max(2 * a.size, _MAX_PADDED):  # a block far longer than the axis: padding, not data, fills memory
        raise ValueError(
            f"block_size: {block_size} would zero-pad the {a.shape[axis]} elements of axis {axis} to {padded} "
            f"elements; use a block_size up to the axis length (the MX spec uses 32)"
        )
    if not np.isfinite(a).all():
        raise ValueError("x: MX quantization needs finite inputs (got Inf/NaN)")
    b, _ = _blocks(a, block_size, axis)
    amax = np.abs(b).max(axis=-1)
    emax = MX_FORMATS[fmt][0]
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(amax > 0, amax, 1.0))).astype(np.int32) - emax
    e = np.where(amax > 0, np.clip(e, -127, 127), -127).astype(np.int16)
    scale = np.ldexp(np.float32(1), e.astype(np.int32))[..., None]
    return e, _elem_round(b / scale, fmt)


def mx_dequantize(shared_exp: np.ndarray, elems: np.ndarray, n: int | None = None, axis: int = -1) -> np.ndarray:
    """float32 X * P, blocks flattened back, cut to ``n`` elements and moved back to ``axis``."""
    shared_exp = as_array(shared_exp, "shared_exp", dtypes=("i", "u"))
    elems = np.asarray(as_array(elems, "elems", dtypes=("f",)), dtype=np.float32)
    if elems.ndim < 2 or elems.shape[:-1] != shared_exp.shape:
        raise ValueError(
            f"shared_exp, elems: expected exponents [..., n_blocks] and elements [..., n_blocks, block_size] "
            f"(what mx_quantize returns), got {shared_exp.shape}, {elems.shape}"
        )
    if n is not None and not 0 <= as_int(n, "n") <= elems.shape[-2] * elems.shape[-1]:
        raise ValueError(f"n: must be in [0, {elems.shape[-2] * elems.shape[-1]}] (the padded length), got {n}")
    v = elems * np.ldexp(np.float32(1), np.asarray(shared_exp, dtype=np.int32))[..., None]
    v = v.reshape(*v.shape[:-2], -1).astype(np.float32)
    if n is not None:
        v = v[..., :n]
    return np.moveaxis(v, -1, _axis(axis, v.ndim))


def mx_round(x: Any, fmt: str = "fp4_e2m1", block_size: int = 32, axis: int = -1) -> np.ndarray:
    """x after an MX quantize/dequantize round trip (same shape)."""
    a = np.asarray(as_array(x, "x", dtypes=("f", "i", "u")), dtype=np.float32)
    if a.ndim == 0:
        raise ValueError("x: expected at least 1 dimension, got a scalar")
    e, p = mx_quantize(a, fmt, block_size, axis)
    return mx_dequantize(e, p, a.shape[axis], axis)


def mx_bits_per_element(fmt: str, block_size: int = 32) -> float:
    """Element bits + the 8-bit shared scale amortised over the block."""
    _check_fmt(fmt)
    if not is_int(block_size) or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    return MX_FORMATS[fmt][2] + 8 / block_size
