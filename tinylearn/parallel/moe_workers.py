"""Rank functions for expert parallelism (``tinylearn.parallel.moe_parallel``), run with ``tl.dist.launch``.

``ep_check`` runs one forward/backward of ``ExpertParallelMoE`` on this rank's slice of a seeded batch and returns
the outputs, gradients and gathered stats as numpy (the caller compares them with the dense ``TorchMoE`` built by
``build_dense`` from the same seed, on the batch from ``make_batch``). With ``replicate=True`` it first
measures the load, replicates the busiest rank's hottest expert on the least loaded other rank
(``plan_replication``), then measures again. ``ep_dead_rank`` is the fault drill: rank ``victim`` raises before
the dispatch all-to-all, the survivors report (to ``outdir/rank<r>.json``) the error they got and how long it took.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .moe_parallel import ExpertParallelMoE, TorchMoE, plan_replication

D_MODEL, D_FF, EXPERTS = 8, 16, 4


def build_dense(seed: int, top_k: int, dropless: bool, capacity_factor: float = 1.25) -> TorchMoE:
    torch.manual_seed(seed)
    return TorchMoE(D_MODEL, D_FF, EXPERTS, top_k=top_k, capacity_factor=capacity_factor, dropless=dropless)


def make_batch(seed: int, tokens: int, dense: TorchMoE, skew: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [tokens, d], r [tokens, d]): random tokens (``skew`` > 0 pushes them toward expert 0's router row, so
    expert 0 becomes hot) and the random cotangent r of the loss sum(y * r)."""
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, D_MODEL, generator=gen)
    if skew:
        w0 = dense.router_weight.detach()[0]
        x = x + skew * w0 / w0.norm()
    return x, torch.randn(tokens, D_MODEL, generator=gen)


def _grads(ep: ExpertParallelMoE) -> dict[str, np.ndarray]:
    out = {n: getattr(ep, n).grad.numpy().copy() for n in ("router_weight", "w1", "b1", "w2", "b2")}
    if ep.replica_params is not None:
        for n, p in zip(("w1", "b1", "w2", "b2"), ep.replica_params):
            out["replica_" + n] = p.grad.numpy().copy()
    return out


def ep_check(
    seed: int,
    tokens_per_rank: int,
    top_k: int,
    dropless: bool,
    method: str = "p2p",
    replicate: bool = False,
    skew: float = 0.0,
    capacity_factor: float = 1.25,
) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dense = build_dense(seed, top_k, dropless, capacity_factor)
    x, r = make_batch(seed, tokens_per_rank * world, dense, skew)
    sl = slice(rank * tokens_per_rank, (rank + 1) * tokens_per_rank)
    ep = ExpertParallelMoE(dense, None, method)
    res: dict[str, Any] = {}
    if replicate:
        with torch.no_grad():
            ep(x[sl])
        res["stats_before"] = ep.last_stats
        hot, host = plan_replication(ep.last_stats["processed_per_expert"], world)
        ep.replicate_expert(hot, host)
        res["replica"] = [hot, host]
    y = ep(x[sl])
    (y * r[sl]).sum().backward()
    ep.sync_replica_grads()
    res.update(y=y.detach().numpy().copy(), grads=_grads(ep), stats=ep.last_stats, expert_ids=ep.expert_ids)
    return res


def ep_dead_rank(outdir: str, group_timeout_s: float = 4.0, victim: int = 1, seed: int = 0) -> dict[str, Any]:
    rank = dist.get_rank()
    group = dist.new_group(timeout=timedelta(seconds=group_timeout_s))
    dense = build_dense(seed, 2, True)
    x, _ = make_batch(seed, 16, dense)
    ep = ExpertParallelMoE(dense, group)
    ep(x)  # one healthy step
    if rank == victim:
        raise RuntimeError(f"deliberate failure of rank {victim} before the dispatch all-to-all")
    t0 = time.monotonic()
    try:
        ep(x)
        report = {"error": None, "elapsed_s": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001 - the drill reports whatever came out
        report = {"error": f"{type(e).__name__}: {e}", "elapsed_s": time.monotonic() - t0}
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(report))
    if report["error"]:
        raise RuntimeError(f"rank {rank}: expert-parallel forward failed after peer rank {victim} died")
    return report


def ep_check_many(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``ep_check(**c)`` for every config, in one launch (start-up is paid once)."""
    return [ep_check(**c) for c in configs]
