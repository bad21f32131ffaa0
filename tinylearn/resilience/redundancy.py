"""Redundancy for critical layers: which layers' activations to replicate, under a budget, to minimise expected
recompute cost.

**The model.** Layer l's activation, if lost (a failed device, a detected memory error), costs c_l seconds to
recompute (its input is checkpointed, so c_l is the layer's own forward time), and is lost during a step with
probability p_l. Without protection the expected recompute cost is Σ p_l·c_l. Protecting layer l — a duplicate copy
of its activation on another device (duplicate storage) or a redundant execution — costs w_l of a budget B (bytes of
activation memory, or seconds of extra compute) and removes its term. Choosing the protected set S:

    minimise Σ_(l ∉ S) p_l·c_l  subject to  Σ_(l ∈ S) w_l ≤ B   ⇔   maximise Σ_(l ∈ S) v_l,  v_l = p_l·c_l,

a 0/1 knapsack. ``knapsack_exact`` solves it by dynamic programming over the budget (integer weights divided by
their gcd: O(L·B/g)), ``greedy_by_ratio`` takes layers by v_l / w_l while they fit (and returns the best single
layer instead if that is worth more: the classic ½-approximation), ``brute_force`` enumerates all 2^L subsets (the
check for small L). Greedy is optimal when weights are equal and can lose up to half otherwise (one heavy, valuable
layer blocked by light, slightly denser ones).

**On a real model** (``measure_layers``): c_l is each layer's forward time measured with ``tinylearn.bench.measure``
and w_l its activation bytes; p_l is a MODEL: a failure rate per byte-second of held activation times the bytes and
the time the activation stays live (until its backward: about 3× the forward time of the layers after it), so
early, large activations are the likeliest to be hit (``failure_probabilities``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from functools import reduce
from typing import Any

import numpy as np

from ..bench import measure

__all__ = [
    "brute_force",
    "choose_redundant",
    "expected_recompute_cost",
    "failure_probabilities",
    "greedy_by_ratio",
    "knapsack_exact",
    "measure_layers",
]

_MAX_CELLS = 20_000_000


def _values(name: str, xs: Sequence[float]) -> list[float]:
    out = [float(x) for x in xs]
    if any(not math.isfinite(x) or x < 0 for x in out):
        raise ValueError(f"{name}: expected finite numbers >= 0, got {list(xs)!r}")
    return out


def _weights(ws: Sequence[int], n: int) -> list[int]:
    if len(ws) != n:
        raise ValueError(f"weights: expected {n} (one per layer), got {len(ws)}")
    out = []
    for w in ws:
        if isinstance(w, bool) or not isinstance(w, int | np.integer) or w < 0:
            raise ValueError(f"weights: expected integers >= 0 (bytes, or quantised units), got {list(ws)!r}")
        out.append(int(w))
    return out


def _budget(b: Any) -> int:
    if isinstance(b, bool) or not isinstance(b, int | np.integer) or b < 0:
        raise ValueError(f"budget: expected an integer >= 0, got {b!r}")
    return int(b)


def expected_recompute_cost(costs: Sequence[float], probs: Sequence[float], protected: Sequence[int] = ()) -> float:
    """Σ over unprotected layers of p_l·c_l."""
    c, p = _values("costs", costs), _values("probs", probs)
    if len(c) != len(p) or any(x > 1 for x in p):
        raise ValueError(f"probs: expected {len(c)} probabilities in [0, 1], got {list(probs)!r}")
    chosen = set(protected)
    return float(sum(ci * pi for i, (ci, pi) in enumerate(zip(c, p, strict=True)) if i not in chosen))


def knapsack_exact(values: Sequence[float], weights: Sequence[int], budget: int) -> tuple[float, list[int]]:
    """Exact 0/1 knapsack by DP over the budget (weights and budget divided by their gcd). Returns (value, chosen
    indices in increasing order)."""
    v = _values("values", values)
    w, b = _weights(weights, len(v)), _budget(budget)
    g = reduce(math.gcd, [x for x in w if x] + [b]) or 1
    w, b = [x // g for x in w], b // g
    if len(v) * (b + 1) > _MAX_CELLS:
        raise ValueError(f"budget: {b} units after gcd {g} needs {len(v) * (b + 1)} DP cells; quantise the weights")
    best = np.zeros(b + 1)
    take = np.zeros((len(v), b + 1), dtype=bool)
    for i, (vi, wi) in enumerate(zip(v, w, strict=True)):
        if wi > b:
            continue
        cand = np.full(b + 1, -np.inf)
        cand[wi:] = best[: b + 1 - wi] + vi
        take[i] = cand > best
        best = np.maximum(best, cand)
    chosen, cap = [], b
    for i in range(len(v) - 1, -1, -1):  # backtrack
        if take[i, cap]:
            chosen.append(i)
            cap -= w[i]
    return float(sum(v[i] for i in chosen)), sorted(chosen)


def greedy_by_ratio(values: Sequence[float], weights: Sequence[int], budget: int) -> tuple[float, list[int]]:
    """Take items by value/weight (zero-weight first) while they fit; return the better of that and the best single
    fitting item (a ½-approximation of the optimum)."""
    v = _values("values", values)
    w, b = _weights(weights, len(v)), _budget(budget)
    order = sorted(range(len(v)), key=lambda i: -(v[i] / w[i]) if w[i] else -math.inf)
    chosen, used = [], 0
    for i in order:
        if used + w[i] <= b:
            chosen.append(i)
            used += w[i]
    total = sum(v[i] for i in chosen)
    fits = [i for i in range(len(v)) if w[i] <= b]
    if fits:
        single = max(fits, key=lambda i: v[i])
        if v[single] > total:
            return float(v[single]), [single]
    return float(total), sorted(chosen)


def brute_force(values: Sequence[float], weights: Sequence[int], budget: int) -> tuple[float, list[int]]:
    """All 2^L subsets (L ≤ 20): the exact optimum, for checking."""
    v = _values("values", values)
    w, b = _weights(weights, len(v)), _budget(budget)
    if len(v) > 20:
        raise ValueError(f"values: brute force is for <= 20 layers, got {len(v)}")
    best, best_set = 0.0, []
    for k in range(len(v) + 1):
        for sub in itertools.combinations(range(len(v)), k):
            if sum(w[i] for i in sub) <= b:
                val = sum(v[i] for i in sub)
                if val > best:
                    best, best_set = val, list(sub)
    return float(best), best_set


def choose_redundant(
    costs: Sequence[float], probs: Sequence[float], weights: Sequence[int], budget: int, method: str = "exact"
) -> dict[str, Any]:
    """Pick the layers to protect (``method`` "exact", "greedy" or "brute"). Returns ``protected``, ``saved``
    (expected seconds of recompute removed), ``cost_before`` / ``cost_after`` and ``used`` (budget spent)."""
    c, p = _values("costs", costs), _values("probs", probs)
    before = expected_recompute_cost(c, p)
    solver = {"exact": knapsack_exact, "greedy": greedy_by_ratio, "brute": brute_force}.get(method)
    if solver is None:
        raise ValueError(f"method: expected 'exact', 'greedy' or 'brute', got {method!r}")
    saved, chosen = solver([ci * pi for ci, pi in zip(c, p, strict=True)], weights, budget)
    return {
        "protected": chosen,
        "saved": saved,
        "cost_before": before,
        "cost_after": expected_recompute_cost(c, p, chosen),
        "used": int(sum(int(weights[i]) for i in chosen)),
    }


def failure_probabilities(
    forward_s: Sequence[float], act_bytes: Sequence[int], rate_per_byte_s: float, backward_factor: float = 2.0
) -> list[float]:
    """MODEL p_l = 1 − exp(−rate·bytes_l·live_l): activation l lives from its forward until its backward, i.e. the
    forwards after it plus (``backward_factor``×) the backwards of the layers after it and its own."""
    f, nb = _values("forward_s", forward_s), _values("act_bytes", act_bytes)
    if len(f) != len(nb):
        raise ValueError(f"act_bytes: expected {len(f)} values, got {len(nb)}")
    if not (isinstance(rate_per_byte_s, int | float) and rate_per_byte_s > 0 and math.isfinite(rate_per_byte_s)):
        raise ValueError(f"rate_per_byte_s: expected a finite number > 0, got {rate_per_byte_s!r}")
    after = np.cumsum(f[::-1])[::-1]  # after[l] = Σ_(j >= l) f_j
    live = [(after[i] - f[i]) + backward_factor * after[i] for i in range(len(f))]
    return [float(-np.expm1(-rate_per_byte_s * b * t)) for b, t in zip(nb, live, strict=True)]


def measure_layers(layers: Sequence[Any], x: Any, repeat: int = 7) -> tuple[list[float], list[int]]:
    """Forward time (median of ``repeat``, ``tinylearn.bench.measure``) and output-activation bytes of each layer of
    a sequential model (torch modules or callables on torch tensors / numpy arrays), fed ``x`` in turn."""
    import torch

    times, nbytes = [], []
    with torch.no_grad():
        h = x
        for layer in layers:
            inp = h
            times.append(measure(lambda layer=layer, inp=inp: layer(inp), warmup=2, repeat=repeat).median)
            h = layer(inp)
            nbytes.append(int(h.nbytes) if hasattr(h, "nbytes") else int(h.numel() * h.element_size()))
    return times, nbytes
