"""Reference answers for exercises/15_resilient_training, bound to tinylearn.resilience.atomic (crash-consistent
writes), tinylearn.dist.parity (XOR parity over shards) and tinylearn.parallel.checkpoint_interval (Young/Daly); thin
adapters where the exercise's signature differs from the library's."""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tinylearn.dist import parity as _parity
from tinylearn.parallel import checkpoint_interval as _ci
from tinylearn.resilience import atomic as _atomic

TMP_PREFIX = _atomic.TMP_PREFIX
CKPT_PATTERN = r"step_(\d+)\.bin"


# ---------------------------------------------------------------------------------------- (a) atomic checkpoints
def atomic_save(path: str | os.PathLike[str], data: bytes | bytearray | Iterable[bytes]) -> int:
    return _atomic.atomic_write(path, data)


def load_latest(dirpath: str | os.PathLike[str]) -> tuple[int, bytes] | None:
    d = Path(dirpath)
    if not d.is_dir():
        raise FileNotFoundError(f"dirpath: no such directory {os.fspath(dirpath)!r}")
    best: tuple[int, Path] | None = None
    for p in d.iterdir():
        m = re.fullmatch(CKPT_PATTERN, p.name)  # a .tmp-* name never matches: a killed writer's file is skipped
        if m and p.is_file() and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), p)
    return None if best is None else (best[0], best[1].read_bytes())


# ------------------------------------------------------------------------------------------------ (b) XOR parity
def _header(k: int) -> struct.Struct:
    return struct.Struct(f"<I{k}Q")


def xor_parity(shards: list[bytes]) -> bytes:
    if not shards:
        raise ValueError("shards: expected at least one shard, got none")
    raw = [np.frombuffer(bytes(s), dtype=np.uint8) for s in shards]
    size = max(r.size for r in raw)
    padded = np.zeros((len(raw), size), dtype=np.uint8)  # as encode_shards: every shard zero-padded to the longest
    for i, r in enumerate(raw):
        padded[i, : r.size] = r
    body = np.bitwise_xor.reduce(padded, axis=0)
    return _header(len(raw)).pack(len(raw), *(r.size for r in raw)) + body.tobytes()


def rebuild(shards: list[bytes | None], parity: bytes) -> list[bytes]:
    parity = bytes(parity)
    if len(parity) < 4:
        raise ValueError(f"parity: {len(parity)} bytes, shorter than its 4-byte header")
    (k,) = struct.unpack_from("<I", parity)
    head = _header(k)
    if len(parity) < head.size:
        raise ValueError(f"parity: {len(parity)} bytes, shorter than its header for k={k} shards ({head.size})")
    lengths = list(head.unpack_from(parity)[1:])
    size = max(lengths, default=0)
    if len(parity) - head.size != size:
        raise ValueError(f"parity: body of {len(parity) - head.size} bytes, the longest shard is {size}")
    if len(shards) != k:
        raise ValueError(f"shards: expected {k} entries (the parity's k), got {len(shards)}")
    for i, (s, n) in enumerate(zip(shards, lengths, strict=True)):
        if s is not None and len(s) != n:
            raise ValueError(f"shards: shard {i} has {len(s)} bytes, the parity recorded {n}")
    lost = [i for i, s in enumerate(shards) if s is None]
    if len(lost) > 1:
        raise ValueError(f"shards: {len(lost)} lost shards {lost}; one XOR parity rebuilds at most one")
    if not lost:
        return [bytes(s) for s in shards if s is not None]
    frags: list[np.ndarray | None] = []
    for s in shards:  # the ShardCode of tinylearn.dist.parity: k data fragments padded to one length, then P
        if s is None:
            frags.append(None)
        else:
            d = np.zeros(size, dtype=np.uint8)
            d[: len(s)] = np.frombuffer(bytes(s), dtype=np.uint8)
            frags.append(d)
    frags.append(np.frombuffer(parity, dtype=np.uint8, offset=head.size).copy())
    code = _parity.ShardCode(frags, k, 1, [(1, n) for n in lengths], np.dtype(np.uint8))
    flat = _parity.recover_shards(code).reshape(-1).tobytes()  # the shards, unpadded, concatenated
    bounds = np.cumsum([0, *lengths])
    return [flat[bounds[i] : bounds[i + 1]] for i in range(k)]


# ------------------------------------------------------------------------------------------ (c) Young/Daly interval
def _pos(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name}: expected a finite number > 0, got {v!r}")
    return float(v)


def young_daly(checkpoint_cost_s: float, mtbf_s: float) -> float:
    c, m = _pos("checkpoint_cost_s", checkpoint_cost_s), _pos("mtbf_s", mtbf_s)
    return _ci.young_daly_interval(1.0 / m, c)


def expected_waste(interval_s: float, checkpoint_cost_s: float, mtbf_s: float) -> float:
    i, c, m = _pos("interval_s", interval_s), _pos("checkpoint_cost_s", checkpoint_cost_s), _pos("mtbf_s", mtbf_s)
    return _ci.waste_rate(i, 1.0 / m, c)
