"""Run-time statistics choose the next batch's kernel variant (a multi-armed bandit over compiled variants).

A serving loop calls the same op batch after batch; it can afford to try a different *variant* of the kernel on
each batch (another loop order, unrolled instead of vectorised, ...) and keep the one the statistics favour.

Per variant (``VariantStats``) two kinds of statistics:

* static, from the scheduled loop IR (``compiler.tuning.scheduled``) before anything runs: loads, stores and
  arithmetic instructions per element of the innermost loop, the load/store mix, the bytes moved per flop, the
  innermost loop's stride over the input (1 = unit stride; a column-order nest walks rows: stride = row length),
  whether it is vectorised / parallel. These order the variants' first tries (lowest estimated traffic first).
* run time, per batch: the wall time per element, and where the PMU is readable
  (``tinylearn.profiler.counters.HardwareCounters``) instructions, cycles and IPC of the calling thread; in a
  container without a virtual PMU only times are collected (``counters`` says why).

Policies (``VariantBandit``): ``ucb`` (UCB1: play every variant once, then the one maximising mean reward +
c sqrt(2 ln n / n_i), reward = fastest median time seen / this variant's median, in (0, 1]) or ``epsilon``
(greedy on the median time, a random variant with probability epsilon). ``run_batches`` drives one policy over a
stream of batches and reports the picks, their times and how often the final best variant was chosen.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..tunable import Space

POLICIES = ("ucb", "epsilon")


@dataclass
class VariantStats:
    config: dict
    static: dict[str, float] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)  # seconds per element, one per batch that ran it
    counters: list[dict] = field(default_factory=list)

    @property
    def mean(self) -> float:
        """The typical time per element: the *median* of the batches (one preempted batch must not condemn a
        variant: on a shared box single-call times have outliers of 10x and more)."""
        return float(np.median(self.times)) if self.times else math.inf

    @property
    def best(self) -> float:
        return float(min(self.times)) if self.times else math.inf


def loop_stats(space: Space, config: Mapping[str, Any], shape: Mapping[str, int]) -> dict[str, float]:
    """Static statistics of a ``compiler.schedule`` variant from its scheduled loop IR (see the module docstring).
    Other spaces: their ``extra_features`` (e.g. the GEMM space's intensity and block bytes), or nothing."""
    if space.op != "compiler.schedule":
        return dict(space.extra_features(config, dict(shape))) if space.extra_features else {}
    from ..compiler.loops import Compute, Loop, Store
    from ..compiler.tuning import scheduled

    nest = scheduled(dict(shape), config)
    inner = nest.body[0]
    while any(isinstance(n, Loop) for n in inner.body):
        inner = next(n for n in inner.body if isinstance(n, Loop))
    ops = [n for n in inner.body if isinstance(n, Compute | Store)]
    loads = sum(1 for n in ops if isinstance(n, Compute) and n.instr.op == "load")
    stores = sum(1 for n in ops if isinstance(n, Store))
    arith = sum(1 for n in ops if isinstance(n, Compute) and n.instr.op not in ("load", "const"))
    dim = [d.var for d in nest.plan.dims].index(inner.dim)
    stride = max(s[dim] for s in nest.plan.in_strides)
    item = np.dtype(nest.kernel.dtype).itemsize
    return {
        "loads": float(loads),
        "stores": float(stores),
        "arith": float(arith),
        "load_store_ratio": loads / max(stores, 1),
        "bytes_per_flop": (loads + stores) * item / max(arith, 1),
        "inner_stride": float(stride),
        "simd": float(inner.simd),
        "parallel": float(any(lp.parallel for lp in nest.loops())),
        "unroll": float(max(inner.unroll, 1)),
    }


def _static_cost(s: dict[str, float]) -> float:
    """A first-try order from static statistics only: traffic per element, x8 for a non-unit inner stride (every
    access a new cache line), / 2 for a parallel nest."""
    if not s:
        return 0.0
    traffic = s.get("loads", 0.0) + s.get("stores", 0.0)
    return traffic * (8.0 if s.get("inner_stride", 1.0) > 1 else 1.0) / (2.0 if s.get("parallel") else 1.0)


def counters_status() -> tuple[bool, str]:
    """(True, detail) when hardware counters can be read here, else (False, why)."""
    try:
        from ..profiler.counters import counters_available
    except Exception as e:  # noqa: BLE001 - the profiler package may be absent or broken: times only
        return False, f"tinylearn.profiler.counters not importable: {type(e).__name__}: {e}"
    return counters_available()


class VariantBandit:
    """Chooses the next batch's variant from the statistics collected so far (see the module docstring)."""

    def __init__(
        self,
        variants: Sequence[VariantStats],
        policy: str = "ucb",
        *,
        epsilon: float = 0.1,
        c: float = 0.5,
        seed: int = 0,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy: expected one of {list(POLICIES)}, got {policy!r}")
        if not variants:
            raise ValueError("variants: need at least one variant")
        if not isinstance(epsilon, (int, float)) or not 0 <= epsilon <= 1:
            raise ValueError(f"epsilon: expected a probability in [0, 1], got {epsilon!r}")
        if not isinstance(c, (int, float)) or c < 0:
            raise ValueError(f"c: expected an exploration weight >= 0, got {c!r}")
        self.variants, self.policy, self.epsilon, self.c = list(variants), policy, float(epsilon), float(c)
        self.rng = np.random.default_rng(seed)
        self.n = 0
        self._first = sorted(range(len(self.variants)), key=lambda i: _static_cost(self.variants[i].static))

    def choose(self) -> int:
        untried = [i for i in self._first if not self.variants[i].times]
        if untried:
            return untried[0]
        means = np.array([v.mean for v in self.variants])
        if self.policy == "epsilon":
            if self.rng.random() < self.epsilon:
                return int(self.rng.integers(len(self.variants)))
            return int(np.argmin(means))
        reward = means.min() / means
        counts = np.array([len(v.times) for v in self.variants], dtype=np.float64)
        return int(np.argmax(reward + self.c * np.sqrt(2.0 * math.log(max(self.n, 1)) / counts)))

    def update(self, i: int, seconds: float, counters: dict | None = None) -> None:
        if not 0 <= i < len(self.variants):
            raise ValueError(f"i: variant index {i} out of range [0, {len(self.variants)})")
        if not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ValueError(f"seconds: expected a positive time, got {seconds!r}")
        self.variants[i].times.append(float(seconds))
        if counters:
            self.variants[i].counters.append(dict(counters))
        self.n += 1


@dataclass
class BanditRun:
    picks: list[int]
    seconds: list[float]
    variants: list[VariantStats]
    best: int  # the variant with the lowest median time at the end
    share_best_last_half: float  # fraction of the last half of the batches that ran ``best``
    counters: str  # "hardware counters: ..." or why only times were collected


def run_batches(
    space: Space,
    shape: Mapping[str, int],
    configs: Sequence[Mapping[str, Any]],
    batches: int = 40,
    *,
    policy: str = "ucb",
    seed: int = 0,
    call: Callable[[int, Callable[..., Any], tuple, dict], float] | None = None,
) -> BanditRun:
    """Serve ``batches`` batches of ``space``'s op at ``shape``; each batch runs the variant the bandit chooses
    from the statistics so far. ``call(i, fn, args, kwargs) -> seconds`` times one batch (default: wall time of
    one call, with hardware counters when readable)."""
    if not isinstance(batches, int) or batches < 1:
        raise ValueError(f"batches: expected an int >= 1, got {batches!r}")
    shape = dict(shape)
    stats = [VariantStats(space.check(c), loop_stats(space, c, shape)) for c in configs]
    bandit = VariantBandit(stats, policy, seed=seed)
    args, kwargs = space.make_args(shape, np.random.default_rng(seed))
    fns = [space.build(v.config) for v in stats]
    for fn in fns:  # compile and warm every variant before serving (never timed)
        fn(*args, **kwargs)
    hw, why = counters_status()
    elems = max(int(np.prod([int(v) for v in shape.values()])), 1)
    picks, secs = [], []
    for _ in range(batches):
        i = bandit.choose()
        counts: dict | None = None
        if call is not None:
            dt = float(call(i, fns[i], args, kwargs))
        elif hw:
            from ..profiler.counters import HardwareCounters

            with HardwareCounters(("cycles", "instructions")) as counts:
                t0 = time.perf_counter()
                fns[i](*args, **kwargs)
                dt = time.perf_counter() - t0
        else:
            t0 = time.perf_counter()
            fns[i](*args, **kwargs)
            dt = time.perf_counter() - t0
        if counts and counts.get("cycles"):
            counts = dict(counts, ipc=counts["instructions"] / counts["cycles"])
        bandit.update(i, dt / elems, counts)
        picks.append(i)
        secs.append(dt)
    best = int(np.argmin([v.mean for v in stats]))
    half = picks[len(picks) // 2 :]
    share = sum(1 for p in half if p == best) / max(len(half), 1)
    return BanditRun(picks, secs, stats, best, share, f"hardware counters: {why}" if hw else f"times only: {why}")
