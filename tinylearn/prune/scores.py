"""Importance scores for pruning: which weights can go with the least damage to the loss L?

For a weight w with gradient g = dL/dw and (diagonal) curvature h = d2L/dw2, removing it (w -> 0) changes the
loss by the Taylor expansion  dL ~= -g w + 1/2 h w^2.  Each score keeps a different part:

- magnitude    |w|                     (the default of l1_unstructured; assumes all weights matter alike)
- gradient     |g|                     (sensitivity of the loss to the weight, ignores its size)
- taylor       |w * g|                 (first-order term; Molchanov et al. 2017)
- snip         |w * g| / sum |w * g|   (connection sensitivity at initialisation, Lee et al. 2019: with a gate c,
                                        w -> c*w, dL/dc at c = 1 is w*g; computed once, before training)
- fisher/obd   1/2 F w^2               (Optimal Brain Damage, LeCun et al. 1990, with the Hessian diagonal
                                        replaced by the empirical Fisher diagonal F = mean_n g_n^2 of
                                        per-sample gradients; at a minimum g ~ 0, so the second-order term is
                                        the one that remains)

(|w * g| is Taylor/SNIP, not "GraSP": GraSP scores -w * (H g), a Hessian-gradient product.)

``compute_scores(model, params, X, y, method)`` returns {(module, name): ndarray}, the dict form
``global_unstructured(..., importance_scores=...)`` takes. For an already pruned parameter the gradient is that of
``<name>_orig`` (zero where masked), so pruned entries score 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..autograd.tensor import Tensor
from ..nn.functional_loss import cross_entropy

METHODS = ("magnitude", "gradient", "taylor", "snip", "fisher", "obd")


def _param(module: Any, name: str) -> Tensor:
    p = module._parameters.get(name)
    if p is None:
        p = module._parameters.get(name + "_orig")
    if p is None:
        raise ValueError(f"name: {type(module).__name__} has no parameter {name!r}")
    return p


def _grads(
    model: Any, params: list[tuple[Any, str]], X: np.ndarray, y: np.ndarray, loss_fn: Callable[..., Tensor]
) -> list[np.ndarray]:
    tensors = [_param(m, n) for m, n in params]
    saved = [t.grad for t in tensors]
    for t in tensors:
        t.grad = None
    loss = loss_fn(model(Tensor(np.ascontiguousarray(X))), Tensor(np.asarray(y)))
    loss.backward()
    out = [np.zeros_like(t.data) if t.grad is None else np.array(t.grad.data) for t in tensors]
    for t, g in zip(tensors, saved):
        t.grad = g
    return out


def compute_scores(
    model: Any,
    params: Iterable[tuple[Any, str]],
    X: Any = None,
    y: Any = None,
    method: str = "magnitude",
    loss_fn: Callable[..., Tensor] = cross_entropy,
    n_fisher_samples: int = 64,
) -> dict[tuple[Any, str], np.ndarray]:
    """Scores for every (module, name) in ``params`` (same shapes). Data-free for ``magnitude``."""
    if method not in METHODS:
        raise ValueError(f"method: unknown importance score {method!r}; known: {list(METHODS)}")
    params = list(params)
    weights = [getattr(m, n).data for m, n in params]  # effective (masked) weights
    if method == "magnitude":
        return {p: np.abs(w) for p, w in zip(params, weights)}
    if X is None or y is None:
        raise ValueError(f"X, y: method {method!r} needs a batch of data")
    X, y = np.asarray(X), np.asarray(y)
    was_training = model.training
    model.eval()
    try:
        if method in ("fisher", "obd"):
            n = min(int(n_fisher_samples), len(X))
            if n < 1:
                raise ValueError(f"n_fisher_samples: need >= 1, got {n_fisher_samples}")
            fisher = [np.zeros_like(w, dtype=np.float64) for w in weights]
            for i in range(n):  # per-sample gradients: the empirical Fisher diagonal is their mean square
                for f, g in zip(fisher, _grads(model, params, X[i : i + 1], y[i : i + 1], loss_fn)):
                    f += g.astype(np.float64) ** 2
            return {p: (0.5 * (f / n) * w.astype(np.float64) ** 2) for p, f, w in zip(params, fisher, weights)}
        grads = _grads(model, params, X, y, loss_fn)
    finally:
        model.train(was_training)
    if method == "gradient":
        return {p: np.abs(g) for p, g in zip(params, grads)}
    wg = [np.abs(w.astype(np.float64) * g) for w, g in zip(weights, grads)]
    if method == "taylor":
        return dict(zip(params, wg))
    total = sum(float(s.sum()) for s in wg)
    return {p: s / total if total > 0 else s for p, s in zip(params, wg)}  # snip
