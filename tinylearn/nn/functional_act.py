"""Activations (torch.nn.functional names) composed from differentiable Tensor ops, so autograd derives their VJPs.

leaky_relu  x if x > 0 else a x           elu   x if x > 0 else a (e^x - 1)      selu  s * elu(x, a)
celu        max(0,x) + min(0, a(e^(x/a)-1))  silu  x sigmoid(x)                 mish  x tanh(softplus(x))
softplus    log(1 + e^(b x)) / b (x where b x > threshold)                    softsign  x / (1 + |x|)
hardtanh    clip(x, lo, hi)    relu6  clip(x, 0, 6)    hardsigmoid  clip(x/6 + 1/2, 0, 1)    hardswish  x hardsigmoid(x)
glu         a * sigmoid(b) with (a, b) = x split in halves along dim     logsigmoid  -softplus(-x)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import factory as _f
from ..autograd.tensor import Tensor

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def leaky_relu(x: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    return _f.where(x.data > 0, x, x * negative_slope)


def elu(x: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    neg = x.clip(max=0.0).expm1() * alpha
    return _f.where(x.data > 0, x, neg)


def selu(x: Tensor, inplace: bool = False) -> Tensor:
    return elu(x, _SELU_ALPHA) * _SELU_SCALE


def celu(x: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    return x.relu() + ((x.clip(max=0.0) / alpha).expm1() * alpha).clip(max=0.0)


def silu(x: Tensor, inplace: bool = False) -> Tensor:
    return x * x.sigmoid()


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    bx = x * beta
    sp = (bx.relu() + (-bx.abs()).exp().log1p()) / beta  # stable log(1 + e^bx)
    return _f.where(bx.data > threshold, x, sp)


def mish(x: Tensor, inplace: bool = False) -> Tensor:
    return x * softplus(x).tanh()


def softsign(x: Tensor) -> Tensor:
    return x / (x.abs() + 1)


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val {min_val} must be <= max_val {max_val}")
    return _clip_open(x, min_val, max_val)


def _clip_open(x: Tensor, lo: float, hi: float) -> Tensor:
    """clip whose gradient is 0 at the boundaries too (torch's hardtanh/relu6/hardsigmoid use lo < x < hi)."""
    inside = (x.data > lo) & (x.data < hi)
    return _f.where(inside, x, x.clip(lo, hi).detach())


def relu6(x: Tensor, inplace: bool = False) -> Tensor:
    return _clip_open(x, 0.0, 6.0)


def hardsigmoid(x: Tensor, inplace: bool = False) -> Tensor:
    inside = (x.data > -3) & (x.data < 3)
    return _f.where(inside, x / 6 + 0.5, (x.clip(-3.0, 3.0) / 6 + 0.5).detach())


def hardswish(x: Tensor, inplace: bool = False) -> Tensor:
    hs = (x + 3).clip(0.0, 6.0) / 6
    return _f.where(x.data <= -3, x * 0, _f.where(x.data >= 3, x, x * hs))


def glu(x: Tensor, dim: int = -1) -> Tensor:
    if x.shape[dim] % 2:
        raise ValueError(f"glu: dim {dim} of shape {x.shape} must have an even size")
    a, b = x.chunk(2, dim)
    return a * b.sigmoid()


def logsigmoid(x: Tensor) -> Tensor:
    return -softplus(-x)


def softmin(x: Tensor, dim: int = -1) -> Tensor:
    return (-x).softmax(dim)


def prelu(x: Tensor, weight: Tensor) -> Tensor:
    w = weight
    if x.ndim >= 2 and weight.numel() > 1:
        w = weight.reshape((1, -1) + (1,) * (x.ndim - 2))
    return _f.where(x.data > 0, x, x * w)


def one_hot(tensor: Any, num_classes: int = -1) -> Tensor:
    idx = np.asarray(tensor.data if isinstance(tensor, Tensor) else tensor)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"one_hot: tensor must hold integer class indices, got dtype {idx.dtype}")
    n = int(idx.max()) + 1 if num_classes < 0 else num_classes
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"one_hot: class values must be in [0, {n}), got range [{idx.min()}, {idx.max()}]")
    return Tensor((idx[..., None] == np.arange(n)).astype(np.int64))
