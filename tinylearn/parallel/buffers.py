"""Per-edge microbatch buffer depth for a pipeline over heterogeneous links (credit-based flow control).

Stage i computes a microbatch in t_i seconds and ships it over edge i (to stage i + 1) in d_i = alpha_i +
beta_i·act_bytes; a buffer slot ("credit") on edge i is taken when stage i starts a microbatch and comes back
a_i seconds (the acknowledgement) after stage i + 1 starts it. With B_i credits on edge i the pipeline settles at
the period (the max-plus cycle bound: a credit loop of delay t_i + d_i + a_i holds B_i tokens)

    T = max( max_i t_i ,  max_i (t_i + d_i + a_i) / B_i ).

**Little's law** (items in the loop = throughput × time each spends in it) gives the smallest depth that does not
slow the bottleneck stage: B_i = ceil((t_i + d_i + a_i) / max_j t_j). A slower or longer link needs a deeper
buffer, and each slot holds one activation, so the memory on edge i is B_i · act_bytes. ``simulate_stream``
replays the recurrences (optionally re-deriving B_i from the measured transfer times every ``adapt_every``
microbatches: the online controller) and ``buffer_depths`` is the formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any


def _check_times(name: str, xs: Sequence[float], n: int | None = None) -> list[float]:
    out = [float(x) for x in xs]
    if (n is not None and len(out) != n) or any(not (x >= 0) for x in out):
        want = f"{n} " if n is not None else ""
        raise ValueError(f"{name}: expected {want}non-negative seconds, got {list(xs)!r}")
    return out


def buffer_depths(stage_s: Sequence[float], edge_s: Sequence[float], ack_s: Sequence[float] | None = None) -> list[int]:
    """Little's law: the smallest credit count per edge that keeps the pipeline at its bottleneck stage's rate."""
    t = _check_times("stage_s", stage_s)
    if not t or max(t) <= 0:
        raise ValueError(f"stage_s: expected at least one stage with a positive time, got {list(stage_s)!r}")
    d = _check_times("edge_s", edge_s, len(t) - 1)
    a = _check_times("ack_s", ack_s if ack_s is not None else [0.0] * len(d), len(d))
    lam = 1.0 / max(t)
    return [max(1, math.ceil((t[i] + d[i] + a[i]) * lam - 1e-12)) for i in range(len(d))]


def stream_period(
    stage_s: Sequence[float], edge_s: Sequence[float], depths: Sequence[int], ack_s: Sequence[float] | None = None
) -> float:
    """The steady-state seconds per microbatch for fixed depths (the formula in the module docstring)."""
    t = _check_times("stage_s", stage_s)
    d = _check_times("edge_s", edge_s, len(t) - 1)
    a = _check_times("ack_s", ack_s if ack_s is not None else [0.0] * len(d), len(d))
    if len(depths) != len(d) or any(not isinstance(b, int) or b < 1 for b in depths):
        raise ValueError(f"depths: expected {len(d)} ints >= 1, got {list(depths)!r}")
    return max([*t, *((t[i] + d[i] + a[i]) / depths[i] for i in range(len(d)))])


def simulate_stream(
    stage_s: Sequence[float],
    edge_s: Sequence[float] | Callable[[int], Sequence[float]],
    depths: Sequence[int],
    n_microbatches: int,
    ack_s: Sequence[float] | None = None,
    *,
    adapt_every: int | None = None,
) -> dict[str, Any]:
    """Replay n microbatches through the stages with credit-based buffers.

    ``edge_s`` is the transfer time per edge, or a function of the microbatch index (a link that changes). With
    ``adapt_every`` the depths are re-derived by ``buffer_depths`` from the transfer times observed over the last
    ``adapt_every`` microbatches. Returns ``end`` (last stage's finish time per microbatch), ``period`` (mean
    seconds per microbatch over the last quarter, rounded to a multiple of lcm(depths)), ``depths`` (per
    microbatch, the depths in force) and
    ``peak_buffered`` (most microbatches sent but not yet started, per edge).
    """
    t = _check_times("stage_s", stage_s)
    n_edges = len(t) - 1
    a = _check_times("ack_s", ack_s if ack_s is not None else [0.0] * n_edges, n_edges)
    if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int) or n_microbatches < 4:
        raise ValueError(f"n_microbatches: expected an int >= 4, got {n_microbatches!r}")
    if adapt_every is not None and (not isinstance(adapt_every, int) or adapt_every < 1):
        raise ValueError(f"adapt_every: expected an int >= 1 or None, got {adapt_every!r}")
    if callable(edge_s):
        edge_at = edge_s
    else:
        fixed_edges = _check_times("edge_s", edge_s, n_edges)

        def edge_at(k: int) -> Sequence[float]:
            return fixed_edges

    depth = list(depths)
    stream_period(t, edge_at(0), depth, a)  # validates depths
    n, s = n_microbatches, len(t)
    start = [[0.0] * n for _ in range(s)]
    end = [[0.0] * n for _ in range(s)]
    arrive = [[0.0] * n for _ in range(s)]
    used_depths, observed = [], []
    for k in range(n):
        d = _check_times("edge_s", edge_at(k), n_edges)
        observed.append(d)
        if adapt_every and k and k % adapt_every == 0:
            window = observed[-adapt_every - 1 : -1]
            mean_d = [sum(w[i] for w in window) / len(window) for i in range(n_edges)]
            depth = buffer_depths(t, mean_d, a)
        used_depths.append(list(depth))
        for i in range(s):
            ready = max(end[i][k - 1] if k else 0.0, arrive[i][k] if i else 0.0)
            if i < n_edges and k >= depth[i]:
                ready = max(ready, start[i + 1][k - depth[i]] + a[i])  # a free slot on edge i
            start[i][k], end[i][k] = ready, ready + t[i]
            if i < n_edges:
                arrive[i + 1][k] = end[i][k] + d[i]
    last = end[-1]
    cyc = math.lcm(*used_depths[-1]) if used_depths[-1] else 1  # the steady state repeats every lcm(B) microbatches
    q = max(cyc, (n // 4) // cyc * cyc) if cyc < n // 2 else n // 4
    peak = []
    for i in range(n_edges):  # microbatches that arrived at stage i + 1 (or are in flight) but have not started
        events = sorted([(end[i][k], 1) for k in range(n)] + [(start[i + 1][k], -1) for k in range(n)])
        held = best = 0
        for _, delta in events:
            held += delta
            best = max(best, held)
        peak.append(best)
    return {
        "end": last,
        "period": (last[-1] - last[-1 - q]) / q,
        "depths": used_depths,
        "peak_buffered": peak,
    }
