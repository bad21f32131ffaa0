"""Sharded checkpoints: every rank writes its own chunks, rank 0 commits a manifest, any world size can load.

**Save** (``save_sharded``): the state is flattened (nested dicts become ``"a.b"`` keys, as DCP does). A ``Shard`` is
one rank's chunk of a global tensor (its ``offsets`` in the global index space, DCP's chunk idea); a whole tensor
(numpy / torch / tl.Tensor) is written by rank 0 only; ints, floats, strings, lists go to the manifest's
``objects`` (rank 0's values: other ranks' whole tensors and objects are taken to be replicas). Each rank writes
``rank{r:05d}.bin`` (its chunks' raw bytes, 64-byte aligned, crc32 per chunk) and then ``rank{r:05d}.json`` (its
index), both with ``atomic_write`` (temp file, fsync, rename, fsync dir). After a barrier rank 0 merges the indexes
into ``manifest.json`` -- written LAST: the commit record (see manifest.py) -- and broadcasts success or its error.
Without a process group (ranks saved one after another in one process) the call whose index completes the set
writes the manifest. ``async_=True`` copies every tensor to host memory (the only time the caller is blocked:
``AsyncSave.stall_s``) and writes from a background thread; with a process group, rank 0's thread commits once it
sees every rank's index (no collectives off the main thread).

**Load** (``load_sharded``): ``world_size=None`` assembles whole tensors. ``world_size=N, rank=r`` returns, for every
key saved as Shards, rank r's Shard under the target layout -- ``template[key] = (offsets, shape)`` or by default
dim 0 split by ``shard_bounds``' ceil(n/N) rule (ZeRO's flat layout for 1-D) -- assembled from the saved chunks that
intersect it: resharding M -> N is an intersection of boxes, one read per overlapping chunk.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._inputs import is_int, to_numpy
from .atomic import CheckpointError, CorruptCheckpoint, atomic_write, check_free_space
from .flatten import _is_tensor, _to_json, flatten_state, unflatten
from .manifest import (
    ALIGN,
    MANIFEST_NAME,
    Manifest,
    build_manifest,
    latest_checkpoint,
    list_checkpoints,
    rank_bin_name,
    rank_index_name,
    read_manifest,
    step_dir,
)

__all__ = [
    "AsyncSave",
    "Shard",
    "bytes_per_rank",
    "latest_checkpoint",
    "list_checkpoints",
    "load_sharded",
    "read_manifest",
    "save_sharded",
    "step_dir",
    "unflatten",
]

_PIECE = 1 << 22  # bytes per write() call


@dataclass(frozen=True)
class Shard:
    """One rank's chunk of a global tensor: ``data`` sits at ``offsets`` inside a tensor of ``global_shape``."""

    data: np.ndarray
    offsets: tuple[int, ...]
    global_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        data = to_numpy(self.data, "data")
        object.__setattr__(self, "data", data)
        for name in ("offsets", "global_shape"):
            v = getattr(self, name)
            if not isinstance(v, (tuple, list)) or not all(is_int(i) and int(i) >= 0 for i in v):
                raise ValueError(f"{name}: expected a tuple of non-negative ints, got {v!r}")
            object.__setattr__(self, name, tuple(int(i) for i in v))
        if not (len(self.offsets) == len(self.global_shape) == data.ndim):
            raise ValueError(
                f"offsets {self.offsets}, global_shape {self.global_shape} and data.shape {data.shape} "
                "must have the same length"
            )
        if any(o + s > g for o, s, g in zip(self.offsets, data.shape, self.global_shape)):
            raise ValueError(
                f"data.shape {data.shape} at offsets {self.offsets} does not fit global_shape {self.global_shape}"
            )


class AsyncSave:
    """A save running in a background thread: ``wait()`` -> Manifest (re-raises its error), ``done()``, ``stall_s``."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self._result: Manifest | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _run(self, fn: Callable[[], Manifest]) -> None:
        try:
            self._result = fn()
        except BaseException as e:  # noqa: BLE001 - handed to wait()
            self._error = e

    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> Manifest:
        assert self._thread is not None
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"async checkpoint still writing after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def _contig(a: np.ndarray, key: str, copy: bool) -> np.ndarray:
    if a.dtype == object or a.dtype.kind not in "biufc":
        raise TypeError(f"state[{key!r}]: dtype {a.dtype} cannot be checkpointed (numeric dtypes only)")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.array(a, order="C", copy=True) if copy else np.ascontiguousarray(a)


def _resolve(rank: Any, world_size: Any, group: Any) -> tuple[int, int, Any]:
    """(rank, world_size, group or None): the torch.distributed group is used only when it matches world_size."""
    dist = sys.modules.get("torch.distributed")
    live = dist is not None and dist.is_available() and dist.is_initialized()
    if live and group is None:
        group = dist.group.WORLD
    if world_size is None:
        world_size = dist.get_world_size(group) if live else 1
    if not is_int(world_size) or int(world_size) < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    world_size = int(world_size)
    if rank is None:
        rank = dist.get_rank(group) if live else 0
    if not is_int(rank) or not 0 <= int(rank) < world_size:
        raise ValueError(f"rank: expected an int in [0, world_size={world_size}), got {rank!r}")
    use = live and dist.get_world_size(group) == world_size and dist.get_rank(group) == int(rank)
    return int(rank), world_size, group if use else None


# --------------------------------------------------------------------------------------------------------- save
def _layout(items: list[tuple[str, np.ndarray, tuple[int, ...], tuple[int, ...], bool]], fname: str) -> tuple:
    index: dict[str, Any] = {}
    pos = 0
    plan = []
    for key, a, offsets, gshape, sharded in items:
        pos = -(-pos // ALIGN) * ALIGN
        chunk = {
            "file": fname,
            "offset": pos,
            "nbytes": a.nbytes,
            "offsets": list(offsets),
            "shape": list(a.shape),
            "crc32": zlib.crc32(memoryview(a).cast("B")) if a.nbytes else 0,
        }
        index[key] = {"dtype": a.dtype.str.lstrip("<|="), "shape": list(gshape), "sharded": sharded, "chunks": [chunk]}
        plan.append((pos, a))
        pos += a.nbytes
    return index, plan, pos


def _pieces(
    plan: list[tuple[int, np.ndarray]], on_write: Callable[[int], None] | None, piece: int
) -> Iterator[bytes | memoryview]:
    pos = 0
    for off, a in plan:
        if off > pos:
            yield b"\0" * (off - pos)
            pos = off
        mv = memoryview(a.reshape(-1)).cast("B") if a.nbytes else memoryview(b"")
        for i in range(0, a.nbytes, piece):
            part = mv[i : i + piece]
            yield part
            pos += part.nbytes
            if on_write is not None:
                on_write(pos)


def _read_indexes(d: Path, world_size: int, step: int | None) -> list[dict[str, Any]] | None:
    out = []
    for r in range(world_size):
        try:
            idx = json.loads((d / rank_index_name(r)).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        if idx.get("world_size") != world_size or idx.get("step") != step:
            return None
        out.append(idx)
    return out


def _commit(d: Path, world_size: int, step: int | None, meta: dict[str, Any] | None, fsync: bool) -> Manifest:
    indexes = _read_indexes(d, world_size, step)
    if indexes is None:
        raise CheckpointError(f"{d}: not every rank's index is there to commit (world_size={world_size})")
    man = build_manifest(indexes, step, world_size, meta)
    atomic_write(d / MANIFEST_NAME, json.dumps(man, indent=1).encode(), fsync=fsync)
    return Manifest.from_dict(man, d)


def save_sharded(
    state: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    async_: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    group: Any = None,
    step: int | None = None,
    meta: dict[str, Any] | None = None,
    fsync: bool = True,
    check_space: bool = True,
    on_write: Callable[[int], None] | None = None,
    piece_bytes: int = _PIECE,
) -> Manifest | AsyncSave:
    """Write this rank's part of ``state`` into checkpoint directory ``path`` (created); see the module docstring.

    ``fsync=False`` skips the fsyncs (faster, not crash-safe: benchmarks only). ``check_space`` raises DiskFull
    before writing when the filesystem lacks the bytes. ``on_write(bytes_so_far)`` is called after each piece of
    the rank file (``piece_bytes`` per write call; fault drills). Returns the Manifest (``committed=False`` on a
    rank that did not write it), or an AsyncSave when ``async_``.
    """
    rank, world_size, group = _resolve(rank, world_size, group)
    if not is_int(piece_bytes) or int(piece_bytes) < 1:
        raise ValueError(f"piece_bytes: expected an int >= 1, got {piece_bytes!r}")
    if step is not None and not is_int(step):
        raise TypeError(f"step: expected an int or None, got {step!r}")
    step = None if step is None else int(step)
    if meta is not None and not isinstance(meta, dict):
        raise TypeError(f"meta: expected a dict or None, got {type(meta).__name__}")
    t0 = time.perf_counter()
    flat = flatten_state(state, leaf=(Shard,))
    items, objects = [], {}
    for key, v in flat.items():
        if isinstance(v, Shard):
            items.append((key, _contig(v.data, key, async_), v.offsets, v.global_shape, True))
        elif _is_tensor(v):
            if rank == 0:
                a = _contig(to_numpy(v, f"state[{key!r}]"), key, async_)
                items.append((key, a, (0,) * a.ndim, a.shape, False))
        elif rank == 0:
            objects[key] = _to_json(v)
    if meta is not None:
        json.dumps(meta)  # fail now, not in the commit
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    fname = rank_bin_name(rank)
    index, plan, total = _layout(items, fname)
    stall = time.perf_counter() - t0

    def write() -> Manifest:
        if check_space:
            check_free_space(d, total)
        atomic_write(d / fname, _pieces(plan, on_write, piece_bytes), fsync=fsync)
        idx = {"rank": rank, "world_size": world_size, "step": step, "tensors": index, "objects": objects}
        atomic_write(d / rank_index_name(rank), json.dumps(idx).encode(), fsync=fsync)
        if group is not None and not async_:
            return _commit_group(d, rank, world_size, step, meta, fsync, group)
        if group is not None:  # async with a process group: no collectives off the main thread; rank 0 polls
            if rank != 0:
                return Manifest(d, step, world_size, "", meta or {}, index, objects, committed=False)
            deadline = time.monotonic() + 600
            while _read_indexes(d, world_size, step) is None:
                if time.monotonic() > deadline:
                    raise CheckpointError(f"{d}: the other ranks' indexes did not appear within 600 s")
                time.sleep(0.005)
        if _read_indexes(d, world_size, step) is not None:  # this rank completed the set: commit
            return _commit(d, world_size, step, meta, fsync)
        return Manifest(d, step, world_size, "", meta or {}, index, objects, committed=False)

    if not async_:
        return write()
    out = AsyncSave(stall)
    out._thread = threading.Thread(target=out._run, args=(write,), name="tinylearn-ckpt-writer", daemon=True)
    out._thread.start()
    return out


def _commit_group(
    d: Path, rank: int, world_size: int, step: int | None, meta: dict[str, Any] | None, fsync: bool, group: Any
) -> Manifest:
    import torch.distributed as dist

    dist.barrier(group=group)
    msg: list[Any] = [None]
    if rank == 0:
        try:
            _commit(d, world_size, step, meta, fsync)
        except Exception as e:  # every rank raises the same error
            msg[0] = f"{type(e).__name__}: {e}"
    dist.broadcast_object_list(msg, src=dist.get_global_rank(group, 0), group=group)
    if msg[0] is not None:
        raise CheckpointError(f"{d}: rank 0 could not commit the manifest: {msg[0]}")
    return Manifest.from_dict(read_manifest(d), d)


# --------------------------------------------------------------------------------------------------------- load
def _box_for(key: str, t: dict[str, Any], world_size: int, rank: int, template: Mapping[str, Any] | None) -> tuple:
    shape = tuple(t["shape"])
    if template is not None and key in template:
        spec = template[key]
        if isinstance(spec, Shard):
            _check_same(key, t, spec.global_shape, spec.data.dtype)
            return spec.offsets, spec.data.shape
        offsets, sub = (tuple(int(i) for i in x) for x in spec)
        if (
            len(offsets) != len(shape)
            or len(sub) != len(shape)
            or any(o + s > g for o, s, g in zip(offsets, sub, shape))
        ):
            raise CheckpointError(
                f"template[{key!r}]: offsets {offsets} shape {sub} do not fit the manifest's shape {shape} "
                "(a manifest from another model?)"
            )
        return offsets, sub
    if not shape:
        return (), ()
    from ..parallel.zero_sharding import shard_bounds

    lo, hi = shard_bounds(shape[0], world_size, rank)
    return (lo,) + (0,) * (len(shape) - 1), (hi - lo,) + shape[1:]


def _check_same(key: str, t: dict[str, Any], shape: tuple[int, ...], dtype: Any) -> None:
    mine = (tuple(t["shape"]), np.dtype(t["dtype"]))
    theirs = (tuple(int(s) for s in shape), np.dtype(dtype))
    if mine != theirs:
        raise CheckpointError(
            f"{key!r}: the checkpoint has shape {mine[0]} dtype {mine[1]}, the template shape {theirs[0]} dtype "
            f"{theirs[1]} (a manifest from another model)"
        )


class _Reader:
    def __init__(self, d: Path, verify: bool) -> None:
        self.d, self.verify, self.files = d, verify, {}

    def chunk(self, key: str, c: dict[str, Any], dtype: np.dtype) -> np.ndarray:
        p = self.d / c["file"]
        f = self._open(key, c)
        buf = f.read(c["nbytes"])
        if len(buf) != c["nbytes"]:
            raise CorruptCheckpoint(f"{p}: key {key!r}: {len(buf)} of {c['nbytes']} bytes at offset {c['offset']}")
        if self.verify and zlib.crc32(buf) != c["crc32"]:
            raise CorruptCheckpoint(f"{p}: key {key!r}: crc32 mismatch in bytes [{c['offset']}, +{c['nbytes']})")
        return np.frombuffer(buf, dtype=dtype).reshape(c["shape"])

    def _open(self, key: str, c: dict[str, Any]) -> Any:
        p = self.d / c["file"]
        if c["file"] not in self.files:
            try:
                self.files[c["file"]] = open(p, "rb")  # noqa: SIM115 - closed in close()
            except FileNotFoundError:
                raise CorruptCheckpoint(f"{p}: missing rank file (needed for key {key!r})") from None
        f = self.files[c["file"]]
        f.seek(c["offset"])
        return f

    def read_into(self, key: str, c: dict[str, Any], out: np.ndarray) -> None:
        mv = memoryview(out.reshape(-1)).cast("B") if out.nbytes else memoryview(bytearray())
        got = self._open(key, c).readinto(mv) if out.nbytes else 0
        p = self.d / c["file"]
        if got != c["nbytes"]:
            raise CorruptCheckpoint(f"{p}: key {key!r}: {got} of {c['nbytes']} bytes at offset {c['offset']}")
        if self.verify and (zlib.crc32(mv) if out.nbytes else 0) != c["crc32"]:
            raise CorruptCheckpoint(f"{p}: key {key!r}: crc32 mismatch in bytes [{c['offset']}, +{c['nbytes']})")

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def _assemble(rd: _Reader, key: str, t: dict[str, Any], offsets: tuple, shape: tuple) -> np.ndarray:
    dtype = np.dtype(t["dtype"])
    out = np.empty(shape, dtype=dtype)
    for c in t["chunks"]:
        lo = [max(o, co) for o, co in zip(offsets, c["offsets"])]
        hi = [min(o + s, co + cs) for o, s, co, cs in zip(offsets, shape, c["offsets"], c["shape"])]
        if any(h <= lo_ for lo_, h in zip(lo, hi)) and len(shape):
            continue
        if tuple(c["offsets"]) == tuple(offsets) and tuple(c["shape"]) == tuple(shape):
            rd.read_into(key, c, out)  # the chunk is the whole target: read straight into it, no second copy
            continue
        src = rd.chunk(key, c, dtype)
        out[tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, offsets))] = src[
            tuple(slice(a - co, b - co) for a, b, co in zip(lo, hi, c["offsets"]))
        ]
    return out


def _boxes(d: Path, tensors: dict, world_size: int | None, rank: Any, template: Any, keys: Any) -> dict[str, tuple]:
    boxes = {}
    for k in list(tensors) if keys is None else keys:
        if k not in tensors:
            raise CheckpointError(f"keys: {k!r} is not in the checkpoint {d}")
        t = tensors[k]
        sharded = world_size is not None and t["sharded"]
        boxes[k] = (
            _box_for(k, t, world_size, rank, template) if sharded else ((0,) * len(t["shape"]), tuple(t["shape"]))
        )
    return boxes


def _box_bytes(tensors: dict[str, Any], boxes: dict[str, tuple]) -> int:
    return sum(math.prod(s) * np.dtype(tensors[k]["dtype"]).itemsize for k, (_, s) in boxes.items())


def bytes_per_rank(
    path: str | os.PathLike[str],
    *,
    world_size: int | None = None,
    rank: int = 0,
    template: Mapping[str, Any] | None = None,
    keys: list[str] | None = None,
) -> int:
    """Bytes of tensors rank ``rank`` holds after ``load_sharded(path, world_size=..., rank=..., template=...,
    keys=...)`` (the same boxes; nothing is read but the manifest)."""
    if world_size is not None and (not is_int(world_size) or int(world_size) < 1):
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    if world_size is not None and (not is_int(rank) or not 0 <= int(rank) < int(world_size)):
        raise ValueError(f"rank: expected an int in [0, world_size={world_size}), got {rank!r}")
    tensors = read_manifest(Path(path))["tensors"]
    return _box_bytes(tensors, _boxes(Path(path), tensors, world_size, rank, template, keys))


def load_sharded(
    path: str | os.PathLike[str],
    *,
    world_size: int | None = None,
    rank: int | None = None,
    template: Mapping[str, Any] | None = None,
    verify: bool = True,
    max_bytes_per_rank: int | None = None,
    keys: list[str] | None = None,
) -> dict[str, Any]:
    """Read checkpoint directory ``path``: whole tensors (``world_size=None``) or rank ``rank``'s Shards under an
    N-rank layout (see the module docstring); objects come back as saved. Keys are the flattened ``"a.b"`` keys.

    ``template``: per key ``(offsets, shape)`` (target box of this rank), a Shard, or a whole array-like whose
    shape/dtype must match the manifest; a key missing from the checkpoint is a CheckpointError.
    ``max_bytes_per_rank``: ValueError (naming world_size and the bytes) when this rank's tensors would exceed it.
    """
    d = Path(path)
    man = read_manifest(d)
    if world_size is not None:
        if not is_int(world_size) or int(world_size) < 1:
            raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
        world_size = int(world_size)
        if rank is None:
            dist = sys.modules.get("torch.distributed")
            rank = dist.get_rank() if dist is not None and dist.is_initialized() else 0
        if not is_int(rank) or not 0 <= int(rank) < world_size:
            raise ValueError(f"rank: expected an int in [0, world_size={world_size}), got {rank!r}")
        rank = int(rank)
    elif rank is not None:
        raise ValueError(f"rank: given ({rank!r}) without world_size; pass world_size too")
    tensors = man["tensors"]
    if template is not None:
        for k, v in template.items():
            if k not in tensors and k not in (man.get("objects") or {}):
                raise CheckpointError(
                    f"template key {k!r} is not in the checkpoint {d} (a manifest from another model)"
                )
            if k in tensors and not isinstance(v, (Shard, tuple, list)):
                a = to_numpy(v, f"template[{k!r}]")
                _check_same(k, tensors[k], a.shape, a.dtype)
    if max_bytes_per_rank is not None and (not is_int(max_bytes_per_rank) or int(max_bytes_per_rank) < 0):
        raise ValueError(f"max_bytes_per_rank: expected an int >= 0 or None, got {max_bytes_per_rank!r}")
    boxes = _boxes(d, tensors, world_size, rank, template, keys)
    if max_bytes_per_rank is not None:
        need = _box_bytes(tensors, boxes)
        if need > max_bytes_per_rank:
            raise ValueError(
                f"max_bytes_per_rank: rank {rank} of world_size={world_size} needs {need} bytes of tensors, "
                f"more than max_bytes_per_rank={max_bytes_per_rank}"
            )
    out: dict[str, Any] = {}
    rd = _Reader(d, verify)
    try:
        for k, (offsets, shape) in boxes.items():
            t = tensors[k]
            a = _assemble(rd, k, t, offsets, shape)
            out[k] = Shard(a, offsets, tuple(t["shape"])) if world_size is not None and t["sharded"] else a
    finally:
        rd.close()
    if keys is None:
        out.update(man.get("objects") or {})
    return out
