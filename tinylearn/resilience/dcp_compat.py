"""Conversion between tinylearn's sharded checkpoints and PyTorch Distributed Checkpoint
(``torch.distributed.checkpoint``, "DCP"), through DCP's own public API: ``dcp.save`` / ``dcp.load`` with
``FileSystemWriter`` / ``FileSystemReader`` and ``no_dist=True`` (one process, no process group).

What interoperates (each direction checked by tests/resilience/test_dcp_compat.py):

* ``to_dcp(tl_dir, dcp_dir)``: every tensor of a tinylearn checkpoint, assembled whole from its chunks (any saved
  world size), becomes a CPU ``torch.Tensor`` under the same flattened ``"a.b"`` key; objects (ints, floats,
  strings, lists) become DCP byte entries (pickled by DCP). ``dcp.load`` into a state dict of tensors of the same
  shapes and dtypes -- flat ``"a.b"`` keys or the nested dicts they came from (DCP flattens nested dicts with the
  same dotted keys) -- gets identical bytes.
* ``from_dcp(dcp_dir)``: every tensor entry of a DCP checkpoint, assembled to its global size by DCP's loader
  (so a checkpoint written by any number of DCP ranks), becomes an ``np.ndarray`` under its flattened key; byte
  entries (non-tensor values) come back as the unpickled Python values.
* Dtypes: those numpy has (float16/32/64, int8-64, uint8, bool, complex). bfloat16 raises TypeError naming the key.

What does not carry over: the tinylearn manifest's ``meta``, ``step`` and per-chunk crc32 (DCP has no field for
them: pass ``meta`` again), the rank layout (DCP writes its own files; tinylearn's chunks are merged first), and
DTensor / ShardedTensor placements (from_dcp returns whole arrays; reshard with ``Shard`` + ``save_sharded``).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from .sharded import load_sharded

_NO_PG = "torch.distributed is disabled, unavailable or uninitialized"


def to_dcp(tl_ckpt_dir: str | os.PathLike[str], dcp_dir: str | os.PathLike[str]) -> Path:
    """Write the tinylearn checkpoint ``tl_ckpt_dir`` as a DCP checkpoint in ``dcp_dir`` (created); returns it."""
    import torch
    import torch.distributed.checkpoint as dcp

    flat = load_sharded(tl_ckpt_dir)
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for k, v in flat.items()}
    out = Path(dcp_dir)
    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_PG)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(os.fspath(out)), no_dist=True)
    return out


def from_dcp(dcp_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a DCP checkpoint: {flattened key: np.ndarray (whole tensor) or the saved Python value}."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not (Path(dcp_dir) / ".metadata").is_file():
        raise FileNotFoundError(f"dcp_dir: no DCP .metadata file in {os.fspath(dcp_dir)!r}")
    reader = dcp.FileSystemReader(os.fspath(dcp_dir))
    md = reader.read_metadata()
    state: dict[str, Any] = {}
    for k, v in md.state_dict_metadata.items():
        if isinstance(v, TensorStorageMetadata):
            if v.properties.dtype == torch.bfloat16:
                raise TypeError(f"{k!r}: bfloat16 has no numpy dtype (convert the tensor with .float() before saving)")
            state[k] = torch.empty(v.size, dtype=v.properties.dtype)
        else:
            state[k] = None  # a byte entry: DCP's planner replaces it with the unpickled value
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_PG)
        dcp.load(state, storage_reader=dcp.FileSystemReader(os.fspath(dcp_dir)), no_dist=True)
    return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
