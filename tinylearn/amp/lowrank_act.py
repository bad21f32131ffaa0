"""Low-rank saved activations for backward (``tl.amp.lowrank_linear``) -- seed question Q102b.

A Linear layer y = x W^T + b saves its input x [N, in] only for dW = g^T x. When x is close to low rank
(activations of a trained layer usually are: a fast-decaying spectrum), store its rank-r truncated SVD
x ~ U_r S_r V_r^T instead -- (N + in) * r numbers instead of N * in -- and compute dW = (g^T U_r S_r) V_r^T.
The rank is the smallest r whose discarded energy meets a relative Frobenius tolerance,
sqrt(sum_{i>r} s_i^2) / ||x||_F <= tol, and the weight-gradient error is bounded by
||g^T (x - x_r)||_F <= ||g||_2 * tol * ||x||_F. dX = g W does not need x and stays exact.

Where it fits: wide, low-rank activations (N and in large, r small) whose gradients tolerate a small error;
combine with recomputation by storing the factors of the layers that are expensive to recompute (GEMMs) and
recomputing the cheap ones. Not for activations that feed nonlinear backwards (ReLU masks, softmax): those need
the exact values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import Function, Tensor

__all__ = ["LowRankLinear", "lowrank_factors", "lowrank_linear"]


def lowrank_factors(x: np.ndarray, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """(US [N, r], Vt [r, in]) of the smallest-rank truncated SVD of the 2-D ``x`` with relative error <= ``tol``."""
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.dtype.kind != "f":
        raise ValueError(f"x: expected a 2-D floating numpy array, got {getattr(x, 'shape', type(x).__name__)}")
    if isinstance(tol, (bool, np.bool_)) or not isinstance(tol, (int, float, np.integer, np.floating)):
        raise TypeError(f"tol: expected a float in [0, 1), got {type(tol).__name__} {tol!r}")
    if not 0.0 <= tol < 1.0:
        raise ValueError(f"tol: must be in [0, 1), got {tol}")
    if not np.isfinite(x).all():
        raise ValueError("x: low-rank factorisation needs finite values, got NaN or Inf")
    u, s, vt = np.linalg.svd(x.astype(np.float64), full_matrices=False)
    total = float(np.sum(s**2))
    if total == 0.0:
        return np.zeros((x.shape[0], 0), np.float32), np.zeros((0, x.shape[1]), np.float32)
    tail = np.sqrt(np.maximum(total - np.cumsum(s**2), 0.0) / total)  # error after keeping i + 1 values
    r = int(np.argmax(tail <= tol)) + 1 if (tail <= tol).any() else len(s)
    return (u[:, :r] * s[:r]).astype(np.float32), vt[:r].astype(np.float32)


class LowRankLinear(Function):
    """y = x W^T + b, saving the low-rank factors of x (not x) for the weight gradient."""

    @staticmethod
    def forward(ctx: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, tol: float = 0.01) -> np.ndarray:
        us, vt = lowrank_factors(x, tol)
        ctx.save_for_backward(us, vt, w)
        ctx.has_b = b is not None
        ctx.saved_elems = us.size + vt.size
        out = x @ w.T
        return out + b if b is not None else out

    @staticmethod
    def backward(ctx: Any, g: np.ndarray) -> tuple[Any, ...]:
        us, vt, w = ctx.saved_tensors
        gx = g @ w if ctx.needs_input_grad[0] else None
        gw = (g.T @ us) @ vt if ctx.needs_input_grad[1] else None
        gb = g.sum(0) if ctx.has_b and ctx.needs_input_grad[2] else None
        return (gx, gw, gb) if ctx.has_b else (gx, gw)


def lowrank_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, tol: float = 0.01) -> Tensor:
    """Linear whose saved input is a rank-r factorisation (relative Frobenius error <= ``tol``); x is [N, in]."""
    if not isinstance(x, Tensor) or x.ndim != 2:
        raise ValueError(f"x: expected a 2-D tinylearn Tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if not isinstance(weight, Tensor) or weight.ndim != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(
            f"weight: expected a Tensor of shape [out, {x.shape[1]}], got {getattr(weight, 'shape', None)}"
        )
    if not 0.0 <= tol < 1.0:
        raise ValueError(f"tol: must be in [0, 1), got {tol}")
    if bias is None:
        return LowRankLinear.apply(x, weight, tol=tol)
    return LowRankLinear.apply(x, weight, bias, tol=tol)
