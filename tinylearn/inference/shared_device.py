"""Scheduling inference jobs of several models / tenants on one shared accelerator (a discrete-event model).

A job is dict(arrival=s, duration=s, slo=s, weight=1.0, sm=1.0, bw=1.0): it runs for ``duration`` seconds once
started (non-preemptive: one kernel / step) and needs the fraction ``sm`` of the streaming multiprocessors and
``bw`` of the memory bandwidth. Jobs run concurrently (as under MPS / several streams) while their summed ``sm``
and ``bw`` stay <= 1; in this model co-running jobs do not slow each other down -- that is what the capacity check
promises. ``estimate_footprint`` derives (sm, bw, duration) of a transformer step from a roofline-style model.

Policies (the waiting queue, looked at whenever a job arrives or finishes):
    "fifo": arrival order, head-of-line blocking (a job that does not fit blocks the ones behind it).
    "edf": earliest deadline (arrival + slo) first; jobs that do not fit the free SM / bandwidth are skipped for
        one that does (backfill).
    "urgency": a min-heap on -weight / remaining time (remaining = deadline - now, floored at 1 us, so late jobs
        come first, heaviest first), re-keyed at every decision because remaining times shrink; backfill as "edf".
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .checks import real_arg


def _check_jobs(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(jobs) == 0:
        raise ValueError("jobs: empty list")
    out = []
    for i, j in enumerate(jobs):
        try:
            a, d, slo = float(j["arrival"]), float(j["duration"]), float(j.get("slo", math.inf))
            w, sm, bw = float(j.get("weight", 1.0)), float(j.get("sm", 1.0)), float(j.get("bw", 1.0))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"jobs[{i}]: need arrival and duration (s), got {j!r}") from e
        if not (math.isfinite(a) and a >= 0 and math.isfinite(d) and d > 0 and slo > 0 and w > 0):
            raise ValueError(f"jobs[{i}]: need arrival >= 0, duration > 0, slo > 0, weight > 0, got {j!r}")
        if not (0 < sm <= 1 and 0 < bw <= 1):
            raise ValueError(f"jobs[{i}]: sm and bw must be fractions in (0, 1], got {j!r}")
        out.append(dict(id=i, arrival=a, duration=d, deadline=a + slo, weight=w, sm=sm, bw=bw, start=None))
    return out


def _order(queue: list[dict[str, Any]], policy: str, now: float) -> list[dict[str, Any]]:
    if policy == "fifo":
        return sorted(queue, key=lambda j: (j["arrival"], j["id"]))
    if policy == "edf":
        return sorted(queue, key=lambda j: (j["deadline"], j["arrival"], j["id"]))
    heap = [(-j["weight"] / max(j["deadline"] - now, 1e-6), j["arrival"], j["id"], j) for j in queue]
    heapq.heapify(heap)
    return [heapq.heappop(heap)[-1] for _ in range(len(heap))]


def simulate_shared_device(jobs: Sequence[dict[str, Any]], policy: str = "urgency") -> dict[str, Any]:
    """Run ``jobs`` on one device under ``policy`` ("fifo", "edf" or "urgency"; see the module docstring).

    Returns latencies and starts (input order), slo_attainment (fraction of jobs with a finite slo that met it),
    weighted_slo_attainment (the same, weighted) and makespan_s."""
    if policy not in ("fifo", "edf", "urgency"):
        raise ValueError(f"policy: expected 'fifo', 'edf' or 'urgency', got {policy!r}")
    js = _check_jobs(jobs)
    pending = sorted(js, key=lambda j: (j["arrival"], j["id"]))
    t, nxt, queue, running = 0.0, 0, [], []  # running: heap of (end, id, job)
    while nxt < len(pending) or queue or running:
        while nxt < len(pending) and pending[nxt]["arrival"] <= t:
            queue.append(pending[nxt])
            nxt += 1
        free_sm = 1.0 - sum(j["sm"] for _, _, j in running)
        free_bw = 1.0 - sum(j["bw"] for _, _, j in running)
        for j in _order(queue, policy, t):
            if j["sm"] <= free_sm + 1e-12 and j["bw"] <= free_bw + 1e-12:
                j["start"] = t
                free_sm -= j["sm"]
                free_bw -= j["bw"]
                heapq.heappush(running, (t + j["duration"], j["id"], j))
                queue.remove(j)
            elif policy == "fifo":
                break
        events = [running[0][0]] if running else []
        if nxt < len(pending):
            events.append(pending[nxt]["arrival"])
        t = min(events)
        while running and running[0][0] <= t:
            heapq.heappop(running)
    lat = np.array([j["start"] + j["duration"] - j["arrival"] for j in js])
    finite = np.array([math.isfinite(j["deadline"]) for j in js])
    met = np.array([j["start"] + j["duration"] <= j["deadline"] for j in js])
    w = np.array([j["weight"] for j in js])
    return dict(
        policy=policy,
        latencies=lat.tolist(),
        starts=[j["start"] for j in js],
        slo_attainment=float(met[finite].mean()) if finite.any() else float("nan"),
        weighted_slo_attainment=float((w * met)[finite].sum() / w[finite].sum()) if finite.any() else float("nan"),
        makespan_s=float(max(j["start"] + j["duration"] for j in js) - min(j["arrival"] for j in js)),
    )


def weighted_tail_latency(latencies: Sequence[float], weights: Sequence[float], q: float = 99.0) -> float:
    """sum_g w_g * percentile_q(latencies of the jobs with weight w_g) / sum_g w_g over the distinct weights g."""
    try:
        lat, w = np.asarray(latencies, float), np.asarray(weights, float)
    except (TypeError, ValueError) as e:
        raise TypeError(f"latencies, weights: expected sequences of numbers, got {latencies!r}, {weights!r}") from e
    if lat.ndim != 1 or lat.shape != w.shape or lat.size == 0:
        raise ValueError(f"weights: need one weight per latency (non-empty), got {w.shape} vs {lat.shape}")
    if np.isnan(lat).any():
        raise ValueError("latencies: NaN latency (a job that never ran is +inf, not NaN)")
    if not (0 <= real_arg(q, "q") <= 100):
        raise ValueError(f"q: must be a percentile in [0, 100], got {q!r}")
    if not np.all(w > 0):
        raise ValueError(f"weights: must all be > 0, got min {w.min()}")
    groups = np.unique(w)
    return float(sum(g * np.percentile(lat[w == g], q) for g in groups) / groups.sum())


def estimate_footprint(
    tokens: int,
    n_params: float,
    d_model: int,
    n_sm: int = 132,
    tile: int = 128,
    sm_flops: float = 7.5e12,
    hbm_bytes_s: float = 4.8e12,
    bw_saturation_sm: float = 0.5,
) -> dict[str, float]:
    """A roofline-style estimate (a model, not a measurement) of one fp16 forward step over ``tokens`` tokens.

    The GEMMs of a [tokens, d_model] activation are tiled into ``ceil(tokens / tile) * ceil(d_model / tile)``
    thread blocks, one per SM at a time: sm = min(1, blocks / n_sm). Compute time = 2 * n_params * tokens / (sm *
    n_sm * sm_flops); the weights (2 * n_params bytes) stream at the HBM rate, which a kernel reaches only with
    ``bw_saturation_sm`` of the SMs issuing loads (fewer SMs: proportionally less). duration = max of the two;
    bw = achieved bytes/s over the HBM rate. Defaults: an H100/H200-class part (132 SMs, ~990 dense fp16 TFLOP/s,
    4.8 TB/s)."""
    for name, v in (("tokens", tokens), ("d_model", d_model), ("n_sm", n_sm), ("tile", tile)):
        if not isinstance(v, int | np.integer) or v < 1:
            raise ValueError(f"{name}: must be an int >= 1, got {v!r}")
    for name, v in (("n_params", n_params), ("sm_flops", sm_flops), ("hbm_bytes_s", hbm_bytes_s)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name}: must be finite and > 0, got {v!r}")
    if not 0 < bw_saturation_sm <= 1:
        raise ValueError(f"bw_saturation_sm: must be in (0, 1], got {bw_saturation_sm!r}")
    blocks = -(-tokens // tile) * -(-d_model // tile)
    sm = min(1.0, blocks / n_sm)
    t_compute = 2 * n_params * tokens / (sm * n_sm * sm_flops)
    t_memory = 2 * n_params / (hbm_bytes_s * min(1.0, sm / bw_saturation_sm))
    duration = max(t_compute, t_memory)
    return dict(sm=sm, bw=2 * n_params / duration / hbm_bytes_s, duration=duration, compute_bound=t_compute > t_memory)
