"""Stale gradients in asynchronous / partially synchronous SGD: staleness weights, aggregation, delay compensation.

A worker reads the parameters w_{t−τ}, computes its gradient, and the server applies it at step t: the gradient is
τ steps *stale*. On a quadratic with curvature h, w_{t+1} = w_t − η·h·w_{t−τ} is stable only for
η·h < 2·sin(π / (2(2τ + 1))) (2 at τ = 0, 1 at τ = 1, 0.18 at τ = 8): delay shrinks the usable learning rate, and
a stale gradient pushes from where the parameters *were*, overshooting where they are. Remedies at aggregation:

* **re-weight** each gradient by a decreasing function of its staleness (``staleness_weight``):
  ``inverse`` 1/(1 + τ)^p (staleness-aware ASGD, Zhang et al. 2016), ``exp`` e^(−λτ), ``threshold`` (drop
  τ > T, bounded-staleness / SSP), ``constant`` (plain averaging);
* **aggregate** (``aggregate_stale``): normalise the weights to sum 1 (``normalize="sum"``: a convex combination
  that favours fresh gradients, the step size is unchanged) or divide by the number of gradients
  (``normalize="count"``: stale gradients also shrink the step);
* **compensate** (``delay_compensate``, DC-ASGD, Zheng et al. 2017): first-order Taylor correction
  g(w_now) ≈ g(w_then) + H·(w_now − w_then) with the Hessian approximated by λ·g⊙g.

``simulate_async_sgd`` is a deterministic (seeded) least-squares run with workers whose minibatch gradients arrive
τ ~ uniform{0..max_delay} steps late; every rule sees the same data, minibatches and delays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

RULES = ("constant", "inverse", "exp", "threshold")
NORMALIZE = ("sum", "count")


def _int(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
    return int(v)


def _num(name: str, v: Any, *, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | np.floating) or not math.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {v!r}")
    if (positive and v <= 0) or (not positive and v < 0):
        raise ValueError(f"{name}: expected a number {'> 0' if positive else '>= 0'}, got {v!r}")
    return float(v)


def staleness_weight(
    tau: int, rule: str = "inverse", *, power: float = 1.0, decay: float = 0.5, max_staleness: int = 4
) -> float:
    """Weight of a gradient that is ``tau`` steps stale.

    ``constant`` 1; ``inverse`` 1/(1 + τ)^power; ``exp`` exp(−decay·τ); ``threshold`` 1 if τ ≤ max_staleness else 0.
    """
    t = _int("tau", tau, 0)
    if rule == "constant":
        return 1.0
    if rule == "inverse":
        return (1.0 + t) ** -_num("power", power)
    if rule == "exp":
        return math.exp(-_num("decay", decay) * t)
    if rule == "threshold":
        return 1.0 if t <= _int("max_staleness", max_staleness, 0) else 0.0
    raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")


def aggregate_stale(
    grads: Sequence[Any],
    staleness: Sequence[int],
    rule: str = "inverse",
    *,
    normalize: str = "sum",
    power: float = 1.0,
    decay: float = 0.5,
    max_staleness: int = 4,
) -> tuple[np.ndarray, list[float]]:
    """Combine gradients by their staleness: Σ wᵢ·gᵢ / Σ wᵢ (``normalize="sum"``) or Σ wᵢ·gᵢ / n (``"count"``).

    Returns (aggregate, weights). If every weight is 0 (all dropped by ``threshold``) the aggregate is zeros.
    """
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize: expected one of {NORMALIZE}, got {normalize!r}")
    if len(grads) == 0:
        raise ValueError(f"grads: expected at least one gradient, got {len(grads)}")
    if len(staleness) != len(grads):
        raise ValueError(f"staleness: expected {len(grads)} values (one per gradient), got {len(staleness)}")
    arrs = [np.asarray(g, dtype=np.float64) for g in grads]
    if any(a.shape != arrs[0].shape for a in arrs):
        raise ValueError(f"grads: expected equal shapes, got {[a.shape for a in arrs]}")
    w = [staleness_weight(t, rule, power=power, decay=decay, max_staleness=max_staleness) for t in staleness]
    total = sum(w) if normalize == "sum" else float(len(w))
    if total == 0:
        return np.zeros_like(arrs[0]), w
    out = np.tensordot(np.asarray(w) / total, np.stack(arrs), axes=1)
    return out, w


def delay_compensate(grad: Any, w_now: Any, w_then: Any, lam: float) -> np.ndarray:
    """DC-ASGD: g + λ·g⊙g⊙(w_now − w_then), a first-order correction of a gradient computed at ``w_then``."""
    g, a, b = (np.asarray(x, dtype=np.float64) for x in (grad, w_now, w_then))
    if not g.shape == a.shape == b.shape:
        raise ValueError(f"grad: expected the shape of w_now and w_then, got {g.shape}, {a.shape}, {b.shape}")
    return g + _num("lam", lam, positive=False) * g * g * (a - b)


def least_squares_problem(
    n_samples: int = 256, dim: int = 20, noise: float = 0.1, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded least-squares problem: A ~ N(0, 1)^(n×d), b = A·x + noise. Loss ‖Aw − b‖² / (2n)."""
    n, d = _int("n_samples", n_samples, 1), _int("dim", dim, 1)
    rng = np.random.default_rng(_int("seed", seed, 0))
    a = rng.standard_normal((n, d))
    b = a @ rng.standard_normal(d) + _num("noise", noise, positive=False) * rng.standard_normal(n)
    return a, b


def simulate_async_sgd(
    rule: str = "constant",
    *,
    lr: float,
    steps: int = 300,
    n_workers: int = 8,
    max_delay: int = 8,
    batch: int = 32,
    n_samples: int = 256,
    dim: int = 20,
    seed: int = 0,
    normalize: str = "sum",
    power: float = 1.0,
    decay: float = 0.5,
    max_staleness: int = 4,
    compensation: float = 0.0,
) -> dict[str, Any]:
    """Partially synchronous SGD on ``least_squares_problem``: each step the server aggregates one minibatch gradient
    per worker, worker k's computed at w_{t−τ} with τ ~ uniform{0..max_delay} (seeded, the same for every rule).

    Returns ``excess`` (loss − optimal loss after each step), ``final_excess`` (inf if diverged), ``diverged``
    (excess above 1e6 × the initial excess or not finite) and ``mean_weight`` (mean weight per gradient).
    """
    lr = _num("lr", lr)
    steps, k, dmax = _int("steps", steps, 1), _int("n_workers", n_workers, 1), _int("max_delay", max_delay, 0)
    bsz, n = _int("batch", batch, 1), _int("n_samples", n_samples, 1)
    if bsz > n:
        raise ValueError(f"batch: expected <= n_samples ({n}), got {batch!r}")
    staleness_weight(0, rule, power=power, decay=decay, max_staleness=max_staleness)  # validates rule & options
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize: expected one of {NORMALIZE}, got {normalize!r}")
    lam = _num("compensation", compensation, positive=False)
    a, b = least_squares_problem(n, dim, seed=seed)
    x_opt = np.linalg.lstsq(a, b, rcond=None)[0]

    hess = a.T @ a / n
    r_opt = a @ x_opt - b
    f_opt = float(r_opt @ r_opt) / (2 * n)

    def excess_loss(w: np.ndarray) -> float:  # loss(w) − loss(x_opt) = ½ (w − x_opt)ᵀ H (w − x_opt), exactly
        dw = w - x_opt
        return 0.5 * float(dw @ hess @ dw)

    rng = np.random.default_rng(seed + 1)
    delays = rng.integers(0, dmax + 1, size=(steps, k))
    rows = rng.integers(0, n, size=(steps, k, bsz))
    hist = np.zeros((steps + 1, a.shape[1]))  # hist[t] = w_t
    excess, weights, diverged = [], [], False
    e0 = excess_loss(hist[0])
    for t in range(steps):
        taus = np.minimum(delays[t], t)  # nothing older than the start exists
        w_then = hist[t - taus]  # (workers, dim)
        ab = a[rows[t]]  # (workers, batch, dim)
        resid = np.einsum("kbd,kd->kb", ab, w_then) - b[rows[t]]
        grads = np.einsum("kbd,kb->kd", ab, resid) / bsz
        if lam:
            grads = delay_compensate(grads, np.broadcast_to(hist[t], grads.shape), w_then, lam)
        agg, ws = aggregate_stale(
            list(grads),
            [int(x) for x in taus],
            rule,
            normalize=normalize,
            power=power,
            decay=decay,
            max_staleness=max_staleness,
        )
        weights.extend(ws)
        hist[t + 1] = hist[t] - lr * agg
        e = excess_loss(hist[t + 1])
        if not math.isfinite(e) or e > 1e6 * e0:
            diverged = True
            break
        excess.append(e)
    return {
        "excess": excess,
        "final_excess": math.inf if diverged else excess[-1],
        "diverged": diverged,
        "mean_weight": float(np.mean(weights)),
        "optimal_loss": f_opt,
    }
