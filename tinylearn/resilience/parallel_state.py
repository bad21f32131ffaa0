"""Tensor-parallel layers and pipeline stages as sharded checkpoints: every rank writes its own shard, any layout
loads it back.

**Tensor parallel** (``tl.parallel.tensor_parallel``): a ``ColumnParallelLinear`` on rank r of t holds rows
[r·out/t, (r+1)·out/t) of the weight and bias (split axis 0), a ``RowParallelLinear`` columns [r·in/t, (r+1)·in/t)
of the weight (split axis 1) and the whole, replicated bias. ``tp_shards(module)`` turns a module tree into
``save_sharded``'s input under the parameter names (``fc1.weight``, ``attn.q.weight``): a split parameter is a
``Shard`` at its offsets in the *global* shape (the dense layer's), a replicated one a whole tensor (rank 0 writes
it), and the manifest's objects record the split axis of every key (``<prefix>split_axis``). The parallel modules
use the dense modules' names (ParallelMLP / DenseMLP: fc1, fc2; ParallelSelfAttention / DenseSelfAttention: q, k, v,
o), so one checkpoint loads into any layout: ``load_tp_state(module, path)`` asks ``load_sharded`` for the box each
parameter covers here -- a row block, a column block, or the whole tensor in a dense module -- and the chunks that
intersect it are read (TP 2 -> 1, 1 -> 2, 2 -> 4: a box intersection, no consolidation step). A checkpoint of
another model (a missing key or another global shape) is a CheckpointError naming the key before anything is set.

**Pipeline stages**: a stage is a slice [first_layer, first_layer + len) of a global ``nn.Sequential``; its
parameters are saved under their *global* layer index (``pp_shards(stage, first_layer)``: the stage's i-th layer
is layer first_layer + i, so its second layer's weight is ``"5.weight"`` in a stage starting at layer 4) as
whole-tensor Shards, so every stage writes its own layers. ``load_pp_state(stage, path, first_layer)`` reads the
layers this stage holds under any other split (2 stages -> 1, 2 -> 3). ``TPState`` and ``PipelineStageState`` are
the ``to_checkpoint`` / ``from_checkpoint`` / ``bytes_needed`` adapters for ``tl.resilience.run``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .._inputs import is_int
from ..parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from .atomic import CheckpointError
from .sharded import Shard, bytes_per_rank, load_sharded, read_manifest

__all__ = ["PipelineStageState", "TPState", "load_pp_state", "load_tp_state", "pp_shards", "tp_shards"]

SPLIT_AXIS = "split_axis"


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy().copy()


def _tp_params(module: nn.Module, prefix: str) -> Iterator[tuple[str, torch.Tensor, int | None, tuple, tuple]]:
    """(key, parameter, split axis or None, offsets, global shape) for every parameter of ``module``."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    for mod_name, mod in module.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            key = f"{prefix}{mod_name + '.' if mod_name else ''}{pname}"
            shape = tuple(p.shape)
            axis = None
            if isinstance(mod, ColumnParallelLinear):
                axis = 0
            elif isinstance(mod, RowParallelLinear) and pname == "weight":
                axis = 1
            if axis is None:
                yield key, p, None, (0,) * len(shape), shape
                continue
            t, r = mod.tp_size, mod.tp_rank
            gshape = shape[:axis] + (shape[axis] * t,) + shape[axis + 1 :]
            offsets = tuple(r * shape[axis] if d == axis else 0 for d in range(len(shape)))
            yield key, p, axis, offsets, gshape


def tp_shards(module: nn.Module, prefix: str = "") -> dict[str, Any]:
    """This rank's part of a (tensor-parallel or dense) module tree for ``save_sharded``; see the module docstring."""
    out: dict[str, Any] = {}
    axes: dict[str, int | None] = {}
    for key, p, axis, offsets, gshape in _tp_params(module, prefix):
        axes[key] = axis
        out[key] = _np(p) if axis is None else Shard(_np(p), offsets, gshape)
    out[f"{prefix}{SPLIT_AXIS}"] = axes
    return out


def _boxes(module: nn.Module, path: Path, prefix: str) -> dict[str, tuple[tuple, tuple, torch.Tensor]]:
    tensors = read_manifest(path)["tensors"]
    boxes = {}
    for key, p, _axis, offsets, gshape in _tp_params(module, prefix):
        if key not in tensors:
            raise CheckpointError(f"{key!r}: not in the checkpoint {path} (a checkpoint of another model)")
        if tuple(tensors[key]["shape"]) != gshape:
            raise CheckpointError(
                f"{key!r}: the checkpoint has global shape {tuple(tensors[key]['shape'])}, this module {gshape} "
                "(a checkpoint of another model)"
            )
        boxes[key] = (offsets, tuple(p.shape), p)
    return boxes


def _install(got: dict[str, Any], boxes: dict[str, tuple[tuple, tuple, torch.Tensor]]) -> None:
    with torch.no_grad():
        for key, (offsets, shape, p) in boxes.items():
            v = got[key]
            a = v.data if isinstance(v, Shard) else np.asarray(v)
            if a.shape != shape:  # saved whole (a dense module, a replicated bias): cut this rank's box out
                a = a[tuple(slice(o, o + s) for o, s in zip(offsets, shape, strict=True))]
            p.copy_(torch.from_numpy(np.array(a)).to(p.dtype))


def load_tp_state(module: nn.Module, path: str | Path, prefix: str = "", max_bytes_per_rank: int | None = None) -> None:
    """Read the box of every parameter of ``module`` (its TP rank's rows / columns, or whole tensors in a dense
    module) from a checkpoint written with ``tp_shards`` at any TP size; see the module docstring."""
    path = Path(path)
    boxes = _boxes(module, path, prefix)
    tpl = {k: (o, s) for k, (o, s, _) in boxes.items()}
    got = load_sharded(
        path, world_size=1, rank=0, template=tpl, keys=list(boxes), max_bytes_per_rank=max_bytes_per_rank
    )
    _install(got, boxes)


def _check_first(first_layer: Any) -> int:
    if not is_int(first_layer) or int(first_layer) < 0:
        raise ValueError(f"first_layer: expected an int >= 0, got {first_layer!r}")
    return int(first_layer)


def _pp_keys(stage: nn.Module, first_layer: int, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(global key, parameter): the stage's i-th child is global layer first_layer + i, whatever its local name (a
    slice of an nn.Sequential keeps the original names, a Sequential built for the stage counts from 0)."""
    if not isinstance(stage, nn.Module):
        raise TypeError(f"stage: expected a torch.nn.Module (an nn.Sequential slice), got {type(stage).__name__}")
    if any(True for _ in stage.named_parameters(recurse=False)):
        raise ValueError("stage: parameters directly on the stage module; expected layers as children (nn.Sequential)")
    for i, (_, child) in enumerate(stage.named_children()):
        for name, p in child.named_parameters():
            yield f"{prefix}{first_layer + i}.{name}", p


def pp_shards(stage: nn.Module, first_layer: int, prefix: str = "") -> dict[str, Any]:
    """A pipeline stage's parameters under their global layer index, as whole-tensor Shards (every stage writes its
    own layers) for ``save_sharded``."""
    first_layer = _check_first(first_layer)
    return {k: Shard(_np(p), (0,) * p.dim(), tuple(p.shape)) for k, p in _pp_keys(stage, first_layer, prefix)}


def load_pp_state(
    stage: nn.Module, path: str | Path, first_layer: int, prefix: str = "", max_bytes_per_rank: int | None = None
) -> None:
    """Read the layers [first_layer, first_layer + len(stage)) of a checkpoint written by any pipeline split."""
    path = Path(path)
    first_layer = _check_first(first_layer)
    tensors = read_manifest(path)["tensors"]
    params = dict(_pp_keys(stage, first_layer, prefix))
    for k, p in params.items():
        if k not in tensors:
            raise CheckpointError(f"{k!r}: not in the checkpoint {path} (another model or another layer numbering)")
        if tuple(tensors[k]["shape"]) != tuple(p.shape):
            raise CheckpointError(
                f"{k!r}: the checkpoint has shape {tuple(tensors[k]['shape'])}, this stage {tuple(p.shape)}"
            )
    got = load_sharded(path, keys=list(params), max_bytes_per_rank=max_bytes_per_rank)
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(torch.from_numpy(np.array(got[k])).to(p.dtype))


class TPState:
    """``tl.resilience.run``'s view of a (tensor-parallel) module: ``to_checkpoint`` / ``from_checkpoint`` /
    ``bytes_needed``."""

    def __init__(self, module: nn.Module, prefix: str = "", max_bytes_per_rank: int | None = None) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
        self.module, self.prefix, self.max_bytes_per_rank = module, prefix, max_bytes_per_rank

    def to_checkpoint(self) -> dict[str, Any]:
        return tp_shards(self.module, self.prefix)

    def bytes_needed(self, path: str | Path) -> int:
        boxes = _boxes(self.module, Path(path), self.prefix)
        tpl = {k: (o, s) for k, (o, s, _) in boxes.items()}
        return bytes_per_rank(path, world_size=1, rank=0, template=tpl, keys=list(boxes))

    def from_checkpoint(self, path: str | Path) -> None:
        load_tp_state(self.module, path, self.prefix, self.max_bytes_per_rank)


class PipelineStageState:
    """``tl.resilience.run``'s view of one pipeline stage (a module, or a ``PipelineParallel``'s ``module``)
    holding global layers [first_layer, ...)."""

    def __init__(self, stage: Any, first_layer: int, prefix: str = "", max_bytes_per_rank: int | None = None) -> None:
        stage = getattr(stage, "module", stage)  # a PipelineParallel: its stage module
        if not isinstance(stage, nn.Module):
            raise TypeError(f"stage: expected a torch.nn.Module or a PipelineParallel, got {type(stage).__name__}")
        self.stage, self.first_layer, self.prefix = stage, _check_first(first_layer), prefix
        self.max_bytes_per_rank = max_bytes_per_rank

    def to_checkpoint(self) -> dict[str, Any]:
        return pp_shards(self.stage, self.first_layer, self.prefix)

    def bytes_needed(self, path: str | Path) -> int:
        return bytes_per_rank(path, keys=[k for k, _ in _pp_keys(self.stage, self.first_layer, self.prefix)])

    def from_checkpoint(self, path: str | Path) -> None:
        load_pp_state(self.stage, path, self.first_layer, self.prefix, self.max_bytes_per_rank)
