"""Losses. ``cross_entropy`` (torch's signature; also ``tinylearn.nn.functional.cross_entropy``) is, for integer
class indices without class weights, fused with log-softmax (one node) and numerically stable:

    loss_i = logsumexp(x_i) - x_i[t_i],   logsumexp(x) = max(x) + log(sum(exp(x - max(x))))
    d loss_i / d x_i = softmax(x_i) - onehot(t_i)                 (divided by N for reduction='mean')

Subtracting the row max keeps exp() <= 1, so logits of 1e4 neither overflow nor lose the answer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..kernels import reference

_REDUCTIONS = ("mean", "sum", "none")


class CrossEntropyFn(Function):
    """One node for integer class indices without class weights: the registered kernels ``kernels.cross_entropy`` /
    ``cross_entropy_backward`` (cpp: cpp_src/kernels_cross_entropy.cpp, the forward writes per-row losses and
    (max, log sum exp) only, the backward softmax - onehot in one pass; numpy: tinylearn/kernels/reference.py),
    float32/float64 on the registry's choice (a ``backends.use`` pin respected), other float dtypes on the numpy
    reference. Saved for the backward: the logits, the row statistics [N, 2] and the targets."""

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
        if target.shape != logits.shape[:1]:
            raise ValueError(f"cross_entropy: target shape {target.shape} does not match logits shape {logits.shape}")
        fwd, bwd = _ce_kernels(logits.dtype)
        x = np.ascontiguousarray(logits)
        t = np.ascontiguousarray(target, dtype=np.int64)
        loss, stats, nvalid = fwd(x, t, ignore_index, label_smoothing)
        ctx.save_for_backward(x, stats, t)
        ctx.meta = (reduction, nvalid, ignore_index, label_smoothing, bwd)
        if reduction == "mean":
            return np.asarray(loss.sum() / nvalid if nvalid else np.nan, dtype=logits.dtype)
        if reduction == "sum":
            return np.asarray(loss.sum(), dtype=logits.dtype)
        return loss[0] if ctx.squeeze else loss

    @staticmethod
    def backward(ctx, g):
        x, stats, t = ctx.saved_tensors
        reduction, nvalid, ignore_index, ls, bwd = ctx.meta
        if reduction == "mean":
            scale = np.asarray(g, x.dtype).reshape(1) / x.dtype.type(max(nvalid, 1))
        elif reduction == "sum":
            scale = np.asarray(g, x.dtype).reshape(1)
        else:
            scale = np.ascontiguousarray(g, x.dtype).reshape(-1)
        grad = bwd(x, stats, t, scale, ignore_index, ls)
        return (grad[0] if ctx.squeeze else grad), None


def _ce_kernels(dtype: np.dtype) -> tuple[Any, Any]:
    """(forward, backward) for logits of ``dtype``: the registered kernels for float32/float64, else the numpy
    reference (float16, bfloat16 arrays)."""
    if dtype.type in (np.float32, np.float64):
        b, _, fwd = backends.resolve("kernels.cross_entropy")
        return fwd, backends.resolve("kernels.cross_entropy_backward", b)[2]
    return reference.cross_entropy, reference.cross_entropy_backward


def _cross_entropy_indices(
    logits: Tensor, target: Any, reduction: str = "mean", ignore_index: int = -100, label_smoothing: float = 0.0
) -> Tensor:
    """The fused node (``CrossEntropyFn``): logits [N, C] / [C] against integer class indices, no class weights."""
    return CrossEntropyFn.apply(
        logits, target, reduction=reduction, ignore_index=ignore_index, label_smoothing=label_smoothing
    )


def _legacy_reduction(size_average: Any, reduce: Any, reduction: str) -> str:
    """torch's _Reduction.legacy_get_string: the deprecated size_average / reduce flags override ``reduction``."""
    if size_average is None and reduce is None:
        return reduction
    if reduce is not None and not reduce:
        return "none"
    return "sum" if size_average is not None and not size_average else "mean"


def _probability_loss(x: Tensor, t: Tensor, w: np.ndarray, label_smoothing: float) -> Tensor:
    """Per-row -sum_c w_c t'_c log_softmax(x)_c with t' = (1 - ls) t + ls / C; differentiable in x and in t."""
    c = x.shape[1]
    if label_smoothing:
        t = t * (1.0 - label_smoothing) + label_smoothing / c
    return -(x.log_softmax(1) * t * Tensor(w.astype(x.dtype, copy=False))).sum(1)


def _index_loss(x: Tensor, t: np.ndarray, w: np.ndarray, ignore_index: int, label_smoothing: float):
    """(per-row loss, mean denominator) of weighted class-index targets, torch's formula with label smoothing."""
    c = x.shape[1]
    valid, ts = reference._ce_targets(x.data, t, ignore_index, label_smoothing)  # the kernel's label checks
    wt = (w[ts] * valid).astype(x.dtype)
    logp = x.log_softmax(1)
    out = -logp.gather(1, ts[:, None]).reshape(-1) * Tensor(wt * (1 - label_smoothing))
    if label_smoothing:
        smooth = -(logp * Tensor((w * label_smoothing / c).astype(x.dtype))).sum(1)
        out = out + smooth * Tensor(valid.astype(x.dtype))
    return out, wt.sum()


def cross_entropy(
    input: Tensor,  # noqa: A002
    target: Any,
    weight: Any = None,
    size_average: Any = None,
    ignore_index: int = -100,
    reduce: Any = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """torch.nn.functional.cross_entropy: class-index or probability targets, inputs [N, C] / [C] / [N, C, d1, ...],
    class ``weight``, ``ignore_index``, ``label_smoothing``, ``reduction`` (and torch's deprecated size_average /
    reduce). Integer targets without weights are one fused node (``CrossEntropyFn``); weights and probability
    targets use log_softmax + a weighted sum, and a probability target Tensor gets its gradient (as in torch).
    (A string as the third positional argument is read as ``reduction``, as in tinylearn's older signature.)"""
    if isinstance(weight, str):
        weight, reduction = None, weight
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction: must be one of {_REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing: must be in [0, 1], got {label_smoothing!r}")
    t = target if isinstance(target, Tensor) else np.asarray(target)
    probs = t.dtype.kind == "f"
    if probs and tuple(t.shape) != tuple(input.shape):
        raise TypeError(
            f"cross_entropy: target must hold integer class indices, or probabilities of the input's shape "
            f"{input.shape}; got dtype {t.dtype} shape {tuple(t.shape)}"
        )
    if probs:  # a Tensor (the gradient flows to it), in the input's dtype
        t = t if isinstance(t, Tensor) else Tensor(t)
        if t.dtype != input.dtype:
            t = t.astype(input.dtype)
    elif isinstance(t, Tensor):
        t = t.data
    x = input
    if x.ndim > 2:  # [N, C, d1, ...] -> [N * d1 * ..., C]
        c = x.shape[1]
        x = x.movedim(1, -1).reshape(-1, c)
        t = t.movedim(1, -1).reshape(-1, c) if probs else t.reshape(-1)
    spatial = input.shape[:1] + input.shape[2:] if input.ndim > 2 else None
    if not probs and weight is None:
        out = _cross_entropy_indices(
            x, t, reduction=reduction, ignore_index=ignore_index, label_smoothing=label_smoothing
        )
    else:
        squeeze = x.ndim == 1
        if squeeze:
            x, t = x.reshape(1, -1), t.reshape(1, -1) if probs else t.reshape(1)
        c = x.shape[1]
        w = np.ones(c, x.dtype) if weight is None else np.asarray(weight.data if isinstance(weight, Tensor) else weight)
        if w.shape != (c,):
            raise ValueError(f"weight: expected one weight per class, shape ({c},), got shape {w.shape}")
        if probs:
            out, denom = _probability_loss(x, t, w, label_smoothing), x.shape[0]
        else:
            out, denom = _index_loss(x, t, w, ignore_index, label_smoothing)
        if reduction == "mean":
            return out.sum() / denom
        if reduction == "sum":
            return out.sum()
        if squeeze:
            out = out.reshape(())
    if reduction == "none" and spatial is not None:
        out = out.reshape(spatial)
    return out


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
