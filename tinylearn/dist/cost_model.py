"""alpha-beta-gamma cost model of all-reduce: a message of n bytes costs alpha + n*beta, reducing n bytes n*gamma.

p ranks, n bytes per rank, L = ceil(log2 p), p2 = 2^floor(log2 p), f = [p != p2] (fold needed):

    ring               2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
    tree (binomial)    2L alpha + 2L n beta + L n gamma                         (reduce + broadcast, whole vectors)
    recursive_doubling log2(p2) (alpha + n beta + n gamma) + f (2 alpha + 2 n beta + n gamma)
    halving_doubling   2 log2(p2) alpha + 2(p2-1)/p2 n beta + (p2-1)/p2 n gamma + f (2 alpha + 2 n beta + n gamma)
    hierarchical       2(k-1)(alpha + n beta / k) + (k-1)/k n gamma                 (intra reduce-scatter + gather)
                       + 2(m-1)(alpha + n beta / (k m)) + (m-1)/(k m) n gamma       (inter all-reduce of a shard)
                       with k ranks per node and m = ceil(p/k) nodes; bytes = ring's, latency 2(k+m-2) alpha.

Derivation of ring: reduce-scatter is p-1 steps in which every rank sends and receives one chunk of n/p bytes
at the same time (full duplex), then reduces it; all-gather is p-1 more steps without the reduction. The bus
bandwidth busbw = (n / t) * 2(p-1)/p normalises that away: it is what each link actually carried.

All times in seconds. ``predict`` is the closed form; ``tinylearn.dist.simulate`` replays the message schedule
and agrees with it exactly on uniform links (tested). ``fit_alpha_beta`` fits the two constants to a measured
ping-pong; ``select`` / ``crossover_points`` give the per-size best algorithm like NCCL's tuner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

ALGORITHMS = ("ring", "tree", "recursive_doubling", "halving_doubling", "hierarchical")


def _check(algorithm: str, nbytes: float, world_size: int, alpha_s: float, beta_s_per_byte: float) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    if isinstance(world_size, bool) or not isinstance(world_size, int | np.integer) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    for name, v in (("nbytes", nbytes), ("alpha_s", alpha_s), ("beta_s_per_byte", beta_s_per_byte)):
        check_nonneg(name, v)


def check_nonneg(name: str, v: Any) -> float:
    """A finite real number >= 0 (TypeError for non-numbers, ValueError for NaN/inf/negative, naming ``name``)."""
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        raise TypeError(f"{name}: expected a real number, got {type(v).__name__} {v!r}")
    if not np.isfinite(v) or v < 0:
        raise ValueError(f"{name}: expected a finite number >= 0, got {v}")
    return float(v)


def predict(
    algorithm: str,
    nbytes: float,
    world_size: int,
    alpha_s: float,
    beta_s_per_byte: float,
    gamma_s_per_byte: float = 0.0,
    *,
    node_size: int | None = None,
) -> float:
    """Predicted all-reduce time in seconds (see the module docstring for the formulas). 0 for p=1 or n=0.

    ``node_size`` only matters for ``hierarchical`` (default: ``default_node_size(p)``); when it does not divide
    p the formula uses the largest node and is an approximation (the simulator replays the exact schedule).
    """
    _check(algorithm, nbytes, world_size, alpha_s, beta_s_per_byte)
    p, n, a, b, g = int(world_size), float(nbytes), alpha_s, beta_s_per_byte, gamma_s_per_byte
    if p == 1 or n == 0:
        return 0.0
    p2 = 1 << (p.bit_length() - 1)
    fold = 0.0 if p == p2 else 2 * a + 2 * n * b + n * g
    if algorithm == "ring":
        return 2 * (p - 1) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * g
    if algorithm == "tree":
        L = math.ceil(math.log2(p))
        return 2 * L * (a + n * b) + L * n * g
    if algorithm == "recursive_doubling":
        return math.log2(p2) * (a + n * b + n * g) + fold
    if algorithm == "halving_doubling":
        return 2 * math.log2(p2) * a + 2 * (p2 - 1) / p2 * n * b + (p2 - 1) / p2 * n * g + fold
    from .collectives import default_node_size

    k = min(node_size or default_node_size(p), p)
    m = math.ceil(p / k)
    return (
        2 * (k - 1) * (a + n * b / k)
        + (k - 1) / k * n * g
        + 2 * (m - 1) * (a + n * b / (k * m))
        + (m - 1) / (k * m) * n * g
    )


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> float:
    """busbw = algbw * 2(p-1)/p in bytes/s (algbw = n / t): what each link carried during a ring all-reduce."""
    if seconds <= 0:
        raise ValueError(f"seconds: expected > 0, got {seconds}")
    return nbytes / seconds * (2 * (world_size - 1) / world_size if world_size > 1 else 1.0)


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of t = alpha + beta * n to one-way message times; both clamped to >= 0.

    Points are weighted by 1/t so small messages (which pin alpha) count as much as large ones (which pin beta).
    """
    x = np.asarray(nbytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if x.shape != t.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(f"nbytes/seconds: need two 1-D sequences of equal length >= 2, got {x.shape} and {t.shape}")
    if np.any(t <= 0):
        raise ValueError("seconds: all times must be > 0")
    w = 1.0 / t
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(A, t * w, rcond=None)
    if alpha < 0:  # refit through the origin
        alpha, beta = 0.0, float(np.sum(w * w * x * t) / np.sum(w * w * x * x))
    return float(max(alpha, 0.0)), float(max(beta, 0.0))


def select(
    nbytes: float,
    world_size: int,
    alpha_s: float,
    beta_s_per_byte: float,
    gamma_s_per_byte: float = 0.0,
    algorithms: Sequence[str] = ALGORITHMS,
    node_size: int | None = None,
) -> str:
    """The algorithm with the smallest predicted time for this size (ties: first in ``algorithms``)."""
    times = [
        predict(a, nbytes, world_size, alpha_s, beta_s_per_byte, gamma_s_per_byte, node_size=node_size)
        for a in algorithms
    ]
    return algorithms[int(np.argmin(times))]


def crossover_points(
    world_size: int,
    alpha_s: float,
    beta_s_per_byte: float,
    gamma_s_per_byte: float = 0.0,
    algorithms: Sequence[str] = ALGORITHMS,
    lo_bytes: float = 1.0,
    hi_bytes: float = float(1 << 34),
    node_size: int | None = None,
) -> list[tuple[float, str, str]]:
    """Sizes where the selector's choice changes: [(nbytes, best below, best above), ...], bisected to 0.1%."""

    def best(n: float) -> str:
        return select(n, world_size, alpha_s, beta_s_per_byte, gamma_s_per_byte, algorithms, node_size)

    grid = np.geomspace(lo_bytes, hi_bytes, 400)
    out = []
    prev = best(grid[0])
    for a, b in zip(grid[:-1], grid[1:]):
        cur = best(b)
        if cur != prev:
            lo, hi = a, b
            while hi / lo > 1.001:
                mid = math.sqrt(lo * hi)
                lo, hi = (mid, hi) if best(mid) == prev else (lo, mid)
            out.append((hi, prev, cur))
            prev = cur
    return out
