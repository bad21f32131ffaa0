"""ZeRO's single-process arithmetic: the memory formula per rank (``zero_memory_per_rank``, paper §5 / Figure 1),
a rank's shard range of a flat tensor (``shard_bounds``: slices of ceil(numel/N) elements) and the sharding of an
optimizer's per-parameter state (``shard_state`` / ``consolidate_state``). ``tinylearn.parallel.zero.ZeroOptimizer``
shards with the same ceil(numel/N) rule, and the tests check its measured bytes and shards against these helpers.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._inputs import as_int, is_int

_STATE_BYTES = {"adam": 8, "adamw": 8, "sgd": 4}  # fp32 state bytes per parameter (SGD: momentum buffer)


def zero_memory_per_rank(
    n_params: int, stage: int, world_size: int, dtype_bytes: int = 2, optimizer: str = "adam"
) -> dict[str, float]:
    """Bytes per rank for params / grads / optimizer_state / total under ZeRO ``stage`` (0 = plain DDP).

    K (optimizer_state bytes per parameter) = fp32 state (Adam 8, SGD-momentum 4) + 4 for the fp32 master copy
    when the parameters are stored in 16 bits (dtype_bytes < 4): mixed-precision Adam has K = 12.
    """
    n_params = as_int(n_params, "n_params", min=0)
    stage = as_int(stage, "stage", min=0, max=3)
    world_size = as_int(world_size, "world_size", min=1)
    if not is_int(dtype_bytes) or int(dtype_bytes) not in (1, 2, 4, 8):
        raise ValueError(f"dtype_bytes: expected 1, 2, 4 or 8, got {dtype_bytes!r}")
    if not isinstance(optimizer, str) or optimizer.lower() not in _STATE_BYTES:
        raise ValueError(f"optimizer: expected one of {sorted(_STATE_BYTES)}, got {optimizer!r}")
    dtype_bytes = int(dtype_bytes)
    k = _STATE_BYTES[optimizer.lower()] + (4 if dtype_bytes < 4 else 0)
    psi, n = float(n_params), world_size
    params = dtype_bytes * psi / (n if stage >= 3 else 1)
    grads = dtype_bytes * psi / (n if stage >= 2 else 1)
    state = k * psi / (n if stage >= 1 else 1)
    return {"params": params, "grads": grads, "optimizer_state": state, "total": params + grads + state}


def shard_bounds(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s element range [lo, hi) of a flat tensor of ``numel`` elements: slices of s = ceil(numel/N)
    elements (the tensor padded to N·s), so the last ranks may own fewer elements or none."""
    world_size = as_int(world_size, "world_size", min=1)
    rank = as_int(rank, "rank", min=0, max=world_size - 1)
    numel = as_int(numel, "numel", min=0)
    s = math.ceil(numel / world_size)
    return min(rank * s, numel), min((rank + 1) * s, numel)


def shard_state(state: dict[str, torch.Tensor], world_size: int, rank: int) -> dict[str, torch.Tensor]:
    """This rank's flat slice (``shard_bounds``) of every tensor in an optimizer's per-parameter state; 0-dim
    tensors (Adam's step) and non-tensors are replicated."""
    out: dict[str, Any] = {}
    for k, v in state.items():
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            lo, hi = shard_bounds(v.numel(), world_size, rank)
            out[k] = v.reshape(-1)[lo:hi].clone()
        else:
            out[k] = v.clone() if isinstance(v, torch.Tensor) else v
    return out


def consolidate_state(shards: list[dict[str, Any]], shape: torch.Size | tuple[int, ...]) -> dict[str, Any]:
    """Inverse of ``shard_state`` over ranks 0..N-1: concatenate the slices and restore ``shape``."""
    if not shards:
        raise ValueError("shards: expected one state dict per rank, got none")
    out: dict[str, Any] = {}
    for k, v in shards[0].items():
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            out[k] = torch.cat([sh[k].reshape(-1) for sh in shards]).view(shape)
        else:
            out[k] = v
    return out
