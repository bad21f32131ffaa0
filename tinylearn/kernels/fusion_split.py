"""Where to split a big fused kernel: a linear scan over estimated register usage, scored by a throughput model.

A MODEL, not a measurement. A fused kernel is a chain of stages (element-wise / row-wise ops, an epilogue) that
every thread runs on its share of ``n`` elements. Fusing keeps intermediates in registers (no HBM round trip) but
the registers add up; past an occupancy cliff the SM holds fewer warps, latency hiding drops, and past 255
registers per thread the compiler spills to local memory. Splitting into several kernels trades those costs for
the bytes of every intermediate written and re-read.

Model (``segment_time``), for one kernel running stages ``[a, b)`` on ``n`` elements:

* registers/thread  ``base_regs + sum(stage.regs)`` (every fused stage's live values at once: a pessimistic,
  ptxas-free estimate); above 255 the excess spills: ``2 * 4 * (regs - 255)`` bytes per element of local traffic;
* occupancy         ``tinylearn.gemm.occupancy.occupancy(threads, min(regs, 255), shared)`` (the CUDA rules);
* efficiency        ``min(1, occupancy / saturation)``: below ``saturation`` too few warps are resident to keep
  the memory pipe and the FMA units busy (Little's law), and the kernel slows in proportion;
* time              ``max(flops / peak_flops, bytes / bandwidth) / efficiency + launch_s``, where bytes are the
  segment's input (the previous segment's output, or the chain's input) + its output + spills.

``choose_split`` runs a greedy linear scan for each register cap at an occupancy cliff (the largest register
count of each occupancy level): walk the stages, start a new kernel when adding the next stage would exceed the
cap. It scores each resulting split with the model and keeps the fastest. ``optimal_split`` (dynamic programming,
O(k^2)) finds the model's optimum, and ``exhaustive_split`` (all 2^(k-1) splits) checks it on small chains: they
measure how far the greedy scan is from the best the model allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from .._inputs import is_int, is_real
from ..gemm.occupancy import ARCHS, occupancy

MAX_REGS = 255


def _py(v: Any) -> Any:
    """A numpy scalar as the Python int / float it holds (results then do not depend on the argument's type)."""
    return v.item() if isinstance(v, np.generic) else v


@dataclass(frozen=True)
class Stage:
    """One op of the fused chain, per element: registers its live values need, FLOPs, bytes of its output."""

    name: str
    regs: int
    flops: float
    out_bytes: float

    def __post_init__(self) -> None:
        if not is_int(self.regs) or self.regs < 0:
            raise ValueError(f"regs: expected a non-negative int for stage {self.name!r}, got {self.regs!r}")
        object.__setattr__(self, "regs", int(self.regs))
        for field in ("flops", "out_bytes"):
            v = getattr(self, field)
            if not is_real(v) or not v >= 0:
                raise ValueError(f"{field}: expected a non-negative number for stage {self.name!r}, got {v!r}")
            object.__setattr__(self, field, _py(v))


@dataclass(frozen=True)
class Machine:
    """Device numbers of the model (defaults: an A100-like sm_80: 19.5 TFLOP/s fp32, 1.5 TB/s, 4 us launch)."""

    arch: str = "sm_80"
    peak_flops: float = 19.5e12
    bandwidth: float = 1.5e12
    launch_s: float = 4e-6
    threads: int = 256
    shared_bytes: int = 0
    saturation: float = 0.5

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch: unknown architecture {self.arch!r}; known: {sorted(ARCHS)}")
        for field in ("peak_flops", "bandwidth"):
            v = getattr(self, field)
            if not (is_real(v) and v > 0):
                raise ValueError(f"{field}: expected a positive number, got {v!r}")
        if not (is_real(self.launch_s) and self.launch_s >= 0):
            raise ValueError(f"launch_s: expected a non-negative number of seconds, got {self.launch_s!r}")
        if not (is_real(self.saturation) and 0 < self.saturation <= 1):
            raise ValueError(f"saturation: expected a number in (0, 1], got {self.saturation!r}")
        for field in ("peak_flops", "bandwidth", "launch_s", "saturation", "threads", "shared_bytes"):
            object.__setattr__(self, field, _py(getattr(self, field)))


def _check(stages: Sequence[Stage], n: int, in_bytes: float, base_regs: int) -> tuple[int, float, int]:
    """Checks the common arguments; returns (n, in_bytes, base_regs) with numpy scalars as Python numbers."""
    if isinstance(stages, str) or not isinstance(stages, Sequence) or len(stages) == 0:
        raise ValueError(f"stages: expected a non-empty list of Stage, got {stages!r:.80}")
    for i, s in enumerate(stages):
        if not isinstance(s, Stage):
            raise ValueError(f"stages[{i}]: expected a Stage, got {type(s).__name__}")
    if not is_int(n) or n < 1:
        raise ValueError(f"n: expected a positive int (elements), got {n!r}")
    if not is_real(in_bytes) or not in_bytes >= 0:
        raise ValueError(f"in_bytes: expected a non-negative number of bytes per element, got {in_bytes!r}")
    return int(n), _py(in_bytes), _base_regs(base_regs)


def _base_regs(base_regs: Any) -> int:
    if not is_int(base_regs) or not 1 <= base_regs <= MAX_REGS:
        raise ValueError(f"base_regs: expected an int in [1, {MAX_REGS}], got {base_regs!r}")
    return int(base_regs)


def segment_regs(stages: Sequence[Stage], base_regs: int = 16) -> int:
    """Estimated registers/thread of one kernel fusing ``stages``: ``base_regs + sum(stage.regs)`` (may exceed 255)."""
    return _base_regs(base_regs) + sum(s.regs for s in stages)


def segment_time(
    stages: Sequence[Stage],
    n: int,
    in_bytes: float,
    machine: Machine | None = None,
    base_regs: int = 16,
) -> dict[str, Any]:
    """Model time of one kernel running ``stages`` on ``n`` elements that reads ``in_bytes`` per element.

    Returns dict(time_s, regs, occupancy, efficiency, spill_bytes, bytes, flops)."""
    n, in_bytes, base_regs = _check(stages, n, in_bytes, base_regs)
    m = Machine() if machine is None else machine
    regs = segment_regs(stages, base_regs)
    spill = 2 * 4 * max(0, regs - MAX_REGS)
    occ = occupancy(m.threads, min(regs, MAX_REGS), m.shared_bytes, arch=m.arch)["occupancy"]
    if occ == 0:
        raise ValueError(f"stages: a kernel with {regs} registers/thread x {m.threads} threads cannot launch")
    eff = min(1.0, occ / m.saturation)
    nbytes = n * (in_bytes + stages[-1].out_bytes + spill)
    flops = n * sum(s.flops for s in stages)
    t = max(flops / m.peak_flops, nbytes / m.bandwidth) / eff + m.launch_s
    return {
        "time_s": t,
        "regs": regs,
        "occupancy": occ,
        "efficiency": eff,
        "spill_bytes": spill * n,
        "bytes": nbytes,
        "flops": flops,
    }


def split_time(
    stages: Sequence[Stage],
    cuts: Sequence[int],
    n: int,
    in_bytes: float,
    machine: Machine | None = None,
    base_regs: int = 16,
) -> dict[str, Any]:
    """Model time of the chain split before each index in ``cuts`` (sorted, in 1..len-1; ``[]`` = fully fused).

    Returns dict(time_s, cuts, segments=[segment_time dicts], kernels)."""
    n, in_bytes, base_regs = _check(stages, n, in_bytes, base_regs)
    k = len(stages)
    cs = list(cuts)
    if not all(is_int(c) for c in cs) or cs != sorted(set(cs)):
        raise ValueError(f"cuts: expected strictly increasing ints, got {cuts!r}")
    cs = [int(c) for c in cs]
    if cs and not (1 <= cs[0] and cs[-1] <= k - 1):
        raise ValueError(f"cuts: every cut must be in [1, {k - 1}] for {k} stages, got {cuts!r}")
    bounds = [0, *cs, k]
    segs, t, b_in = [], 0.0, in_bytes
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        seg = segment_time(stages[a:b], n, b_in, machine, base_regs)
        segs.append(seg)
        t += seg["time_s"]
        b_in = stages[b - 1].out_bytes
    return {"time_s": t, "cuts": cs, "segments": segs, "kernels": len(segs)}


def register_caps(machine: Machine | None = None) -> list[int]:
    """The occupancy cliffs: for each occupancy level reachable with 1..255 registers/thread, the largest count."""
    m = Machine() if machine is None else machine
    best: dict[float, int] = {}
    for r in range(1, MAX_REGS + 1):
        o = occupancy(m.threads, r, m.shared_bytes, arch=m.arch)["occupancy"]
        if o > 0:
            best[o] = r
    return sorted(best.values())


def linear_scan(stages: Sequence[Stage], cap: int, base_regs: int = 16) -> list[int]:
    """Greedy cuts: walk the stages, start a new kernel when the next stage would push the estimate above ``cap``
    (a stage that alone exceeds the cap gets a kernel of its own)."""
    if not is_int(cap) or cap < 1:
        raise ValueError(f"cap: expected a positive int (registers/thread), got {cap!r}")
    cap = int(cap)
    _, _, base_regs = _check(stages, 1, 0, base_regs)
    cuts, regs = [], base_regs
    for i, s in enumerate(stages):
        if i and regs + s.regs > cap:
            cuts.append(i)
            regs = base_regs
        regs += s.regs
    return cuts


def choose_split(
    stages: Sequence[Stage],
    n: int,
    in_bytes: float,
    machine: Machine | None = None,
    base_regs: int = 16,
) -> dict[str, Any]:
    """The fastest (on the model) of the linear scans at every register cap in ``register_caps``.

    Returns split_time's dict plus ``cap`` (the winning cap) and ``candidates`` ({cap: (cuts, time_s)})."""
    n, in_bytes, base_regs = _check(stages, n, in_bytes, base_regs)
    candidates: dict[int, tuple[list[int], float]] = {}
    best: dict[str, Any] | None = None
    for cap in register_caps(machine):
        cuts = linear_scan(stages, cap, base_regs)
        r = split_time(stages, cuts, n, in_bytes, machine, base_regs)
        candidates[cap] = (cuts, r["time_s"])
        if best is None or r["time_s"] < best["time_s"]:
            best = {**r, "cap": cap}
    assert best is not None
    return {**best, "candidates": candidates}


def optimal_split(
    stages: Sequence[Stage],
    n: int,
    in_bytes: float,
    machine: Machine | None = None,
    base_regs: int = 16,
) -> dict[str, Any]:
    """The model's optimum by dynamic programming over the last cut (k(k+1)/2 segment evaluations): the model's
    time is a sum over kernels, each depending only on its stages and its input, so ``best[j] = min_i best[i] +
    time(stages[i:j])`` is exact. Returns split_time's dict."""
    n, in_bytes, base_regs = _check(stages, n, in_bytes, base_regs)
    k = len(stages)
    best: list[tuple[float, list[int]]] = [(0.0, [])]
    for j in range(1, k + 1):
        options = []
        for i in range(j):
            b_in = in_bytes if i == 0 else stages[i - 1].out_bytes
            t = best[i][0] + segment_time(stages[i:j], n, b_in, machine, base_regs)["time_s"]
            options.append((t, best[i][1] + ([i] if i else [])))
        best.append(min(options, key=lambda o: o[0]))
    return split_time(stages, best[k][1], n, in_bytes, machine, base_regs)


def exhaustive_split(
    stages: Sequence[Stage],
    n: int,
    in_bytes: float,
    machine: Machine | None = None,
    base_regs: int = 16,
    max_stages: int = 16,
) -> dict[str, Any]:
    """The model's optimum over all 2^(k-1) splits (a check for ``choose_split``; ValueError above ``max_stages``)."""
    n, in_bytes, base_regs = _check(stages, n, in_bytes, base_regs)
    k = len(stages)
    if k > max_stages:
        raise ValueError(f"stages: {k} stages means 2^{k - 1} splits; raise max_stages (={max_stages}) to allow it")
    best = None
    for m in range(k):
        for cuts in combinations(range(1, k), m):
            r = split_time(stages, list(cuts), n, in_bytes, machine, base_regs)
            if best is None or r["time_s"] < best["time_s"]:
                best = r
    assert best is not None
    return best


__all__ = [
    "MAX_REGS",
    "Machine",
    "Stage",
    "choose_split",
    "exhaustive_split",
    "linear_scan",
    "optimal_split",
    "register_caps",
    "segment_regs",
    "segment_time",
    "split_time",
]
