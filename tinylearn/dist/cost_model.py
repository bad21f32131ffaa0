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

Ranks that share cores (the benchmark's 2 and 4 processes on a 2-core box): ``predict_contended`` scales the byte
terms by the core share and adds a scheduling latency per message; ``fit_contended`` fits its constants to
measured all-reduce times (see the section "contention" below).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
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
    n = float(nbytes)
    if int(world_size) == 1 or n == 0:
        return 0.0
    lat, bcoef, rcoef = coefficients(algorithm, int(world_size), node_size=node_size)
    return lat * alpha_s + bcoef * n * beta_s_per_byte + rcoef * n * gamma_s_per_byte


def coefficients(algorithm: str, world_size: int, *, node_size: int | None = None) -> tuple[float, float, float]:
    """(L, B, R) with predict = L alpha + B n beta + R n gamma: the latency count (messages on the critical path),
    the bytes sent per byte of input, and the bytes reduced per byte of input (the formulas above)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    p = int(world_size)
    if p < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    if p == 1:
        return 0.0, 0.0, 0.0
    p2 = 1 << (p.bit_length() - 1)
    f = 0.0 if p == p2 else 1.0
    lg = math.log2(p2)
    if algorithm == "ring":
        return 2.0 * (p - 1), 2 * (p - 1) / p, (p - 1) / p
    if algorithm == "tree":
        L = math.ceil(math.log2(p))
        return 2.0 * L, 2.0 * L, float(L)
    if algorithm == "recursive_doubling":
        return lg + 2 * f, lg + 2 * f, lg + f
    if algorithm == "halving_doubling":
        return 2 * lg + 2 * f, 2 * (p2 - 1) / p2 + 2 * f, (p2 - 1) / p2 + f
    from .collectives import default_node_size

    k = min(node_size or default_node_size(p), p)
    m = math.ceil(p / k)
    return 2.0 * (k - 1) + 2.0 * (m - 1), 2 * (k - 1) / k + 2 * (m - 1) / (k * m), (k - 1) / k + (m - 1) / (k * m)


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


# ------------------------------------------------------------------------- contention: p ranks sharing c cores
# On one box the "network" is the CPU: a loopback TCP message is two memcpys done by the kernel on behalf of the
# sender and the receiver, and the reduction is an add on the receiver's core. A rank blocked in wait() sleeps and
# takes no core, so what shares the c cores in a step are the ranks *active* in it (sending or receiving), a_t of
# them: every byte term of that step slows by s_t = max(1, a_t / c), and a message whose receiver is not running
# waits for the scheduler, a latency that grows with the step's oversubscription o_t = max(0, a_t / c - 1):
#
#     T(alg, n, p; c) = sum over steps t of  L_t (alpha + o_t sched) + s_t (B_t n beta + R_t n gamma)
#
# (L_t, B_t, R_t: the step's messages on the critical path, bytes sent and reduced per input byte). Ring,
# halving-doubling and recursive doubling keep all p ranks busy every step (a_t = p: the whole formula scales by
# s = max(1, p/c)); a binomial tree does not: at p = 4 its middle rounds move one message between two ranks, which
# then have a core each (a_t = 2). alpha, sched, beta, gamma are single-rank constants; fit_contended fits them
# per algorithm family from measured all-reduce times at several p. ``contended_coefficients`` gives the sums.

PARAM_NAMES = ("alpha_s", "sched_s", "beta_s_per_byte", "gamma_s_per_byte")


def core_share(world_size: int, cores: int) -> float:
    """s = max(1, p / c): how many times slower a rank's copies and adds run when p ranks share c cores."""
    if cores < 1:
        raise ValueError(f"cores: expected an int >= 1, got {cores!r}")
    return max(1.0, world_size / cores)


def oversubscription(world_size: int, cores: int) -> float:
    """o = max(0, p / c - 1): runnable ranks per core beyond the first (0 when every rank has a core)."""
    return core_share(world_size, cores) - 1.0


@dataclass(frozen=True)
class ContendedParams:
    """Single-rank constants of the contended model (seconds, seconds per byte); see the comment above."""

    alpha_s: float
    sched_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float

    def as_array(self) -> np.ndarray:
        return np.array([self.alpha_s, self.sched_s, self.beta_s_per_byte, self.gamma_s_per_byte])


def _tree_round_pairs(world_size: int) -> list[int]:
    """Messages in each of the ceil(log2 p) rounds of a binomial reduce (and, mirrored, of the broadcast)."""
    p = world_size
    return [sum(1 for r in range(p) if r & ((2 << k) - 1) == (1 << k)) for k in range(math.ceil(math.log2(p)))]


def contended_coefficients(
    algorithm: str, world_size: int, cores: int, *, node_size: int | None = None, background: float = 0.0
) -> tuple[float, float, float, float]:
    """(L, O, SB, SR) with T = L alpha + O sched + SB n beta + SR n gamma: sums over the algorithm's steps of the
    latency count, o_t x latency count, s_t x bytes sent and s_t x bytes reduced (see the comment above).

    With every rank active in every step this is (L, L o, s B, s R) of ``coefficients``; the tree and the fold
    steps of recursive doubling / halving-doubling for p not a power of two have steps with fewer active ranks.
    Hierarchical with unequal nodes uses the largest node (like ``predict``). ``background``: runnable threads of
    other jobs on the same cores (load average beyond ours); they count as active in every step."""
    lat, bcoef, rcoef = coefficients(algorithm, world_size, node_size=node_size)
    p = int(world_size)
    core_share(p, cores)  # validates cores
    b = check_nonneg("background", background)
    if p == 1:
        return 0.0, 0.0, 0.0, 0.0

    def s_o(active: int) -> tuple[float, float]:
        return max(1.0, (active + b) / cores), max(0.0, (active + b) / cores - 1.0)

    if algorithm == "tree":
        L = O = SB = SR = 0.0
        for cnt in _tree_round_pairs(p):
            s, o = s_o(2 * cnt)
            L, O, SB, SR = L + 2, O + 2 * o, SB + 2 * s, SR + s  # a reduce round and its broadcast round
        return L, O, SB, SR
    if algorithm in ("recursive_doubling", "halving_doubling"):
        p2 = 1 << (p.bit_length() - 1)
        sc, oc = s_o(p2)
        fl, fb, fr = (2.0, 2.0, 1.0) if p != p2 else (0.0, 0.0, 0.0)  # fold in (reduce) + result back out
        cl, cb, cr = lat - fl, bcoef - fb, rcoef - fr
        sf, of = s_o(2 * (p - p2))
        return cl + fl, cl * oc + fl * of, sc * cb + sf * fb, sc * cr + sf * fr
    s, o = s_o(p)
    return lat, lat * o, s * bcoef, s * rcoef


def contended_features(
    algorithm: str,
    nbytes: float,
    world_size: int,
    cores: int,
    *,
    node_size: int | None = None,
    background: float = 0.0,
) -> np.ndarray:
    """x with T = x . (alpha, sched, beta, gamma): [L, O, SB n, SR n] (the model is linear in its constants)."""
    n = check_nonneg("nbytes", nbytes)
    L, O, SB, SR = contended_coefficients(algorithm, world_size, cores, node_size=node_size, background=background)
    if n == 0:
        return np.zeros(4)
    return np.array([L, O, SB * n, SR * n])


def predict_contended(
    algorithm: str,
    nbytes: float,
    world_size: int,
    params: ContendedParams,
    cores: int,
    *,
    node_size: int | None = None,
    background: float = 0.0,
) -> float:
    """Predicted all-reduce seconds with p ranks on ``cores`` cores (== ``simulate(..., cores=, sched_s=,
    background=)``); ``background`` runnable threads of other jobs share the cores too."""
    _check(algorithm, nbytes, world_size, params.alpha_s, params.beta_s_per_byte)
    x = contended_features(algorithm, nbytes, world_size, cores, node_size=node_size, background=background)
    return float(x @ params.as_array())


def fit_contended(
    algorithms: str | Sequence[str],
    nbytes: Sequence[float],
    world_sizes: Sequence[int],
    seconds: Sequence[float],
    cores: int,
    *,
    gamma_s_per_byte: float | None = None,
    node_size: int | None = None,
    background: float = 0.0,
    rel_sigma: Sequence[float] | None = None,
) -> ContendedParams:
    """Fit (alpha, sched, beta[, gamma]) >= 0 to measured all-reduce times by least squares on relative error.

    One point per (algorithm, nbytes, world_size, seconds); ``algorithms`` is one name for all points or one per
    point (a family fitted jointly). Minimises sum(((x . theta - t) / t)^2) with theta >= 0 (scipy NNLS), so a
    64 KB point counts as much as a 64 MB one. ``gamma_s_per_byte``: fixed (measured) gamma; None fits it too,
    which needs points whose bytes-sent / bytes-reduced ratios differ (e.g. ring with recursive doubling: for one
    algorithm, beta and gamma multiply the same n and cannot be told apart — ValueError). sched is 0 when no
    point is oversubscribed or all share one oversubscription (alpha and sched cannot be told apart).
    ``background``: other jobs' runnable threads (see ``contended_coefficients``), held fixed here;
    ``tinylearn.dist.bench.calibrate`` fits it by a 1-D search. ``rel_sigma``: each time's relative standard error
    (e.g. the mean's CV / sqrt(samples)); residuals are divided by it (weighted least squares: a noisy 64 KB mean
    counts less than a steady 16 MB one). Default: all equal.
    """
    from scipy.optimize import nnls

    t = np.asarray(seconds, dtype=np.float64)
    n_pts = t.size
    algs = [algorithms] * n_pts if isinstance(algorithms, str) else list(algorithms)
    if not (len(algs) == len(nbytes) == len(world_sizes) == n_pts) or n_pts < 2:
        raise ValueError(
            f"seconds: algorithms, nbytes, world_sizes and seconds need equal lengths >= 2, got "
            f"{len(algs)}, {len(nbytes)}, {len(world_sizes)}, {n_pts}"
        )
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("seconds: all times must be finite and > 0")
    X = np.stack(
        [
            contended_features(a, n, p, cores, node_size=node_size, background=background)
            for a, n, p in zip(algs, nbytes, world_sizes)
        ]
    )
    y = t.copy()
    free = [0, 1, 2, 3]
    fixed = np.zeros(4)
    if gamma_s_per_byte is not None:
        fixed[3] = check_nonneg("gamma_s_per_byte", gamma_s_per_byte)
        y = y - X[:, 3] * fixed[3]
        free.remove(3)
    lat_cols = X[:, :2] / np.where(X[:, :2].max(axis=0) > 0, X[:, :2].max(axis=0), 1.0)
    if not np.any(X[:, 1]) or np.linalg.matrix_rank(lat_cols, tol=1e-9) < 2:
        free.remove(1)  # no oversubscribed point, or one oversubscription level: alpha absorbs it, sched stays 0
    w = np.ones_like(t)
    if rel_sigma is not None:
        sig = np.asarray(rel_sigma, dtype=np.float64)
        if sig.shape != t.shape or not np.all(np.isfinite(sig)) or np.any(sig <= 0):
            raise ValueError(f"rel_sigma: expected {n_pts} finite values > 0, got {sig.tolist()}")
        w = 1.0 / sig
    A = X[:, free] * (w / t)[:, None]
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    A = A / scale
    rank = np.linalg.matrix_rank(A, tol=1e-9 * max(A.shape))
    if rank < len(free):
        names = [PARAM_NAMES[i] for i in free]
        raise ValueError(
            f"algorithms: the points cannot separate {names} (design rank {rank} < {len(free)}); for a single "
            "algorithm pass the measured gamma_s_per_byte, and use several sizes"
        )
    theta, _ = nnls(A, y * w / t)
    out = fixed.copy()
    out[free] = theta / scale
    return ContendedParams(*(float(v) for v in out))


def relative_errors(predicted: Sequence[float], samples: Sequence[Sequence[float]]) -> np.ndarray:
    """Per point [median error, q25 error, q75 error] of measured samples vs prediction: (t - pred) / pred."""
    pred = np.asarray(predicted, dtype=np.float64)
    out = np.empty((pred.size, 3))
    for i, (p, s) in enumerate(zip(pred, samples)):
        q25, med, q75 = np.percentile(np.asarray(s, dtype=np.float64), [25, 50, 75])
        out[i] = [(med - p) / p, (q25 - p) / p, (q75 - p) / p]
    return out
