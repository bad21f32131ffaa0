"""Plot helpers for benchmark tables: grouped bars of median time (or GFLOP/s) per case and implementation."""

from __future__ import annotations

from typing import Any

import numpy as np

from .table import Table


def plot_table(
    table: Table, metric: str = "median_ms", ax: Any = None, log: bool = True, path: str | None = None
) -> Any:
    """Grouped bar chart: one group per case, one bar per implementation; rows without a value are skipped.

    ``metric`` is a Row field (median_ms, ratio, gflops, gbps, peak_mb). Returns the matplotlib Axes.
    """
    import matplotlib

    if path is not None and ax is None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if metric not in ("median_ms", "ratio", "gflops", "gbps", "peak_mb"):
        raise ValueError(f"metric: unknown metric {metric!r}")
    cases, impls = table.cases(), table.impls()
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6, 1.2 * len(cases) + 2), 3.6))
    width = 0.8 / max(1, len(impls))
    x = np.arange(len(cases))
    for i, impl in enumerate(impls):
        vals = []
        for c in cases:
            r = table.get(c, impl)
            v = getattr(r, metric) if r is not None else None
            vals.append(np.nan if v is None else v)
        ax.bar(x + (i - (len(impls) - 1) / 2) * width, vals, width, label=impl)
    ax.set_xticks(x, cases, rotation=20, ha="right")
    labels = {
        "median_ms": "median time (ms)",
        "ratio": f"time / {table.baseline}",
        "gflops": "GFLOP/s",
        "gbps": "GB/s",
        "peak_mb": "peak MB",
    }
    ax.set_ylabel(labels[metric])
    if log:
        ax.set_yscale("log")
    ax.set_title(table.title)
    ax.legend(fontsize=8)
    if path is not None:
        ax.figure.tight_layout()
        ax.figure.savefig(path, dpi=110)
    return ax
