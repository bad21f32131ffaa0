"""Save/load timing of one process's checkpoint: tinylearn ``save_sharded`` (sync, with and without fsync) vs
``torch.save`` / ``torch.load`` vs torch DCP (``dcp.save`` / ``dcp.load``, FileSystemWriter/Reader, no_dist), and the
bytes each leaves on disk. Timed with ``tinylearn.bench.Comparison`` (median of ``repeat`` after warm-up).

What differs between them: save_sharded and DCP fsync every file (DCP's ``sync_files=True`` default) and write
raw bytes + a JSON/pickle index; torch.save writes a zip of the tensors' storages and does not fsync (the
"tinylearn (no fsync)" row is the like-for-like comparison with it). The state is four fp32 tensors of
``nbytes / 4`` bytes each. tinygrad's ``nn.state.safe_save`` / ``safe_load`` (one safetensors file of a flat dict of
realized tensors; no sharding, resharding, checksums or fsync) is timed beside them when tinygrad can run here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np

from ..bench.comparators import Comparison, import_tinygrad, tinygrad_status
from ..bench.table import Table
from .sharded import load_sharded, save_sharded

MAX_BYTES = 64 << 20


def _du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_save_load(nbytes_list: list[int] | tuple[int, ...] = (1 << 20, 16 << 20), repeat: int = 3) -> Table:
    """Rows "save N MiB" / "load N MiB" x impl; ``extra["bytes_on_disk"]`` on save rows. Baseline torch.save."""
    for n in nbytes_list:
        if not isinstance(n, int) or not 16 <= n <= MAX_BYTES:
            raise ValueError(f"nbytes_list: each size must be an int in [16, {MAX_BYTES}] bytes, got {n!r}")
    cmp = Comparison("checkpoint save/load (1 process)", baseline="torch.save", warmup=2, repeat=repeat)
    cmp.note("tinylearn and DCP fsync every file; torch.save does not (compare it with 'tinylearn (no fsync)')")
    root = Path(tempfile.mkdtemp(prefix="tl-bench-ckpt-"))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
            for n in nbytes_list:
                _one_size(cmp, n, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return cmp.table


def _one_size(cmp: Comparison, n: int, root: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    rng = np.random.default_rng(0)
    arrs = {f"layer{i}.w": rng.standard_normal(n // 16).astype(np.float32) for i in range(4)}
    tens = {k: torch.from_numpy(v) for k, v in arrs.items()}
    total = sum(a.nbytes for a in arrs.values())
    mib = f"{total / 2**20:g} MiB"
    paths = {"torch.save": root / "pt.pt", "tinylearn": root / "tl", "tinylearn (no fsync)": root / "tl_nofsync"}
    paths["torch DCP"] = root / "dcp"
    tg_ok, tg_reason = tinygrad_status()
    if tg_ok:  # tinygrad's nn.state.safe_save: one safetensors file of a flat dict, no sharding, no fsync
        tg = import_tinygrad()
        from tinygrad.nn.state import safe_load, safe_save

        tg_tens = {k: tg.Tensor(v).realize() for k, v in arrs.items()}
        paths["tinygrad safe_save"] = root / "tg.safetensors"
    with cmp.case(f"save {mib}", nbytes=total) as c:
        c.add("torch.save", lambda: torch.save(tens, paths["torch.save"]))
        c.add("tinylearn", lambda: save_sharded(arrs, paths["tinylearn"]))
        c.add("tinylearn (no fsync)", lambda: save_sharded(arrs, paths["tinylearn (no fsync)"], fsync=False))
        writer = os.fspath(paths["torch DCP"])
        c.add(
            "torch DCP",
            lambda: dcp.save(tens, storage_writer=dcp.FileSystemWriter(writer, overwrite=True), no_dist=True),
        )
        if tg_ok:
            c.add("tinygrad safe_save", lambda: safe_save(tg_tens, os.fspath(paths["tinygrad safe_save"])))
        else:
            c.unavailable("tinygrad safe_save", tg_reason)
    for r in cmp.table.rows[-5:]:
        if r.impl in paths and paths[r.impl].exists():
            r.extra["bytes_on_disk"] = _du(paths[r.impl])
    tgt = {k: torch.empty_like(v) for k, v in tens.items()}
    with cmp.case(f"load {mib}", nbytes=total) as c:
        c.add("torch.save", lambda: torch.load(paths["torch.save"], weights_only=True), note="torch.load")
        c.add("tinylearn", lambda: load_sharded(paths["tinylearn"]))
        c.add("tinylearn (no crc)", lambda: load_sharded(paths["tinylearn"], verify=False))
        c.add("torch DCP", lambda: dcp.load(tgt, storage_reader=dcp.FileSystemReader(writer), no_dist=True))
        if tg_ok:
            tg_file = os.fspath(paths["tinygrad safe_save"])
            c.add("tinygrad safe_load", lambda: {k: v.to("CPU").realize() for k, v in safe_load(tg_file).items()})
        else:
            c.unavailable("tinygrad safe_load", tg_reason)
