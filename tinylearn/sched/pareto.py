"""Multi-objective choice for schedules and kernels: an online Pareto front, scalarisations, Tchebycheff queues.

All objectives are MINIMISED (negate a throughput). Point a *dominates* b when a <= b in every objective and a < b
in at least one; the Pareto front is the set of non-dominated points.

* ``ParetoFront`` [Q229]: configurations (energy, latency, risk, ...) arrive one at a time; ``insert`` rejects a
  point some front member dominates (or equals) and prunes every member the new point dominates, so the front is
  always exactly the non-dominated subset of everything inserted (cost O(front size) per insert).
  ``hypervolume(ref)`` -- the volume dominated by the front and bounded by a reference point (Zitzler & Thiele
  1998), the standard quality indicator -- is exact in 2-D (a sweep over points sorted by the first objective)
  and a seeded Monte Carlo estimate in higher dimensions (fraction of uniform samples in the box [ideal, ref]
  dominated by some front point, times the box volume, with its binomial standard error).
* Scalarisations [Q127] (Miettinen, *Nonlinear Multiobjective Optimization*, 1999): the **weighted sum**
  ``sum_i w_i f_i / range_i`` only ever picks points on the CONVEX hull of the front -- a front point in a
  concave dent ("unsupported") is chosen by no weights at all; the **epsilon-constraint** method minimises one
  objective subject to upper bounds on the others and can reach every front point; ``pareto_choice`` returns the
  whole front for a human (or a later rule) to pick from.
* **Weighted Tchebycheff** [Q194]: score ``max_i w_i |f_i - z*_i| / scale_i`` (z* the ideal point); unlike a
  weighted sum, some weight vector makes every Pareto-optimal point the best score (Bowman 1976; Steuer & Choo
  1983). ``TchebycheffQueue`` is a priority queue of jobs ordered by that score over (power W, temperature C,
  -throughput in TFLOP/s), the MODEL numbers coming from ``device_model.DeviceSpec`` (``job_objectives``).
* **Kernel choice by (time, joules)** [Q282]: ``kernel_objective = time^alpha * joules^(1 - alpha)``; alpha = 1
  is the fastest, alpha = 0 the most frugal, alpha = 1/2 ranks as the energy-delay product E*t (Gonzalez &
  Horowitz, "Energy dissipation in general purpose microprocessors", JSSC 1996). The notebook times real tinylearn
  kernels; their joules are a MODEL (no power meter on this VM).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from .._inputs import is_int, is_real
from .device_model import DeviceSpec

__all__ = [
    "dominates",
    "pareto_filter",
    "ParetoFront",
    "hypervolume_2d",
    "weighted_sum",
    "epsilon_constraint",
    "pareto_choice",
    "supported_by_weighted_sum",
    "tchebycheff",
    "TchebycheffQueue",
    "job_objectives",
    "kernel_objective",
    "choose_kernel",
]


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """True when ``a`` is <= ``b`` everywhere and < somewhere (minimisation)."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def pareto_filter(points: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the non-dominated points (brute force O(m^2); duplicates: the first one is kept)."""
    pts = [tuple(map(float, p)) for p in points]
    keep = []
    for i, p in enumerate(pts):
        if any(dominates(q, p) or (q == p and j < i) for j, q in enumerate(pts) if j != i):
            continue
        keep.append(i)
    return keep


def _as_point(point: Sequence[float], n_obj: int, name: str = "point") -> tuple[float, ...]:
    try:
        p = tuple(float(x) for x in point)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected {n_obj} numbers, got {point!r}") from None
    if len(p) != n_obj or not all(math.isfinite(x) for x in p):
        raise ValueError(f"{name}: expected {n_obj} finite numbers, got {point!r}")
    return p


class ParetoFront:
    """Online Pareto front of ``n_obj``-objective points (minimised), each with an optional payload."""

    def __init__(self, n_obj: int) -> None:
        if not is_int(n_obj) or n_obj < 1:
            raise ValueError(f"n_obj: expected an int >= 1, got {n_obj!r}")
        self.n_obj = int(n_obj)
        self._pts: list[tuple[float, ...]] = []
        self._payloads: list[Any] = []
        self.inserted = 0
        self.pruned = 0

    def __len__(self) -> int:
        return len(self._pts)

    def insert(self, point: Sequence[float], payload: Any = None) -> bool:
        """Add ``point`` if no member dominates or equals it (True); members it dominates are removed."""
        p = _as_point(point, self.n_obj)
        self.inserted += 1
        for q in self._pts:
            if q == p or dominates(q, p):
                return False
        keep = [i for i, q in enumerate(self._pts) if not dominates(p, q)]
        self.pruned += len(self._pts) - len(keep)
        self._pts = [self._pts[i] for i in keep] + [p]
        self._payloads = [self._payloads[i] for i in keep] + [payload]
        return True

    def points(self) -> list[tuple[float, ...]]:
        """The front, sorted lexicographically."""
        return sorted(self._pts)

    def items(self) -> list[tuple[tuple[float, ...], Any]]:
        """``(point, payload)`` pairs, sorted by point."""
        return sorted(zip(self._pts, self._payloads), key=lambda t: t[0])

    def hypervolume(self, ref: Sequence[float], samples: int = 20000, seed: int = 0) -> float:
        """Volume dominated by the front inside the box below ``ref`` (exact for 2 objectives, else Monte Carlo
        with ``samples`` points; ``hypervolume_mc`` gives its standard error)."""
        r = _as_point(ref, self.n_obj, "ref")
        if self.n_obj == 2:
            return hypervolume_2d(self._pts, r)
        return self.hypervolume_mc(r, samples, seed)[0]

    def hypervolume_mc(self, ref: Sequence[float], samples: int = 20000, seed: int = 0) -> tuple[float, float]:
        """Monte Carlo hypervolume ``(estimate, stderr)`` in any dimension (seeded)."""
        r = np.array(_as_point(ref, self.n_obj, "ref"))
        if not is_int(samples) or samples < 1:
            raise ValueError(f"samples: expected an int >= 1, got {samples!r}")
        pts = np.array([p for p in self._pts if all(x < y for x, y in zip(p, r))])
        if len(pts) == 0:
            return 0.0, 0.0
        lo = pts.min(axis=0)
        vol = float(np.prod(r - lo))
        u = np.random.default_rng(seed).uniform(lo, r, size=(samples, self.n_obj))
        hit = np.zeros(samples, dtype=bool)
        for p in pts:
            hit |= np.all(u >= p, axis=1)
        f = hit.mean()
        return vol * float(f), vol * math.sqrt(f * (1 - f) / samples)


def hypervolume_2d(points: Sequence[Sequence[float]], ref: Sequence[float]) -> float:
    """Exact 2-D hypervolume: sweep the non-dominated points in increasing f1, adding each one's rectangle."""
    r = _as_point(ref, 2, "ref")
    pts = sorted(tuple(map(float, p)) for p in points if p[0] < r[0] and p[1] < r[1])
    vol, best_f2 = 0.0, r[1]
    for f1, f2 in pts:
        if f2 < best_f2:
            vol += (r[0] - f1) * (best_f2 - f2)
            best_f2 = f2
    return vol


# ------------------------------------------------------------------------------------------ scalarisations
def _cands(candidates: Sequence[Sequence[float]]) -> np.ndarray:
    c = np.asarray(candidates, dtype=float)
    if c.ndim != 2 or len(c) == 0 or not np.all(np.isfinite(c)):
        raise ValueError(f"candidates: expected a non-empty (m, k) table of finite objectives, got shape {c.shape}")
    return c


def weighted_sum(candidates: Sequence[Sequence[float]], weights: Sequence[float], normalise: bool = True) -> int:
    """Index minimising ``sum_i w_i f_i`` (objectives scaled to [0, 1] over the candidates when ``normalise``)."""
    c = _cands(candidates)
    w = np.asarray(weights, dtype=float)
    if w.shape != (c.shape[1],) or np.any(w < 0) or not np.all(np.isfinite(w)) or w.sum() == 0:
        raise ValueError(f"weights: expected {c.shape[1]} finite weights >= 0, not all 0, got {list(weights)!r}")
    if normalise:
        span = c.max(axis=0) - c.min(axis=0)
        c = (c - c.min(axis=0)) / np.where(span > 0, span, 1.0)
    return int(np.argmin(c @ w))


def epsilon_constraint(candidates: Sequence[Sequence[float]], primary: int, bounds: Mapping[int, float]) -> int | None:
    """Index minimising objective ``primary`` among candidates with ``f_j <= bounds[j]`` for every bounded j
    (ties: smaller other objectives); None when no candidate satisfies the bounds."""
    c = _cands(candidates)
    k = c.shape[1]
    if not is_int(primary) or not 0 <= primary < k:
        raise ValueError(f"primary: expected an objective index in [0, {k}), got {primary!r}")
    for j, b in bounds.items():
        if not is_int(j) or not 0 <= j < k or j == primary or not is_real(b):
            raise ValueError(f"bounds: expected {{objective index != primary: bound}}, got {dict(bounds)!r}")
    ok = [i for i in range(len(c)) if all(c[i, j] <= b for j, b in bounds.items())]
    if not ok:
        return None
    return min(ok, key=lambda i: (c[i, primary], tuple(c[i])))


def pareto_choice(candidates: Sequence[Sequence[float]]) -> list[int]:
    """The Pareto-optimal candidates' indices (the menu a multi-objective scheduler offers)."""
    return pareto_filter(_cands(candidates))


def supported_by_weighted_sum(candidates: Sequence[Sequence[float]], n_weights: int = 200, seed: int = 0) -> set[int]:
    """Indices some weighted sum picks: a grid of weights for 2 objectives, ``n_weights`` Dirichlet samples plus
    the corners otherwise. A front point outside this set is unsupported (in a non-convex part of the front)."""
    c = _cands(candidates)
    k = c.shape[1]
    if not is_int(n_weights) or n_weights < 2:
        raise ValueError(f"n_weights: expected an int >= 2, got {n_weights!r}")
    if k == 2:
        ws = [np.array([a, 1 - a]) for a in np.linspace(0, 1, n_weights)]
    else:
        ws = list(np.eye(k)) + list(np.random.default_rng(seed).dirichlet(np.ones(k), size=n_weights))
    return {weighted_sum(c, w) for w in ws}


# ------------------------------------------------------------------------------------------ Tchebycheff
def tchebycheff(f: Sequence[float], weights: Sequence[float], ideal: Sequence[float], scale: Sequence[float]) -> float:
    """Weighted Tchebycheff distance ``max_i w_i |f_i - z*_i| / scale_i``."""
    return float(max(w * abs(a - z) / s for a, w, z, s in zip(f, weights, ideal, scale)))


class TchebycheffQueue:
    """Priority queue popping the job with the smallest weighted Tchebycheff score (module docstring).

    ``weights``, ``ideal`` (z*) and ``scale`` (objective units, e.g. (100 W, 10 C, 1 job/s)) have one entry per
    objective; equal scores pop in insertion order.
    """

    def __init__(self, weights: Sequence[float], ideal: Sequence[float], scale: Sequence[float] | None = None) -> None:
        w = [float(x) for x in weights]
        if not w or any(not math.isfinite(x) or x < 0 for x in w) or sum(w) == 0:
            raise ValueError(f"weights: expected finite weights >= 0, not all 0, got {list(weights)!r}")
        self.weights = w
        self.ideal = list(_as_point(ideal, len(w), "ideal"))
        s = [1.0] * len(w) if scale is None else list(_as_point(scale, len(w), "scale"))
        if any(x <= 0 for x in s):
            raise ValueError(f"scale: expected positive units, got {s!r}")
        self.scale = s
        self._heap: list[tuple[float, int, Hashable, tuple[float, ...]]] = []
        self._count = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def score(self, objectives: Sequence[float]) -> float:
        return tchebycheff(_as_point(objectives, len(self.weights), "objectives"), self.weights, self.ideal, self.scale)

    def push(self, job: Hashable, objectives: Sequence[float]) -> float:
        """Queue ``job`` with its objective vector; returns its score."""
        s = self.score(objectives)
        heapq.heappush(self._heap, (s, next(self._count), job, tuple(objectives)))
        return s

    def pop(self) -> tuple[Hashable, float]:
        """``(job, score)`` of the best-scored job; IndexError when empty."""
        if not self._heap:
            raise IndexError("pop from an empty TchebycheffQueue")
        s, _, job, _ = heapq.heappop(self._heap)
        return job, s


def job_objectives(spec: DeviceSpec, flops: float, nbytes: float, f_mhz: float, util: float) -> tuple[float, ...]:
    """MODEL objectives of running a job's steps on ``spec`` at clock ``f_mhz`` and utilisation ``util``:
    (board power W, steady temperature C, -achieved TFLOP/s = -flops / roofline step time / 1e12)."""
    p = spec.power_w(f_mhz, util)
    return (p, spec.steady_temp_c(p), -flops / spec.step_time_s(flops, nbytes, f_mhz) / 1e12)


# ------------------------------------------------------------------------------------------ kernel choice
def kernel_objective(time_s: float, joules: float, alpha: float) -> float:
    """``time_s^alpha * joules^(1 - alpha)``: alpha = 1 time only, 0 energy only, 0.5 ranks like energy x delay."""
    for nm, v in (("time_s", time_s), ("joules", joules)):
        if not is_real(v) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{nm}: expected a finite number > 0, got {v!r}")
    if not is_real(alpha) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha: expected a number in [0, 1], got {alpha!r}")
    return float(time_s**alpha * joules ** (1.0 - alpha))


def choose_kernel(candidates: Mapping[str, tuple[float, float]], alpha: float) -> str:
    """Name of the candidate {name: (time_s, joules)} minimising ``kernel_objective`` (ties: first listed)."""
    if not isinstance(candidates, Mapping) or not candidates:
        raise ValueError(f"candidates: expected a non-empty dict name -> (time_s, joules), got {candidates!r}")
    return min(candidates, key=lambda k: kernel_objective(candidates[k][0], candidates[k][1], alpha))
