"""Balancing layers and batches over devices of unequal (and changing) speed.

**Model slicing** (pipeline / model parallel): L layers of work c_j (seconds on a speed-1 device) go to S devices
in order, as contiguous blocks; device s has speed v_s, so stage s takes sum(c_j in block s) / v_s plus, when the
block ends at layer j and is not the last, the time e_j to send layer j's activation to the next stage.
``partition_layers`` finds the blocks that minimise the largest stage time exactly (dynamic programming,
O(S·L²)); with equal speeds and no edge costs that is the classic linear-partition problem.

A pipeline step of m microbatches through stage times t_s takes (flow shop of identical jobs, exact for the
forward sweep) ``pipeline_step_time`` = sum t_s + (m − 1)·max t_s: the slowest stage sets the pace.

**Online rebalancing** (``LayerRebalancer``): each step the stage times are measured; a device's speed is
estimated as the work it holds / its measured time (exponentially smoothed), the optimal partition for those speeds
is computed, and the layers that would change device are priced: each receiving device pulls its new layers'
bytes (weights + optimizer state) over its link, α + β·bytes per layer, receivers in parallel. The layers move only
when the step time saved over ``horizon_steps`` steps exceeds that migration time.

**Batch slicing** (data parallel on unequal devices): ``split_batch`` gives device i n_i samples so that the
slowest device finishes first-possible (greedy, exact for minimising max n_i / v_i); ``simulate_reslicing``
re-derives the split every step from the measured per-device times.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any


def _reals(name: str, xs: Sequence[float], n: int | None = None, positive: bool = False) -> list[float]:
    try:
        out = [float(x) for x in xs]
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a sequence of numbers, got {xs!r}") from None
    bad = [x for x in out if not math.isfinite(x) or x < 0 or (positive and x == 0)]
    if bad or not out or (n is not None and len(out) != n):
        want = f"{n} " if n is not None else ""
        raise ValueError(f"{name}: expected {want}finite numbers {'> 0' if positive else '>= 0'}, got {list(xs)!r}")
    return out


def _check_bounds(bounds: Sequence[int], n_layers: int) -> list[int]:
    b = list(bounds)
    ok = len(b) >= 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in b)
    if not ok or b[0] != 0 or b[-1] != n_layers or any(b[i] >= b[i + 1] for i in range(len(b) - 1)):
        raise ValueError(f"bounds: expected increasing ints from 0 to {n_layers} (one block per stage), got {b!r}")
    return b


def stage_times(
    layer_costs: Sequence[float], bounds: Sequence[int], speeds: Sequence[float], edge_s: Sequence[float] | None = None
) -> list[float]:
    """Seconds per stage: block work / device speed + the send after the block's last layer (not the last stage)."""
    c = _reals("layer_costs", layer_costs)
    b = _check_bounds(bounds, len(c))
    v = _reals("speeds", speeds, len(b) - 1, positive=True)
    e = _reals("edge_s", edge_s, len(c) - 1) if edge_s is not None and len(c) > 1 else [0.0] * max(len(c) - 1, 0)
    out = []
    for s in range(len(v)):
        t = sum(c[b[s] : b[s + 1]]) / v[s]
        if s < len(v) - 1:
            t += e[b[s + 1] - 1]
        out.append(t)
    return out


def partition_layers(
    layer_costs: Sequence[float], speeds: Sequence[float], edge_s: Sequence[float] | None = None
) -> list[int]:
    """Contiguous blocks (bounds [0, ..., L], one block per device in order) minimising the largest stage time.

    Exact dynamic programming; times within a relative 1e-9 count as tied (float sums of equal costs), and a tie
    keeps the earliest cut for each stage's start."""
    c = _reals("layer_costs", layer_costs)
    v = _reals("speeds", speeds, positive=True)
    n, s_n = len(c), len(v)
    if s_n > n:
        raise ValueError(f"speeds: more devices ({s_n}) than layers ({n}); every stage needs a layer")
    e = _reals("edge_s", edge_s, n - 1) if edge_s is not None and n > 1 else [0.0] * max(n - 1, 0)
    pre = [0.0]
    for x in c:
        pre.append(pre[-1] + x)
    inf = math.inf
    best = [[inf] * (n + 1) for _ in range(s_n + 1)]  # best[s][j]: first j layers on the first s devices
    arg = [[0] * (n + 1) for _ in range(s_n + 1)]
    best[0][0] = 0.0
    for s in range(1, s_n + 1):
        for j in range(s, n - (s_n - s) + 1):
            for i in range(s - 1, j):
                t = (pre[j] - pre[i]) / v[s - 1] + (e[j - 1] if s < s_n else 0.0)
                cand = max(best[s - 1][i], t)
                if cand < best[s][j] - 1e-9 * abs(best[s][j]) if best[s][j] < inf else True:
                    best[s][j], arg[s][j] = cand, i
    bounds, j = [n], n
    for s in range(s_n, 0, -1):
        j = arg[s][j]
        bounds.append(j)
    return bounds[::-1]


def pipeline_step_time(stage_s: Sequence[float], n_microbatches: int) -> float:
    """sum t_s + (m − 1)·max t_s: m identical microbatches through stages in order (flow-shop makespan)."""
    t = _reals("stage_s", stage_s)
    if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int) or n_microbatches < 1:
        raise ValueError(f"n_microbatches: expected an int >= 1, got {n_microbatches!r}")
    return sum(t) + (n_microbatches - 1) * max(t)


def migration_seconds(
    old_bounds: Sequence[int],
    new_bounds: Sequence[int],
    layer_bytes: Sequence[float],
    alpha_s: float,
    beta_s_per_byte: float,
) -> float:
    """Time to move the layers whose device changes: each receiver pulls its new layers (α + β·bytes each), the
    receivers in parallel; 0 when nothing moves."""
    w = _reals("layer_bytes", layer_bytes)
    old, new = _check_bounds(old_bounds, len(w)), _check_bounds(new_bounds, len(w))
    if len(old) != len(new):
        raise ValueError(f"new_bounds: expected {len(old) - 1} stages like old_bounds, got {new!r}")
    a = _reals("alpha_s", [alpha_s])[0]
    b = _reals("beta_s_per_byte", [beta_s_per_byte])[0]

    def owner(bounds: list[int], j: int) -> int:
        return next(s for s in range(len(bounds) - 1) if bounds[s] <= j < bounds[s + 1])

    per_dst: dict[int, float] = {}
    for j in range(len(w)):
        d = owner(new, j)
        if owner(old, j) != d:
            per_dst[d] = per_dst.get(d, 0.0) + a + b * w[j]
    return max(per_dst.values(), default=0.0)


class LayerRebalancer:
    """Monitor stage times, estimate device speeds, re-partition when the gain over a horizon beats the move.

    ``bounds`` is the current partition; ``layer_bytes`` what moving a layer ships (weights + optimizer state);
    ``link`` = dict(alpha_s, beta_s_per_byte); ``smoothing`` the weight of the newest speed measurement (EWMA).
    """

    def __init__(
        self,
        layer_costs: Sequence[float],
        bounds: Sequence[int],
        layer_bytes: Sequence[float],
        link: dict[str, float],
        n_microbatches: int,
        horizon_steps: int,
        *,
        edge_s: Sequence[float] | None = None,
        smoothing: float = 0.5,
    ) -> None:
        self.layer_costs = _reals("layer_costs", layer_costs)
        self.bounds = _check_bounds(bounds, len(self.layer_costs))
        self.layer_bytes = _reals("layer_bytes", layer_bytes, len(self.layer_costs))
        if not isinstance(link, dict) or not {"alpha_s", "beta_s_per_byte"} <= set(link):
            raise ValueError(f"link: expected dict(alpha_s=..., beta_s_per_byte=...), got {link!r}")
        self.link = link
        pipeline_step_time([1.0], n_microbatches)  # validates n_microbatches
        self.n_microbatches = n_microbatches
        if isinstance(horizon_steps, bool) or not isinstance(horizon_steps, int) or horizon_steps < 1:
            raise ValueError(f"horizon_steps: expected an int >= 1, got {horizon_steps!r}")
        self.horizon_steps = horizon_steps
        self.edge_s = edge_s
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing: expected 0 < smoothing <= 1, got {smoothing!r}")
        self.smoothing = float(smoothing)
        self.speeds: list[float] | None = None

    def observe(self, stage_s: Sequence[float]) -> list[float]:
        """Update the speed estimates from measured stage times (edge times removed); returns them."""
        n_st = len(self.bounds) - 1
        t = _reals("stage_s", stage_s, n_st, positive=True)
        send = stage_times([0.0] * len(self.layer_costs), self.bounds, [1.0] * n_st, self.edge_s)
        b, c = self.bounds, self.layer_costs
        meas = [sum(c[b[s] : b[s + 1]]) / max(t[s] - send[s], 1e-12) for s in range(n_st)]
        if self.speeds is None:
            self.speeds = meas
        else:
            a = self.smoothing
            self.speeds = [a * x + (1 - a) * y for x, y in zip(meas, self.speeds, strict=True)]
        return list(self.speeds)

    def propose(self) -> dict[str, Any]:
        """The optimal partition for the estimated speeds, its gain per step, the migration time, and the decision
        ``migrate`` = horizon_steps · gain > migration_s."""
        if self.speeds is None:
            raise ValueError("speeds: nothing observed yet; call observe(stage_s) first")
        new = partition_layers(self.layer_costs, self.speeds, self.edge_s)
        m = self.n_microbatches
        now = pipeline_step_time(stage_times(self.layer_costs, self.bounds, self.speeds, self.edge_s), m)
        then = pipeline_step_time(stage_times(self.layer_costs, new, self.speeds, self.edge_s), m)
        cost = migration_seconds(self.bounds, new, self.layer_bytes, self.link["alpha_s"], self.link["beta_s_per_byte"])
        gain = now - then
        return {"bounds": new, "gain_s": gain, "migration_s": cost, "migrate": self.horizon_steps * gain > cost}

    def step(self, stage_s: Sequence[float]) -> dict[str, Any]:
        """observe + propose, and adopt the new partition when ``migrate``; returns the proposal."""
        self.observe(stage_s)
        prop = self.propose()
        if prop["migrate"]:
            self.bounds = prop["bounds"]
        return prop


def simulate_rebalance(
    rebalancer: LayerRebalancer | None,
    layer_costs: Sequence[float],
    bounds: Sequence[int],
    speeds_at: Callable[[int], Sequence[float]],
    n_steps: int,
    n_microbatches: int,
    edge_s: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Deterministic run: step k's true speeds are ``speeds_at(k)``; stage times follow ``stage_times``; the
    rebalancer (None: static partition) sees them after each step; a migration's time is added to the next step.
    Returns per-step ``step_s`` (incl. migrations), ``bottleneck_s``, ``migrations`` [(step, bounds, seconds)]."""
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"n_steps: expected an int >= 1, got {n_steps!r}")
    cur = _check_bounds(bounds, len(layer_costs))
    step_s, bottleneck, migrations, pending = [], [], [], 0.0
    for k in range(n_steps):
        if rebalancer is not None:
            cur = rebalancer.bounds
        t = stage_times(layer_costs, cur, speeds_at(k), edge_s)
        step_s.append(pipeline_step_time(t, n_microbatches) + pending)
        bottleneck.append(max(t))
        pending = 0.0
        if rebalancer is not None:
            prop = rebalancer.step(t)
            if prop["migrate"]:
                migrations.append((k, list(prop["bounds"]), prop["migration_s"]))
                pending = prop["migration_s"]
    return {"step_s": step_s, "bottleneck_s": bottleneck, "migrations": migrations}


def split_batch(batch: int, speeds: Sequence[float]) -> list[int]:
    """Samples per device minimising max n_i / v_i (greedy: each next sample goes where it finishes first)."""
    v = _reals("speeds", speeds, positive=True)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
        raise ValueError(f"batch: expected an int >= 0, got {batch!r}")
    n = [0] * len(v)
    heap = [(1 / v[i], i) for i in range(len(v))]
    heapq.heapify(heap)
    for _ in range(batch):
        _, i = heapq.heappop(heap)
        n[i] += 1
        heapq.heappush(heap, ((n[i] + 1) / v[i], i))
    return n


def simulate_reslicing(
    batch: int,
    speeds_at: Callable[[int], Sequence[float]],
    n_steps: int,
    sample_s: float,
    *,
    adaptive: bool = True,
    smoothing: float = 0.5,
) -> dict[str, Any]:
    """Data parallel over devices with true speeds ``speeds_at(k)``: device i computes n_i samples in
    n_i·sample_s/v_i. Adaptive: the split is re-derived each step by ``split_batch`` from speeds estimated as
    n_i·sample_s / measured time (EWMA); otherwise the equal split is kept. Returns per-step ``step_s`` (the slowest
    device) and ``splits``."""
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"n_steps: expected an int >= 1, got {n_steps!r}")
    ts = _reals("sample_s", [sample_s], positive=True)[0]
    if not 0 < smoothing <= 1:
        raise ValueError(f"smoothing: expected 0 < smoothing <= 1, got {smoothing!r}")
    n_dev = len(_reals("speeds_at(0)", speeds_at(0), positive=True))
    split = split_batch(batch, [1.0] * n_dev)
    est: list[float] | None = None
    step_s, splits = [], []
    for k in range(n_steps):
        v = _reals(f"speeds_at({k})", speeds_at(k), n_dev, positive=True)
        times = [n * ts / x for n, x in zip(split, v, strict=True)]
        step_s.append(max(times))
        splits.append(list(split))
        if adaptive:
            meas = [n * ts / t if t > 0 else (est[i] if est else 1.0) for i, (n, t) in enumerate(zip(split, times))]
            est = meas if est is None else [smoothing * a + (1 - smoothing) * b for a, b in zip(meas, est, strict=True)]
            split = split_batch(batch, est)
    return {"step_s": step_s, "splits": splits}
