"""Stragglers: detect a slow rank from step times, and tolerate one with bounded-staleness asynchronous SGD.

**Detection** (``StragglerDetector``). In synchronous data parallelism every step waits for the slowest rank, so one
slow rank (thermal throttling, a noisy neighbour, a failing link) slows all of them. Each rank reports its own compute
time per step, divided by that step's median over all ranks (so that a global slowdown — every rank slower, e.g. a
bigger batch — cancels). A rank is compared with its *peers*: the baseline is the median of the other ranks'
normalised times over a rolling window, the scale their median absolute deviation (MAD; ×1.4826 estimates σ for
Gaussian noise, floored at ``rel_floor``·median so that perfectly regular ranks do not divide by zero). The robust
z-score

    z_r = (t_r − median(peers)) / (1.4826 · MAD(peers))

ignores outliers in the baseline (one slow rank cannot drag a median, as it would a mean), and comparing with peers
at the same step (not with the rank's own past) makes a global slowdown no straggler. A rank is flagged after
``patience`` consecutive steps with z > ``threshold``: one hiccup (a GC pause) is not a straggler.

**Tolerance** (``ParameterServer``, ``run_async_sgd``). Instead of waiting, let workers run asynchronously: each
pulls the parameters (version v), computes a gradient on its minibatch, pushes it; the server applies it at version
t, so it is τ = t − v steps stale. Bounded staleness (SSP) rejects a gradient with τ > s (the worker re-pulls), and
the staleness-aware step η/(1 + τ) (``parallel.staleness.staleness_weight(τ, "inverse")``) shrinks stale pushes: a
stale gradient points from where the parameters *were*. Workers are real threads (numpy releases the GIL in its
BLAS calls), so staleness arises from real interleaving; ``run_sync_sgd`` is the synchronous baseline (all workers'
gradients at the same parameters, averaged). Loss vs updates is recorded for both.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..parallel.staleness import least_squares_problem, staleness_weight

__all__ = [
    "ParameterServer",
    "StragglerDetector",
    "detect_stragglers",
    "run_async_sgd",
    "run_sync_sgd",
    "straggler_rank_fn",
]

_MAD_TO_SIGMA = 1.4826


def _int(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
    return int(v)


def _pos(name: str, v: Any) -> float:
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float | np.integer | np.floating)
        or not math.isfinite(v)
        or v <= 0
    ):
        raise ValueError(f"{name}: expected a finite number > 0, got {v!r}")
    return float(v)


class StragglerDetector:
    """Flag ranks whose step time is persistently far above their peers' (robust z-score over ranks).

    ``observe(times)`` takes one step's per-rank times and returns the ranks flagged now; ``z`` holds the last
    z-scores, ``streak`` the consecutive-slow counts, ``history`` [(step, rank)] of flags raised.
    """

    def __init__(
        self,
        world_size: int,
        *,
        window: int = 20,
        threshold: float = 3.5,
        patience: int = 3,
        min_history: int = 3,
        rel_floor: float = 0.02,
    ) -> None:
        self.world_size = _int("world_size", world_size, 2)
        self.window = _int("window", window, 1)
        self.threshold = _pos("threshold", threshold)
        self.patience = _int("patience", patience, 1)
        self.min_history = _int("min_history", min_history, 1)
        self.rel_floor = _pos("rel_floor", rel_floor)
        self._hist: list[deque[float]] = [deque(maxlen=self.window) for _ in range(self.world_size)]
        self.streak = [0] * self.world_size
        self.z = [0.0] * self.world_size
        self.step = 0
        self.history: list[tuple[int, int]] = []

    def observe(self, times: Sequence[float]) -> list[int]:
        """Record one step's per-rank times (seconds); returns the ranks currently flagged (streak ≥ patience)."""
        ts = [float(t) for t in times]
        if len(ts) != self.world_size:
            raise ValueError(f"times: expected {self.world_size} per-rank times, got {len(ts)}")
        if any(not math.isfinite(t) or t < 0 for t in ts):
            raise ValueError(f"times: expected finite times >= 0, got {ts!r}")
        step_med = float(np.median(ts))
        norm = [t / step_med if step_med > 0 else 1.0 for t in ts]  # a global slowdown cancels here
        for r, t in enumerate(norm):
            self._hist[r].append(t)
        flagged = []
        for r, t in enumerate(norm):
            peers = np.concatenate([np.asarray(self._hist[q]) for q in range(self.world_size) if q != r])
            if len(self._hist[r]) < self.min_history:
                self.z[r] = 0.0
                continue
            med = float(np.median(peers))
            mad = float(np.median(np.abs(peers - med)))
            scale = _MAD_TO_SIGMA * max(mad, self.rel_floor * med, 1e-12)
            self.z[r] = (t - med) / scale
            self.streak[r] = self.streak[r] + 1 if self.z[r] > self.threshold else 0
            if self.streak[r] >= self.patience:
                flagged.append(r)
                if self.streak[r] == self.patience:
                    self.history.append((self.step, r))
        self.step += 1
        return flagged


def detect_stragglers(times: Any, **kwargs: Any) -> dict[str, Any]:
    """Run a ``StragglerDetector`` over a (steps, ranks) array of step times. Returns ``flagged`` (ranks ever
    flagged), ``flag_steps`` (per rank, the number of steps it was flagged), ``first`` (first flagged step per rank
    or None) and ``z`` ((steps, ranks) z-scores)."""
    arr = np.asarray(times, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] < 2:
        raise ValueError(f"times: expected a (steps, ranks >= 2) array, got shape {arr.shape}")
    det = StragglerDetector(arr.shape[1], **kwargs)
    counts, first, zs = [0] * arr.shape[1], [None] * arr.shape[1], np.zeros_like(arr)
    for i, row in enumerate(arr):
        for r in det.observe(row):
            counts[r] += 1
            first[r] = i if first[r] is None else first[r]
        zs[i] = det.z
    return {
        "flagged": sorted(r for r in range(arr.shape[1]) if counts[r]),
        "flag_steps": counts,
        "first": first,
        "z": zs,
    }


def _busy(a: np.ndarray, reps: int) -> float:
    acc = 0.0
    for _ in range(reps):
        acc += float(np.tanh(a @ a).sum())
    return acc


def straggler_rank_fn(steps: int, slow_rank: int, reps: int = 8, slow_factor: int = 4, size: int = 128) -> list[float]:
    """A rank of a real job (run by ``tinylearn.dist.launch``): each step does ``reps`` real matmuls (``slow_rank``
    does ``slow_factor``× as many), times its own compute, then all-gathers the times (the synchronising collective
    of a data-parallel step). Returns the per-step times of every rank, flattened (steps × world_size). Each rank
    computes on one BLAS thread: a rank waiting in the collective must not lend its core to the other's BLAS pool
    (that would hide the straggler's extra work)."""
    import torch
    import torch.distributed as dist

    from .._threads import limited_threads

    rank, world = dist.get_rank(), dist.get_world_size()
    a = np.random.default_rng(rank).standard_normal((size, size)).astype(np.float32) / math.sqrt(size)
    n = reps * (slow_factor if rank == slow_rank else 1)
    out = []
    with limited_threads(1):
        for _ in range(steps):
            t0 = time.perf_counter()
            _busy(a, n)
            mine = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
            dist.all_gather(gathered, mine)
            out.extend(float(g) for g in gathered)
    return out


class ParameterServer:
    """Parameters behind a lock; ``push`` applies a gradient with the staleness-aware step η·w(τ) (``weighting``:
    a ``parallel.staleness`` rule, ``"inverse"`` = 1/(1 + τ)) and rejects it if τ > ``staleness_bound``."""

    def __init__(self, w0: Any, lr: float, staleness_bound: int, weighting: str = "inverse") -> None:
        self.w = np.array(w0, dtype=np.float64)
        self.lr = _pos("lr", lr)
        self.staleness_bound = _int("staleness_bound", staleness_bound, 0)
        staleness_weight(0, weighting)  # validates the rule name
        self.weighting = weighting
        self.version = 0
        self.rejected = 0
        self.staleness: list[int] = []
        self._lock = threading.Lock()

    def pull(self) -> tuple[np.ndarray, int]:
        """A copy of the parameters and their version."""
        with self._lock:
            return self.w.copy(), self.version

    def push(self, grad: np.ndarray, version: int) -> bool:
        """Apply ``grad`` computed at ``version``; False (nothing applied) if it is more than the bound stale."""
        with self._lock:
            tau = self.version - version
            if tau > self.staleness_bound:
                self.rejected += 1
                return False
            self.w -= self.lr * staleness_weight(tau, self.weighting) * grad
            self.version += 1
            self.staleness.append(tau)
            return True


def _problem(n_samples: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    a, b = least_squares_problem(n_samples, dim, noise=0.01, seed=seed)
    x = np.linalg.lstsq(a, b, rcond=None)[0]
    r = a @ x - b
    return a, b, x, float(r @ r) / (2 * n_samples)


def _loss(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> float:
    r = a @ w - b
    return float(r @ r) / (2 * len(b))


def run_async_sgd(
    *,
    n_workers: int = 4,
    updates: int = 400,
    lr: float = 0.05,
    staleness_bound: int = 4,
    weighting: str = "inverse",
    batch: int = 32,
    n_samples: int = 512,
    dim: int = 20,
    seed: int = 0,
    slow_worker_reps: int = 0,
    latency_s: float = 2e-4,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Asynchronous SGD on a least-squares problem with ``n_workers`` real threads and a ``ParameterServer``; worker 0
    additionally repeats its gradient ``slow_worker_reps`` times (a real straggler). Each worker sleeps ``latency_s``
    between pull and push (a MODEL of the network round trip; it also releases the GIL, so pushes interleave). Stops
    after ``updates`` applied updates. Returns ``loss`` (after each update, recorded under the lock), ``excess``
    (loss − optimum), ``staleness`` (τ of every applied update), ``rejected``, ``grads`` (gradients computed) and
    ``per_worker`` (updates applied)."""
    k, n_up = _int("n_workers", n_workers, 1), _int("updates", updates, 1)
    bsz, timeout = _int("batch", batch, 1), _pos("timeout_s", timeout_s)
    slow = _int("slow_worker_reps", slow_worker_reps, 0)
    if isinstance(latency_s, bool) or not isinstance(latency_s, int | float) or not 0 <= latency_s < math.inf:
        raise ValueError(f"latency_s: expected a number >= 0, got {latency_s!r}")
    latency = float(latency_s)
    a, b, _, f_opt = _problem(_int("n_samples", n_samples, bsz), _int("dim", dim, 1), seed)
    ps = ParameterServer(np.zeros(a.shape[1]), lr, staleness_bound, weighting)
    losses: list[float] = []
    stop, lock = threading.Event(), threading.Lock()
    grads, per_worker, errors = [0] * k, [0] * k, []
    deadline = time.monotonic() + timeout

    def worker(i: int) -> None:
        rng = np.random.default_rng(seed * 1000 + i + 1)
        try:
            while not stop.is_set():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run_async_sgd: worker {i} ran past timeout_s={timeout}")
                w, v = ps.pull()
                if latency:
                    time.sleep(latency)
                rows = rng.integers(0, len(b), size=bsz)
                ab = a[rows]
                for _ in range(1 + (slow if i == 0 else 0)):
                    g = ab.T @ (ab @ w - b[rows]) / bsz
                grads[i] += 1
                with lock:  # push + loss record together, so loss[j] is the loss after update j
                    if stop.is_set():
                        return
                    if ps.push(g, v):
                        per_worker[i] += 1
                        losses.append(_loss(a, b, ps.w))
                        if len(losses) >= n_up:
                            stop.set()
        except BaseException as e:  # re-raised in the caller
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    if errors:
        raise errors[0]
    return {
        "loss": losses,
        "excess": [x - f_opt for x in losses],
        "initial_excess": _loss(a, b, np.zeros(a.shape[1])) - f_opt,
        "staleness": list(ps.staleness),
        "rejected": ps.rejected,
        "grads": sum(grads),
        "per_worker": per_worker,
    }


def run_sync_sgd(
    *,
    n_workers: int = 4,
    updates: int = 100,
    lr: float = 0.05,
    batch: int = 32,
    n_samples: int = 512,
    dim: int = 20,
    seed: int = 0,
) -> dict[str, Any]:
    """Synchronous SGD baseline: each update averages ``n_workers`` minibatch gradients taken at the same parameters
    (a barrier per step: as fast as the slowest worker). Same problem as ``run_async_sgd``."""
    k, n_up, bsz = _int("n_workers", n_workers, 1), _int("updates", updates, 1), _int("batch", batch, 1)
    lr = _pos("lr", lr)
    a, b, _, f_opt = _problem(_int("n_samples", n_samples, bsz), _int("dim", dim, 1), seed)
    rngs = [np.random.default_rng(seed * 1000 + i + 1) for i in range(k)]
    w, losses = np.zeros(a.shape[1]), []
    for _ in range(n_up):
        g = np.zeros_like(w)
        for rng in rngs:
            rows = rng.integers(0, len(b), size=bsz)
            ab = a[rows]
            g += ab.T @ (ab @ w - b[rows]) / bsz
        w -= lr * g / k
        losses.append(_loss(a, b, w))
    return {
        "loss": losses,
        "excess": [x - f_opt for x in losses],
        "initial_excess": _loss(a, b, np.zeros(a.shape[1])) - f_opt,
        "grads": k * n_up,
    }
