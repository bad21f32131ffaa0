"""Sending the most important gradient buckets first when the link cannot carry them all (notebook 06 §8c).

Under a byte budget per step (what the link moves before the step must go on), the order of the buckets decides
which gradients arrive; the rest are kept in an error-feedback residual and offered again next step. Importance of
an element with accumulated gradient v (gradient + residual):

* ``"second_order"``: the loss decrease of applying -lr*v to it, lr*v^2 - lr^2*h*v^2/2 (diagonal curvature h: a
  Hessian / Fisher diagonal estimate), the second-order Taylor model;
* ``"momentum"``: |v| * |beta*m + v| (the momentum this update would leave: gradients the optimizer keeps moving
  along; m alone would be 0, hence never sent, for a bucket that was never sent);
* ``"magnitude"``: v^2 (the first-order decrease lr*v^2, up to lr).

Buckets are sent in decreasing importance per byte (the greedy knapsack order); the baseline is DDP's fixed order
with carry-over (buckets deferred last step go first: a FIFO queue, so every bucket is sent at the same rate).

    order = send_order(scores, nbytes, policy="importance")
    sent, captured = within_budget(order, scores, nbytes, budget)
    run = budgeted_sgd(h, w0, w_star, bucket_sizes, budget_frac=0.25, steps=40, policy="importance")
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["IMPORTANCE", "budgeted_sgd", "importance", "send_order", "within_budget"]

IMPORTANCE = ("second_order", "momentum", "magnitude")


def importance(
    v: np.ndarray,
    kind: str = "magnitude",
    momentum: np.ndarray | None = None,
    curvature: np.ndarray | None = None,
    lr: float = 1.0,
    beta: float = 0.9,
) -> np.ndarray:
    """Per-element importance of sending the accumulated gradient ``v`` (see the module docstring), >= 0."""
    if kind not in IMPORTANCE:
        raise ValueError(f"kind: expected one of {IMPORTANCE}, got {kind!r}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr: expected a finite value > 0, got {lr}")
    v = np.asarray(v, dtype=np.float64)
    if kind == "momentum":
        if momentum is None or np.shape(momentum) != v.shape:
            raise ValueError(f"momentum: expected an array of shape {v.shape}, got {np.shape(momentum)}")
        return np.abs(v) * np.abs(beta * np.asarray(momentum) + v)
    if kind == "second_order":
        if curvature is None or np.shape(curvature) != v.shape:
            raise ValueError(f"curvature: expected an array of shape {v.shape}, got {np.shape(curvature)}")
        return np.maximum(lr * v * v - 0.5 * lr * lr * np.asarray(curvature) * v * v, 0.0)
    return v * v


def send_order(scores: Sequence[float], nbytes: Sequence[int], policy: str = "importance") -> list[int]:
    """Bucket send order: ``"importance"`` = decreasing score per byte (ties: lower index first); ``"default"`` =
    index order (the caller rotates deferred buckets to the front, see ``budgeted_sgd``)."""
    if len(scores) != len(nbytes):
        raise ValueError(f"scores / nbytes: expected equal lengths, got {len(scores)} and {len(nbytes)}")
    if any(b <= 0 for b in nbytes):
        raise ValueError(f"nbytes: every bucket must have > 0 bytes, got {list(nbytes)}")
    if policy == "default":
        return list(range(len(scores)))
    if policy != "importance":
        raise ValueError(f"policy: expected 'importance' or 'default', got {policy!r}")
    return sorted(range(len(scores)), key=lambda i: (-scores[i] / nbytes[i], i))


def within_budget(
    order: Sequence[int], scores: Sequence[float], nbytes: Sequence[int], budget: float
) -> tuple[list[int], float]:
    """Buckets sent (in ``order``, each whole, stopping at the first that no longer fits) and their total score."""
    if not budget >= 0:
        raise ValueError(f"budget: expected >= 0 bytes, got {budget}")
    if sorted(order) != list(range(len(scores))) or len(nbytes) != len(scores):
        raise ValueError(f"order: expected a permutation of range({len(scores)}), got {list(order)}")
    sent, used, got = [], 0.0, 0.0
    for i in order:
        if used + nbytes[i] > budget:
            break
        sent.append(i)
        used += nbytes[i]
        got += scores[i]
    return sent, got


def budgeted_sgd(
    h: np.ndarray,
    w0: np.ndarray,
    w_star: np.ndarray,
    bucket_sizes: Sequence[int],
    budget_frac: float,
    steps: int,
    policy: str = "importance",
    kind: str = "second_order",
    lr: float = 1.0,
    beta: float = 0.5,
) -> dict[str, list[float]]:
    """SGD with momentum on the test problem L(w) = sum h (w - w*)^2 / 2 (a model) where each step only
    ``budget_frac`` of the gradient bytes (fp32) can be sent: buckets are chosen by ``policy`` ("importance" with
    importance ``kind``, or "default" = fixed order with carry-over), the rest stays in an error-feedback residual.

    Returns per step: "loss" (before the step), "captured" (share of the step's total second-order importance that
    was sent: the loss decrease the sent buckets buy, over what sending everything would buy)."""
    h, w, w_star = (np.asarray(a, dtype=np.float64).copy() for a in (h, w0, w_star))
    if not (h.shape == w.shape == w_star.shape and h.ndim == 1):
        raise ValueError(f"h / w0 / w_star: expected equal 1-D shapes, got {h.shape}, {w.shape}, {w_star.shape}")
    if sum(bucket_sizes) != h.size or any(s <= 0 for s in bucket_sizes):
        raise ValueError(f"bucket_sizes: expected positive sizes summing to {h.size}, got {list(bucket_sizes)}")
    if not 0 < budget_frac <= 1:
        raise ValueError(f"budget_frac: expected 0 < budget_frac <= 1, got {budget_frac}")
    if steps < 1:
        raise ValueError(f"steps: expected >= 1, got {steps}")
    if policy not in ("importance", "default"):
        raise ValueError(f"policy: expected 'importance' or 'default', got {policy!r}")
    if kind not in IMPORTANCE:
        raise ValueError(f"kind: expected one of {IMPORTANCE}, got {kind!r}")
    if not 0 <= beta < 1:
        raise ValueError(f"beta: expected 0 <= beta < 1, got {beta}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr: expected a finite value > 0, got {lr}")
    edges = np.concatenate([[0], np.cumsum(bucket_sizes)])
    nbytes = [4 * s for s in bucket_sizes]
    budget = budget_frac * sum(nbytes)
    resid, mom = np.zeros_like(w), np.zeros_like(w)
    queue = list(range(len(bucket_sizes)))  # the default policy's order, deferred buckets first
    out: dict[str, list[float]] = {"loss": [], "captured": []}
    for _ in range(steps):
        out["loss"].append(float(0.5 * np.sum(h * (w - w_star) ** 2)))
        v = h * (w - w_star) + resid
        elem = importance(v, kind, momentum=mom, curvature=h, lr=lr, beta=beta)
        scores = [float(elem[a:b].sum()) for a, b in zip(edges[:-1], edges[1:], strict=True)]
        gain = importance(v, "second_order", curvature=h, lr=lr)
        gains = [float(gain[a:b].sum()) for a, b in zip(edges[:-1], edges[1:], strict=True)]
        order = send_order(scores, nbytes, "importance") if policy == "importance" else queue
        sent, _ = within_budget(order, scores, nbytes, budget)
        if policy == "default":
            queue = [i for i in queue if i not in sent] + sent
        mask = np.zeros(w.size, dtype=bool)
        for i in sent:
            mask[edges[i] : edges[i + 1]] = True
        update = np.where(mask, v, 0.0)
        resid = np.where(mask, 0.0, v)
        mom = beta * mom + update
        w -= lr * mom
        total = sum(gains)
        out["captured"].append(sum(gains[i] for i in sent) / total if total > 0 else 1.0)
    return out
