"""Exercises for notebook 10 (parallel training). Fill in each function; run `pytest exercises/10_parallel_training`.

Single-process simulations: "rank r of N" is just an index; no processes are started. Reference answers live in
tinylearn/parallel (named per function below); `pytest exercises/10_parallel_training --impl=reference` runs them.
"""

from __future__ import annotations

import torch


def shard_bounds(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """ZeRO's partition of a flat tensor: rank r owns [r*s, (r+1)*s) clipped to numel, with s = ceil(numel/N)
    (the tensor is padded to N*s; the last ranks may own fewer elements or none). ValueError for a bad rank.

    Reference: tinylearn/parallel/zero_sharding.py:shard_bounds"""
    raise NotImplementedError


def shard_state(state: dict, world_size: int, rank: int) -> dict:
    """This rank's flat slice (shard_bounds) of every tensor with dim > 0 in a per-parameter optimizer state
    (e.g. Adam's {"step": tensor(3.), "exp_avg": ..., "exp_avg_sq": ...}); 0-dim tensors are copied whole.

    Reference: tinylearn/parallel/zero_sharding.py:shard_state"""
    raise NotImplementedError


def consolidate(shards: list[dict], shape: tuple[int, ...]) -> dict:
    """Inverse of shard_state: given the shards of ranks 0..N-1, rebuild the full state (tensors of ``shape``).

    Reference: tinylearn/parallel/zero_sharding.py:consolidate_state"""
    raise NotImplementedError


def zero_bytes_per_rank(n_params: int, stage: int, world_size: int) -> float:
    """Total bytes per rank for mixed-precision Adam (2-byte params, 2-byte grads, K = 12 bytes of optimizer
    state per parameter) under ZeRO ``stage`` 0 (plain DDP), 1, 2 or 3.

    Reference: tinylearn/parallel/zero_sharding.py:zero_memory_per_rank(...)["total"]"""
    raise NotImplementedError


def one_f_one_b(n_stages: int, n_microbatches: int) -> list[list[tuple[str, int]]]:
    """The 1F1B (PipeDream-flush) schedule: per stage s, w = min(p - s - 1, m) warm-up forwards ("F", i), then
    alternate ("F", next) / ("B", oldest) until every forward ran, then the remaining backwards in order.

    Reference: tinylearn/parallel/schedules.py:pipeline_schedule("1f1b", ...)"""
    raise NotImplementedError


def bubble(n_stages: int, n_microbatches: int, n_chunks: int = 1) -> float:
    """Idle fraction of a pipeline step: (p - 1) / (v*m + p - 1) (v = 1 for GPipe / 1F1B).

    Reference: tinylearn/parallel/schedules.py:bubble_fraction"""
    raise NotImplementedError


def column_parallel_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, world_size: int
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Split ``weight`` (out x in) by output rows over N ranks; return each rank's output X W_r^T + b_r and the
    all-gathered (concatenated along the last dim) result, which must equal F.linear(x, weight, bias).

    Reference: tinylearn/parallel/tensor_parallel.py:simulate_column_parallel"""
    raise NotImplementedError


def row_parallel_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, world_size: int
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Split ``weight`` by input columns (and x's last dim likewise); return each rank's partial product
    X_r W_r^T and the all-reduced sum plus the bias (added once), which must equal F.linear(x, weight, bias).

    Reference: tinylearn/parallel/tensor_parallel.py:simulate_row_parallel"""
    raise NotImplementedError
