"""Iterative magnitude pruning with rewinding (the lottery-ticket procedure, Frankle & Carbin 2019).

    theta_0 = weights at step k (k = 0: initialisation; small k > 0: "late rewinding", more stable)
    repeat R rounds:  train -> globally prune p of the surviving weights by |w| -> rewind survivors to theta_k

After R rounds the sparsity is 1 - (1 - p)^R; ``per_round_amount(final, R)`` inverts that. The masks compose
(PruningContainer), so a weight pruned in round r stays pruned. Rewinding writes theta_k into ``<name>_orig`` (and
the unpruned parameters and buffers), leaving the masks alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .finetune import global_sparsity
from .functional import global_unstructured


def per_round_amount(final_sparsity: float, rounds: int) -> float:
    if not 0.0 <= final_sparsity < 1.0:
        raise ValueError(f"final_sparsity: expected a value in [0, 1), got {final_sparsity}")
    if rounds < 1:
        raise ValueError(f"rounds: expected >= 1, got {rounds}")
    return 1.0 - (1.0 - final_sparsity) ** (1.0 / rounds)


def snapshot(model: Any) -> dict[str, np.ndarray]:
    """Copies of every parameter and buffer, keyed by their *unpruned* names (weight_orig -> weight)."""
    out = {}
    for k, v in model.state_dict().items():
        if k.endswith("_mask"):
            continue
        out[k[:-5] if k.endswith("_orig") else k] = np.array(v.data, copy=True)
    return out


def rewind(model: Any, state: dict[str, np.ndarray]) -> None:
    """Copy ``state`` (from ``snapshot``) back; pruned parameters receive it through ``<name>_orig``."""
    current = model.state_dict()
    for k, arr in state.items():
        key = k if k in current else k + "_orig"
        if key not in current:
            raise ValueError(f"state: key {k!r} not found in the model")
        np.copyto(current[key].data, arr, casting="unsafe")


def iterative_magnitude_pruning(
    model: Any,
    params: list[tuple[Any, str]],
    train_fn: Callable[[Any], Any],
    rounds: int,
    final_sparsity: float,
    rewind_state: dict[str, np.ndarray] | None = None,
    evaluate: Callable[[Any], float] | None = None,
) -> list[dict[str, float]]:
    """Run the rounds; returns [{round, sparsity, metric (after training, before pruning)}]. Ends rewound and
    pruned: call ``train_fn(model)`` once more to train the final ticket."""
    p = per_round_amount(final_sparsity, rounds)
    state = rewind_state if rewind_state is not None else snapshot(model)
    history = []
    for r in range(rounds):
        train_fn(model)
        metric = float(evaluate(model)) if evaluate is not None else float("nan")
        global_unstructured(params, amount=p)
        rewind(model, state)
        history.append({"round": r + 1, "sparsity": global_sparsity(params), "metric": metric})
    return history
