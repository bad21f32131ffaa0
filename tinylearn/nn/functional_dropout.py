"""Inverted dropout (one fused Function), shared by ``nn.functional`` and ``functional_extra``'s attention.

dropout (training)   y = x * m / (1 - p),  m ~ Bernoulli(1 - p)       dx = g * m / (1 - p)
"""

from __future__ import annotations

from ..autograd import factory as _factory
from ..autograd.function import Function
from ..autograd.tensor import Tensor


class DropoutFn(Function):
    @staticmethod
    def forward(ctx, x, mask=None, scale=1.0):
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return x * mask * x.dtype.type(scale)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * mask * g.dtype.type(ctx.scale)


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Inverted dropout: zero each element with probability p and scale the rest by 1/(1-p); identity in eval."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p: dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    mask = _factory.get_rng().random(x.shape) >= p
    return DropoutFn.apply(x, mask=mask, scale=1.0 / (1.0 - p))
