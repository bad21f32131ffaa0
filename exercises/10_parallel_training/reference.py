"""Reference answers: the exercise names bound to tinylearn.parallel (thin adapters only)."""

from __future__ import annotations

import torch

from tinylearn.parallel import (
    bubble_fraction,
    consolidate_state,
    pipeline_schedule,
    shard_bounds,
    shard_state,
    simulate_column_parallel,
    simulate_row_parallel,
    zero_memory_per_rank,
)

__all__ = [
    "shard_bounds",
    "shard_state",
    "consolidate",
    "zero_bytes_per_rank",
    "one_f_one_b",
    "bubble",
    "column_parallel_forward",
    "row_parallel_forward",
]


def consolidate(shards: list[dict], shape: tuple[int, ...]) -> dict:
    return consolidate_state(shards, shape)


def zero_bytes_per_rank(n_params: int, stage: int, world_size: int) -> float:
    return zero_memory_per_rank(n_params, stage, world_size)["total"]


def one_f_one_b(n_stages: int, n_microbatches: int) -> list[list[tuple[str, int]]]:
    return pipeline_schedule("1f1b", n_stages, n_microbatches)


def bubble(n_stages: int, n_microbatches: int, n_chunks: int = 1) -> float:
    name = "1f1b" if n_chunks == 1 else "interleaved_1f1b"
    return bubble_fraction(name, n_stages, n_microbatches, n_chunks)


def column_parallel_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, world_size: int
) -> tuple[list[torch.Tensor], torch.Tensor]:
    return simulate_column_parallel(x, weight, bias, world_size)


def row_parallel_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, world_size: int
) -> tuple[list[torch.Tensor], torch.Tensor]:
    return simulate_row_parallel(x, weight, bias, world_size)
