"""Sensitivity analysis: prune one layer at a time, measure the metric, restore; pick per-layer ratios.

    scan = sensitivity_scan(model, {"fc1": (model.fc1, "weight"), ...}, [0.5, 0.7, 0.9], evaluate)
    ratios = choose_ratios(scan, baseline=evaluate(model), max_drop=0.01)

``scan[label][i]`` is ``evaluate(model)`` with only that layer L1-pruned to ``sparsities[i]`` (no fine-tuning);
``choose_ratios`` takes, per layer, the largest swept sparsity whose metric stays within ``max_drop`` of the
baseline. Layers whose curve falls early (usually the first and the last) get low ratios.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .functional import l1_unstructured, restore


def sensitivity_scan(
    model: Any,
    layers: dict[str, tuple[Any, str]],
    sparsities: Sequence[float],
    evaluate: Callable[[Any], float],
    prune_fn: Callable[[Any, str, float], Any] = l1_unstructured,
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for label, (module, name) in layers.items():
        vals = []
        for s in sparsities:
            prune_fn(module, name, float(s))
            try:
                vals.append(float(evaluate(model)))
            finally:
                restore(module, name)
        out[label] = vals
    return out


def choose_ratios(
    scan: dict[str, list[float]], sparsities: Sequence[float], baseline: float, max_drop: float
) -> dict[str, float]:
    """Largest sparsity per layer with metric >= baseline - max_drop (0.0 if none qualifies)."""
    if len(sparsities) == 0:
        raise ValueError("sparsities: empty")
    ratios = {}
    for label, vals in scan.items():
        if len(vals) != len(sparsities):
            raise ValueError(f"scan[{label!r}]: {len(vals)} values for {len(sparsities)} sparsities")
        ok = [s for s, v in zip(sparsities, vals) if v >= baseline - max_drop]
        ratios[label] = max(ok) if ok else 0.0
    return ratios
