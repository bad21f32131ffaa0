"""Plots for notebook 10: pipeline Gantt charts (simulated or measured events) and ZeRO memory bars."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .zero import zero_memory_per_rank


def gantt(events_by_stage: Sequence[Sequence[tuple]], title: str = "", ax: Any = None, unit: str = "time") -> Any:
    """One row per stage; events are (kind, mb, start, end) or simulator tuples (stage, kind, mb, chunk, start,
    end). Forwards blue, backwards orange (darker for later chunks), the microbatch number inside each box."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(events_by_stage)))
    colors = {"F": ("#9ecae1", "#3182bd"), "B": ("#fdae6b", "#e6550d")}
    for s, evs in enumerate(events_by_stage):
        for e in evs:
            kind, mb, chunk, start, end = (e[0], e[1], 0, e[2], e[3]) if len(e) == 4 else (e[1], e[2], e[3], e[4], e[5])
            ax.barh(s, end - start, left=start, color=colors[kind][min(chunk, 1)], edgecolor="k", linewidth=0.5)
            ax.text((start + end) / 2, s, str(mb), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(events_by_stage)))
    ax.set_yticklabels([f"stage {s}" for s in range(len(events_by_stage))])
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title)
    return ax


def simulated_rows(sim: dict[str, Any], n_stages: int) -> list[list[tuple]]:
    """The simulator's flat event list split per stage (for ``gantt``)."""
    return [[e for e in sim["events"] if e[0] == s] for s in range(n_stages)]


def memory_bars(n_params: int, world_size: int, dtype_bytes: int = 2, ax: Any = None) -> Any:
    """Stacked bars of params / grads / optimizer state per rank (GB) for DDP and ZeRO stages 1-3."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    labels = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    parts = [zero_memory_per_rank(n_params, s, world_size, dtype_bytes) for s in range(4)]
    bottom = [0.0] * 4
    for key, color in (("params", "#3182bd"), ("grads", "#e6550d"), ("optimizer_state", "#31a354")):
        vals = [p[key] / 1e9 for p in parts]
        ax.bar(labels, vals, bottom=bottom, color=color, label=key)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for i, b in enumerate(bottom):
        ax.text(i, b, f"{b:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("GB per rank")
    ax.set_title(f"Ψ = {n_params / 1e9:.1f}B params, N = {world_size} ranks, mixed-precision Adam")
    ax.legend(fontsize=8)
    return ax
