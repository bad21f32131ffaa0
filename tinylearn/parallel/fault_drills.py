"""Fault drills for the parallel wrappers on real processes (rank functions for ``tl.dist.launch``, 2 ranks).

* ``mismatch_messages()``: every wrapper built with rank-dependent arguments (parameter shapes, a frozen or extra
  parameter, the batch size, the pipeline schedule...). Each must raise ValueError on EVERY rank, naming the first
  difference and each rank's value — never abort inside gloo or deadlock — and leave the group usable.
* ``fault(action, outdir)``: one healthy training step of every feature, then rank ``victim`` exits
  (``os._exit``), raises or hangs (sleeps) while the other rank keeps training. The survivor must fail within the
  group timeout with a message naming the rank it was waiting for and the cause (connection closed / timed out);
  it writes what it saw to ``outdir/rank<r>.json`` (the launcher stops the job at the first failure, so files
  carry the details).

The drills run on a fresh process group with a short timeout (``group_timeout_s``), so a hang costs seconds.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..dist.ddp import DataParallel
from .pipeline import PipelineParallel
from .tensor_parallel import ColumnParallelLinear, DenseMLP, ParallelMLP, RowParallelLinear
from .zero import ZeroOptimizer

FEATURES = ("zero1", "zero2", "zero3", "tp", "pipeline", "ddp")
ACTIONS = ("exit", "raise", "hang")


def _mlp(hidden: int = 8, extra: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 2)]
    return nn.Sequential(*layers, nn.Linear(2, 2)) if extra else nn.Sequential(*layers)


def _zero_step(stage: int, group: Any, model: nn.Module | None = None, **kw: Any) -> Callable[[], None]:
    model = model if model is not None else _mlp()
    opt = ZeroOptimizer(model, torch.optim.SGD, stage=stage, group=group, lr=0.1, **kw)
    x = torch.randn(6, 4)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    return step


def _tp_step(group: Any, batch: int = 2) -> Callable[[], None]:
    torch.manual_seed(0)
    layer = ColumnParallelLinear(4, 4, gather_output=True, group=group)
    x = torch.randn(batch, 4, requires_grad=True)

    def step() -> None:
        layer(x).sum().backward()

    return step


def _pipeline_step(group: Any, schedule: str = "1f1b", m: int = 2) -> Callable[[], None]:
    torch.manual_seed(0)
    pipe = PipelineParallel(nn.Linear(4, 4), schedule=schedule, n_microbatches=m, group=group)
    x, y = torch.randn(4, 4), torch.randn(4, 4)

    def step() -> None:
        pipe.train_step(x, y, nn.functional.mse_loss)

    return step


def _ddp_step(group: Any, model: nn.Module | None = None, **kw: Any) -> Callable[[], None]:
    model = model if model is not None else _mlp()
    dp = DataParallel(model, group=group, **kw)
    x = torch.randn(6, 4)

    def step() -> None:
        model(x).square().mean().backward()
        dp.sync()
        for p in model.parameters():
            p.grad = None

    return step


def _build(feature: str, group: Any) -> Callable[[], None]:
    if feature.startswith("zero"):
        return _zero_step(int(feature[-1]), group)
    if feature == "tp":
        return _tp_step(group)
    if feature == "pipeline":
        return _pipeline_step(group)
    if feature == "ddp":
        return _ddp_step(group, overlap=False)
    raise ValueError(f"feature: expected one of {FEATURES}, got {feature!r}")


def _frozen_bias(rank: int) -> nn.Module:
    model = _mlp()
    if rank == 1:
        model[2].bias.requires_grad_(False)
    return model


def mismatch_messages(
    prefixes: tuple[str, ...] = ("zero", "tp", "pipeline", "ddp"), group_timeout_s: float = 20.0
) -> dict[str, Any]:
    """Run the mismatch cases whose name starts with one of ``prefixes`` on the current ranks; returns
    {case: "Type: message"} plus ``group_usable`` (a plain all-reduce on the same group still works afterwards)."""
    g = dist.new_group(timeout=timedelta(seconds=group_timeout_s))
    r = dist.get_rank(g)
    weight = nn.Parameter(torch.ones(3))
    cases: dict[str, Callable[[], Any]] = {
        "zero1_shape": lambda: _zero_step(1, g, _mlp(hidden=8 + r)),
        "zero2_frozen": lambda: _zero_step(2, g, _frozen_bias(r)),
        "zero3_count": lambda: _zero_step(3, g, _mlp(extra=r == 1)),
        "zero1_dtype": lambda: _zero_step(1, g, _mlp().to(torch.float64 if r else torch.float32)),
        "zero2_bucket_cap": lambda: _zero_step(2, g, bucket_cap_bytes=1024 * (r + 1)),
        "zero3_duplicate": lambda: ZeroOptimizer([weight, weight], torch.optim.SGD, stage=3, group=g, lr=0.1),
        "tp_column_batch": lambda: _tp_step(g, batch=2 + r)(),
        "tp_row_batch": lambda: RowParallelLinear(4, 4, input_is_parallel=True, group=g)(torch.randn(2 + r, 2)),
        "tp_mlp_seq": lambda: ParallelMLP(DenseMLP(4, 8), group=g)(torch.randn(2, 3 + r, 4)),
        "pipeline_schedule": lambda: _pipeline_step(g, schedule="gpipe" if r else "1f1b"),
        "pipeline_microbatches": lambda: _pipeline_step(g, m=2 + 2 * r),
        "ddp_shape": lambda: _ddp_step(g, _mlp(hidden=8 + r)),
        "ddp_algorithm": lambda: _ddp_step(g, algorithm="tree" if r else "ring"),
    }
    out: dict[str, Any] = {}
    for name, make in cases.items():
        if not name.startswith(prefixes):
            continue
        try:
            make()
            out[name] = "no error"
        except Exception as e:  # noqa: BLE001 - the drill reports whatever came out
            out[name] = f"{type(e).__name__}: {e}"
    x = torch.ones(4)
    dist.all_reduce(x, group=g)  # every rank ran the same collectives: the group still works
    out["group_usable"] = float(x[0]) == dist.get_world_size(g)
    return out


def _run_steps(step: Callable[[], None], steps: int) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        for _ in range(steps):
            step()
    except Exception as e:  # noqa: BLE001 - the drill reports whatever came out
        return {"error": f"{type(e).__name__}: {e}", "elapsed_s": time.monotonic() - t0}
    return {"error": None, "elapsed_s": time.monotonic() - t0}


def fault(
    action: str,
    outdir: str,
    features: tuple[str, ...] = FEATURES,
    victim: int = 1,
    group_timeout_s: float = 4.0,
    steps: int = 3,
    with_mismatch: bool = False,
) -> dict[str, Any]:
    """Every feature on its own process group (timeout ``group_timeout_s``) takes one healthy step; then rank
    ``victim`` exits / raises / hangs and the other ranks keep stepping every feature, concurrently (one thread per
    feature, so a hang costs one group timeout in all). A survivor writes {feature: {error, elapsed_s}} to
    ``outdir/rank<r>.json`` and raises RuntimeError if any feature failed (so the launcher stops the job).
    ``with_mismatch`` first runs ``mismatch_messages`` for these features on every rank (to
    ``outdir/mismatch_rank<r>.json``): one launch then checks both."""
    if action not in ACTIONS:
        raise ValueError(f"action: expected one of {ACTIONS}, got {action!r}")
    rank = dist.get_rank()
    if with_mismatch:
        prefixes = tuple(sorted({f.rstrip("123") for f in features}))
        Path(outdir, f"mismatch_rank{rank}.json").write_text(json.dumps(mismatch_messages(prefixes)))
    built = {}
    for f in features:
        built[f] = _build(f, dist.new_group(timeout=timedelta(seconds=group_timeout_s)))
        built[f]()  # one healthy step
    if rank == victim:
        if action == "exit":
            os._exit(7)
        if action == "raise":
            raise RuntimeError(f"deliberate failure of rank {victim} in the middle of training")
        time.sleep(3600)  # hung: the launcher stops it once a survivor has failed
    with ThreadPoolExecutor(max_workers=len(features)) as pool:
        futures = {f: pool.submit(_run_steps, built[f], steps) for f in features}
        report = {f: fut.result() for f, fut in futures.items()}
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(report))
    failed = [f for f in features if report[f]["error"]]
    if failed:
        raise RuntimeError(  # worded as a peer failure: the launcher reports the victim's own failure first
            f"rank {rank}: features {failed} failed after peer rank {victim} did {action!r}; "
            f"first error: {report[failed[0]]['error']}"
        )
    return report


def check_order_drill() -> dict[str, Any]:
    """Per rank: ZeRO-2/3 trained 3 steps with and without ``check_order`` (the per-bucket order all-reduce) give the
    same parameters bitwise; a rank that alone turns the check off is refused at construction (ValueError naming
    ``check_order``) instead of running different collectives than its peer."""
    from .zero import ZeroOptimizer

    rank, out = dist.get_rank(), {}
    for stage in (2, 3):
        finals = []
        for check in (True, False):
            torch.manual_seed(0)
            model = _mlp()
            opt = ZeroOptimizer(model, torch.optim.SGD, stage=stage, lr=0.1, bucket_cap_bytes=64, check_order=check)
            g = torch.Generator().manual_seed(rank)
            for _ in range(3):
                model(torch.randn(6, 4, generator=g)).square().mean().backward()
                opt.step()
                opt.zero_grad()
            with opt.gather_parameters():
                finals.append([p.detach().clone() for p in model.parameters()])
            opt.remove_hooks()
        out[f"stage{stage}_same"] = all(torch.equal(a, b) for a, b in zip(*finals, strict=True))
    try:
        ZeroOptimizer(_mlp(), torch.optim.SGD, stage=2, lr=0.1, check_order=rank == 0)
        out["mismatch"] = "no error"
    except ValueError as e:
        out["mismatch"] = str(e)
    return out
