"""Mapping (dp, tp, pp) onto a link hierarchy (NVLink group < PCIe within a node < Ethernet across racks).

Ranks are numbered with one axis innermost: for the order (a, b, c), innermost first, rank = i_a + n_a·(i_b +
n_b·i_c). A process group of axis a (the ranks that differ only in i_a) is an arithmetic progression with stride
= the product of the sizes of the axes inside a; the hierarchy is a list of levels, innermost first, each a block
of ``size`` children of the level below (an NVLink group of 4 GPUs, 2 groups per node over PCIe, 4 nodes over
Ethernet: 32 GPUs). A group *runs on* the slowest level it crosses — the first level whose blocks hold every
member — and its collectives pay that level's α, β (a ring that crosses a slow link waits on it every step).
Assumed: one link per GPU at each level (rail-optimised NICs), so groups do not share bandwidth.

Per training step (the terms of ``plan_3d``'s model, m = global_batch / (dp·b) microbatches, 1F1B):

    tp  (m + pp − 1) · k·L/pp · ring(b·s·h·bytes, tp)       k all-reduces per layer per microbatch
    pp  (m + pp − 1) · 2·(α + β·b·s·h·bytes)                  activation + gradient hand-over
    dp  ring(Ψ/(tp·pp)·bytes, dp)                            the gradient all-reduce, once per step

``map_3d`` scores the 6 orders and sorts them, cheapest first. tp moves activations k·L/pp times per microbatch,
so it lands on NVLink. What goes outermost depends on what fits below the slow level: with tp = 4 on 8-GPU nodes,
(dp, pp) = (4, 2) puts pp on PCIe and dp across Ethernet (dp's gradients once per step cost less there than pp's
~2·m activation hand-overs), while (dp, pp) = (2, 4) keeps dp inside the node and sends pp across (Megatron-LM's
default rank order tp-dp-pp); notebook 10 checks both.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

from ..dist import cost_model


class Level(NamedTuple):
    name: str
    size: int  # children of the level below per block (GPUs per NVLink group at level 0)
    alpha_s: float
    beta_s_per_byte: float


class Placement(NamedTuple):
    order: tuple[str, ...]  # axes innermost first
    levels: dict[str, str]  # axis -> name of the level its groups run on
    comm_s: dict[str, float]  # axis -> seconds per step
    total_s: float


AXES = ("tp", "pp", "dp")


def _int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
    return v


def _check_levels(levels: list[Level] | list[tuple]) -> list[Level]:
    out = []
    for lv in levels:
        try:
            lv = Level(*lv)
        except TypeError:
            raise ValueError(f"levels: expected (name, size, alpha_s, beta_s_per_byte) tuples, got {lv!r}") from None
        _int("levels size", lv.size)
        cost_model.check_nonneg("alpha_s", lv.alpha_s)
        cost_model.check_nonneg("beta_s_per_byte", lv.beta_s_per_byte)
        out.append(lv)
    if not out:
        raise ValueError(f"levels: expected at least one level, got {levels!r}")
    return out


def group_levels(sizes: dict[str, int], order: tuple[str, ...], levels: list[Level]) -> dict[str, int]:
    """Index of the level each axis's groups run on (the first level whose blocks contain every group member)."""
    lv = _check_levels(levels)
    if sorted(order) != sorted(sizes) or len(set(order)) != len(order):
        raise ValueError(f"order: expected a permutation of {sorted(sizes)}, got {order!r}")
    world = 1
    for a in order:
        world *= _int(f"sizes[{a!r}]", sizes[a])
    blocks, acc = [], 1
    for x in lv:
        acc *= x.size
        blocks.append(acc)
    if blocks[-1] != world:
        raise ValueError(f"levels: the hierarchy holds {blocks[-1]} ranks but the sizes multiply to {world}")
    strides, acc = {}, 1
    for a in order:
        strides[a] = acc
        acc *= sizes[a]
    out = {}
    for a in order:
        level = 0
        for r in range(world):  # every group: its first member r has coordinate 0 on axis a
            if (r // strides[a]) % sizes[a]:
                continue
            members = [r + i * strides[a] for i in range(sizes[a])]
            while len({x // blocks[level] for x in members}) > 1:
                level += 1
        out[a] = level
    return out


def comm_per_step(
    sizes: dict[str, int],
    links: dict[str, Level],
    *,
    n_params: int,
    n_layers: int,
    hidden: int,
    seq_len: int,
    global_batch: int,
    microbatch_size: int = 1,
    dtype_bytes: int = 2,
    tp_allreduces_per_layer: int = 4,
) -> dict[str, float]:
    """Seconds of communication per step for each axis, given the level each axis runs on (module docstring)."""
    dp, tp, pp = (_int(a, sizes[a]) for a in ("dp", "tp", "pp"))
    for name, v in (("n_params", n_params), ("n_layers", n_layers), ("hidden", hidden), ("seq_len", seq_len)):
        _int(name, v)
    _int("global_batch", global_batch)
    _int("microbatch_size", microbatch_size)
    if global_batch % (dp * microbatch_size):
        raise ValueError(
            f"global_batch: {global_batch} is not a multiple of dp·microbatch_size = {dp * microbatch_size}"
        )
    if dtype_bytes not in (2, 4):
        raise ValueError(f"dtype_bytes: expected 2 or 4, got {dtype_bytes!r}")
    m = global_batch // (dp * microbatch_size)
    act = microbatch_size * seq_len * hidden * dtype_bytes
    slots = m + pp - 1
    tl, pl, dl = links["tp"], links["pp"], links["dp"]
    t_tp = (
        slots
        * tp_allreduces_per_layer
        * n_layers
        / pp
        * cost_model.predict("ring", act, tp, tl.alpha_s, tl.beta_s_per_byte)
    )
    t_pp = slots * 2 * (pl.alpha_s + pl.beta_s_per_byte * act) if pp > 1 else 0.0
    t_dp = cost_model.predict("ring", n_params / (tp * pp) * dtype_bytes, dp, dl.alpha_s, dl.beta_s_per_byte)
    return {"tp": t_tp, "pp": t_pp, "dp": t_dp}


def map_3d(dp: int, tp: int, pp: int, levels: list[Level] | list[tuple], **job: Any) -> list[Placement]:
    """Every rank order of (tp, pp, dp), scored by ``comm_per_step`` with each axis on the level its groups
    reach; cheapest first. ``job``: n_params, n_layers, hidden, seq_len, global_batch (+ the optional model
    parameters of ``comm_per_step``)."""
    lv = _check_levels(levels)
    sizes = {"dp": _int("dp", dp), "tp": _int("tp", tp), "pp": _int("pp", pp)}
    out = []
    for order in itertools.permutations(AXES):
        at = group_levels(sizes, order, lv)
        comm = comm_per_step(sizes, {a: lv[at[a]] for a in AXES}, **job)
        out.append(Placement(order, {a: lv[at[a]].name for a in AXES}, comm, sum(comm.values())))
    return sorted(out, key=lambda p: (p.total_s, p.order))
