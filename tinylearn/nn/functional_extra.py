"""More torch.nn.functional: losses, normalize, cosine_similarity, group_norm, pad (scaled_dot_product_attention and
cross_entropy are re-exported from functional_attention.py / functional_loss.py). All are compositions of
differentiable Tensor ops (autograd derives the VJPs), except pad (ops_movement.Pad, plus slicing for negative pads).

    bce               -(w) [y log p + (1-y) log(1-p)]                 (log clamped at -100, as torch)
    bce_with_logits   (1-y) x + (1 + (pw-1) y) softplus(-x)           (stable: never exp of a large positive)
    nll_loss          -x[n, t_n] (weighted mean over the non-ignored targets)
    kl_div            target (log target - input)   (input is log-probabilities; log_target= as torch)
    huber             0.5 d^2 if |d| < delta else delta (|d| - 0.5 delta);  smooth_l1 = huber / beta
    group_norm        (x - mean_g) / sqrt(var_g + eps) * w + b        (statistics over each group of channels)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import factory as _f
from ..autograd.ops_movement import Pad
from ..autograd.tensor import Tensor
from .functional_act import softplus
from .functional_attention import scaled_dot_product_attention  # noqa: F401  (re-exported)
from .functional_loss import cross_entropy  # noqa: F401  (the implementation; re-exported here)

_RED = ("mean", "sum", "none")


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction not in _RED:
        raise ValueError(f"reduction: must be one of {_RED}, got {reduction!r}")
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def _t(x: Any, like: Tensor) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(np.asarray(x, like.dtype))


def binary_cross_entropy(
    input: Tensor,
    target: Any,
    weight: Any = None,
    reduction: str = "mean",  # noqa: A002
) -> Tensor:
    y = _t(target, input)
    if y.shape != input.shape:
        raise ValueError(f"binary_cross_entropy: target shape {y.shape} != input shape {input.shape}")
    if ((input.data < 0) | (input.data > 1)).any():
        raise ValueError("binary_cross_entropy: input values must be probabilities in [0, 1]")
    loss = -(y * input.log().clip(min=-100.0) + (1 - y) * (1 - input).log().clip(min=-100.0))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(
    input: Tensor,
    target: Any,
    weight: Any = None,
    reduction: str = "mean",
    pos_weight: Any = None,  # noqa: A002
) -> Tensor:
    y = _t(target, input)
    if y.shape != input.shape:
        raise ValueError(f"binary_cross_entropy_with_logits: target shape {y.shape} != input shape {input.shape}")
    lw = 1 if pos_weight is None else (pos_weight - 1) * y + 1
    loss = (1 - y) * input + lw * softplus(-input)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def nll_loss(
    input: Tensor,
    target: Any,
    weight: Any = None,
    ignore_index: int = -100,
    reduction: str = "mean",  # noqa: A002
) -> Tensor:
    t = np.asarray(target.data if isinstance(target, Tensor) else target)
    if t.dtype.kind not in "iu":
        raise TypeError(f"nll_loss: target must hold integer class indices, got dtype {t.dtype}")
    x = input
    if x.ndim == 1:
        x, t = x.reshape(1, -1), t.reshape(1)
    if x.ndim > 2:  # [N, C, d1, ...] -> [N * d1 * ..., C]
        x = x.movedim(1, -1).reshape(-1, x.shape[1])
        t = t.reshape(-1)
    n, c = x.shape
    if t.shape != (n,):
        raise ValueError(f"nll_loss: target shape {t.shape} does not match input shape {input.shape}")
    valid = t != ignore_index
    if ((t[valid] < 0) | (t[valid] >= c)).any():
        raise ValueError(f"nll_loss: target out of range [0, {c})")
    ts = np.where(valid, t, 0)
    w = np.ones(c, x.dtype) if weight is None else np.asarray(weight.data if isinstance(weight, Tensor) else weight)
    wn = (w[ts] * valid).astype(x.dtype)
    picked = x.gather(1, ts[:, None]).reshape(-1)
    loss = -picked * Tensor(wn)
    if reduction == "mean":
        return loss.sum() / wn.sum()
    if reduction == "none" and input.ndim > 2:
        return loss.reshape(input.shape[:1] + input.shape[2:])
    return _reduce(loss, reduction)


def kl_div(input: Tensor, target: Any, reduction: str = "mean", log_target: bool = False) -> Tensor:  # noqa: A002
    y = _t(target, input)
    if log_target:
        loss = y.exp() * (y - input)
    else:
        loss = _f.where(
            y.data > 0, y * (y.clip(min=1e-300 if y.dtype == np.float64 else 1e-38).log() - input), 0.0 * input
        )
    if reduction == "batchmean":
        return loss.sum() / input.shape[0]
    return _reduce(loss, reduction)


def huber_loss(input: Tensor, target: Any, reduction: str = "mean", delta: float = 1.0) -> Tensor:  # noqa: A002
    d = input - _t(target, input)
    ad = d.abs()
    loss = _f.where(ad.data < delta, 0.5 * d * d, delta * (ad - 0.5 * delta))
    return _reduce(loss, reduction)


def smooth_l1_loss(input: Tensor, target: Any, reduction: str = "mean", beta: float = 1.0) -> Tensor:  # noqa: A002
    if beta == 0:
        return l1_loss(input, target, reduction)
    d = input - _t(target, input)
    ad = d.abs()
    loss = _f.where(ad.data < beta, 0.5 * d * d / beta, ad - 0.5 * beta)
    return _reduce(loss, reduction)


def l1_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:  # noqa: A002
    return _reduce((input - _t(target, input)).abs(), reduction)


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:  # noqa: A002
    from ..autograd.linalg_breadth import vector_norm

    return input / vector_norm(input, p, dim, keepdim=True).clip(min=eps)


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    shape = np.broadcast_shapes(x1.shape, x2.shape)
    x1, x2 = x1.expand(*shape), x2.expand(*shape)
    n1 = (x1 * x1).sum(dim).sqrt().clip(min=eps)
    n2 = (x2 * x2).sum(dim).sqrt().clip(min=eps)
    return (x1 * x2).sum(dim) / (n1 * n2)


def group_norm(
    input: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,  # noqa: A002
) -> Tensor:
    """torch.nn.functional.group_norm: one fused graph node (``functional_norm.GroupNormFn``: forward and VJP)."""
    from .functional_norm import GroupNormFn

    if input.ndim < 2:
        raise ValueError(f"group_norm: input must have >= 2 dims [N, C, ...], got shape {input.shape}")
    if not isinstance(num_groups, int | np.integer) or isinstance(num_groups, bool) or num_groups < 1:
        raise ValueError(f"num_groups: must be a positive int, got {num_groups!r}")
    c = input.shape[1]
    if c % num_groups:
        raise ValueError(f"group_norm: {c} channels (input shape {input.shape}) not divisible by {num_groups} groups")
    for name, a in (("weight", weight), ("bias", bias)):
        if a is not None and tuple(a.shape) != (c,):
            raise ValueError(f"{name}: expected shape ({c},) for {c} channels, got {tuple(a.shape)}")
    return GroupNormFn.apply(input, weight, bias, num_groups=int(num_groups), eps=eps)


def instance_norm(input: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:  # noqa: A002
    return group_norm(input, input.shape[1], weight, bias, eps)


def pad(input: Tensor, pad: Any, mode: str = "constant", value: float | None = None) -> Tensor:  # noqa: A002
    """torch.nn.functional.pad: ``pad`` lists (left, right) pairs starting from the LAST dim. A negative entry crops
    that side, as torch (``autograd.ops_movement.pad_maps``: circular crops first and wraps the cropped input;
    constant / reflect / replicate pad the whole input first and then crop)."""
    if not isinstance(pad, tuple | list) or not all(isinstance(p, int | np.integer) for p in pad):
        raise TypeError(f"pad: expected a tuple of ints, got {pad!r}")
    pads = tuple(int(p) for p in pad)
    if len(pads) % 2 or len(pads) // 2 > input.ndim:
        raise ValueError(f"pad: padding {pads} must have an even length <= 2 * ndim for input shape {input.shape}")
    return Pad.apply(input, pads, mode=mode, value=0.0 if value is None else value)  # crops too (pad_maps)
