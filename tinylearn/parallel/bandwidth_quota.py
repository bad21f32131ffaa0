"""Per-layer communication bandwidth quotas for MoE all-to-all: weighted max-min fairness by water-filling. [Q200]

Every MoE layer l of a step wants to move d_l bytes (its dispatch + combine all-to-all; measured, it depends on
how many tokens its router sends off-rank) through a shared link budget C (bytes per step, or a bandwidth share).
Each layer gets a weight w_l = load_l * importance_l (load: its measured demand or tokens routed; importance: how
much the layer's output matters, e.g. its share of the loss gradient norm, or a user priority).

Weighted max-min fair allocation (Bertsekas-Gallager "progressive filling"):

    x_l = min(d_l, lambda * w_l)      with lambda the water level such that sum_l x_l = min(C, sum_l d_l)

Raise one water level lambda for everybody (each layer's allocation grows at rate w_l) and freeze a layer when
its demand is met; the freed capacity keeps filling the others. Sorting layers by d_l / w_l gives lambda in
O(L log L): walk the sorted list, at each step lambda = remaining / (sum of unfrozen weights), freeze the layer
if d_l / w_l <= lambda. Properties checked by ``is_weighted_max_min_fair``: sum x <= C, 0 <= x_l <= d_l, no
capacity is left while a layer is unmet, and every unmet layer sits at the same normalised share x_l / w_l =
lambda, which is >= d_j / w_j of every met layer: no layer can gain without taking from a layer whose normalised
share is no larger (the definition of weighted max-min fairness). ``floors`` reserve a minimum per layer first
(a control message must always fit), the rest is water-filled.

Baselines: ``proportional_share`` (x ~ d, ignores importance: the hungry unimportant layer wins) and
``equal_share`` (C / L, capped at d, slack not redistributed). ``quota_report`` turns an allocation into what a
MoE layer does with it: the fraction of its traffic that fits (the rest is delayed to the next step or its
capacity factor lowered) and, as a MODEL, the time t_l = d_l / (x_l / C * B) to move its demand at link
bandwidth B with the given share.

``measure_layer_demands`` (run with ``tl.dist.launch``) measures the real per-layer demands: L expert-parallel
layers (``ExpertParallelMoE``) with different router skews, one forward each, bytes sent per layer from
``traffic_meter``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "equal_share",
    "is_weighted_max_min_fair",
    "layer_weights",
    "measure_layer_demands",
    "proportional_share",
    "quota_report",
    "water_fill",
]


def _vec(x: Any, name: str, positive: bool = False) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D sequence, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0) or (positive and np.any(a <= 0)):
        bad = a[~np.isfinite(a) | (a <= 0 if positive else a < 0)][0]
        raise ValueError(f"{name}: expected finite values {'> 0' if positive else '>= 0'}, got {bad}")
    return a


def _cap(cap: Any) -> float:
    if isinstance(cap, bool) or not isinstance(cap, int | float | np.integer | np.floating) or not np.isfinite(cap):
        raise ValueError(f"cap: expected a finite number >= 0, got {cap!r}")
    if cap < 0:
        raise ValueError(f"cap: expected a finite number >= 0, got {cap!r}")
    return float(cap)


def water_fill(demands: Any, weights: Any, cap: float, floors: Any = None) -> tuple[np.ndarray, float]:
    """Weighted max-min fair allocation (x [L], lambda). ``floors`` (optional, <= demands, sum <= cap) are granted
    first; the remaining capacity is water-filled over the remaining demand. lambda = inf when every demand fits."""
    d = _vec(demands, "demands")
    w = _vec(weights, "weights", positive=True)
    if w.shape != d.shape:
        raise ValueError(f"weights: expected {d.size} values (one per layer), got {w.size}")
    c = _cap(cap)
    f = np.zeros_like(d) if floors is None else _vec(floors, "floors")
    if f.shape != d.shape:
        raise ValueError(f"floors: expected {d.size} values (one per layer), got {f.size}")
    if np.any(f > d):
        i = int(np.argmax(f > d))
        raise ValueError(f"floors: floor {f[i]} of layer {i} exceeds its demand {d[i]}")
    if f.sum() > c * (1 + 1e-12):
        raise ValueError(f"floors: their sum {f.sum()} exceeds cap {c}")
    rest_d, rest_c = d - f, c - f.sum()
    if rest_d.sum() <= rest_c:
        return d.copy(), float("inf")
    order = np.argsort(rest_d / w, kind="stable")
    x = f.copy()
    wsum = w.sum()
    lam, cut = 0.0, len(order)
    for pos, i in enumerate(order):
        lam = rest_c / wsum
        if rest_d[i] > lam * w[i]:  # this and every later layer (larger d/w) are cut at the water level
            cut = pos
            break
        x[i] += rest_d[i]  # met below the water level: freeze it, its slack stays in the pool
        rest_c -= rest_d[i]
        wsum -= w[i]
    for i in order[cut:]:
        x[i] += lam * w[i]
    return x, float(lam)


def is_weighted_max_min_fair(
    alloc: Any, demands: Any, weights: Any, cap: float, floors: Any = None, rtol: float = 1e-9
) -> bool:
    """Check the optimality conditions of weighted max-min fairness (see the module docstring)."""
    x, d, w, c = np.asarray(alloc, float), _vec(demands, "demands"), _vec(weights, "weights", True), _cap(cap)
    f = np.zeros_like(d) if floors is None else _vec(floors, "floors")
    tol = rtol * max(c, d.sum(), 1.0)
    if x.shape != d.shape or np.any(x < f - tol) or np.any(x > d + tol) or x.sum() > c + tol:
        return False
    unmet = x < d - tol
    if not unmet.any():
        return True
    if x.sum() < min(c, d.sum()) - tol:  # capacity left while someone is unmet
        return False
    share = (x - f) / w
    lam = share[unmet]
    if np.ptp(lam) > rtol * max(1.0, lam.max()) * 1e3:
        return False
    met = ~unmet
    return bool(np.all((d - f)[met] / w[met] <= lam.min() * (1 + 1e-6) + tol))


def proportional_share(demands: Any, cap: float) -> np.ndarray:
    """x_l = min(d_l, C d_l / sum d): every layer gets the same fraction of its demand (importance ignored)."""
    d, c = _vec(demands, "demands"), _cap(cap)
    return d.copy() if d.sum() <= c else d * (c / d.sum())


def equal_share(demands: Any, cap: float) -> np.ndarray:
    """x_l = min(d_l, C / L): static equal split, no redistribution of unused share."""
    d, c = _vec(demands, "demands"), _cap(cap)
    return np.minimum(d, c / d.size)


def layer_weights(load: Any, importance: Any) -> np.ndarray:
    """w_l = load_l * importance_l, normalised to sum 1 (a zero load gets a tiny weight so it stays defined)."""
    ld, im = _vec(load, "load"), _vec(importance, "importance", positive=True)
    if ld.shape != im.shape:
        raise ValueError(f"importance: expected {ld.size} values (one per layer), got {im.size}")
    w = np.maximum(ld * im, 1e-12 * max(float((ld * im).max()), 1.0))
    return w / w.sum()


def quota_report(alloc: Any, demands: Any, weights: Any, cap: float, link_bytes_per_s: float = 10e9) -> dict[str, Any]:
    """Per layer: fraction of demand that fits, normalised share x/w, and MODEL time d / (x / C * B) (inf if x=0);
    plus the importance-weighted fraction served sum_l w_l * min(1, x_l/d_l) / sum w."""
    x, d, w, c = np.asarray(alloc, float), _vec(demands, "demands"), _vec(weights, "weights", True), _cap(cap)
    served = np.where(d > 0, np.minimum(1.0, x / np.where(d > 0, d, 1.0)), 1.0)
    bw = np.where(x > 0, x / max(c, 1e-300) * link_bytes_per_s, 0.0)
    t = np.where(d == 0, 0.0, np.where(bw > 0, d / np.where(bw > 0, bw, 1.0), np.inf))
    return {
        "served": served,
        "share_per_weight": x / w,
        "model_time_s": t,
        "weighted_served": float((w * served).sum() / w.sum()),
        "min_served": float(served.min()),
    }


def measure_layer_demands(pulls: list[float], tokens_per_rank: int = 64, seed: int = 0) -> dict[str, Any]:
    """Inside ``tl.dist.launch``: one ExpertParallelMoE layer (top-1, dropless, 4 experts) per entry of ``pulls``;
    each rank's tokens are pushed along the router row of an expert by |pull|: one of its OWN experts when pull > 0
    (local traffic, little all-to-all), one of the NEXT rank's experts when pull < 0 (most tokens leave the rank).
    One forward per layer; returns the bytes this rank sent per layer (``traffic_meter``: counts, labels,
    dispatched and combined rows, stats; the backward all-to-all sends the same rows' gradients back, so a
    training step moves about twice this) and the per-layer routed tokens per expert."""
    import torch

    from . import moe_workers as W
    from .bench_longctx import traffic_meter
    from .moe_parallel import ExpertParallelMoE

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    out: dict[str, Any] = {"bytes": [], "tokens_per_expert": []}
    for i, pull in enumerate(pulls):
        dense = W.build_dense(seed + i, top_k=1, dropless=True)
        per = W.EXPERTS // world
        target = (rank if pull > 0 else (rank + 1) % world) * per
        gen = torch.Generator().manual_seed(seed + 1000 * i + rank)
        row = dense.router_weight.detach()[target]
        x = torch.randn(tokens_per_rank, W.D_MODEL, generator=gen) + abs(pull) * row / row.norm()
        ep = ExpertParallelMoE(dense)
        with torch.no_grad(), traffic_meter() as tm:
            ep(x)
        out["bytes"].append(int(tm["p2p_bytes"]))
        out["tokens_per_expert"].append(list(ep.last_stats["tokens_per_expert"]))
    return out
