"""Fake quantization (quantize -> dequantize in float) with the straight-through estimator, and LSQ.

Forward (torch.fake_quantize_per_tensor_affine / _per_channel_affine, bit-exact):
    r = round(float32(x * (1/scale))) + zero_point          (round half to even)
    y = (clamp(r, qmin, qmax) - zero_point) * scale
Backward — the straight-through estimator (STE). round() has derivative 0 almost everywhere, so the true gradient
would stop all learning; STE treats round as the identity and keeps only the clamp:
    dL/dx = dL/dy * [qmin <= r <= qmax]                       (zero where the value was clipped)

LSQ (Esser et al., "Learned Step Size Quantization", 2020) also learns scale s and zero point z (torch's
_fake_quantize_learnable_per_tensor_affine), with q = clamp(r, qmin, qmax):
    dy/ds = q - z - x/s  inside the range,   qmin - z or qmax - z where clipped
    dy/dz = 0            inside the range,   -s where clipped
(gradients summed over the elements sharing s and z, times ``grad_factor``; LSQ suggests 1/sqrt(N * qmax)).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import Function, Tensor


def _qparam_arrays(x: np.ndarray, scale: Any, zero_point: Any, quant_min: int, quant_max: int, axis: int | None):
    if not (isinstance(quant_min, int | np.integer) and isinstance(quant_max, int | np.integer)):
        raise TypeError(f"quant_min/quant_max: expected ints, got {quant_min!r}, {quant_max!r}")
    if quant_min >= quant_max:
        raise ValueError(f"quant_min/quant_max: need quant_min < quant_max, got {quant_min}, {quant_max}")
    s = np.asarray(getattr(scale, "data", scale), np.float64)
    z = np.asarray(getattr(zero_point, "data", zero_point), np.float64)
    if np.any(~np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(f"scale: must be finite and > 0, got {scale!r}")
    if np.any(~np.isfinite(z)):
        raise ValueError(f"zero_point: must be finite, got {zero_point!r}")
    z = np.rint(z)
    if np.any(z < quant_min) or np.any(z > quant_max):
        raise ValueError(f"zero_point: {zero_point!r} outside [quant_min, quant_max] = [{quant_min}, {quant_max}]")
    if axis is None:
        if s.size != 1 or z.size != 1:
            raise ValueError(f"scale/zero_point: axis=None needs scalars, got shapes {s.shape}, {z.shape}")
        return np.float32(s.reshape(())), np.float32(z.reshape(())), None
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis: {axis} out of range for input of shape {x.shape}")
    ax = axis % x.ndim
    c = x.shape[ax]
    if s.size != c or z.size != c:
        raise ValueError(
            f"scale/zero_point: need {c} values for axis {axis} of shape {x.shape}, got {s.size}, {z.size}"
        )
    view = [1] * x.ndim
    view[ax] = c
    return s.astype(np.float32).reshape(view), z.astype(np.float32).reshape(view), ax


def fake_quantize_array(x: np.ndarray, s: Any, z: Any, quant_min: int, quant_max: int) -> tuple[np.ndarray, np.ndarray]:
    """(y, r) for float32 x with float32 scale(s) s and integer-valued zero point(s) z (broadcastable)."""
    inv = (np.float32(1.0) / s).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.rint((x * inv).astype(np.float32)) + z
        y = ((np.clip(r, quant_min, quant_max) - z) * s).astype(np.float32)
    return y, r


class FakeQuantizeSTE(Function):
    @staticmethod
    def forward(ctx: Any, x: np.ndarray, s: Any, z: Any, quant_min: int, quant_max: int) -> np.ndarray:
        xf = x.astype(np.float32, copy=False)
        y, r = fake_quantize_array(xf, s, z, quant_min, quant_max)
        ctx.save_for_backward((r >= quant_min) & (r <= quant_max))
        return y.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx: Any, g: np.ndarray) -> tuple:
        (mask,) = ctx.saved_tensors
        return g * mask, None, None, None, None


def fake_quantize(
    x: Tensor, scale: Any, zero_point: Any, quant_min: int, quant_max: int, axis: int | None = None
) -> Tensor:
    """Quantize-dequantize x (per-tensor, or per-channel along ``axis``) with a straight-through gradient."""
    if not isinstance(x, Tensor):
        x = Tensor(np.asarray(x, np.float32))
    s, z, _ = _qparam_arrays(x.data, scale, zero_point, quant_min, quant_max, axis)
    return FakeQuantizeSTE.apply(x, s, z, int(quant_min), int(quant_max))


class FakeQuantizeLSQ(Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: np.ndarray,
        scale: np.ndarray,
        zero_point: np.ndarray,
        quant_min: int,
        quant_max: int,
        axis: int | None,
        grad_factor: float,
    ) -> np.ndarray:
        xf = x.astype(np.float32, copy=False)
        s, z, ax = _qparam_arrays(xf, scale, zero_point, quant_min, quant_max, axis)
        y, r = fake_quantize_array(xf, s, z, quant_min, quant_max)
        ctx.save_for_backward(xf, y, r, s, z)
        ctx.meta = (quant_min, quant_max, ax, grad_factor, scale.shape, zero_point.shape)
        return y

    @staticmethod
    def backward(ctx: Any, g: np.ndarray) -> tuple:
        x, y, r, s, z = ctx.saved_tensors
        qmin, qmax, ax, gf, sshape, zshape = ctx.meta
        lo, hi = r < qmin, r > qmax
        inside = ~(lo | hi)
        dx = g * inside
        ds_el = np.where(lo, qmin - z, np.where(hi, qmax - z, (y - x) / s))
        dz_el = np.where(inside, 0.0, -s)
        axes = tuple(i for i in range(x.ndim) if i != ax) if ax is not None else None
        ds = (g * ds_el).sum(axis=axes).astype(np.float32) * np.float32(gf)
        dz = (g * dz_el).sum(axis=axes).astype(np.float32) * np.float32(gf)
        return dx, ds.reshape(sshape), dz.reshape(zshape), None, None, None, None


def fake_quantize_learnable(
    x: Tensor,
    scale: Tensor,
    zero_point: Tensor,
    quant_min: int,
    quant_max: int,
    axis: int | None = None,
    grad_factor: float = 1.0,
) -> Tensor:
    """LSQ fake quantization: gradients flow to x (STE), ``scale`` and ``zero_point`` (float Tensors)."""
    for name, t in (("scale", scale), ("zero_point", zero_point)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a tinylearn Tensor (learnable), got {type(t).__name__}")
    return FakeQuantizeLSQ.apply(x, scale, zero_point, int(quant_min), int(quant_max), axis, float(grad_factor))
