"""Rank functions for ``tinylearn.dist.launch`` (importable, so child processes can unpickle them): save a model's
state as Shards from N ranks and load/reshard it on N' ranks.

The state (``global_state``) has the three layouts a trainer produces:

* ``opt.flat`` -- a ZeRO-like flat 1-D fp32 buffer, rank r owns ``shard_bounds(numel, N, r)`` (ceil split);
* ``tp.row`` / ``tp.col`` -- a tensor-parallel 2-D weight split by rows (dim 0) and one split by columns (dim 1);
* ``norm.weight`` -- a replicated tensor saved as the same Shard by every rank (kept once), ``emb`` -- a whole
  tensor (written by rank 0 only) and ``step`` / ``lr`` -- objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..parallel.zero_sharding import shard_bounds
from .sharded import Shard, load_sharded, save_sharded

FLAT_NUMEL = 1001
ROW_SHAPE = (10, 6)
COL_SHAPE = (6, 11)


def global_state(seed: int = 0) -> dict[str, Any]:
    """The whole (unsharded) state every test compares against."""
    rng = np.random.default_rng(seed)
    return {
        "opt.flat": rng.standard_normal(FLAT_NUMEL).astype(np.float32),
        "tp.row": rng.standard_normal(ROW_SHAPE).astype(np.float32),
        "tp.col": rng.standard_normal(COL_SHAPE),
        "norm.weight": rng.standard_normal(7).astype(np.float32),
        "emb": rng.integers(-100, 100, size=(5, 3), dtype=np.int64),
        "step": 7,
        "lr": 0.125,
    }


def col_box(n_cols: int, world_size: int, rank: int, rows: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(offsets, shape) of rank's column block of a (rows, n_cols) weight under the ceil split."""
    lo, hi = shard_bounds(n_cols, world_size, rank)
    return (0, lo), (rows, hi - lo)


def rank_state(rank: int, world_size: int, seed: int = 0) -> dict[str, Any]:
    """Rank ``rank``'s part of ``global_state`` as Shards (nested dicts, as a trainer would hold them)."""
    g = global_state(seed)
    lo, hi = shard_bounds(FLAT_NUMEL, world_size, rank)
    rlo, rhi = shard_bounds(ROW_SHAPE[0], world_size, rank)
    (o0, o1), (r, c) = col_box(COL_SHAPE[1], world_size, rank, COL_SHAPE[0])
    return {
        "opt": {"flat": Shard(g["opt.flat"][lo:hi], (lo,), (FLAT_NUMEL,))},
        "tp": {
            "row": Shard(g["tp.row"][rlo:rhi], (rlo, 0), ROW_SHAPE),
            "col": Shard(g["tp.col"][:, o1 : o1 + c], (o0, o1), COL_SHAPE),
        },
        "norm": {"weight": Shard(g["norm.weight"].copy(), (0,), g["norm.weight"].shape)},
        "emb": g["emb"],
        "step": g["step"],
        "lr": g["lr"],
    }


def save_rank(path: str, seed: int = 0, async_: bool = False) -> dict[str, Any]:
    """Save this rank's Shards into ``path`` (inside a launch: rank/world_size from torch.distributed)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    out = save_sharded(rank_state(rank, world, seed), path, step=1, meta={"saved_by": world}, async_=async_)
    man = out.wait() if async_ else out
    return {"rank": rank, "committed": man.committed, "fingerprint": man.fingerprint}


def load_rank(path: str) -> dict[str, Any]:
    """Load this rank's Shards under the current world size: default layout (dim 0 ceil split) for every key but
    ``tp.col``, whose template is the column split. Returns plain arrays + boxes (picklable)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    template = {"tp.col": col_box(COL_SHAPE[1], world, rank, COL_SHAPE[0])}
    got = load_sharded(Path(path), world_size=world, rank=rank, template=template)
    return {k: (v.data, v.offsets) if isinstance(v, Shard) else v for k, v in got.items()}


def save_and_reshard(path: str, new_world: int, seed: int = 0, async_path: str | None = None) -> dict[str, Any]:
    """Save on every rank of the launch, then ranks ``0..new_world-1`` -- a new process group of their own --
    load the checkpoint under the ``new_world`` layout (restart on fewer ranks without a second launch).
    ``async_path``: also save there with ``async_=True`` (rank 0's writer thread commits once every index exists)."""
    import torch.distributed as dist

    saved = save_rank(path, seed)
    if async_path is not None:
        saved["async_committed"] = save_rank(async_path, seed, async_=True)["committed"]
    sub = dist.new_group(list(range(new_world)))  # collective: every rank calls it
    if dist.get_rank() >= new_world:
        return {"saved": saved, "loaded": None}
    rank, world = dist.get_rank(sub), dist.get_world_size(sub)
    template = {"tp.col": col_box(COL_SHAPE[1], world, rank, COL_SHAPE[0])}
    got = load_sharded(Path(path), world_size=world, rank=rank, template=template)
    dist.barrier(group=sub)
    loaded = {k: (v.data, v.offsets) if isinstance(v, Shard) else v for k, v in got.items()}
    return {"saved": saved, "loaded": loaded, "sub_rank": rank, "sub_world": world}
