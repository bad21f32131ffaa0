"""UCB1: choosing among implementations online, paying for exploration in regret.

A tuner measures every candidate carefully before choosing; a *bandit* instead chooses on every call, learning
while serving. Each arm (here: a configuration of a tunable op, e.g. a GEMM version / ISA) has an unknown mean
reward; UCB1 (Auer et al. 2002) plays every arm once, then the arm maximising

    mean_i + c * sqrt(ln N / n_i)         (N pulls in all, n_i of arm i; c = sqrt(2) in the paper)

-- optimism in the face of uncertainty: a rarely tried arm gets a large bonus, so every arm is retried, but
ever more rarely, and the expected number of pulls of a suboptimal arm grows only like log N / gap^2.

``run_bandit`` pulls arms = configurations: one pull is one timed call, its reward ``t_ref / t`` (``t_ref``: the
fastest call so far, of any arm, so the best arm earns about 1 and an arm twice as slow about 0.5; when a faster
call arrives every earlier reward is rescored against it: a scale fixed by one slow first round -- a busy neighbour
-- would shrink the gaps the bandit needs) or a callable ``reward(config, seconds)``. ``reward="cycles"`` counts CPU
cycles of the call with the hardware counters of ``tinylearn.profiler.counters`` (same ratio, cycles instead of
seconds: immune to frequency changes and to time the thread spent descheduled); where the PMU cannot be read (a VM
without one) it falls back to time and ``reward_source`` says so. Afterwards every arm is measured carefully
(``measure_config``) and the *regret* of each round is ``(t[chosen] - t[best]) / t[best]``: the fraction of a best
call's time lost to exploring; its cumulative sum grows logarithmically when the bandit works.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._inputs import is_real
from ..tunable import Space
from .measure import check_output, measure_config
from .tuner import check_shape, expected_output


class UCB1:
    """The UCB1 index policy over ``arms`` (any hashables); rewards are expected in [0, 1]."""

    def __init__(self, arms: Sequence[Any], c: float = math.sqrt(2)) -> None:
        arms = list(arms)
        if not arms:
            raise ValueError("arms: expected at least one arm, got none")
        if not is_real(c) or c < 0 or not math.isfinite(c):
            raise ValueError(f"c: expected a finite exploration constant >= 0, got {c!r}")
        self.arms, self.c = arms, float(c)
        self.counts = [0] * len(arms)
        self.sums = [0.0] * len(arms)

    @property
    def total(self) -> int:
        return sum(self.counts)

    def means(self) -> list[float]:
        return [s / n if n else 0.0 for s, n in zip(self.sums, self.counts)]

    def select(self) -> Any:
        """The arm to pull next: an untried arm first (in order), else the largest upper confidence bound."""
        for i, n in enumerate(self.counts):
            if n == 0:
                return self.arms[i]
        log_n = math.log(self.total)
        ucb = [m + self.c * math.sqrt(log_n / n) for m, n in zip(self.means(), self.counts)]
        return self.arms[int(np.argmax(ucb))]

    def index(self, arm: Any) -> int:
        for i, a in enumerate(self.arms):
            if a is arm or a == arm:
                return i
        raise ValueError(f"arm: {arm!r} is not one of the bandit's arms")

    def update(self, arm: Any, reward: float) -> None:
        """Record ``reward`` for ``arm``."""
        if not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"reward: expected a finite number, got {reward!r}")
        i = self.index(arm)
        self.counts[i] += 1
        self.sums[i] += float(reward)

    def favourite(self) -> Any:
        """The arm pulled most often (where the bandit settled)."""
        return self.arms[int(np.argmax(self.counts))]


@dataclass
class BanditResult:
    """``chosen``: arm index per round; ``regret``: cumulative relative regret after each round."""

    configs: list[dict]
    counts: list[int]
    means: list[float]
    chosen: list[int]
    seconds: list[float]  # careful per-arm median times (measure_config), after the bandit
    regret: list[float] = field(default_factory=list)
    reward_source: str = "time"

    @property
    def best_arm(self) -> int:
        return int(np.argmin(self.seconds))

    @property
    def settled_arm(self) -> int:
        return int(np.argmax(self.counts))


def _counters() -> tuple[Any, str]:
    """(HardwareCounters class or None, what the reward is based on)."""
    try:
        from ..profiler.counters import HardwareCounters, counters_available

        ok, why = counters_available()
    except Exception as e:  # noqa: BLE001 - profiler or its counters absent: time only
        return None, f"time only (hardware counters unavailable: {type(e).__name__}: {e})"
    if ok:
        return HardwareCounters, "cycles (hardware counters)"
    return None, f"time only (hardware counters unavailable: {why})"


def _cycles(counters: Any, fn: Callable[[], Any]) -> float:
    with counters(("cycles",)) as c:
        fn()
    return float(c["cycles"] or 0) or 1.0


def _timed(fn: Callable[[], Any], min_s: float = 2e-4) -> float:
    t0 = time.perf_counter()
    fn()
    t = time.perf_counter() - t0
    if t >= min_s:
        return t
    inner = min(1000, max(2, int(min_s / max(t, 1e-9))))
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def run_bandit(
    space: Space,
    shape: Mapping[str, int],
    configs: Sequence[Mapping[str, Any]],
    rounds: int = 200,
    reward: str | Callable[[dict, float], float] = "time",
    *,
    c: float = math.sqrt(2),
    seed: int = 0,
) -> BanditResult:
    """Play UCB1 for ``rounds`` pulls over ``configs`` of ``space`` at ``shape`` (see the module docstring).

    Every configuration is checked against the reference output first (a wrong one raises ValueError)."""
    if not isinstance(space, Space):
        raise TypeError(f"space: expected a tunable.Space, got {type(space).__name__}")
    shape = check_shape(space, shape)
    cfgs = [space.check(cf) for cf in configs]
    if not cfgs:
        raise ValueError("configs: expected at least one configuration (an arm), got none")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < len(cfgs):
        raise ValueError(f"rounds: expected an int >= the number of arms ({len(cfgs)}), got {rounds!r}")
    if not (reward in ("time", "cycles") or callable(reward)):
        raise ValueError(f"reward: expected 'time', 'cycles' or a callable (config, seconds) -> float, got {reward!r}")
    counters, source = _counters() if reward == "cycles" else (None, "time")
    if callable(reward):
        source = "callable"
    args, kwargs = space.make_args(shape, np.random.default_rng(seed))
    expected = expected_output(space, args, kwargs)
    fns = []
    for cf in cfgs:
        fn = space.build(cf)
        err = check_output(space, fn(*args, **kwargs), expected, args, kwargs)
        if err is not None:
            raise ValueError(f"configs: {cf} computes a wrong result: {err}")
        fns.append(fn)
    ucb = UCB1(list(range(len(cfgs))), c=c)
    chosen: list[int] = []
    costs: list[list[float]] = [[] for _ in cfgs]  # every pull's cost, per arm: rewards are rescored when t_ref falls
    t_ref = math.inf
    for _ in range(rounds):
        i = ucb.select()
        call = functools.partial(fns[i], *args, **kwargs)
        t = _timed(call)
        chosen.append(i)
        if callable(reward):
            ucb.update(i, float(reward(cfgs[i], t)))
            continue
        cost = _cycles(counters, call) if counters is not None else t
        costs[i].append(cost)
        if cost < t_ref:  # a new fastest call sets the scale: rescore every reward so far against it
            t_ref = cost
            ucb.counts[i] += 1
            ucb.sums = [sum(min(1.0, t_ref / cj) for cj in cs) for cs in costs]
        else:
            ucb.update(i, min(1.0, t_ref / cost))
    true_s = [measure_config(space, cf, args, kwargs, warmup=1, repeat=5).seconds or float("inf") for cf in cfgs]
    best = min(true_s)
    regret, acc = [], 0.0
    for i in chosen:
        acc += (true_s[i] - best) / best
        regret.append(acc)
    return BanditResult(cfgs, list(ucb.counts), ucb.means(), chosen, true_s, regret, source)
