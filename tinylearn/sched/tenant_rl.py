"""Which tenant's kernel launches next? Tabular Q-learning on a MODEL shared GPU [Q138].

The environment (``KernelLaunchEnv``) is a MODEL, not a measurement: time advances in ticks of ``dt_s``; each
tenant k receives Poisson(``rate_k``) kernels per tick into its queue; each tick the device runs ONE queued kernel
of the tenant the scheduler picks (or idles when every queue is empty). A kernel of tenant k keeps the device at
utilisation ``util_k``, so the board draws ``spec.power_w(f_max, util_k)`` watts that tick (``device_model``:
idle + (TDP - idle) u (f / f_max)^3) and the temperature follows the first-order RC model
(``spec.temp_after``). The reward of a tick is

    r = -(sum_k w_k q_k)  -  power_penalty * max(0, P - power_cap_w) / 10 W  -  temp_penalty * max(0, T - temp_cap_c)

-- weighted queue length (by Little's law, proportional to the weighted mean latency) plus penalties for power above
the cap and temperature above a soft limit.

The agent sees a discretised state: each queue length bucketed (``queue_bins``), whether the last tick's power was
above the cap, and a temperature bucket; its action is the tenant to serve, restricted to non-empty queues.
Q-learning (Watkins & Dayan, "Q-learning", Machine Learning 1992):
``Q(s, a) += lr * (r + gamma * max_a' Q(s', a') - Q(s, a))`` with epsilon-greedy exploration, all randomness from
one seed. Baselines: ``RoundRobin`` (next non-empty queue after the last one served) and ``ShortestQueueFirst``.
With unequal weights the learned policy serves the heavy-weight tenant first -- the c-mu rule, learned from reward
alone. With the default loads the power penalty is the same for every work-conserving policy (the power-hungry
tenant's kernels must all run; only their order changes), so the gain over the baselines is the weighted
latency. ``evaluate`` runs every policy on the SAME arrival sequences (common random numbers) so the comparison
is paired. Real multi-tenant GPU schedulers (e.g. time-slicing in the NVIDIA driver, MPS, MIG partitions) do not
learn online; this is the question's design exercise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .._inputs import is_int, is_real
from .device_model import A100, DeviceSpec

__all__ = [
    "TenantLoad",
    "KernelLaunchEnv",
    "RoundRobin",
    "ShortestQueueFirst",
    "QPolicy",
    "q_learning",
    "evaluate",
    "DEFAULT_TENANTS",
]


@dataclass(frozen=True)
class TenantLoad:
    """One tenant of the MODEL: kernel arrival rate per tick, share weight, device utilisation of its kernels."""

    name: str
    rate: float
    weight: float = 1.0
    util: float = 0.6

    def __post_init__(self) -> None:
        if not is_real(self.rate) or not 0 <= self.rate < 1:
            raise ValueError(f"rate: expected kernels per tick in [0, 1), got {self.rate!r} (tenant {self.name!r})")
        if not is_real(self.weight) or not self.weight > 0:
            raise ValueError(f"weight: expected > 0, got {self.weight!r} (tenant {self.name!r})")
        if not is_real(self.util) or not 0 <= self.util <= 1:
            raise ValueError(f"util: expected a utilisation in [0, 1], got {self.util!r} (tenant {self.name!r})")


DEFAULT_TENANTS = (
    TenantLoad("chat", rate=0.30, weight=4.0, util=0.5),  # latency-critical inference: heavy weight
    TenantLoad("train", rate=0.25, weight=1.0, util=1.0),  # power-hungry training kernels
    TenantLoad("batch", rate=0.25, weight=1.0, util=0.6),  # offline batch inference
)


class KernelLaunchEnv:
    """MODEL environment (module docstring). ``reset(seed)`` draws the episode's arrivals; ``step(action)``."""

    def __init__(
        self,
        tenants: Sequence[TenantLoad] = DEFAULT_TENANTS,
        spec: DeviceSpec = A100,
        dt_s: float = 1.0,
        power_cap_w: float = 300.0,
        power_penalty: float = 1.0,
        temp_cap_c: float = 70.0,
        temp_penalty: float = 0.5,
        horizon: int = 200,
        queue_bins: Sequence[int] = (1, 2, 4),
        temp_bins: Sequence[float] = (55.0, 65.0),
        max_queue: int = 50,
    ) -> None:
        if not tenants or not all(isinstance(t, TenantLoad) for t in tenants):
            raise ValueError(f"tenants: expected a non-empty list of TenantLoad, got {tenants!r}")
        if sum(t.rate for t in tenants) >= 1:
            raise ValueError(
                f"tenants: total arrival rate must be < 1 kernel per tick, got {[t.rate for t in tenants]}"
            )
        for nm, v in (("dt_s", dt_s), ("power_cap_w", power_cap_w)):
            if not is_real(v) or not v > 0:
                raise ValueError(f"{nm}: expected a number > 0, got {v!r}")
        if not is_int(horizon) or horizon < 1:
            raise ValueError(f"horizon: expected an int >= 1, got {horizon!r}")
        self.tenants = tuple(tenants)
        self.spec = spec
        self.dt_s = float(dt_s)
        self.power_cap_w = float(power_cap_w)
        self.power_penalty = float(power_penalty)
        self.temp_cap_c = float(temp_cap_c)
        self.temp_penalty = float(temp_penalty)
        self.horizon = int(horizon)
        self.queue_bins = tuple(queue_bins)
        self.temp_bins = tuple(temp_bins)
        self.max_queue = int(max_queue)
        self.weights = np.array([t.weight for t in tenants])
        self.power_by_tenant = [spec.power_w(spec.f_max_mhz, t.util) for t in tenants]
        self.reset(0)

    @property
    def n_actions(self) -> int:
        return len(self.tenants)

    def reset(self, seed: int) -> tuple[int, ...]:
        rng = np.random.default_rng(seed)
        self._arrivals = rng.poisson([t.rate for t in self.tenants], size=(self.horizon, len(self.tenants)))
        self.queues = [0] * len(self.tenants)
        self.t = 0
        self.power_w = self.spec.idle_w
        self.temp_c = self.spec.steady_temp_c(self.spec.idle_w)
        return self.state()

    def state(self) -> tuple[int, ...]:
        qb = tuple(int(np.searchsorted(self.queue_bins, q, side="right")) for q in self.queues)
        pb = int(self.power_w > self.power_cap_w)
        tb = int(np.searchsorted(self.temp_bins, self.temp_c, side="right"))
        return qb + (pb, tb)

    def valid_actions(self) -> list[int]:
        return [k for k, q in enumerate(self.queues) if q > 0]

    def done(self) -> bool:
        return self.t >= self.horizon

    def step(self, action: int | None) -> tuple[tuple[int, ...], float]:
        """Serve one kernel of tenant ``action`` (None or an empty queue: idle), then add this tick's arrivals."""
        if self.done():
            raise ValueError(f"action: the episode ended at t={self.t}; call reset(seed)")
        if action is not None and (not is_int(action) or not 0 <= action < self.n_actions):
            raise ValueError(f"action: expected a tenant index in [0, {self.n_actions}) or None, got {action!r}")
        if action is not None and self.queues[action] > 0:
            self.queues[action] -= 1
            self.power_w = self.power_by_tenant[action]
        else:
            self.power_w = self.spec.idle_w
        self.temp_c = self.spec.temp_after(self.temp_c, self.power_w, self.dt_s)
        for k, a in enumerate(self._arrivals[self.t]):
            self.queues[k] = min(self.max_queue, self.queues[k] + int(a))
        self.t += 1
        r = -float(np.dot(self.weights, self.queues))
        r -= self.power_penalty * max(0.0, self.power_w - self.power_cap_w) / 10.0
        r -= self.temp_penalty * max(0.0, self.temp_c - self.temp_cap_c)
        return self.state(), r


Policy = Callable[[KernelLaunchEnv], "int | None"]


class RoundRobin:
    """Serve the next non-empty queue after the one served last."""

    def __init__(self) -> None:
        self.last = -1

    def __call__(self, env: KernelLaunchEnv) -> int | None:
        n = env.n_actions
        for d in range(1, n + 1):
            k = (self.last + d) % n
            if env.queues[k] > 0:
                self.last = k
                return k
        return None


class ShortestQueueFirst:
    """Serve the shortest non-empty queue (ties: lowest index)."""

    def __call__(self, env: KernelLaunchEnv) -> int | None:
        valid = env.valid_actions()
        return min(valid, key=lambda k: (env.queues[k], k)) if valid else None


class QPolicy:
    """Greedy policy of a learned Q-table (unseen states: Q = 0 for every action)."""

    def __init__(self, q: dict[tuple[int, ...], np.ndarray], n_actions: int) -> None:
        self.q = q
        self.n_actions = n_actions

    def __call__(self, env: KernelLaunchEnv) -> int | None:
        valid = env.valid_actions()
        if not valid:
            return None
        row = self.q.get(env.state())
        if row is None:
            return valid[0]
        return max(valid, key=lambda a: (row[a], -a))


def q_learning(
    env: KernelLaunchEnv,
    episodes: int = 300,
    seed: int = 0,
    lr: float = 0.1,
    gamma: float = 0.9,
    eps_start: float = 0.3,
    eps_end: float = 0.02,
) -> tuple[QPolicy, list[float]]:
    """Tabular epsilon-greedy Q-learning (module docstring); ``(greedy policy, mean reward per tick per episode)``.

    Episode e uses arrival seed ``seed * 100003 + e``; epsilon decays linearly from ``eps_start`` to ``eps_end``.
    """
    if not is_int(episodes) or episodes < 1:
        raise ValueError(f"episodes: expected an int >= 1, got {episodes!r}")
    for nm, v, lo, hi in (("lr", lr, 0, 1), ("gamma", gamma, 0, 1), ("eps_start", eps_start, 0, 1),
                          ("eps_end", eps_end, 0, 1)):  # fmt: skip
        if not is_real(v) or not lo <= v <= hi or math.isnan(v):
            raise ValueError(f"{nm}: expected a number in [{lo}, {hi}], got {v!r}")
    rng = np.random.default_rng(seed)
    n = env.n_actions
    q: dict[tuple[int, ...], np.ndarray] = {}
    curve = []
    for e in range(episodes):
        eps = eps_start + (eps_end - eps_start) * e / max(1, episodes - 1)
        s = env.reset(seed * 100003 + e)
        total = 0.0
        while not env.done():
            valid = env.valid_actions()
            row = q.setdefault(s, np.zeros(n))
            if not valid:
                a = None
            elif rng.random() < eps:
                a = int(valid[rng.integers(len(valid))])
            else:
                a = max(valid, key=lambda x: (row[x], -x))
            s2, r = env.step(a)
            total += r
            nxt = q.setdefault(s2, np.zeros(n))
            valid2 = env.valid_actions()
            target = r + (gamma * max(nxt[x] for x in valid2) if valid2 and not env.done() else 0.0)
            if a is not None:
                row[a] += lr * (target - row[a])
            s = s2
        curve.append(total / env.horizon)
    return QPolicy(q, n), curve


def evaluate(env: KernelLaunchEnv, policy: Policy, episodes: int = 20, seed: int = 10_000) -> dict[str, float]:
    """Run ``policy`` on episodes with arrival seeds ``seed .. seed + episodes - 1`` (the same for every policy):
    mean reward per tick, mean weighted queue, fraction of ticks above the power cap, peak temperature (MODEL)."""
    if not is_int(episodes) or episodes < 1:
        raise ValueError(f"episodes: expected an int >= 1, got {episodes!r}")
    rew, wq, over, peak = [], [], 0, -math.inf
    for e in range(episodes):
        env.reset(seed + e)
        if isinstance(policy, RoundRobin):
            policy.last = -1
        while not env.done():
            _, r = env.step(policy(env))
            rew.append(r)
            wq.append(float(np.dot(env.weights, env.queues)))
            over += env.power_w > env.power_cap_w
            peak = max(peak, env.temp_c)
    n = len(rew)
    return {"reward": float(np.mean(rew)), "weighted_queue": float(np.mean(wq)), "over_cap": over / n, "peak_c": peak}
