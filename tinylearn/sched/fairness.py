"""Fair division of a cluster: Dominant Resource Fairness and weighted max-min (water-filling).

**Weighted max-min fairness, one resource** (the classic water-filling of Bertsekas & Gallager, *Data Networks*,
sec. 6.5.2): raise every unsatisfied user's allocation in proportion to its weight, ``x_i = w_i * level``, until a
user's demand is met (freeze it at its demand) or the capacity is used up. The result gives no user more than it
asked for, and no user can gain without taking from a user whose allocation per unit of weight is no larger.

**Dominant Resource Fairness** (Ghodsi, Zaharia, Hindman, Konwinski, Shenker, Stoica, "Dominant Resource
Fairness: Fair Allocation of Multiple Resource Types", NSDI 2011): with several resources (CPU, memory, GPUs) each
user ``i`` runs identical tasks of demand vector ``d_i``; its *dominant share* is ``s_i = max_r n_i d_ir / C_r``
(the largest fraction of any one resource its ``n_i`` tasks hold). DRF equalises (weighted: ``s_i / w_i``) the
dominant shares by *progressive filling*: repeatedly give one more task to the user with the smallest weighted
dominant share whose next task still fits in what is left. The paper's example: capacity <9 CPU, 18 GB>, user A
tasks <1 CPU, 4 GB> (dominant resource: memory), user B tasks <3 CPU, 1 GB> (dominant: CPU) -> A 3 tasks
(<3, 12>, share 2/3), B 2 tasks (<6, 2>, share 2/3). The properties the paper proves for the continuous version
(``drf_continuous``), which ``tests/sched/test_fairness.py`` checks on seeded random instances: Pareto efficiency
(every user needs an exhausted resource), sharing incentive (each user runs at least as many tasks as with its
weighted slice ``w_i / sum w`` of every resource), envy-freeness (no user could run more tasks with another user's
bundle scaled by the ratio of their weights); strategy-proofness is not tested here. The discrete ``drf_allocate``
is checked for feasibility, Pareto efficiency (when filling stops, no user's next task fits) and sharing incentive
up to one task (with indivisible tasks a tie in the filling order can leave a user one task short of its static
slice); its envy-freeness is only approximate: a user whose next task no longer fits can fall behind one that
keeps receiving small tasks.

Slurm's fair-share factor and Kubernetes' scheduler do not implement DRF; YARN's and Mesos' allocators do
(``DominantResourceCalculator``, Mesos' DRF sorter). This module is the allocation rule; it schedules nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .._inputs import is_real

__all__ = [
    "drf_allocate",
    "drf_continuous",
    "dominant_shares",
    "weighted_max_min",
    "sharing_incentive_tasks",
    "max_tasks_in",
    "max_fraction_in",
]


def _check_capacity(capacity: Mapping[str, float]) -> dict[str, float]:
    if not isinstance(capacity, Mapping) or not capacity:
        raise ValueError(f"capacity: expected a non-empty dict resource -> amount, got {capacity!r}")
    out = {}
    for r, c in capacity.items():
        if not is_real(c) or not math.isfinite(c) or c <= 0:
            raise ValueError(f"capacity: resource {r!r} needs a finite amount > 0, got {c!r}")
        out[r] = float(c)
    return out


def _check_demands(demands: Mapping, capacity: Mapping[str, float]) -> dict:
    if not isinstance(demands, Mapping) or not demands:
        raise ValueError(f"demands: expected a non-empty dict user -> {{resource: per-task amount}}, got {demands!r}")
    out = {}
    for u, d in demands.items():
        if not isinstance(d, Mapping):
            raise ValueError(f"demands: user {u!r} needs a dict resource -> amount, got {d!r}")
        dd = {}
        for r, a in d.items():
            if r not in capacity:
                raise ValueError(f"demands: user {u!r} asks for unknown resource {r!r} (capacity has {list(capacity)})")
            if not is_real(a) or not math.isfinite(a) or a < 0:
                raise ValueError(f"demands: user {u!r} resource {r!r} needs a finite amount >= 0, got {a!r}")
            dd[r] = float(a)
        if not any(a > 0 for a in dd.values()):
            raise ValueError(f"demands: user {u!r} has an all-zero task demand {d!r} (it could run infinitely many)")
        out[u] = dd
    return out


def _check_weights(weights: Mapping | None, users: list) -> dict:
    if weights is None:
        return {u: 1.0 for u in users}
    if not isinstance(weights, Mapping):
        raise ValueError(f"weights: expected a dict user -> weight > 0, got {weights!r}")
    out = {}
    for u in users:
        w = weights.get(u, None)
        if not is_real(w) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"weights: user {u!r} needs a finite weight > 0, got {w!r}")
        out[u] = float(w)
    return out


def dominant_shares(capacity: Mapping[str, float], demands: Mapping, tasks: Mapping) -> dict:
    """Each user's dominant share ``max_r tasks_i * d_ir / C_r`` for the given task counts."""
    cap = _check_capacity(capacity)
    dem = _check_demands(demands, cap)
    return {u: max(tasks.get(u, 0) * a / cap[r] for r, a in d.items()) for u, d in dem.items()}


def drf_allocate(capacity: Mapping[str, float], demands: Mapping, weights: Mapping | None = None) -> dict:
    """Dominant Resource Fairness by progressive filling (module docstring): ``{user: number of tasks}``.

    Each round gives one task to the user with the smallest weighted dominant share ``s_i / w_i`` whose next task
    fits in the remaining capacity (ties: the user listed first in ``demands``); stops when no user's task fits.
    """
    cap = _check_capacity(capacity)
    dem = _check_demands(demands, cap)
    users = list(dem)
    w = _check_weights(weights, users)
    free = dict(cap)
    tasks = {u: 0 for u in users}
    share = {u: 0.0 for u in users}
    dom = {u: max(a / cap[r] for r, a in dem[u].items()) for u in users}  # dominant share of one task
    eps = 1e-12
    while True:
        fitting = [u for u in users if all(a <= free[r] + eps * cap[r] for r, a in dem[u].items())]
        if not fitting:
            return tasks
        u = min(fitting, key=lambda v: (share[v] / w[v], users.index(v)))
        for r, a in dem[u].items():
            free[r] -= a
        tasks[u] += 1
        share[u] = tasks[u] * dom[u]


def drf_continuous(capacity: Mapping[str, float], demands: Mapping, weights: Mapping | None = None) -> dict:
    """DRF with divisible tasks (the paper's continuous model): ``{user: fractional tasks}``.

    Progressive filling in closed form: all active users' weighted dominant shares rise together (user i runs
    ``level * w_i / dom_i`` tasks, ``dom_i`` = the dominant share of one task) until a resource is exhausted; every
    active user that needs that resource is frozen; repeat until nobody is active. The discrete ``drf_allocate``
    approaches this allocation as tasks get small.
    """
    cap = _check_capacity(capacity)
    dem = _check_demands(demands, cap)
    users = list(dem)
    w = _check_weights(weights, users)
    dom = {u: max(a / cap[r] for r, a in dem[u].items()) for u in users}
    rate = {u: w[u] / dom[u] for u in users}  # tasks per unit of level
    x = {u: 0.0 for u in users}
    free = dict(cap)
    active = set(users)
    while active:
        use = {r: sum(rate[u] * dem[u].get(r, 0.0) for u in active) for r in cap}
        steps = {r: free[r] / use[r] for r in cap if use[r] > 0}
        dt = min(steps.values())
        for u in active:
            x[u] += rate[u] * dt
        for r in cap:
            free[r] -= use[r] * dt
        full = {r for r, t in steps.items() if t <= dt * (1 + 1e-12)}
        active = {u for u in active if not any(dem[u].get(r, 0.0) > 0 for r in full)}
    return x


def max_tasks_in(bundle: Mapping[str, float], demand: Mapping[str, float]) -> int:
    """How many tasks of ``demand`` fit in ``bundle`` (a resource dict): ``floor(min_r bundle_r / d_r)``."""
    return int(math.floor(max_fraction_in(bundle, demand) + 1e-9))


def max_fraction_in(bundle: Mapping[str, float], demand: Mapping[str, float]) -> float:
    """How many (fractional) tasks of ``demand`` fit in ``bundle``: ``min_r bundle_r / d_r``."""
    ratios = [bundle.get(r, 0.0) / a for r, a in demand.items() if a > 0]
    if not ratios:
        raise ValueError(f"demand: expected at least one positive amount, got {dict(demand)!r}")
    return float(min(ratios))


def sharing_incentive_tasks(capacity: Mapping[str, float], demands: Mapping, weights: Mapping | None = None) -> dict:
    """Tasks each user could run on its own static slice ``w_i / sum w`` of every resource (the sharing-incentive
    baseline DRF must match or beat)."""
    cap = _check_capacity(capacity)
    dem = _check_demands(demands, cap)
    w = _check_weights(weights, list(dem))
    tot = sum(w.values())
    return {u: max_tasks_in({r: c * w[u] / tot for r, c in cap.items()}, d) for u, d in dem.items()}


def weighted_max_min(capacity: float, demands: Mapping, weights: Mapping | None = None) -> dict:
    """Weighted max-min fair shares of ONE divisible resource by water-filling: ``{user: amount}``.

    Users are frozen at their demand in order of ``demand / weight``; the rest share what is left in proportion to
    their weights. Sum of the result = min(capacity, sum of demands).
    """
    if not is_real(capacity) or not math.isfinite(capacity) or capacity < 0:
        raise ValueError(f"capacity: expected a finite amount >= 0, got {capacity!r}")
    if not isinstance(demands, Mapping) or not demands:
        raise ValueError(f"demands: expected a non-empty dict user -> amount, got {demands!r}")
    for u, d in demands.items():
        if not is_real(d) or not math.isfinite(d) or d < 0:
            raise ValueError(f"demands: user {u!r} needs a finite amount >= 0, got {d!r}")
    users = list(demands)
    w = _check_weights(weights, users)
    alloc = {u: 0.0 for u in users}
    left = float(capacity)
    active = sorted(users, key=lambda u: demands[u] / w[u])
    while active and left > 1e-15:
        wsum = sum(w[u] for u in active)
        level = left / wsum  # the water level per unit of weight if nobody else were frozen
        u0 = active[0]
        if demands[u0] / w[u0] <= level:  # the smallest relative demand is satisfied: freeze it
            alloc[u0] = float(demands[u0])
            left -= alloc[u0]
            active.pop(0)
        else:
            for u in active:
                alloc[u] = w[u] * level
            left = 0.0
            active = []
    return alloc
