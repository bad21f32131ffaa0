"""A composite placement cost with simulated annealing [Q140], and latency-bounded energy minimisation over a
multi-path model [Q234] -- both on the MODEL devices of ``hetero.py``.

[Q140] Composite cost of a placement p (op -> device), every term from ``hetero.evaluate``'s timed schedule:

    T_c     the schedule's makespan (critical path of compute + waits: the latency a user sees)
    T_m     sum over ops of their memory time bytes / bandwidth (pressure on HBM/DRAM)
    T_comm  sum of all transfer times between devices (link occupancy)
    E       energy: sum of op time x active power (device_model's P(f, u))
    Risk    probability that some device used fails during the run: 1 - exp(-sum_d lambda_d busy_d)
            (independent exponential failures, rates ``Device.fail_per_hour``)

    J(p) = sum_k w_k * m_k(p) / m_k(ref)        (each term normalised by a reference placement, here HEFT's, so
                                                 weights are dimensionless and mean "relative importance")

``anneal`` minimises J by simulated annealing (Kirkpatrick et al., Science 1983): a move re-places one op, or with
probability ``p_segment`` a run of consecutive ops of the topological order (single moves on a chain pay two
transfers and are nearly always rejected); Metropolis acceptance exp(-dJ / T) with geometric cooling; the best
placement seen is returned. Seeded, so deterministic.

[Q234] A model with alternative execution paths per block (parallel experts on one device or split over two,
optional variants, DVFS levels): choose one option per block to minimise total energy subject to total latency <=
L_max. This is the multiple-choice knapsack problem (NP-hard in general). ``min_energy_dp`` solves it exactly by
dynamic programming over Pareto-optimal (latency, energy) partial solutions -- a partial choice dominated in both
coordinates can never be completed into a better solution, so pruning it is safe; ``min_energy_greedy`` starts from
the fastest option everywhere and repeatedly takes the swap with the largest energy saved per latency added that
still fits (fast, not optimal); ``min_energy_brute`` enumerates all choices (checks small instances).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .hetero import Op, Platform, Schedule, check_graph, evaluate, upward_ranks

TERMS = ("T_c", "T_m", "T_comm", "E", "Risk")


def cost_terms(ops: Sequence[Op], platform: Platform, sched: Schedule) -> dict[str, float]:
    """The five terms of the composite cost of a timed schedule (see the module docstring)."""
    by = {o.name: o for o in ops}
    t_m = sum(platform.device(sched.placement[n]).memory_s(by[n]) for n in by)
    lam = sum(platform.device(d).fail_per_hour / 3600.0 * b for d, b in sched.busy_s.items())
    return {"T_c": sched.makespan_s, "T_m": t_m, "T_comm": sched.comm_s, "E": sched.energy_j,
            "Risk": 1.0 - math.exp(-lam)}  # fmt: skip


def composite(terms: Mapping[str, float], ref: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """J = sum_k w_k m_k / m_k(ref) (a reference term of 0 counts the raw value)."""
    for k, w in weights.items():
        if k not in TERMS or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
            raise ValueError(f"weights: expected {{term in {TERMS}: number >= 0}}, got {k!r}: {w!r}")
    return sum(w * terms[k] / (ref[k] if ref[k] > 0 else 1.0) for k, w in weights.items())


@dataclass
class AnnealResult:
    """The best placement found, its schedule, terms and cost, and the cost trace (best so far per iteration)."""

    placement: dict[str, str]
    schedule: Schedule
    terms: dict[str, float]
    cost: float
    trace: list[float]
    accepted: int


def anneal(
    ops: Sequence[Op],
    platform: Platform,
    weights: Mapping[str, float],
    ref: Mapping[str, float],
    *,
    init: Mapping[str, str] | None = None,
    iters: int = 2000,
    t0: float = 0.05,
    t_end: float = 1e-4,
    p_segment: float = 0.5,
    max_segment: int = 12,
    seed: int = 0,
) -> AnnealResult:
    """Simulated annealing over placements minimising ``composite(..., ref, weights)``; ``init`` defaults to a random
    placement (seeded)."""
    if not isinstance(iters, int) or isinstance(iters, bool) or iters < 1:
        raise ValueError(f"iters: expected an int >= 1, got {iters!r}")
    if not (0 < t_end <= t0):
        raise ValueError(f"t0: expected 0 < t_end <= t0, got t0={t0!r}, t_end={t_end!r}")
    ops = check_graph(ops)
    rank = upward_ranks(ops, platform)
    order = sorted((o.name for o in ops), key=lambda n: -rank[n])
    names = [o.name for o in ops]
    devs = [d.name for d in platform.devices]
    rng = np.random.default_rng(seed)
    cur = dict(init) if init is not None else {n: devs[int(rng.integers(len(devs)))] for n in names}

    def cost_of(p: Mapping[str, str]) -> tuple[float, Schedule, dict[str, float]]:
        s = evaluate(ops, platform, p, order=order)
        terms = cost_terms(ops, platform, s)
        return composite(terms, ref, weights), s, terms

    c_cur, s_cur, t_cur = cost_of(cur)
    best = (c_cur, dict(cur), s_cur, t_cur)
    trace, accepted = [], 0
    cool = (t_end / t0) ** (1.0 / max(1, iters - 1))
    temp = t0
    for _ in range(iters):
        cand = dict(cur)
        dev = devs[int(rng.integers(len(devs)))]
        if rng.random() < p_segment:
            i = int(rng.integers(len(names)))
            for n in names[i : i + int(rng.integers(2, max_segment + 1))]:
                cand[n] = dev
        else:
            cand[names[int(rng.integers(len(names)))]] = dev
        c, s, t = cost_of(cand)
        if c <= c_cur or rng.random() < math.exp(-(c - c_cur) / temp):
            cur, c_cur = cand, c
            accepted += 1
            if c < best[0]:
                best = (c, dict(cand), s, t)
        trace.append(best[0])
        temp *= cool
    return AnnealResult(best[1], best[2], best[3], best[0], trace, accepted)


# ------------------------------------------------------------------------------------------------ [Q234]
@dataclass(frozen=True)
class PathOption:
    """One way to execute a block: its latency (s) and energy (J) (MODEL numbers from ``hetero``'s device models)."""

    name: str
    latency_s: float
    energy_j: float


def _check_blocks(blocks: Sequence[Sequence[PathOption]], l_max: float) -> None:
    if not blocks or any(not b for b in blocks):
        raise ValueError(f"blocks: expected a non-empty list of non-empty option lists, got {blocks!r}")
    for b in blocks:
        for o in b:
            if not isinstance(o, PathOption) or not (o.latency_s >= 0 and o.energy_j >= 0):
                raise ValueError(f"blocks: expected PathOption with latency, energy >= 0, got {o!r}")
    if not isinstance(l_max, int | float) or not l_max > 0:
        raise ValueError(f"l_max: expected a latency bound > 0 seconds, got {l_max!r}")


def _total(blocks: Sequence[Sequence[PathOption]], choice: Sequence[int]) -> tuple[float, float]:
    return (sum(b[i].latency_s for b, i in zip(blocks, choice, strict=True)),
            sum(b[i].energy_j for b, i in zip(blocks, choice, strict=True)))  # fmt: skip


def min_energy_dp(blocks: Sequence[Sequence[PathOption]], l_max: float) -> tuple[list[int], float, float] | None:
    """Exact: (choice per block, latency, energy) with the least energy and latency <= l_max (None if infeasible),
    by DP over Pareto-optimal partial solutions (see the module docstring)."""
    _check_blocks(blocks, l_max)
    front: list[tuple[float, float, tuple[int, ...]]] = [(0.0, 0.0, ())]
    for b in blocks:
        cand = [(lat + o.latency_s, e + o.energy_j, ch + (i,)) for lat, e, ch in front for i, o in enumerate(b)]
        cand = [c for c in cand if c[0] <= l_max + 1e-12]
        if not cand:
            return None
        cand.sort(key=lambda c: (c[0], c[1]))
        front, best_e = [], math.inf
        for c in cand:  # keep a state only if it uses less energy than every faster one
            if c[1] < best_e - 1e-15:
                front.append(c)
                best_e = c[1]
    lat, e, ch = min(front, key=lambda c: (c[1], c[0]))
    return list(ch), lat, e


def min_energy_greedy(blocks: Sequence[Sequence[PathOption]], l_max: float) -> tuple[list[int], float, float] | None:
    """Heuristic: fastest option everywhere, then the best energy-saved-per-latency-added swap that fits, repeated."""
    _check_blocks(blocks, l_max)
    choice = [min(range(len(b)), key=lambda i, b=b: (b[i].latency_s, b[i].energy_j)) for b in blocks]
    lat, e = _total(blocks, choice)
    if lat > l_max + 1e-12:
        return None
    while True:
        best = None
        for k, b in enumerate(blocks):
            cur = b[choice[k]]
            for i, o in enumerate(b):
                saved, added = cur.energy_j - o.energy_j, o.latency_s - cur.latency_s
                if saved <= 0 or lat + added > l_max + 1e-12:
                    continue
                score = saved / added if added > 0 else math.inf
                if best is None or score > best[0]:
                    best = (score, k, i, added, saved)
        if best is None:
            return choice, lat, e
        _, k, i, added, saved = best
        choice[k], lat, e = i, lat + added, e - saved


def min_energy_brute(blocks: Sequence[Sequence[PathOption]], l_max: float) -> tuple[list[int], float, float] | None:
    """Exhaustive reference for small instances."""
    _check_blocks(blocks, l_max)
    best = None
    for ch in itertools.product(*[range(len(b)) for b in blocks]):
        lat, e = _total(blocks, ch)
        if lat <= l_max + 1e-12 and (best is None or e < best[2] - 1e-15):
            best = (list(ch), lat, e)
    return best


def block_options(ops: Sequence[Op], platform: Platform, *, n_freqs: int = 4,
                  split: tuple[str, str] | None = None) -> list[PathOption]:  # fmt: skip
    """The options of one block of ``ops`` (run as a sequence): every device at ``n_freqs`` DVFS levels (compute
    time scales with f_max / f, memory time does not; power P(f, 1)); with ``split=(a, b)`` also the block's ops
    split in two halves run in parallel on devices a and b (parallel experts: latency = max + a transfer, energy =
    sum)."""
    out = []
    for d in platform.devices:
        fs = d.spec.freqs()
        idx = sorted({round(i * (len(fs) - 1) / max(1, n_freqs - 1)) for i in range(n_freqs)})
        for i in idx:
            f = fs[i]
            lat = sum(d.overhead_s[o.kind] + max(d.compute_s(o) * d.spec.f_max_mhz / f, d.memory_s(o)) for o in ops)
            out.append(PathOption(f"{d.name}@{f:.0f}MHz", lat, lat * d.spec.power_w(f, 1.0)))
    if split is not None:
        a, b = platform.device(split[0]), platform.device(split[1])
        h = len(ops) // 2
        ta, tb = sum(a.time_s(o) for o in ops[:h]), sum(b.time_s(o) for o in ops[h:])
        xfer = platform.comm_s(max((o.out_bytes for o in ops), default=0.0), a.name, b.name)
        out.append(PathOption(f"{a.name}||{b.name}", max(ta, tb) + xfer, ta * a.active_w() + tb * b.active_w()))
    return out
