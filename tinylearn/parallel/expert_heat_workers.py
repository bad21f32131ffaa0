"""Rank functions for ``tinylearn.parallel.expert_heat`` (run with ``tl.dist.launch``; the caller builds the dense
reference with ``build_dense`` / ``make_x`` from the same seed and compares).

* ``ep_traffic``: one forward + backward of ``ExpertParallelMoE`` on this rank's slice, with the bytes it sent
  (``traffic_meter``, forward and backward separately) and the rows it dispatched to each rank (``dispatch_rows``).
* ``swap_check``: forward/backward, ``swap_experts`` (weights and accumulated gradients travel), a second
  forward/backward, then a replica through ``ExpertHeat.apply`` and a third forward, its release, and a swap of two
  slots on one rank (must raise): outputs and gradients for the caller to compare with the dense layer (slot s now
  holds logical expert ``slot_expert[s]``).
* ``heat_stream``: a skewed, drifting token stream (MODEL of a topic shift: the hot logical expert changes at fixed
  steps, its strength is noisy) through one EP layer per policy (``None`` = static placement, or ``ExpertHeat``
  keyword arguments); per step the measured rank loads, all-to-all bytes and the decision with its bytes moved.
* ``run_many``: several of the above in one launch (start-up paid once).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .bench_longctx import traffic_meter
from .expert_heat import ExpertHeat, HeatDecision, dispatch_rows, swap_experts
from .moe_parallel import ExpertParallelMoE, TorchMoE, plan_replication

D_MODEL, D_FF = 16, 32


def build_dense(seed: int, experts: int, top_k: int = 1, dropless: bool = True, cf: float = 1.25) -> TorchMoE:
    torch.manual_seed(seed)
    return TorchMoE(D_MODEL, D_FF, experts, top_k=top_k, capacity_factor=cf, dropless=dropless)


def make_x(seed: int, tokens: int, dense: TorchMoE, hot: int = -1, skew: float = 0.0) -> torch.Tensor:
    """Random tokens; ``hot >= 0`` pushes them along that expert's router row by ``skew`` (it becomes hot)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, D_MODEL, generator=gen)
    if hot >= 0 and skew:
        w = dense.router_weight.detach()[hot]
        x = x + skew * w / w.norm()
    return x


def _grads(ep: ExpertParallelMoE) -> dict[str, np.ndarray]:
    return {n: getattr(ep, n).grad.numpy().copy() for n in ("router_weight", "w1", "b1", "w2", "b2")}


def ep_traffic(
    seed: int, experts: int, tokens_per_rank: int, top_k: int = 1, dropless: bool = True, cf: float = 1.25
) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dense = build_dense(seed, experts, top_k, dropless, cf)
    x = make_x(seed + 1, tokens_per_rank * world, dense, hot=0, skew=1.0).requires_grad_(True)  # a layer's input
    r = make_x(seed + 2, tokens_per_rank * world, dense)
    sl = slice(rank * tokens_per_rank, (rank + 1) * tokens_per_rank)
    ep = ExpertParallelMoE(dense)
    rows = dispatch_rows(ep, x[sl].detach())
    with traffic_meter() as fwd:
        y = ep(x[sl])
    with traffic_meter() as bwd:
        (y * r[sl]).sum().backward()
    return {"rows": rows, "fwd_bytes": fwd["p2p_bytes"], "bwd_bytes": bwd["p2p_bytes"], "y": y.detach().numpy(),
            "grads": _grads(ep), "stats": ep.last_stats}  # fmt: skip


def swap_check(seed: int, experts: int, tokens_per_rank: int, slot_a: int, slot_b: int) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dense = build_dense(seed, experts, top_k=2)
    sl = slice(rank * tokens_per_rank, (rank + 1) * tokens_per_rank)
    xs = [make_x(seed + 10 + i, tokens_per_rank * world, dense, hot=i, skew=1.5)[sl] for i in range(3)]
    rs = [make_x(seed + 20 + i, tokens_per_rank * world, dense)[sl] for i in range(2)]
    ep = ExpertParallelMoE(dense)
    (ep(xs[0]) * rs[0]).sum().backward()
    with traffic_meter() as moved:
        swap_experts(ep, slot_a, slot_b)
    y1 = ep(xs[1])
    (y1 * rs[1]).sum().backward()
    ctrl = ExpertHeat(experts, world)  # used here for apply() only
    ctrl.placement[[slot_a, slot_b]] = ctrl.placement[[slot_b, slot_a]]  # the swap done by hand above
    with torch.no_grad():
        ep(xs[2])
        before = dict(ep.last_stats)
        hot_slot, host = plan_replication(before["processed_per_expert"], world)
        d = HeatDecision(ctrl.steps, "replicate", 0.0, 0.0, int(ctrl.slot_expert()[hot_slot]), -1, host, (hot_slot,))
        ctrl.apply(ep, d)
        y2 = ep(xs[2])
        after = dict(ep.last_stats)
        ctrl.apply(ep, HeatDecision(ctrl.steps, "release", 0.0, 0.0, d.expert, -1, host))
        released = [ep.replica is None and ep.replica_params is None, ep(xs[2]).numpy()]
    try:
        swap_experts(ep, 0, 1)
        same_rank_error = ""
    except ValueError as e:
        same_rank_error = str(e)
    return {"y1": y1.detach().numpy(), "y2": y2.numpy(), "grads": _grads(ep), "swap_bytes": moved["p2p_bytes"],
            "before": before, "after": after, "replica": [hot_slot, host], "released": released,
            "same_rank_error": same_rank_error}  # fmt: skip


def stream_x(dense: TorchMoE, seed: int, step: int, tokens: int, schedule: list[int], skew: float) -> torch.Tensor:
    """Step ``step``'s tokens of all ranks: the hot logical expert is ``schedule[step]`` (-1: none), its pull
    ``skew * U(0.5, 1.5)`` (noisy, seeded by (seed, step)) so the instantaneous load crosses thresholds."""
    strength = skew * (0.5 + np.random.default_rng([seed, step]).random())
    return make_x(seed * 1000 + step, tokens, dense, schedule[step], strength)


def heat_stream(
    seed: int,
    experts: int,
    tokens_per_rank: int,
    schedule: list[int],
    skew: float,
    policies: dict[str, dict[str, Any] | None],
) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dense = build_dense(seed, experts)
    sl = slice(rank * tokens_per_rank, (rank + 1) * tokens_per_rank)
    out: dict[str, Any] = {}
    for name, kw in policies.items():
        ep = ExpertParallelMoE(dense)
        ctrl = ExpertHeat(experts, world, **(kw or {}))
        rec: dict[str, list] = {"rank_load": [], "a2a_bytes": [], "rows": [], "decisions": [], "moved_bytes": []}
        for step in range(len(schedule)):
            x = stream_x(dense, seed, step, tokens_per_rank * world, schedule, skew)[sl]
            rec["rows"].append(dispatch_rows(ep, x))
            with torch.no_grad(), traffic_meter() as tm:
                ep(x)
            rec["rank_load"].append(ep.last_stats["rank_load"])
            rec["a2a_bytes"].append(tm["p2p_bytes"])
            ctrl.update(ep.last_stats["processed_per_expert"])
            if kw is None:
                continue
            d = ctrl.decide()
            with traffic_meter() as mv:
                ctrl.apply(ep, d)
            rec["moved_bytes"].append(mv["p2p_bytes"])
            if d.action != "none":
                rec["decisions"].append([step, d.action, d.expert, d.other, d.host, d.imbalance, d.predicted])
        rec["placement"] = ctrl.placement.tolist()
        rec["heat"] = ctrl.heat.tolist()
        out[name] = rec
    return out


def run_many(calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Run ``globals()[name](**kwargs)`` for every (name, kwargs) in one launch."""
    table = {"ep_traffic": ep_traffic, "swap_check": swap_check, "heat_stream": heat_stream}
    return [table[name](**kw) for name, kw in calls]
