"""Reference answers: the exercise names bound to tinylearn.dist (thin adapters only)."""

from __future__ import annotations

from tinylearn.dist import cost_model, recursive_doubling_partner, ring_schedule
from tinylearn.dist.compression import topk_error_feedback
from tinylearn.dist.ddp import assign_buckets

__all__ = [
    "ring_schedule",
    "ring_cost",
    "tree_cost",
    "recursive_doubling_partner",
    "assign_buckets",
    "topk_error_feedback",
]


def ring_cost(nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    return cost_model.predict("ring", nbytes, world_size, alpha, beta)


def tree_cost(nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    return cost_model.predict("tree", nbytes, world_size, alpha, beta)
