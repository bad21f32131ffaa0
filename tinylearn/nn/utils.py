"""torch.nn.utils: gradient clipping."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..autograd.tensor import Tensor


def clip_grad_norm_(
    parameters: Any, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
) -> Tensor:
    """Scale all gradients in place so their joint ``norm_type`` norm is <= max_norm; returns the norm before."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    grads = [p.grad.data for p in params if p.grad is not None]
    if not grads:
        return Tensor(np.float32(0.0))
    if norm_type == float("inf"):
        total = max(float(np.abs(g).max()) for g in grads)
    else:
        total = float(sum(float((np.abs(g.astype(np.float64)) ** norm_type).sum()) for g in grads) ** (1.0 / norm_type))
    if error_if_nonfinite and not np.isfinite(total):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} is non-finite ({total})")
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for p in params:
            if p.grad is not None:
                p.grad.data = (p.grad.data * coef).astype(p.grad.data.dtype)
    return Tensor(np.asarray(total, grads[0].dtype))


def clip_grad_value_(parameters: Iterable[Tensor], clip_value: float) -> None:
    for p in [parameters] if isinstance(parameters, Tensor) else parameters:
        if p.grad is not None:
            p.grad.data = np.clip(p.grad.data, -clip_value, clip_value)
