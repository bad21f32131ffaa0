"""Incremental checkpoints: fixed-size blocks with hashes, deltas that write only changed blocks, and XOR-diffs.

**Block deltas.** Every tensor's bytes are cut into ``block_size`` blocks (default 256 KiB) and each block gets a
blake2b digest. A *full* checkpoint writes every block; a *delta* writes only the blocks whose digest differs from
the parent's and an index whose entries for the other blocks point at the file (in an older checkpoint directory)
that already holds those bytes. Each index names its ``parent``; ``restore`` walks the chain back to the last full
checkpoint (a missing link is ``CorruptCheckpoint`` naming the file), reads every block from where the tip's index
says it lives and checks its digest: the result is bitwise the saved state. Every ``full_every``-th checkpoint is
full, which bounds the chain. ``compact`` folds a chain into one full checkpoint equal to the tip (new data file,
then the index replaced atomically: the commit) and deletes the directories no kept checkpoint references.

Deltas pay when most bytes do not change between checkpoints: fine-tuning a few layers, embeddings of rare tokens.
With Adam (or any update of every weight) every block changes and a delta costs a full checkpoint plus hashing.

**XOR-diffs** [Q225] for activation checkpoints (pipeline micro-batches): ``xor_delta(prev, new)`` stores
``zlib(shuffle(prev XOR new))``: bits that did not change are zeros, and byte-shuffling (all first bytes, then all
second bytes, ...) groups the float's sign/exponent bytes, which rarely change between nearby steps, into long zero
runs. ``XorChain`` keeps a base and a chain of such diffs; ``merge`` XOR-accumulates diffs (``a^b ^ b^c = a^c``), so a
chain squashes into one diff, and every state is rebuilt bit-exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .async_ckpt import flatten, to_host
from .atomic import CheckpointError, CorruptCheckpoint, IncompleteCheckpoint, atomic_write, read_commit_record

FORMAT = "tinylearn.delta/1"
INDEX = "index.json"


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return int(step)


def _dirname(step: int) -> str:
    return f"step_{step:08d}"


def _blocks(raw: memoryview, bs: int) -> Iterable[memoryview]:
    for i in range(0, len(raw), bs):
        yield raw[i : i + bs]


def _digest(b: memoryview | bytes) -> str:
    return hashlib.blake2b(b, digest_size=16).hexdigest()


def read_index(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The index of one delta checkpoint directory; IncompleteCheckpoint without one, CorruptCheckpoint if torn."""
    p = Path(path) / INDEX
    idx = read_commit_record(p, FORMAT, "index", f"{p}: missing (the checkpoint did not commit)")
    return idx


def list_deltas(root: str | os.PathLike[str]) -> list[int]:
    """Steps of the committed (indexed) checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(d.name[5:]) for d in root.glob("step_*") if d.name[5:].isdigit() and (d / INDEX).is_file())


class DeltaCheckpointer:
    """Full + delta checkpoints of a state dict under ``root``; see the module docstring."""

    def __init__(
        self, root: str | os.PathLike[str], *, block_size: int = 256 * 1024, full_every: int = 8, fsync: bool = True
    ) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be an int > 0, got {block_size!r}")
        if isinstance(full_every, bool) or not isinstance(full_every, int) or full_every < 1:
            raise ValueError(f"full_every must be an int >= 1, got {full_every!r}")
        self.root, self.block_size, self.full_every, self.fsync = Path(root), block_size, full_every, fsync
        self.root.mkdir(parents=True, exist_ok=True)
        self.history: list[dict[str, Any]] = []  # per save: step, kind, bytes_written, blocks_written, blocks_total
        steps = list_deltas(self.root)
        self._last: dict[str, Any] | None = read_index(self.root / _dirname(steps[-1])) if steps else None
        if self._last is not None and self._last["block_size"] != block_size:
            self._last = None  # another block size: the next checkpoint is full

    def save(self, state: Mapping[str, Any], step: int, *, full: bool | None = None) -> dict[str, Any]:
        """Write checkpoint ``step`` (full when ``full`` or every ``full_every``-th); returns its stats."""
        step = _check_step(step)
        last = self._last
        if last is not None:  # re-read: a compact() may have rewritten it to point at other files
            try:
                last = read_index(self.root / _dirname(last["step"]))
            except IncompleteCheckpoint:
                last = None
        if last is not None and step <= last["step"]:
            raise ValueError(f"step {step} is not newer than the last checkpoint step {last['step']}")
        if full is None:
            full = last is None or last["depth"] + 1 >= self.full_every
        d = self.root / _dirname(step)
        d.mkdir(parents=True, exist_ok=True)
        bs, rel = self.block_size, f"{d.name}/data.bin"
        parts: list[memoryview] = []
        offset, nblocks, nwritten, keys, objects = 0, 0, 0, {}, {}
        for k, v in flatten(state).items():
            a = to_host(v)
            if a is None:
                objects[k] = v
                continue
            raw = memoryview(a.reshape(-1)).cast("B") if a.size else memoryview(b"")
            old = None if full or last is None else last["tensors"].get(k)
            if old is not None and (old["dtype"] != a.dtype.str or old["shape"] != list(a.shape)):
                old = None
            refs = []
            for i, blk in enumerate(_blocks(raw, bs)):
                dig = _digest(blk)
                nblocks += 1
                if old is not None and old["blocks"][i][0] == dig:
                    refs.append(old["blocks"][i])
                    continue
                refs.append([dig, rel, offset, len(blk)])
                parts.append(blk)
                offset += len(blk)
                nwritten += 1
            keys[k] = {"dtype": a.dtype.str, "shape": list(a.shape), "blocks": refs}
        atomic_write(self.root / rel, parts, fsync=self.fsync)
        idx = {
            "format": FORMAT,
            "step": step,
            "kind": "full" if full else "delta",
            "parent": None if full else last["step"],
            "depth": 0 if full else last["depth"] + 1,
            "block_size": bs,
            "objects": objects,
            "tensors": keys,
        }
        atomic_write(d / INDEX, json.dumps(idx).encode(), fsync=self.fsync)  # the commit, last
        self._last = idx
        stat = {"step": step, "kind": idx["kind"], "bytes_written": offset, "blocks_written": nwritten}
        stat["blocks_total"] = nblocks
        self.history.append(stat)
        return stat


def chain(root: str | os.PathLike[str], step: int | None = None) -> list[int]:
    """The steps from checkpoint ``step`` (default: the newest) back to its full base, tip first.

    A link whose index is missing raises CorruptCheckpoint naming the missing file."""
    root = Path(root)
    if step is None:
        steps = list_deltas(root)
        if not steps:
            raise IncompleteCheckpoint(f"{root}: no committed checkpoint")
        step = steps[-1]
    step = _check_step(step)
    out, s, child = [], step, None
    while s is not None:
        try:
            idx = read_index(root / _dirname(s))
        except IncompleteCheckpoint:
            if child is None:
                raise
            raise CorruptCheckpoint(
                f"{root / _dirname(s) / INDEX}: missing; it is the parent of checkpoint {child}"
            ) from None
        out.append(s)
        if len(out) > 100_000:
            raise CorruptCheckpoint(f"{root}: parent chain from {step} does not end (a cycle)")
        child, s = s, idx["parent"]
    return out


def restore(root: str | os.PathLike[str], step: int | None = None, *, verify: bool = True) -> dict[str, Any]:
    """Rebuild checkpoint ``step`` (default: newest) bitwise: numpy arrays and objects."""
    root = Path(root)
    steps = chain(root, step)
    idx = read_index(root / _dirname(steps[0]))
    out: dict[str, Any] = dict(idx["objects"])
    files: dict[str, np.memmap | bytes] = {}
    for k, e in idx["tensors"].items():
        a = np.empty(e["shape"], dtype=np.dtype(e["dtype"]))
        dst = memoryview(a.reshape(-1)).cast("B") if a.size else memoryview(bytearray())
        pos = 0
        for dig, rel, off, n in e["blocks"]:
            if rel not in files:
                f = root / rel
                if not f.is_file():
                    raise CorruptCheckpoint(f"{f}: missing (a block of tensor {k!r} of checkpoint {steps[0]})")
                files[rel] = np.memmap(f, dtype=np.uint8, mode="r") if f.stat().st_size else b""
            blk = files[rel][off : off + n]
            if len(blk) != n or (verify and _digest(memoryview(blk)) != dig):
                raise CorruptCheckpoint(f"{root / rel}: block at {off} of tensor {k!r} does not match its digest")
            dst[pos : pos + n] = memoryview(blk)
            pos += n
        if pos != len(dst):
            raise CorruptCheckpoint(f"{root / _dirname(steps[0])}: tensor {k!r} has {pos} of {len(dst)} bytes")
        out[k] = a
    return out


def _referenced(root: Path, step: int) -> set[str]:
    """Directory names checkpoint ``step`` needs: its chain and every directory holding one of its blocks."""
    need = {_dirname(s) for s in chain(root, step)}
    for e in read_index(root / _dirname(step))["tensors"].values():
        need.update(b[1].split("/")[0] for b in e["blocks"])
    return need


def compact(
    root: str | os.PathLike[str], step: int | None = None, *, keep: Iterable[int] = (), fsync: bool = True
) -> dict[str, Any]:
    """Fold the chain ending at ``step`` (default: newest) into one full checkpoint equal to it, then delete the
    checkpoints older than it that are not in ``keep`` and that no kept checkpoint (``step``, every newer one,
    ``keep``) references. Returns {"step", "deleted": [dir names], "bytes_written"}."""
    root = Path(root)
    step = chain(root, step)[0]
    state = restore(root, step) if read_index(root / _dirname(step))["kind"] != "full" else {}
    d = root / _dirname(step)
    idx = read_index(d)
    rel = f"{d.name}/data_full.bin"
    parts, offset, keys = [], 0, {}
    for k, e in idx["tensors"].items() if idx["kind"] != "full" else ():
        a = state[k]
        raw = memoryview(a.reshape(-1)).cast("B") if a.size else memoryview(b"")
        refs = []
        for (dig, *_), blk in zip(e["blocks"], _blocks(raw, idx["block_size"]), strict=True):
            refs.append([dig, rel, offset, len(blk)])
            parts.append(blk)
            offset += len(blk)
        keys[k] = {"dtype": e["dtype"], "shape": e["shape"], "blocks": refs}
    if idx["kind"] != "full":
        atomic_write(root / rel, parts, fsync=fsync)
        new = dict(idx, kind="full", parent=None, depth=0, tensors=keys)
        atomic_write(d / INDEX, json.dumps(new).encode(), fsync=fsync)  # the commit: the tip no longer needs its chain
    keep = {_check_step(s) for s in keep}
    kept = [s for s in list_deltas(root) if s >= step or s in keep]
    needed: set[str] = set()
    for s in kept:
        needed |= _referenced(root, s)
    deleted = []
    for s in list_deltas(root):
        name = _dirname(s)
        if s not in kept and name not in needed:
            shutil.rmtree(root / name)
            deleted.append(name)
    old_data = d / "data.bin"  # the tip's own delta file, unless a newer delta still points into it
    if old_data.exists() and not any(
        b[1] == f"{d.name}/data.bin"
        for s in kept
        for e in read_index(root / _dirname(s))["tensors"].values()
        for b in e["blocks"]
    ):
        old_data.unlink()
    return {"step": step, "deleted": deleted, "bytes_written": offset}


# ---- XOR-diff mode (activation checkpoints) [Q225] -----------------------------------------------------------------


def _shuffle(b: np.ndarray, itemsize: int) -> np.ndarray:
    return b.reshape(-1, itemsize).T.copy().reshape(-1) if itemsize > 1 else b


def _unshuffle(b: np.ndarray, itemsize: int) -> np.ndarray:
    return b.reshape(itemsize, -1).T.copy().reshape(-1) if itemsize > 1 else b


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def xor_delta(prev: np.ndarray, new: np.ndarray, *, shuffle: bool = True, level: int = 6) -> bytes:
    """``zlib(shuffle(prev XOR new))``: the bit-exact difference of two same-shape, same-dtype arrays."""
    prev, new = np.asarray(prev), np.asarray(new)
    if prev.shape != new.shape or prev.dtype != new.dtype:
        raise ValueError(
            f"xor_delta: prev (dtype {prev.dtype}, shape {prev.shape}) and new "
            f"(dtype {new.dtype}, shape {new.shape}) must match"
        )
    x = np.bitwise_xor(_bytes(prev), _bytes(new))
    return zlib.compress(_shuffle(x, new.itemsize if shuffle else 1).tobytes(), level)


def _xor_raw(delta: bytes, nbytes: int, itemsize: int) -> np.ndarray:
    x = np.frombuffer(zlib.decompress(delta), dtype=np.uint8)
    if x.size != nbytes:
        raise CorruptCheckpoint(f"xor delta holds {x.size} bytes, expected {nbytes}")
    return _unshuffle(x, itemsize)


def xor_apply(prev: np.ndarray, delta: bytes, *, shuffle: bool = True) -> np.ndarray:
    """``prev XOR unzlib(delta)``: the array ``xor_delta(prev, new)`` was made from, bit-exactly."""
    prev = np.asarray(prev)
    x = _xor_raw(delta, prev.nbytes, prev.itemsize if shuffle else 1)
    return np.bitwise_xor(_bytes(prev), x).view(prev.dtype).reshape(prev.shape)


class XorChain:
    """A base array and a chain of XOR-diffs; ``get(i)`` rebuilds state i, ``merge(i, j)`` one diff from i to j."""

    def __init__(self, base: np.ndarray, *, shuffle: bool = True, level: int = 6) -> None:
        base = np.ascontiguousarray(base)
        self.dtype, self.shape, self.shuffle, self.level = base.dtype, base.shape, shuffle, level
        self.base = zlib.compress(base.tobytes(), level)
        self.deltas: list[bytes] = []
        self._tip = base.copy()
        self.raw_bytes = base.nbytes  # what storing every state uncompressed would cost

    def append(self, new: np.ndarray) -> int:
        """Add the next state; returns the stored diff's size in bytes."""
        new = np.asarray(new)
        self.deltas.append(xor_delta(self._tip, new, shuffle=self.shuffle, level=self.level))
        self._tip = np.array(new, copy=True)
        self.raw_bytes += new.nbytes
        return len(self.deltas[-1])

    @property
    def stored_bytes(self) -> int:
        return len(self.base) + sum(len(d) for d in self.deltas)

    def _item(self) -> int:
        return self.dtype.itemsize if self.shuffle else 1

    def merge(self, i: int, j: int) -> bytes:
        """One diff taking state ``i`` to state ``j`` (i <= j): the XOR of diffs i+1..j, recompressed."""
        if not 0 <= i <= j <= len(self.deltas):
            raise ValueError(f"merge: need 0 <= i <= j <= {len(self.deltas)}, got i={i}, j={j}")
        n = int(np.prod(self.shape)) * self.dtype.itemsize
        acc = np.zeros(n, np.uint8)
        for d in self.deltas[i:j]:
            acc ^= _xor_raw(d, n, 1)  # shuffled layout is the same for every diff: XOR there, no unshuffle
        return zlib.compress(acc.tobytes(), self.level)

    def get(self, i: int) -> np.ndarray:
        """State ``i`` (0 = base), rebuilt by XOR-accumulating the chain; bit-exact."""
        if not 0 <= i <= len(self.deltas):
            raise ValueError(f"get: i must be in [0, {len(self.deltas)}], got {i}")
        base = np.frombuffer(zlib.decompress(self.base), dtype=self.dtype).reshape(self.shape)
        return xor_apply(base, self.merge(0, i), shuffle=self.shuffle) if i else base.copy()

    def squash(self) -> None:
        """Replace the chain by one diff base -> tip (what a restore needs)."""
        if self.deltas:
            self.deltas = [self.merge(0, len(self.deltas))]


def xor_ratio(prev: np.ndarray, new: np.ndarray, *, shuffle: bool = True) -> float:
    """Compression ratio of the XOR-diff: raw bytes / stored bytes."""
    return np.asarray(new).nbytes / len(xor_delta(prev, new, shuffle=shuffle))


__all__ = [
    "CheckpointError",
    "DeltaCheckpointer",
    "XorChain",
    "chain",
    "compact",
    "list_deltas",
    "read_index",
    "restore",
    "xor_apply",
    "xor_delta",
    "xor_ratio",
]
