"""Arena maps: one horizontal bar per allocator, allocated blocks coloured, free blocks light, waste hatched."""

from __future__ import annotations

from typing import Any


def plot_arena(alloc: Any, ax: Any = None, title: str | None = None, limit: int | None = None) -> Any:
    """Draw ``alloc.snapshot()`` on ``ax`` (x = byte offset). Allocated blocks: dark = requested bytes, lighter
    = rounding waste; free blocks the allocator can hand out: light grey. ``limit`` caps the x axis."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 1.2))
    for b in alloc.snapshot():
        if b["state"] == "allocated":
            ax.broken_barh([(b["offset"], b["requested"])], (0, 1), facecolors="tab:blue")
            if b["size"] > b["requested"]:
                ax.broken_barh(
                    [(b["offset"] + b["requested"], b["size"] - b["requested"])], (0, 1), facecolors="tab:orange"
                )
        else:
            ax.broken_barh([(b["offset"], b["size"])], (0, 1), facecolors="0.9", edgecolors="0.6", linewidth=0.3)
    ax.set_xlim(0, limit or alloc.capacity)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    s = alloc.stats()
    ax.set_title(
        title or f"{type(alloc).__name__}: allocated {s['allocated']} B, fragmentation {s['fragmentation']:.2f}",
        fontsize=9,
    )
    return ax
