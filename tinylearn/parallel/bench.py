"""Benchmark: tinylearn.parallel vs torch on 2 local processes (gloo, CPU), one launch.

* ZeRO: one Adam training step (MLP 4 x 256x256, batch 32 per rank) — tl ZeRO-1/2/3 vs
  ``torch.distributed.optim.ZeroRedundancyOptimizer`` (torch's ZeRO stage 1) over DDP, torch DDP + Adam and the
  plain DDP built on tl.dist (the reference of the equivalence tests). Baseline: torch DDP + Adam.
* Tensor parallel: forward + backward of a Megatron MLP (256 -> 1024 -> 256, 256 tokens) — tl Column/Row
  layers vs ``torch.distributed.tensor.parallel`` (ColwiseParallel/RowwiseParallel on a CPU DeviceMesh over gloo)
  and the unsplit dense MLP. Baseline: torch TP (if it fails on this build, the error is in the notes).

Times: median over repeats of the slowest rank, between barriers. tinygrad: n/a (no multi-process collectives or
process groups); torch.compile: not applied (the step is communication-bound at these sizes).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..bench.table import Row, Table
from ..dist.launch import launch
from .workers import bench_job


def run(full: bool = False, progress: Callable[[str], None] | None = None, world_size: int = 2) -> list[Table]:
    repeats = 9 if full else 5
    if progress:
        progress(f"parallel: launching {world_size} ranks")
    res = launch(bench_job, world_size, repeats, timeout_s=600)[0]
    z, tp = res["zero"], res["tp"]
    t1 = Table(
        f"ZeRO: Adam training step, MLP {int(z['n_params']):,} params, p={world_size} processes (gloo)",
        baseline="torch DDP + Adam",
    )
    for impl, ms in z.items():
        if impl != "n_params":
            t1.add(Row("train step", impl, ms))
    t1.compute_ratios()
    t1.notes.append(
        "torch ZeroRedundancyOptimizer = ZeRO stage 1 (DDP all-reduce, sharded Adam state, broadcast of the "
        "updated shards); tl ZeRO-2/3 reduce-scatter gradient buckets (25 MB) from backward hooks, ZeRO-3 also "
        "all-gathers every layer's parameters in forward and again in backward (more messages: latency-bound here)"
    )
    t1.notes.append("tinygrad: n/a — no multi-process collectives / process groups; torch.compile: not applied")
    t2 = Table(f"Tensor parallel MLP forward+backward, p={world_size} processes (gloo)", baseline="torch")
    torch_ms = tp.get("torch.distributed.tensor.parallel")
    if torch_ms is not None:
        t2.add(Row("mlp 256x1024", "torch", torch_ms, note="torch.distributed.tensor.parallel"))
    else:
        t2.add(Row("mlp 256x1024", "torch", None, note="failed on gloo/CPU"))
        t2.notes.append(f"torch.distributed.tensor.parallel failed here: {tp.get('torch_tp_error')}")
    t2.add(Row("mlp 256x1024", "tinylearn", tp["tl ColumnParallel/RowParallel"], note="Column/RowParallelLinear"))
    t2.add(Row("mlp 256x1024", "dense (1 rank's work)", tp["dense (every rank, no split)"], note="no split"))
    t2.compute_ratios()
    if "torch_tp_maxdiff" in tp:
        t2.notes.append(f"torch TP output vs dense: max |diff| = {tp['torch_tp_maxdiff']:.2e} (same math)")
    t2.notes.append(
        "both TP versions do one all-reduce forward and one backward; on 2 CPU processes sharing 2 cores the split "
        "halves the matmul work but adds the all-reduces, so 'dense' is the honest single-rank reference"
    )
    t2.notes.append("tinygrad: n/a — no tensor-parallel process groups")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    for t in (t1, t2):
        t.notes.append(
            f"{os.cpu_count()} cores shared by {world_size} ranks (1 thread each), loopback TCP; 1-min load average "
            f"{load:.1f} when the table was printed (other processes distort the times when it exceeds the cores)"
        )
    return [t1, t2]


if __name__ == "__main__":  # pragma: no cover
    for tab in run(full=bool(os.environ.get("TINYLEARN_FULL"))):
        print(tab)
