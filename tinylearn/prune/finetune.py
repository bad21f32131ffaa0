"""Training with pruning: gradual (AGP-scheduled) global magnitude pruning inside the training loop.

At every step where ``schedule.should_update(step)``, the global sparsity of ``params`` is raised to
``schedule(step)`` by pruning ``amount_to_reach(current, target)`` of the *remaining* weights (masks compose, so
pruned weights never come back); between updates the masks hold and the optimizer trains the survivors
(gradients of masked entries are exactly zero through the weight_orig * weight_mask reparameterisation).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..data.loader import DataLoader
from ..nn.layers import Conv2d, Linear
from ..nn.training import _make_optimizer, evaluate, train_epoch
from .functional import global_unstructured
from .schedules import amount_to_reach


def prunable_weights(model: Any, kinds: tuple[type, ...] = (Linear, Conv2d)) -> list[tuple[Any, str]]:
    """[(module, "weight")] for every Linear / Conv2d in ``model`` (registration order)."""
    return [(m, "weight") for m in model.modules() if isinstance(m, kinds)]


def global_sparsity(params: list[tuple[Any, str]]) -> float:
    zeros = sum(int(np.count_nonzero(getattr(m, n).data == 0)) for m, n in params)
    total = sum(getattr(m, n).data.size for m, n in params)
    return zeros / total if total else 0.0


def train_with_schedule(
    model: Any,
    params: list[tuple[Any, str]],
    X: np.ndarray,
    y: np.ndarray,
    schedule: Any,
    epochs: int,
    lr: float = 1e-3,
    batch_size: int = 64,
    optimizer: Any = "adam",
    seed: int = 0,
    X_val: np.ndarray | None = None,
    y_val: np.ndarray | None = None,
) -> dict[str, list[float]]:
    """Train while pruning on ``schedule`` (step -> target sparsity; one step = one mini-batch).

    Returns per-epoch "loss", "sparsity" (global, of ``params``) and "val_acc" (if validation data is given).
    """
    if epochs < 1:
        raise ValueError(f"epochs: must be >= 1, got {epochs}")
    opt = _make_optimizer(model, optimizer, lr, 0.0)
    loader = DataLoader(X, y, batch_size=batch_size, shuffle=True, seed=seed)
    hist: dict[str, list[float]] = {"loss": [], "sparsity": []}
    if X_val is not None:
        hist["val_acc"] = []
    step = 0

    def prune_on_schedule() -> None:
        nonlocal step
        if schedule.should_update(step):
            amount = amount_to_reach(global_sparsity(params), float(schedule(step)))
            if amount > 0:
                global_unstructured(params, amount=amount)
        step += 1

    model.train()
    for _ in range(epochs):
        loss, _ = train_epoch(model, opt, loader, before_step=prune_on_schedule)
        hist["loss"].append(loss)
        hist["sparsity"].append(global_sparsity(params))
        if X_val is not None:
            hist["val_acc"].append(evaluate(model, X_val, y_val))
            model.train()
    model.eval()
    return hist
