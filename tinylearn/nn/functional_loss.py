"""Losses. ``cross_entropy`` is fused with log-softmax (one node) and numerically stable:

    loss_i = logsumexp(x_i) - x_i[t_i],   logsumexp(x) = max(x) + log(sum(exp(x - max(x))))
    d loss_i / d x_i = softmax(x_i) - onehot(t_i)                 (divided by N for reduction='mean')

Subtracting the row max keeps exp() <= 1, so logits of 1e4 neither overflow nor lose the answer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd.function import Function
from ..autograd.tensor import Tensor

_REDUCTIONS = ("mean", "sum", "none")


class CrossEntropyFn(Function):
    @staticmethod
    def forward(ctx, logits, target, reduction="mean", ignore_index=-100, label_smoothing=0.0):
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction: must be one of {_REDUCTIONS}, got {reduction!r}")
        if logits.ndim == 1:
            logits = logits[None]
            target = np.asarray(target).reshape(1)
            ctx.squeeze = True
        else:
            ctx.squeeze = False
        if logits.ndim != 2:
            raise ValueError(f"cross_entropy: logits must be [N, C] (or [C]), got shape {logits.shape}")
        target = np.asarray(target)
        if target.dtype.kind not in "iu":
            raise TypeError(f"cross_entropy: target must hold integer class indices, got dtype {target.dtype}")
        n, c = logits.shape
        if target.shape != (n,):
            raise ValueError(f"cross_entropy: target shape {target.shape} does not match logits shape {logits.shape}")
        # every label in range and ignore_index outside it (the usual case): no mask, fewer small numpy calls
        all_valid = n > 0 and not 0 <= ignore_index < c and target.min() >= 0 and target.max() < c
        if all_valid:
            valid, tsafe = None, target
        else:
            valid = target != ignore_index
            bad = valid & ((target < 0) | (target >= c))
            if bad.any():
                lbl = int(target[bad][0])
                raise ValueError(
                    f"cross_entropy: target label {lbl} is out of range [0, {c}) for logits shape {logits.shape}"
                )
            tsafe = np.where(valid, target, 0)
        z = logits - logits.max(axis=1, keepdims=True)
        e = np.exp(z)
        s = e.sum(axis=1, keepdims=True)
        logp_t = z[np.arange(n), tsafe] - np.log(s[:, 0])
        loss = -logp_t
        if label_smoothing:
            logp_mean = (z - np.log(s)).mean(axis=1)
            loss = (1 - label_smoothing) * loss - label_smoothing * logp_mean
        if valid is not None:
            loss = np.where(valid, loss, 0)
        loss = loss.astype(logits.dtype, copy=False)
        nvalid = n if valid is None else int(valid.sum())
        e /= s  # softmax
        ctx.save_for_backward(e, tsafe, valid)
        ctx.meta = (reduction, nvalid, label_smoothing)
        if reduction == "mean":
            return np.asarray(loss.sum() / max(nvalid, 1) if nvalid else np.nan, dtype=logits.dtype)
        if reduction == "sum":
            return np.asarray(loss.sum(), dtype=logits.dtype)
        return loss[0] if ctx.squeeze else loss

    @staticmethod
    def backward(ctx, g):
        p, t, valid = ctx.saved_tensors
        reduction, nvalid, ls = ctx.meta
        grad = p.copy()
        c = p.shape[1]
        if ls:
            grad -= ls / c
        grad[np.arange(p.shape[0]), t] -= 1 - ls
        if valid is not None:  # None: every row counts (see forward)
            grad *= valid[:, None]
        if reduction == "mean":
            grad *= g / max(nvalid, 1)
        elif reduction == "sum":
            grad *= g
        else:
            grad *= (g.reshape(1) if ctx.squeeze else g)[:, None]
        return (grad[0] if ctx.squeeze else grad), None


def cross_entropy(
    logits: Tensor,
    target: Any,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Softmax cross-entropy of logits [N, C] against integer class indices [N] (Tensor, array or list)."""
    if isinstance(target, Tensor):
        target = target.data
    return CrossEntropyFn.apply(
        logits, target, reduction=reduction, ignore_index=ignore_index, label_smoothing=label_smoothing
    )


def mse_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:  # noqa: A002
    """mean((input - target)^2); shapes must match exactly (torch only warns; we refuse silent broadcasting)."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction: must be one of {_REDUCTIONS}, got {reduction!r}")
    tshape = target.shape if isinstance(target, Tensor) else np.shape(target)
    if tuple(input.shape) != tuple(tshape):
        raise ValueError(f"mse_loss: input shape {input.shape} and target shape {tuple(tshape)} differ")
    d = input - target
    sq = d * d
    if reduction == "mean":
        return sq.mean()
    if reduction == "sum":
        return sq.sum()
    return sq
