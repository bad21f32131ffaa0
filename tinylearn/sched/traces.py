"""Synthetic GPU-cluster traces from stated distributions -- a MODEL of a workload, not a recorded one.

``synthetic_trace(n_jobs, n_gpus, load, seed)`` draws ``n_jobs`` jobs as ``(arrival_s, Job)`` pairs:

    arrivals    a Poisson process: gaps ~ Exponential(rate lam), first arrival at 0. lam is set so the offered load
                is ``load``: lam * E[gpus] * E[duration] = load * n_gpus (load 1 = the cluster is exactly busy on
                average; above 1 the queue grows without bound).
    duration    log-normal: ln(duration_s) ~ Normal(mu, sigma); defaults mu = ln(600) (median 10 min), sigma = 1.5
                (mean = exp(mu + sigma^2/2) ~ 31 min; the 99th percentile ~ 5.5 h). The Philly (Jeon et al., ATC'19)
                and Helios (Hu et al., SC'21) trace studies report this shape qualitatively: most DL jobs are short
                (many minutes or less, lots of them failed or debugging runs) while a heavy tail of long jobs holds
                most GPU-hours.
    GPUs        from ``gpu_probs`` (default {1: .55, 2: .15, 4: .14, 8: .11, 16: .03, 32: .02}: single-GPU jobs
                dominate by count in both studies; large gangs are rare), restricted to sizes <= n_gpus and
                renormalised; independent of the duration. ``LARGE_GPU_PROBS`` (1: .40, 2: .15, 4: .15, 8: .15,
                16: .08, 32: .04, 64: .02, 128: .01) is the stated mix for a 512-GPU cluster.
    steps       ``steps`` per job (default 20): a job's step is duration / steps -- the granularity of preemption.
                ``est_step_s`` is the true step time: SJF/SRPT/backfill get an oracle estimate (real schedulers
                see users' estimates, often several times too long; Tiresias avoids needing them).
    tenants     ``n_tenants`` tenants ("t0", "t1", ...) drawn uniformly, weight 1.
    priority    1 with probability ``p_high`` (default 0.2), else 0.
    deadline    for a fraction ``p_deadline`` (default 0.3) of jobs: slack * duration after submission, slack ~
                Uniform(1.5, 5).

Same seed, same trace (numpy ``default_rng``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .._inputs import as_int, is_real
from .jobs import Job

DEFAULT_GPU_PROBS: dict[int, float] = {1: 0.55, 2: 0.15, 4: 0.14, 8: 0.11, 16: 0.03, 32: 0.02}
# a large cluster's mix (an ASSUMPTION in the same spirit): fewer single-GPU jobs, gangs up to 128 GPUs
LARGE_GPU_PROBS: dict[int, float] = {1: 0.4, 2: 0.15, 4: 0.15, 8: 0.15, 16: 0.08, 32: 0.04, 64: 0.02, 128: 0.01}
DEFAULT_MU = math.log(600.0)
DEFAULT_SIGMA = 1.5


def _real(v: object, name: str, lo: float, hi: float = math.inf, *, lo_open: bool = False) -> float:
    if not is_real(v) or not math.isfinite(float(v)):  # type: ignore[arg-type]
        raise ValueError(f"{name}: expected a finite number, got {v!r}")
    x = float(v)  # type: ignore[arg-type]
    if x < lo or (lo_open and x == lo) or x > hi:
        raise ValueError(f"{name}: expected a value in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")
    return x


def gpu_table(n_gpus: int, gpu_probs: Mapping[int, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The GPU-count distribution restricted to sizes <= ``n_gpus``: (sizes, probabilities summing to 1)."""
    probs = dict(DEFAULT_GPU_PROBS if gpu_probs is None else gpu_probs)
    for g, p in probs.items():
        if not isinstance(g, int) or g < 1 or not is_real(p) or p < 0:
            raise ValueError(f"gpu_probs: expected {{int >= 1: probability >= 0}}, got {g!r}: {p!r}")
    sizes = np.array(sorted(g for g in probs if g <= n_gpus and probs[g] > 0), dtype=np.int64)
    if sizes.size == 0:
        raise ValueError(f"gpu_probs: no size with probability > 0 fits n_gpus={n_gpus}: {probs}")
    p = np.array([probs[int(g)] for g in sizes], dtype=np.float64)
    return sizes, p / p.sum()


def arrival_rate(n_gpus: int, load: float, mu: float = DEFAULT_MU, sigma: float = DEFAULT_SIGMA,
                 gpu_probs: Mapping[int, float] | None = None) -> float:  # fmt: skip
    """Poisson rate lam (jobs/s) with offered load ``load``: lam E[g] E[d] = load * n_gpus."""
    sizes, p = gpu_table(n_gpus, gpu_probs)
    mean_d = math.exp(mu + sigma * sigma / 2)
    return load * n_gpus / (float((sizes * p).sum()) * mean_d)


def synthetic_trace(
    n_jobs: int,
    n_gpus: int,
    load: float = 0.8,
    seed: int = 0,
    *,
    mu: float = DEFAULT_MU,
    sigma: float = DEFAULT_SIGMA,
    gpu_probs: Mapping[int, float] | None = None,
    steps: int = 20,
    n_tenants: int = 4,
    p_high: float = 0.2,
    p_deadline: float = 0.3,
    mem_gb_per_gpu: float | None = None,
) -> list[tuple[float, Job]]:
    """A synthetic trace (MODEL) of ``(arrival_s, Job)``; see the module docstring for every distribution."""
    n_jobs = as_int(n_jobs, "n_jobs", min=1)
    n_gpus = as_int(n_gpus, "n_gpus", min=1)
    load = _real(load, "load", 0.0, 100.0, lo_open=True)
    seed = as_int(seed, "seed", min=0)
    mu = _real(mu, "mu", -50.0, 50.0)
    sigma = _real(sigma, "sigma", 0.0, 10.0)
    steps = as_int(steps, "steps", min=1)
    n_tenants = as_int(n_tenants, "n_tenants", min=1)
    p_high = _real(p_high, "p_high", 0.0, 1.0)
    p_deadline = _real(p_deadline, "p_deadline", 0.0, 1.0)
    sizes, p = gpu_table(n_gpus, gpu_probs)
    lam = arrival_rate(n_gpus, load, mu, sigma, gpu_probs)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / lam, size=n_jobs)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    durations = np.exp(rng.normal(mu, sigma, size=n_jobs))
    gpus = rng.choice(sizes, size=n_jobs, p=p)
    tenants = rng.integers(0, n_tenants, size=n_jobs)
    high = rng.random(n_jobs) < p_high
    has_dl = rng.random(n_jobs) < p_deadline
    slack = rng.uniform(1.5, 5.0, size=n_jobs)
    out = []
    for i in range(n_jobs):
        g = int(gpus[i])
        demand = {"gpu": float(g)}
        if mem_gb_per_gpu is not None:
            demand["mem_gb"] = float(mem_gb_per_gpu) * g
        step_s = float(durations[i]) / steps
        job = Job(
            name=f"job{i:05d}",
            steps=steps,
            demand=demand,
            priority=int(high[i]),
            deadline_s=float(slack[i] * durations[i]) if has_dl[i] else None,
            tenant=f"t{int(tenants[i])}",
            workload="gpt" if g >= 8 else "cnn",
            est_step_s=step_s,
            seed=seed,
        )
        out.append((float(arrivals[i]), job))
    return out
