"""Pictures of collective schedules: which chunk each rank holds (and how many ranks' data it contains) per step.

ring_contributions(p)[s][r][c] = set of ranks whose data is summed in rank r's copy of chunk c after step s
(s = 0 is the initial state). Replays ``ring_schedule`` symbolically, so the picture is the algorithm.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .collectives import ring_schedule


def ring_contributions(p: int) -> list[list[list[frozenset[int]]]]:
    state = [[frozenset([r]) for _ in range(p)] for r in range(p)]
    out = [[list(row) for row in state]]
    for s in range(2 * (p - 1)):
        sends = [ring_schedule(r, s, p) for r in range(p)]
        new = [list(row) for row in state]
        for r in range(p):
            left = (r - 1) % p
            c = sends[r][1]
            assert sends[left][0] == c
            new[r][c] = state[r][c] | state[left][c] if s < p - 1 else state[left][c]
        state = new
        out.append([list(row) for row in state])
    return out


def draw_ring_allreduce(p: int = 4, axes: Any = None) -> Any:
    """One panel per step of ring all-reduce: rows = ranks, columns = chunks, colour = how many ranks'
    contributions that copy holds (p = fully reduced); the outlined cell is the chunk each rank sends."""
    import matplotlib.pyplot as plt

    steps = ring_contributions(p)
    n = len(steps)
    if axes is None:
        fig, axes = plt.subplots(1, n, figsize=(2.1 * n, 2.6), sharey=True)
    else:
        fig = np.ravel(axes)[0].figure
    axes = np.ravel(axes)
    for s, ax in enumerate(axes[:n]):
        grid = np.array([[len(steps[s][r][c]) for c in range(p)] for r in range(p)])
        ax.imshow(grid, cmap="Blues", vmin=0, vmax=p)
        for r in range(p):
            for c in range(p):
                ax.text(
                    c,
                    r,
                    str(grid[r, c]),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if grid[r, c] > p / 2 else "black",
                )
            if s < n - 1:
                c = ring_schedule(r, s, p)[0]
                ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, ec="red", lw=2))
        phase = "start" if s == 0 else ("reduce-scatter" if s <= p - 1 else "all-gather")
        ax.set_title(f"after step {s}\n{phase}" if s else "initial", fontsize=8)
        ax.set_xticks(range(p), [f"c{c}" for c in range(p)], fontsize=7)
        ax.set_yticks(range(p), [f"rank {r}" for r in range(p)], fontsize=7)
    fig.suptitle(
        f"ring all-reduce, p={p}: number of ranks summed into each chunk copy (red = sent next step)", fontsize=9
    )
    fig.tight_layout()
    return fig
