"""Exercises for notebook 06 (all-reduce). Fill in each function; run `pytest exercises/06_allreduce`.

Conventions: p = world_size ranks, the vector is split into p chunks numbered 0..p-1, n bytes per rank,
a message of m bytes costs alpha + m * beta seconds.

Each stub's NotImplementedError names the library function its reference answer (reference.py) calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def ring_schedule(rank: int, step: int, world_size: int) -> tuple[int, int]:
    """(chunk sent, chunk received) by ``rank`` at ``step`` of ring all-reduce, steps 0 .. 2(p-1)-1.

    Rank r sends to r+1 and receives from r-1. Steps 0..p-2 are reduce-scatter: at step 0 rank r sends its own
    chunk r; the chunk received at step s is reduced and sent on at step s+1. Steps p-1..2p-3 are all-gather:
    rank r starts by sending the chunk it finished reducing, and forwards what it receives.
    Raise ValueError for a step outside the range.
    """
    raise NotImplementedError("reference solution: tinylearn/dist/allreduce_algorithms.py:ring_schedule")


def ring_cost(nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """alpha-beta time of ring all-reduce (reduce-scatter + all-gather); 0 for one rank."""
    raise NotImplementedError("reference solution: tinylearn/dist/cost_model.py:predict")


def tree_cost(nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """alpha-beta time of binomial-tree reduce to rank 0 followed by binomial-tree broadcast, whole vectors
    in every message (ceil(log2 p) rounds each way); 0 for one rank."""
    raise NotImplementedError("reference solution: tinylearn/dist/cost_model.py:predict")


def recursive_doubling_partner(rank: int, round_: int, world_size: int) -> int | None:
    """Partner of ``rank`` in core round ``round_`` of recursive doubling. For p not a power of two the ranks
    >= 2^floor(log2 p) are folded into the first ones beforehand and have no partner (None) in the core rounds."""
    raise NotImplementedError("reference solution: tinylearn/dist/allreduce_algorithms.py:recursive_doubling_partner")


def assign_buckets(param_nbytes: Sequence[int], cap_bytes: int) -> list[list[int]]:
    """Gradient buckets: parameter indices in reverse order (last layer first — its gradient is ready first in
    backward), packed greedily so a bucket's bytes stay <= cap_bytes; a parameter bigger than the cap gets its
    own bucket. Raise ValueError for cap_bytes <= 0."""
    raise NotImplementedError("reference solution: tinylearn/dist/ddp.py:assign_buckets")


def topk_error_feedback(
    grad: torch.Tensor, residual: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One top-k step with error feedback on flat tensors: v = grad + residual; return (indices of the k
    largest |v|, v at those indices, new residual = v with those entries set to 0)."""
    raise NotImplementedError("reference solution: tinylearn/dist/compression.py:topk_error_feedback")
