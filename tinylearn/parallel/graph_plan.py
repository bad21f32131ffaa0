"""plan_graph: (dp, tp, pp) and the pipeline stage cuts for a model given as an operator DAG.

A MODEL — an estimate from FLOP and byte counts and an α-β link — not a measurement. It extends ``plan_3d``
(planner.py: L identical layers) to any DAG of ops, with plan_3d's conventions and cost helpers.

Graph: a sequence of ``OpNode``s, each naming its predecessors in ``inputs``. Per op and per sample (one sequence):
``flops`` training FLOPs, forward + backward (a matmul with P weights on s tokens: 6·P·s); ``params``;
``out_bytes`` its output tensor (what a pipeline cut sends, what a TP all-reduce moves); ``saved_bytes`` the
activations kept for the backward; ``tp_dim`` 0 = replicated over the tp ranks, > 0 = sharded along a dimension of
that size (tp must divide it; flops, params and saved bytes are divided by tp); ``tp_allreduces`` ring all-reduces of
its output per microbatch when tp > 1 (a Megatron attention or MLP block: 1 forward + 1 backward = 2).

Chain (``to_chain``): the ops in topological order (Kahn, ties in declaration order). A cut between two positions
sends the distinct tensors made before it and read after it (their bytes summed, one message); it is legal when at
most ``max_cut_tensors`` cross (default 1: a cut inside a residual branch would send the branch and the skip). The
ops between consecutive legal cuts form a block; stages hold whole blocks.

Search (``plan_graph``): every (dp, tp, pp) with dp·tp·pp = world_size (divisors, as plan_3d), tp dividing every
``tp_dim``, pp ≤ blocks, dp·b dividing global_batch, m = global_batch/(dp·b). Stage s holding blocks [i, j) takes,
per microbatch of b samples,

    T_s = b·Σ flops/flops_per_s + Σ tp_allreduces·ring(b·out_bytes, tp) + [pp > 1]·2·(α + β·b·max(cut_in, cut_out))

(an activation p2p forward and a gradient p2p backward; sends to the two neighbours overlap, so the larger cut
counts: for a chain of equal layers plan_3d's 2·(α + β·b·s·h·dtype_bytes)) and holds
zero_memory_per_rank(Ψ_s) + b·Σ saved_bytes·min(pp − s, m) bytes (1F1B: stage s keeps pp − s microbatches).
``min_max_partition`` picks the cuts minimising max_s T_s among the stages that fit (exact DP, O(pp·n²)), and

    step = (m + pp − 1)·max_s T_s + max_s [ring(Ψ_s·dtype_bytes, dp) + optimizer_s_per_param·Ψ_s (/dp if ZeRO ≥ 1)]

For ``layer_chain`` (plan_3d's L identical layers) and pp | L this equals ``estimate_3d`` (tested); for pp ∤ L it
charges the real ⌈L/pp⌉-layer bottleneck where estimate_3d charges L/pp.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from .._inputs import as_int
from ..dist import cost_model
from .divisors import divisors
from .planner import _check_model_args, check_resources
from .zero import zero_memory_per_rank


class OpNode(NamedTuple):
    name: str
    flops: float
    params: float = 0.0
    out_bytes: float = 0.0
    saved_bytes: float = 0.0
    inputs: tuple[str, ...] = ()
    tp_dim: int = 0
    tp_allreduces: int = 0


class Chain(NamedTuple):
    blocks: tuple[tuple[OpNode, ...], ...]  # ops between consecutive legal cuts, in topological order
    cut_bytes: tuple[float, ...]  # per sample, after block i (len(blocks) - 1 entries)
    crossing: tuple[tuple[str, ...], ...]  # the tensors (producer names) each cut sends


class GraphPlan(NamedTuple):
    dp: int
    tp: int
    pp: int
    est_step_s: float
    est_bytes: float  # the fullest stage's rank
    stages: tuple[tuple[str, ...], ...]  # op names per pipeline stage


def check_graph(graph: Sequence[OpNode]) -> list[OpNode]:
    """The ops in topological order (Kahn, ties in declaration order); ValueError naming the op and field for
    duplicate names, unknown inputs, negative or non-finite costs, bad tp fields, and cycles."""
    ops = list(graph)
    if not ops or not all(isinstance(op, OpNode) for op in ops):
        raise ValueError(f"graph: expected a non-empty sequence of OpNode, got {graph!r}")
    names = [op.name for op in ops]
    for op in ops:
        if not isinstance(op.name, str) or not op.name or names.count(op.name) > 1:
            raise ValueError(f"graph: op names must be unique non-empty strings, got {op.name!r}")
        for field in ("flops", "params", "out_bytes", "saved_bytes"):
            cost_model.check_nonneg(f"{op.name}.{field}", getattr(op, field))
        as_int(op.tp_dim, f"{op.name}.tp_dim", min=0)
        as_int(op.tp_allreduces, f"{op.name}.tp_allreduces", min=0)
        if isinstance(op.inputs, str) or not isinstance(op.inputs, Sequence):
            raise ValueError(f"{op.name}.inputs: expected a tuple of op names, got {op.inputs!r}")
        bad = [x for x in op.inputs if x not in names or x == op.name]
        if bad:
            raise ValueError(f"{op.name}.inputs: unknown or self inputs {bad} in {op.inputs!r}; ops are {names}")
    rank = {n: i for i, n in enumerate(names)}
    indeg = {op.name: len(set(op.inputs)) for op in ops}
    users: dict[str, list[OpNode]] = {n: [] for n in names}
    for op in ops:
        for x in set(op.inputs):
            users[x].append(op)
    ready, order = [op for op in ops if not indeg[op.name]], []
    while ready:
        op = ready.pop(0)
        order.append(op)
        for u in users[op.name]:
            indeg[u.name] -= 1
            if not indeg[u.name]:
                ready.append(u)
        ready.sort(key=lambda o: rank[o.name])
    if len(order) < len(ops):
        raise ValueError(f"graph: cycle through ops {sorted(n for n in names if indeg[n])}")
    return order


def to_chain(graph: Sequence[OpNode], max_cut_tensors: int | None = 1) -> Chain:
    """Blocks of the topological order split at every cut that ``max_cut_tensors`` or fewer tensors cross (None:
    every position), with each cut's bytes per sample (module docstring)."""
    if max_cut_tensors is not None:
        as_int(max_cut_tensors, "max_cut_tensors", min=1)
    order = check_graph(graph)
    last_use: dict[str, int] = {}
    for k, op in enumerate(order):
        for x in op.inputs:
            last_use[x] = k
    blocks, cuts, crossing, cur = [], [], [], []
    live: dict[str, float] = {}  # tensors made so far and read later
    for k, op in enumerate(order):
        cur.append(op)
        for x in op.inputs:
            if last_use[x] == k:
                live.pop(x, None)
        if last_use.get(op.name, -1) > k:
            live[op.name] = float(op.out_bytes)
        if k < len(order) - 1 and (max_cut_tensors is None or len(live) <= max_cut_tensors):
            blocks.append(tuple(cur))
            cuts.append(sum(live.values()))
            crossing.append(tuple(live))
            cur = []
    blocks.append(tuple(cur))
    return Chain(tuple(blocks), tuple(cuts), tuple(crossing))


def min_max_partition(n: int, n_stages: int, cost: Callable[[int, int, int], float]) -> tuple[float, list[int]]:
    """Bounds [0, ..., n] splitting n blocks into n_stages contiguous non-empty stages that minimise
    max_s cost(s, bound_s, bound_s+1) (cost inf: stage s may not hold those blocks). Exact DP; (inf, []) when no
    split fits. Values within a relative 1e-9 count as tied and keep the earliest cut."""
    n, n_stages = as_int(n, "n", min=1), as_int(n_stages, "n_stages", min=1, max=n)
    best = [[math.inf] * (n + 1) for _ in range(n_stages + 1)]  # best[s][j]: first j blocks on s stages
    arg = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, n_stages + 1):
        for j in range(s, n - (n_stages - s) + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] < math.inf:
                    cand = max(best[s - 1][i], cost(s - 1, i, j))
                    if cand < best[s][j] * (1 - 1e-9):
                        best[s][j], arg[s][j] = cand, i
    if best[n_stages][n] == math.inf:
        return math.inf, []
    bounds = [n]
    for s in range(n_stages, 0, -1):
        bounds.append(arg[s][bounds[-1]])
    return best[n_stages][n], bounds[::-1]


def layer_chain(
    n_params: float, n_layers: int, hidden: int, seq_len: int, *, dtype_bytes: int = 2, tp_allreduces_per_layer: int = 4
) -> list[OpNode]:
    """plan_3d's model as a DAG: L identical layers in a chain (6·Ψ/L·s FLOPs, 17·dtype_bytes·s·h saved bytes)."""
    n_layers = as_int(n_layers, "n_layers", min=1)
    act, psi, k = float(seq_len * hidden * dtype_bytes), n_params / n_layers, tp_allreduces_per_layer
    return [
        OpNode(f"layer{i}", 6 * psi * seq_len, psi, act, 17 * act, (f"layer{i - 1}",) if i else (), hidden, k)
        for i in range(n_layers)
    ]


def _stage_cost(
    pre: tuple[list[float], list[float], list[float]],
    cut: list[float],
    dp: int,
    pp: int,
    m: int,
    job: dict,
) -> tuple[Callable[[int, int, int], float], Callable[[int, int, int], float]]:
    """(cost, mem) of stage s holding blocks [i, j) for one (dp, tp, pp): seconds per microbatch (inf when it does
    not fit) and bytes per rank. ``pre``: prefix sums over blocks of seconds, parameters and saved bytes."""
    t_pre, psi_pre, saved_pre = pre
    a, beta = job["alpha_s"], job["beta_s_per_byte"]

    def mem(s: int, i: int, j: int) -> float:
        states = zero_memory_per_rank(round(psi_pre[j] - psi_pre[i]), job["zero_stage"], dp, job["dtype_bytes"])
        return states["total"] + (saved_pre[j] - saved_pre[i]) * min(pp - s, m)

    def cost(s: int, i: int, j: int) -> float:
        if mem(s, i, j) > job["memory_per_rank_bytes"]:
            return math.inf
        return t_pre[j] - t_pre[i] + (2 * (a + beta * max(cut[i], cut[j])) if pp > 1 else 0.0)

    return cost, mem


def plan_graph(
    graph: Sequence[OpNode],
    world_size: int,
    global_batch: int,
    memory_per_rank_bytes: float,
    link: dict[str, float] | None = None,
    *,
    flops_per_s: float = 100e12,
    microbatch_size: int = 1,
    zero_stage: int = 1,
    dtype_bytes: int = 2,
    optimizer_s_per_param: float = 0.0,
    max_cut_tensors: int | None = 1,
) -> list[GraphPlan]:
    """Every (dp, tp, pp) that fits, with its best stage cuts, fastest estimated step first (module docstring)."""
    world_size = as_int(world_size, "world_size", min=1)
    global_batch = as_int(global_batch, "global_batch", min=1)
    b = as_int(microbatch_size, "microbatch_size", min=1)
    zero_stage = as_int(zero_stage, "zero_stage", min=0, max=3)
    link = check_resources(memory_per_rank_bytes, link, flops_per_s)
    a, beta = float(link["alpha_s"]), float(link["beta_s_per_byte"])
    _check_model_args(0, dtype_bytes, optimizer_s_per_param)
    job = {"alpha_s": a, "beta_s_per_byte": beta, "zero_stage": zero_stage, "dtype_bytes": dtype_bytes}
    job["memory_per_rank_bytes"] = memory_per_rank_bytes
    chain = to_chain(graph, max_cut_tensors)
    n = len(chain.blocks)
    cut = [0.0, *(b * x for x in chain.cut_bytes), 0.0]  # cut[i]: bytes entering block i (0 at both ends)
    divs = divisors(world_size)
    dims = {op.tp_dim for blk in chain.blocks for op in blk if op.tp_dim}
    out: list[GraphPlan] = []
    for tp in (d for d in divs if all(h % d == 0 for h in dims)):
        pre: tuple[list[float], list[float], list[float]] = ([0.0], [0.0], [0.0])  # seconds, params, saved bytes
        for blk in chain.blocks:  # per microbatch on one tp rank: compute + TP all-reduces; sharded ops / tp
            t = psi = saved = 0.0
            for op in blk:
                sh = tp if op.tp_dim else 1
                t += b * op.flops / sh / flops_per_s
                if op.tp_dim:
                    t += op.tp_allreduces * cost_model.predict("ring", b * op.out_bytes, tp, a, beta)
                psi, saved = psi + op.params / sh, saved + b * op.saved_bytes / sh
            for acc, v in zip(pre, (t, psi, saved)):
                acc.append(acc[-1] + v)
        for pp in (d for d in divs if d <= n and (world_size // tp) % d == 0):
            dp = world_size // (tp * pp)
            if global_batch % (dp * b):
                continue
            m = global_batch // (dp * b)
            cost, mem = _stage_cost(pre, cut, dp, pp, m, job)
            t_mb, bounds = min_max_partition(n, pp, cost)
            if not bounds:
                continue  # no split fits in memory
            spans = list(zip(bounds[:-1], bounds[1:]))
            psi_max = max(pre[1][j] - pre[1][i] for i, j in spans)
            step = (m + pp - 1) * t_mb + cost_model.predict("ring", psi_max * dtype_bytes, dp, a, beta)
            step += optimizer_s_per_param * psi_max / (dp if zero_stage >= 1 else 1)
            stages = tuple(tuple(op.name for blk in chain.blocks[i:j] for op in blk) for i, j in spans)
            out.append(GraphPlan(dp, tp, pp, step, max(mem(s, i, j) for s, (i, j) in enumerate(spans)), stages))
    return sorted(out, key=lambda x: (x.est_step_s, x.est_bytes))
