"""The checkpoint manifest: the one file whose existence makes a directory a checkpoint (the commit record).

Layout of ``root/step_{step:08d}/``::

    rank00000.bin    rank 0's tensors' raw bytes, each chunk 64-byte aligned (written with atomic_write)
    rank00000.json   rank 0's index: per key dtype, global shape, chunks (offset, nbytes, offsets, shape, crc32)
    ...              one .bin/.json pair per rank
    manifest.json    written LAST by rank 0 (after every rank's index exists): the commit record

The manifest merges every rank's index: ``format``/``version``, ``step``, ``world_size``, ``fingerprint`` (sha256 of
the sorted ``(key, global shape, dtype)`` list: two checkpoints of the same model have the same fingerprint whatever
their world size), the user's ``meta``, ``tensors`` (per key: ``dtype``, ``shape``, ``sharded``, ``chunks``) and
``objects`` (ints, floats, strings, lists: JSON values). Chunks that are the same box on several ranks (a replicated
Shard) are kept once; the rest must tile the global tensor exactly (no overlap, no gap), checked at commit time.

A writer killed at any byte leaves a directory without manifest.json (or ``.tmp-*`` files): ``list_checkpoints``
reports it with its reason and ``latest_checkpoint`` skips it, so a restart resumes from the last committed step.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .atomic import CheckpointError, CorruptCheckpoint, IncompleteCheckpoint, read_commit_record

FORMAT = "tinylearn-sharded"
VERSION = 1
MANIFEST_NAME = "manifest.json"
ALIGN = 64
_STEP_RE = re.compile(r"^step_(\d+)$")


def rank_bin_name(rank: int) -> str:
    return f"rank{rank:05d}.bin"


def rank_index_name(rank: int) -> str:
    return f"rank{rank:05d}.json"


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    """``root/step_{step:08d}``: where ``save_sharded`` puts the checkpoint of ``step``."""
    return Path(root) / f"step_{int(step):08d}"


def fingerprint(tensors: dict[str, dict[str, Any]]) -> str:
    """sha256 (first 16 hex digits) of the sorted (key, global shape, dtype) list: a model's identity."""
    items = sorted((k, list(v["shape"]), str(v["dtype"])) for k, v in tensors.items())
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]


@dataclass
class Manifest:
    """A parsed manifest (``raw`` is the JSON dict); ``committed`` is False for a rank that wrote its files but
    whose ``save_sharded`` call did not write the manifest (single-process saves of ranks 1..N-1)."""

    path: Path
    step: int | None
    world_size: int
    fingerprint: str
    meta: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    objects: dict[str, Any] = field(default_factory=dict)
    committed: bool = True
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any], path: str | os.PathLike[str], committed: bool = True) -> Manifest:
        return cls(
            Path(path),
            d.get("step"),
            int(d["world_size"]),
            str(d["fingerprint"]),
            dict(d.get("meta") or {}),
            dict(d["tensors"]),
            dict(d.get("objects") or {}),
            committed,
            d,
        )

    def nbytes(self) -> int:
        """Tensor bytes in the checkpoint (the sum of all chunks)."""
        return sum(c["nbytes"] for t in self.tensors.values() for c in t["chunks"])


def _box_overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(
        max(oa, ob) < min(oa + sa, ob + sb)
        for oa, sa, ob, sb in zip(a["offsets"], a["shape"], b["offsets"], b["shape"])
    )


def merge_chunks(key: str, shape: list[int], chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop repeated boxes (replicated Shards: the lowest rank's copy is kept) and check that the rest tile the
    global ``shape`` exactly; raise CheckpointError naming the key otherwise."""
    seen: dict[tuple, dict[str, Any]] = {}
    for c in chunks:
        box = (tuple(c["offsets"]), tuple(c["shape"]))
        if box not in seen:
            seen[box] = c
    out = list(seen.values())
    for i, a in enumerate(out):
        if any(o < 0 or o + s > g for o, s, g in zip(a["offsets"], a["shape"], shape)):
            raise CheckpointError(f"{key!r}: chunk at offsets {a['offsets']} shape {a['shape']} exceeds {shape}")
        for b in out[i + 1 :]:
            if math.prod(a["shape"]) and math.prod(b["shape"]) and _box_overlap(a, b):
                raise CheckpointError(
                    f"{key!r}: chunks overlap but differ: offsets {a['offsets']} shape {a['shape']} vs "
                    f"offsets {b['offsets']} shape {b['shape']}"
                )
    covered = sum(math.prod(c["shape"]) for c in out)
    if covered != math.prod(shape):
        raise CheckpointError(f"{key!r}: the ranks' chunks cover {covered} of {math.prod(shape)} elements")
    return out


def build_manifest(
    indexes: list[dict[str, Any]], step: int | None, world_size: int, meta: dict[str, Any] | None
) -> dict[str, Any]:
    """Merge the per-rank indexes (rank order) into the manifest dict."""
    tensors: dict[str, dict[str, Any]] = {}
    objects: dict[str, Any] = {}
    for idx in indexes:
        for k, t in idx["tensors"].items():
            new = {"dtype": t["dtype"], "shape": t["shape"], "sharded": t["sharded"], "chunks": []}
            cur = tensors.setdefault(k, new)
            if (cur["dtype"], cur["shape"], cur["sharded"]) != (t["dtype"], t["shape"], t["sharded"]):
                raise CheckpointError(
                    f"{k!r}: rank {idx['rank']} saved dtype {t['dtype']} shape {t['shape']} sharded={t['sharded']}, "
                    f"an earlier rank dtype {cur['dtype']} shape {cur['shape']} sharded={cur['sharded']}"
                )
            cur["chunks"].extend(t["chunks"])
        objects.update(idx.get("objects") or {})
    for k, t in tensors.items():
        t["chunks"] = merge_chunks(k, t["shape"], t["chunks"])
    return {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "world_size": world_size,
        "fingerprint": fingerprint(tensors),
        "meta": meta or {},
        "tensors": dict(sorted(tensors.items())),
        "objects": objects,
    }


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest dict of checkpoint directory ``path``.

    No manifest.json: IncompleteCheckpoint (a writer died before its commit). Unparseable or of another format:
    CorruptCheckpoint naming the file.
    """
    f = Path(path) / MANIFEST_NAME
    if not Path(path).is_dir():
        raise IncompleteCheckpoint(f"{os.fspath(path)}: not a directory")
    missing = f"{os.fspath(path)}: no {MANIFEST_NAME} (the save was not committed: a writer died or is still writing)"
    d = read_commit_record(f, FORMAT, "manifest", missing)
    if d.get("version") != VERSION:
        raise CorruptCheckpoint(f"{f}: manifest version {d.get('version')!r}, this reader knows {VERSION}")
    for name in ("world_size", "fingerprint", "tensors"):
        if name not in d:
            raise CorruptCheckpoint(f"{f}: manifest lacks {name!r}")
    return d


def check_files(path: str | os.PathLike[str], manifest: dict[str, Any]) -> str:
    """ "ok", or why the files the manifest lists are not all there (cheap: sizes only, no checksums)."""
    need: dict[str, int] = {}
    for t in manifest["tensors"].values():
        for c in t["chunks"]:
            need[c["file"]] = max(need.get(c["file"], 0), c["offset"] + c["nbytes"])
    for name, size in sorted(need.items()):
        p = Path(path) / name
        if not p.is_file():
            return f"missing rank file {name}"
        if p.stat().st_size < size:
            return f"rank file {name} has {p.stat().st_size} bytes, the manifest needs {size}"
    return "ok"


def list_checkpoints(root: str | os.PathLike[str]) -> list[tuple[int, Path, str]]:
    """Every ``step_*`` directory under ``root``, oldest first: (step, dir, "ok" | the reason it is not loadable)."""
    out = []
    root = Path(root)
    if not root.is_dir():
        return out
    for d in root.iterdir():
        m = _STEP_RE.match(d.name)
        if not m or not d.is_dir():
            continue
        step = int(m.group(1))
        try:
            man = read_manifest(d)
            reason = check_files(d, man)
            if reason == "ok" and man.get("step") not in (None, step):
                reason = f"manifest says step {man.get('step')}, directory step {step}"
        except CheckpointError as e:
            reason = str(e)
        out.append((step, d, reason))
    return sorted(out, key=lambda t: t[0])


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The newest ``step_*`` directory with a valid manifest and all its files; torn/incomplete ones skipped."""
    ok = [d for _, d, why in list_checkpoints(root) if why == "ok"]
    return ok[-1] if ok else None
