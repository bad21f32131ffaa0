"""Sharded Adam with optimizer state (m, v) stored in bf16 / fp16 / int8, with error feedback -- seed question Q219.

Storing m and v in 16 or 8 bits halves or quarters the optimizer memory (sharding them ZeRO-1 style over W
ranks divides it again), but rounding every step loses information systematically: v is an EMA with
beta2 = 0.999, so each step changes it by 0.1% -- less than half a bf16 ulp (2^-9 relative) -- and
round-to-nearest sends the update back to the old value: v stagnates and Adam's step size drifts.

Error feedback keeps, per shard, a compensation buffer e (the rounding error of the stored state) and adds it
back before the next rounding:

    s_full = dequant(s_stored) + e          (the state as if it had never been rounded)
    s_full = beta * s_full + (1 - beta) * x (the Adam EMA, in fp32 for this step only)
    s_stored = quant(s_full);  e = s_full - dequant(s_stored)   (stored in the same low format)

so rounding errors are carried forward, not lost: small increments accumulate in e until they flip the stored
value. The buffer costs as much as the state (same format), so bf16+e is 4 bytes per element like fp32 (but
with ~16 significant bits); int8+e is 2 bytes (+ one fp32 scale per shard and tensor) instead of 4.
Each rank owns its contiguous shard of the flattened parameter; int8 uses a per-shard absmax scale.
"""

from __future__ import annotations

import numpy as np

from .args import bool_arg, is_int, positive_real, real_arg
from .bf16 import round_to_bf16

__all__ = ["STATE_FORMATS", "ShardedLowPrecisionAdam", "quantize_state"]

STATE_FORMATS = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}  # bytes per stored element


def quantize_state(x: np.ndarray, fmt: str) -> np.ndarray:
    """``x`` rounded to ``fmt`` and returned as fp32 (int8: symmetric, one absmax scale for the whole array)."""
    if not isinstance(fmt, str) or fmt not in STATE_FORMATS:
        raise ValueError(f"fmt: expected one of {sorted(STATE_FORMATS)}, got {fmt!r}")
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
        raise ValueError(f"x: expected a floating numpy array, got {type(x).__name__}")
    x = x.astype(np.float32)
    if fmt == "int8" and not np.isfinite(x).all():  # one NaN/Inf absmax would make the shared scale NaN/Inf
        raise ValueError("x: int8 state quantisation needs finite values, got NaN or Inf")
    if fmt == "fp32":
        return x.copy()
    if fmt == "bf16":
        return round_to_bf16(x)
    if fmt == "fp16":
        return x.astype(np.float16).astype(np.float32)
    amax = float(np.max(np.abs(x))) if x.size else 0.0
    if amax == 0.0:
        return np.zeros_like(x)
    s = np.float32(amax / 127.0)
    return (np.clip(np.rint(x / s), -127, 127) * s).astype(np.float32)


class ShardedLowPrecisionAdam:
    """Adam on one flat fp32 parameter vector, m and v sharded over ``world_size`` and stored in ``state_format``.

    ``error_feedback=True`` keeps a per-shard compensation buffer (also in ``state_format``) for m and v.
    ``step(param, grad)`` updates ``param`` (fp32, 1-D) in place, shard by shard, as each rank would.
    """

    def __init__(
        self,
        numel: int,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        state_format: str = "bf16",
        error_feedback: bool = True,
        world_size: int = 1,
    ) -> None:
        if not is_int(numel) or numel < 1:
            raise ValueError(f"numel: must be a positive int, got {numel!r}")
        lr, eps = positive_real(lr, "lr"), positive_real(eps, "eps")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas: expected a pair of floats, got {betas!r}")
        if not all(0.0 <= real_arg(b, "betas") < 1.0 for b in betas):
            raise ValueError(f"betas: expected two values in [0, 1), got {betas}")
        error_feedback = bool_arg(error_feedback, "error_feedback")
        if not isinstance(state_format, str) or state_format not in STATE_FORMATS:
            raise ValueError(f"state_format: expected one of {sorted(STATE_FORMATS)}, got {state_format!r}")
        if not is_int(world_size) or not 1 <= world_size <= numel:
            raise ValueError(f"world_size: must be an int in [1, numel={numel}], got {world_size!r}")
        numel, world_size = int(numel), int(world_size)
        self.numel, self.lr, self.betas, self.eps = numel, lr, betas, eps
        self.state_format, self.error_feedback, self.world_size = state_format, error_feedback, world_size
        bounds = np.linspace(0, numel, world_size + 1).astype(int)
        self.shards = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        z = [np.zeros(s.stop - s.start, np.float32) for s in self.shards]
        self.m, self.v = [a.copy() for a in z], [a.copy() for a in z]  # stored (dequantized) values
        self.em, self.ev = [a.copy() for a in z], [a.copy() for a in z]  # compensation buffers
        self.t = 0

    def state_bytes(self) -> int:
        """Bytes of optimizer state over all ranks: m, v (+ buffers with error feedback) + int8 scales."""
        per = STATE_FORMATS[self.state_format] * self.numel * 2
        scales = 4 * 2 * self.world_size if self.state_format == "int8" else 0
        return (per + scales) * (2 if self.error_feedback and self.state_format != "fp32" else 1)

    def _store(self, full: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = quantize_state(full, self.state_format)
        if not self.error_feedback:
            return q, np.zeros_like(q)
        return q, quantize_state(full - q, self.state_format)

    def step(self, param: np.ndarray, grad: np.ndarray) -> None:
        if not isinstance(param, np.ndarray) or param.dtype != np.float32 or param.shape != (self.numel,):
            raise ValueError(
                f"param: expected a float32 array of shape ({self.numel},), got {getattr(param, 'shape', param)}"
            )
        if not isinstance(grad, np.ndarray) or grad.shape != (self.numel,):
            raise ValueError(f"grad: expected an array of shape ({self.numel},), got {getattr(grad, 'shape', grad)}")
        self.t += 1
        b1, b2 = self.betas
        bc1, bc2 = 1.0 - b1**self.t, 1.0 - b2**self.t
        g32 = grad.astype(np.float32)
        for r, sl in enumerate(self.shards):  # each rank: its shard of m, v, buffers and the parameter
            g = g32[sl]
            m_full = self.m[r] + self.em[r]
            v_full = self.v[r] + self.ev[r]
            m_full = np.float32(b1) * m_full + np.float32(1 - b1) * g
            v_full = np.float32(b2) * v_full + np.float32(1 - b2) * g * g
            v_full = np.maximum(v_full, 0.0)
            self.m[r], self.em[r] = self._store(m_full)
            self.v[r], self.ev[r] = self._store(v_full)
            mh = m_full / np.float32(bc1)
            vh = np.maximum(v_full, 0.0) / np.float32(bc2)
            param[sl] -= np.float32(self.lr) * mh / (np.sqrt(vh) + np.float32(self.eps))
