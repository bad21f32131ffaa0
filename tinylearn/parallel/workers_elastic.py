"""Rank function for ``tl.dist.launch``: an elastic drill on live processes (shrink N -> N' -> grow back) with
``reshard_zero``, checked three ways:

* at every resize the consolidated optimizer state after equals the state before, bitwise (resharding only copies);
* the whole run equals the same world-size sequence done the restart way (consolidate with ``state_dict()``, hand
  the dict and the parameters to the new world, ``load_state_dict``), bitwise: the ranks of each world sum
  gradients in the same order on both paths;
* it equals a single process that never resized (plain Adam, same global batch per step) within fp32 rounding:
  the world size changes the summation order of the gradient average (``fp32_maxdiff``, not zero in general).

Data: step t's global batch (``global_batch`` rows, from seed t) is re-split over whichever world is training:
rank r of N takes rows ``shard_bounds(global_batch, N, r)``, so every step sees the same examples at any size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .reshard import Transfer, consolidate_bytes, plan_traffic, reshard_plan, reshard_zero
from .workers import tiny_mlp
from .zero import ZeroOptimizer, shard_bounds


def misrouted_plan(numel: int, old_world: int, new_world: int) -> list[Transfer]:
    """``reshard_plan`` with the destinations of the first two equal-length pieces bound for the same new rank
    swapped: same sizes and messages, elements in the wrong place (the checks must catch it)."""
    plan = reshard_plan(numel, old_world, new_world)
    for i, a in enumerate(plan):
        for j in range(i + 1, len(plan)):
            b = plan[j]
            if a.dst_rank == b.dst_rank and a.length == b.length:
                plan[i], plan[j] = a._replace(dst_offset=b.dst_offset), b._replace(dst_offset=a.dst_offset)
                return plan
    return plan


def _global_batch(step: int, rows: int, dims: Sequence[int], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7919 * step + 17)
    return torch.randn(rows, dims[0], generator=g).to(dtype), torch.randn(rows, dims[-1], generator=g).to(dtype)


def _train(model: nn.Module, opt: Any, steps: range, members: list[int], rows: int, dims: Sequence[int]) -> None:
    """DP steps over ``members`` (this process is one of them): each takes its rows of the global batch."""
    dtype = next(model.parameters()).dtype
    lo, hi = shard_bounds(rows, len(members), members.index(dist.get_rank()))
    for step in steps:
        x, y = _global_batch(step, rows, dims, dtype)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[lo:hi]).float(), y[lo:hi].float()).backward()
        opt.step()


def _state_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two consolidated optimizer state dicts hold bitwise the same tensors and values."""
    if a["state"].keys() != b["state"].keys():
        return False
    for i, sa in a["state"].items():
        sb = b["state"][i]
        if sa.keys() != sb.keys():
            return False
        for k, v in sa.items():
            w = sb[k]
            if isinstance(v, torch.Tensor) != isinstance(w, torch.Tensor):
                return False
            if isinstance(v, torch.Tensor) and not (v.dtype == w.dtype and torch.equal(v, w)):
                return False
            if not isinstance(v, torch.Tensor) and v != w:
                return False
    ma, mb = a.get("master_params", {}), b.get("master_params", {})  # fp32 masters of 16-bit parameters
    if ma.keys() != mb.keys() or not all(torch.equal(ma[i], mb[i]) for i in ma):
        return False
    strip = [{k: v for k, v in g.items() if k != "params"} for g in a["param_groups"]]
    return strip == [{k: v for k, v in g.items() if k != "params"} for g in b["param_groups"]]


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _pairs(numels: list[int], prev: list[int], cur: list[int]) -> set[tuple[int, int]]:
    """(old rank, new rank) pairs of different processes that exchange data: state pieces whose owner changes,
    and every old rank's parameter slices to each joining process."""
    pairs = {
        (t.src_rank, t.dst_rank)
        for n in numels
        for t in reshard_plan(n, len(prev), len(cur))
        if prev[t.src_rank] != cur[t.dst_rank]
    }
    joiners = [j for j, r in enumerate(cur) if r not in prev]
    return pairs | {
        (i, j)
        for j in joiners
        for i in range(len(prev))
        if any(shard_bounds(n, len(prev), i)[1] > shard_bounds(n, len(prev), i)[0] for n in numels)
    }


def _group(ranks: list[int], world: int) -> Any:
    return None if ranks == list(range(world)) else dist.new_group(ranks)


def bad_input_messages(model: nn.Module, build: Callable[[Any], ZeroOptimizer], opt: ZeroOptimizer) -> dict[str, str]:
    """What ``reshard_zero`` raises for wrong calls (all raise before any message is sent)."""
    everyone = list(range(dist.get_world_size()))
    me = dist.get_rank()
    torch.manual_seed(0)
    opt3 = ZeroOptimizer(nn.Linear(4, 4), torch.optim.Adam, stage=3)  # collective: every rank builds it
    calls: dict[str, Callable[[], Any]] = {
        "stage3": lambda: reshard_zero(opt3, build, everyone, everyone[:1]),
        "joiner_with_opt": lambda: reshard_zero(opt, build, [r for r in everyone if r != me], everyone),
        "old_ranks_mismatch": lambda: reshard_zero(opt, build, everyone[::-1], everyone),
        "not_a_member": lambda: reshard_zero(None, build, [me + 100], [me + 101]),
        "duplicate_ranks": lambda: reshard_zero(opt, build, everyone, [0, 0]),
        "timeout": lambda: reshard_zero(opt, build, everyone, everyone, timeout_s=-1),
        "build": lambda: reshard_zero(opt, "ZeroOptimizer", everyone, everyone),  # type: ignore[arg-type]
        "plan_numel": lambda: reshard_plan(-1, 4, 2),
        "plan_world": lambda: reshard_plan(8, 0, 2),
        "plan_float": lambda: reshard_plan(8, 4, 2.0),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = "no error"
        except Exception as e:  # noqa: BLE001 - the messages are the result
            out[name] = f"{type(e).__name__}: {e}"
    opt3.remove_hooks()
    return out


def elastic_job(
    steps: int = 3,
    global_batch: int = 8,
    dims: tuple[int, ...] = (8, 32, 32, 4),
    leave: tuple[int, ...] = (1, 3),
    grow: bool = True,
    stage: int = 1,
    dtype: str = "float32",
    lr: float = 1e-2,
    plan_fn: Callable[..., list[Transfer]] = reshard_plan,
    timeout_s: float = 30.0,
    bad_inputs: bool = False,
) -> dict[str, Any]:
    """Train ``steps`` ZeRO steps on every launched process, shrink to the processes not in ``leave`` (they send
    their shards and leave the loop as spares), train ``steps``, grow back to all (``grow``), train ``steps``.
    Returns the same summary on every rank (see the module docstring for what is checked)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    everyone = list(range(world))
    stay = [r for r in everyone if r not in leave]
    schedule = [everyone, stay] + ([everyone] if grow else [])
    for members in schedule:
        if global_batch % len(members):
            raise ValueError(f"global_batch: {global_batch} rows do not split evenly over {len(members)} ranks")
    groups = {tuple(m): _group(m, world) for m in schedule}  # every process creates every group, in one order
    model = tiny_mlp(0, dims, getattr(torch, dtype))

    def build(group: Any) -> ZeroOptimizer:
        return ZeroOptimizer(model, torch.optim.Adam, stage=stage, group=group, lr=lr)

    opt: ZeroOptimizer | None = build(None)
    mine: dict[str, Any] = {"rank": rank}
    if bad_inputs:
        mine["bad_inputs"] = bad_input_messages(model, build, opt)
    numels = [p.numel() for p in model.parameters()]
    snapshots: list[tuple[dict[str, Any], list[torch.Tensor]] | None] = []
    _train(model, opt, range(0, steps), everyone, global_batch, dims)
    for phase in range(1, len(schedule)):  # ---------------------------------------- the live path
        prev, cur = schedule[phase - 1], schedule[phase]
        t0 = time.perf_counter()
        sd_before = opt.state_dict() if opt is not None else None  # for the checks and the restart path
        mine[f"consolidate_s_{phase}"] = time.perf_counter() - t0
        snapshots.append((sd_before, _params(model)) if opt is not None else None)
        opt, st = reshard_zero(opt, build, prev, cur, groups[tuple(cur)], timeout_s=timeout_s, plan_fn=plan_fn)
        if opt is not None:
            mine[f"grad_shard_elems_{phase}"] = sum(sl.s for sl in opt.slots)
            sd_after = opt.state_dict()  # collective over the new group: joiners take part too
            if sd_before is not None:
                mine[f"state_equal_{phase}"] = _state_equal(sd_before, sd_after)
            _train(model, opt, range(phase * steps, (phase + 1) * steps), cur, global_batch, dims)
        mine[f"resize_{phase}"] = st
    last = schedule[-1]
    live_sd = opt.state_dict() if opt is not None else None
    live_params = _params(model)
    if opt is not None:
        opt.remove_hooks()

    # ---------------------------------------------------------------- the restart way, same world sizes
    ropt: ZeroOptimizer | None = None
    for phase in range(1, len(schedule)):
        prev, cur = schedule[phase - 1], schedule[phase]
        t0 = time.perf_counter()
        if phase == 1:
            held = snapshots[0]
        else:
            held = (ropt.state_dict(), _params(model)) if ropt is not None else None
        box = [held if rank == prev[0] else None]
        dist.broadcast_object_list(box, src=prev[0])  # "write the checkpoint, every new member reads it"
        if ropt is not None:
            ropt.remove_hooks()
            ropt = None
        if rank in cur:
            sd, params = box[0]
            with torch.no_grad():
                for p, q in zip(model.parameters(), params, strict=True):
                    p.copy_(q)
            ropt = build(groups[tuple(cur)])
            ropt.load_state_dict(sd)  # with the fp32 masters of 16-bit parameters (master_params)
            mine[f"restart_load_s_{phase}"] = time.perf_counter() - t0
            _train(model, ropt, range(phase * steps, (phase + 1) * steps), cur, global_batch, dims)
    if rank in last:
        assert ropt is not None and live_sd is not None
        mine["restart_params_bitwise"] = all(
            torch.equal(a, b) for a, b in zip(_params(model), live_params, strict=True)
        )
        mine["restart_state_bitwise"] = _state_equal(ropt.state_dict(), live_sd)
        ropt.remove_hooks()

    # -------------------------------------------------- a single process that never resized (fp32 runs)
    if rank == 0 and dtype == "float32":
        ref = tiny_mlp(0, dims)
        adam = torch.optim.Adam(ref.parameters(), lr=lr)
        for step in range(len(schedule) * steps):
            x, y = _global_batch(step, global_batch, dims, torch.float32)
            adam.zero_grad()
            nn.functional.mse_loss(ref(x), y).backward()
            adam.step()
        mine["fp32_maxdiff"] = max(float((a - b).abs().max()) for a, b in zip(live_params, _params(ref), strict=True))

    # ------------------------------------------------------------------------------- one summary for all
    per_rank: list[Any] = [None] * world
    dist.all_gather_object(per_rank, mine)
    itemsize = getattr(torch, dtype).itemsize
    n_keys = 2 + (1 if itemsize < 4 else 0)  # Adam's exp_avg, exp_avg_sq (+ the fp32 master of 16-bit params)
    out: dict[str, Any] = {
        "stage": stage,
        "dtype": dtype,
        "steps_per_world": [(len(m), steps) for m in schedule],
        "fp32_maxdiff": per_rank[0].get("fp32_maxdiff"),
        "restart_params_bitwise": all(r["restart_params_bitwise"] for r in per_rank if r["rank"] in last),
        "restart_state_bitwise": all(r["restart_state_bitwise"] for r in per_rank if r["rank"] in last),
        "resizes": [],
    }
    for phase in range(1, len(schedule)):
        prev, cur = schedule[phase - 1], schedule[phase]
        plans = [plan_traffic(reshard_plan(n, len(prev), len(cur)), 4, prev, cur) for n in numels]
        joiners = [r for r in cur if r not in prev]
        stats = [r[f"resize_{phase}"] for r in per_rank]
        out["resizes"].append(
            {
                "from": prev,
                "to": cur,
                "state_equal": all(
                    r[f"state_equal_{phase}"] for r in per_rank if r["rank"] in prev and r["rank"] in cur
                ),
                "sent_bytes": sum(s["sent_bytes"] for s in stats),
                "received_bytes": sum(s["received_bytes"] for s in stats),
                "plan_state_bytes": n_keys * sum(p["moved_bytes"] for p in plans),
                "plan_param_bytes": len(joiners) * sum(numels) * itemsize,
                "plan_messages": len(_pairs(numels, prev, cur)),
                "messages_sent": sum(s["messages_sent"] for s in stats),
                "consolidate_state_bytes": n_keys * sum(consolidate_bytes(n, len(prev), 4) for n in numels),
                "state_bytes": n_keys * sum(numels) * 4,
                "first_ranks_plan_state_bytes": n_keys
                * sum(plan_traffic(reshard_plan(n, len(prev), len(cur)), 4)["moved_bytes"] for n in numels),
                "grad_shard_elems": max(r.get(f"grad_shard_elems_{phase}", 0) for r in per_rank),
                "live_s": max(s["seconds"] for s in stats),
                "consolidate_s": max(r.get(f"consolidate_s_{phase}", 0.0) for r in per_rank)
                + max(r.get(f"restart_load_s_{phase}", 0.0) for r in per_rank),
            }
        )
    if bad_inputs:
        out["bad_inputs"] = per_rank[0]["bad_inputs"]
    return out


# ``tl.dist.launch`` passes arguments by position: named variants for the tests
def elastic_checks() -> dict[str, Any]:
    """The default drill plus the bad-input messages of ``reshard_zero`` / ``reshard_plan``."""
    return elastic_job(bad_inputs=True)


def elastic_variants() -> dict[str, Any]:
    """Two more drills in the same processes (one launch):

    * ``bf16_stage2``: ZeRO-2, bf16 parameters whose sizes do not divide by 4 (padded shards): the fp32 master copy
      moves with the state, the stage-2 gradient buckets are rebuilt for each world;
    * ``misrouted``: one shrink with ``misrouted_plan``: the equality checks must report False."""
    return {
        "bf16_stage2": elastic_job(dims=(6, 30, 30, 3), stage=2, dtype="bfloat16"),
        "misrouted": elastic_job(steps=1, grow=False, plan_fn=misrouted_plan),
    }


def hang_drill(timeout_s: float = 3.0) -> dict[str, Any]:
    """2 ranks: both train one ZeRO-1 step, then rank 1 hangs instead of resizing while rank 0 shrinks to itself.
    Rank 0 must raise a RuntimeError naming rank 1 after about ``timeout_s`` (the launcher then stops rank 1)."""
    rank = dist.get_rank()
    group0 = dist.new_group([0])
    model = tiny_mlp(0)
    opt = ZeroOptimizer(model, torch.optim.Adam, stage=1, lr=1e-2)
    _train(model, opt, range(1), [0, 1], 8, (8, 16, 16, 4))
    if rank == 1:
        time.sleep(20 * timeout_s)  # hung: never reaches the resize
        return {}

    def build(group: Any) -> ZeroOptimizer:
        return ZeroOptimizer(model, torch.optim.Adam, stage=1, group=group, lr=1e-2)

    t0 = time.monotonic()
    try:
        reshard_zero(opt, build, [0, 1], [0], group0, timeout_s=timeout_s)
    except RuntimeError as e:
        raise RuntimeError(f"after {time.monotonic() - t0:.2f} s: {e}") from e
    return {}


def _own_slice(opt: ZeroOptimizer, sl: Any, full: torch.Tensor) -> torch.Tensor:
    """This rank's padded slice of a full tensor, as ZeroOptimizer lays out a parameter's shard."""
    return opt._padded(full.reshape(-1), sl)[opt.rank * sl.s : (opt.rank + 1) * sl.s]


def mixed_checkpoint_check(dims: tuple[int, ...] = (8, 33, 16, 4), steps: int = 3) -> dict[str, Any]:
    """Per rank: a bf16 model under ZeroOptimizer (stages 1-3) trained ``steps`` steps, checkpointed with
    ``state_dict()`` and resumed in a fresh optimizer over the same weights. With the fp32 master copies in the
    checkpoint (``master_params``) the resumed masters and the next step are bitwise those of the original; a plain
    state (no masters) takes the masters from the loaded bf16 weights, so they equal ``param.float()``."""
    from contextlib import nullcontext

    from .workers import _rank_batch

    rank, out = dist.get_rank(), {}
    for stage in (1, 2, 3):
        runs = [
            (m, ZeroOptimizer(m, torch.optim.Adam, stage=stage, lr=1e-2))
            for m in (tiny_mlp(0, dims, torch.bfloat16), tiny_mlp(0, dims, torch.bfloat16))
        ]
        (m0, o0), (m1, o1) = runs
        for step in range(steps):
            x, y = _rank_batch(step, rank, dims, dtype=torch.bfloat16)
            o0.zero_grad()
            nn.functional.mse_loss(m0(x), y).backward()
            o0.step()
        sd = o0.state_dict()
        with o0.gather_parameters() if stage == 3 else nullcontext():
            weights = [p.detach().clone() for p in m0.parameters()]
        with torch.no_grad():  # the "model checkpoint": the resumed model gets the same bf16 weights
            for p, sl, w in zip(m1.parameters(), o1.slots, weights, strict=True):
                if stage == 3:  # stage 3 keeps the weights in its shards
                    sl.p_shard.copy_(_own_slice(o1, sl, w))
                else:
                    p.copy_(w)
        o1.load_state_dict({"state": sd["state"], "param_groups": sd["param_groups"]})  # a plain state: no masters
        out[f"stage{stage}_plain_masters_from_weights"] = all(
            torch.equal(sl.master, _own_slice(o1, sl, w).float()) for sl, w in zip(o1.slots, weights, strict=True)
        )
        o1.load_state_dict(sd)
        out[f"stage{stage}_has_masters"] = "master_params" in sd and len(sd["master_params"]) == len(weights)
        out[f"stage{stage}_masters_bitwise"] = all(
            torch.equal(a.master, b.master) for a, b in zip(o0.slots, o1.slots, strict=True)
        )
        x, y = _rank_batch(steps, rank, dims, dtype=torch.bfloat16)
        for mdl, o in runs:
            o.zero_grad()
            nn.functional.mse_loss(mdl(x), y).backward()
            o.step()
        out[f"stage{stage}_next_step_bitwise"] = all(
            torch.equal(a.master, b.master) for a, b in zip(o0.slots, o1.slots, strict=True)
        )
        for _, o in runs:
            o.remove_hooks()
    return out
