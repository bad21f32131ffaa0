"""Erasure-coded checkpoint files: r parity files protect the k ``rank*.bin`` files of a checkpoint directory.

A sharded checkpoint (``step_XXXXXXXX/rank00000.bin ...``, the STORAGE layout) loses a rank file when a node's
disk dies. Full replication keeps c extra copies of every file to survive c losses (c x the data in overhead);
a Reed–Solomon code (tinylearn.resilience.erasure) survives ANY r lost files of k + r with r parity files of the
size of the largest rank file: overhead r / k of the data instead of r.

``protect(ckpt_dir, r)`` reads the k rank files (sorted by name; shorter ones are zero-padded in the code, not on
disk), writes ``parity0.bin .. parity{r-1}.bin`` and then ``ec.json`` -- k, r, the code's name, and the size and
CRC-32 of every data and parity file -- each with ``atomic_write`` (ec.json last: it is the EC layer's commit
record; a crash before it leaves the checkpoint as it was). Re-protecting with another r removes stale parity files.

``repair(ckpt_dir)`` finds the damaged files (missing, wrong size, or CRC-32 mismatch), and when at most r are
damaged rebuilds them bit-exactly from any k good ones (each rebuilt file's CRC is checked before it is written
atomically); more than r damaged: ``CorruptCheckpoint`` naming the files. It returns the rebuilt paths ([] when
intact). The small JSON index files and the manifest are not coded: they are tiny, replicate them instead.

``bench_erasure`` measures encode / decode throughput (C++ kernel vs numpy reference) and file protect / repair,
``overhead_rows`` tabulates parity bytes vs full replication for the same number of tolerated losses.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from .._inputs import is_int
from .atomic import CheckpointError, CorruptCheckpoint, atomic_write
from .erasure import decode, encode, rebuild

__all__ = ["EC_FILE", "bench_erasure", "damaged_files", "overhead_rows", "protect", "repair"]

EC_FILE = "ec.json"
CODE_NAME = "reed-solomon-cauchy-gf256-0x11d"
_FORMAT = 1


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(memoryview(a)) & 0xFFFFFFFF


def _rank_files(d: Path) -> list[Path]:
    return sorted(p for p in d.glob("rank*.bin") if p.is_file())


def _read(p: Path) -> np.ndarray:
    return np.fromfile(p, dtype=np.uint8)


def protect(ckpt_dir: str | os.PathLike[str], r: int = 1, *, backend: str | None = None, fsync: bool = True) -> dict:
    """Write ``r`` parity files and ``ec.json`` for the ``rank*.bin`` files of ``ckpt_dir``; returns the ec.json
    content. Any r of the k + r files can then be lost or corrupted and ``repair`` rebuilds them."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"ckpt_dir: not a directory: {os.fspath(d)!r}")
    if not is_int(r) or int(r) < 1:
        raise ValueError(f"r: expected an int >= 1 parity files, got {r!r}")
    r = int(r)
    files = _rank_files(d)
    if not files:
        raise CheckpointError(f"ckpt_dir: no rank*.bin files in {os.fspath(d)!r} to protect")
    if len(files) + r > 256:
        raise ValueError(f"r: k + r must be <= 256, got k={len(files)} rank files and r={r}")
    data = [_read(p) for p in files]
    parity = encode(data, r, backend=backend)
    meta = {
        "format": _FORMAT,
        "code": CODE_NAME,
        "k": len(files),
        "r": r,
        "shard_bytes": int(parity[0].size),
        "data": [{"file": p.name, "size": int(a.size), "crc32": _crc(a)} for p, a in zip(files, data, strict=True)],
        "parity": [{"file": f"parity{j}.bin", "size": int(q.size), "crc32": _crc(q)} for j, q in enumerate(parity)],
    }
    for ent, q in zip(meta["parity"], parity, strict=True):
        atomic_write(d / ent["file"], memoryview(q), fsync=fsync)
    atomic_write(d / EC_FILE, json.dumps(meta, indent=1).encode(), fsync=fsync)
    for p in d.glob("parity*.bin"):  # stale parity of an earlier protect with a larger r
        stem = p.stem[len("parity") :]
        if stem.isdigit() and int(stem) >= r:
            p.unlink()
    return meta


def _load_meta(d: Path) -> dict:
    p = d / EC_FILE
    if not p.is_file():
        raise CheckpointError(f"{os.fspath(p)}: missing; the checkpoint was not protected (call protect first)")
    try:
        meta = json.loads(p.read_text())
        _ = meta["k"], meta["r"], meta["data"], meta["parity"], meta["shard_bytes"]
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"{os.fspath(p)}: unreadable ({type(e).__name__}: {e})") from e
    if meta.get("code") != CODE_NAME:
        raise CheckpointError(f"{os.fspath(p)}: code {meta.get('code')!r}, this reader knows {CODE_NAME!r}")
    return meta


def _scan(d: Path, meta: dict) -> tuple[list[np.ndarray | None], list[str]]:
    shards: list[np.ndarray | None] = []
    bad = []
    for ent in [*meta["data"], *meta["parity"]]:
        p = d / ent["file"]
        a = _read(p) if p.is_file() else None
        if a is None or a.size != ent["size"] or _crc(a) != ent["crc32"]:
            shards.append(None)
            bad.append(ent["file"])
        else:
            shards.append(a)
    return shards, bad


def damaged_files(ckpt_dir: str | os.PathLike[str]) -> list[str]:
    """Names of the protected files that are missing, of the wrong size, or fail their CRC-32 ([] if intact)."""
    d = Path(ckpt_dir)
    return _scan(d, _load_meta(d))[1]


def repair(ckpt_dir: str | os.PathLike[str], *, backend: str | None = None, fsync: bool = True) -> list[Path]:
    """Rebuild the damaged rank / parity files of a protected checkpoint bit-exactly; returns their paths ([] when
    nothing was damaged). More than r damaged files: CorruptCheckpoint naming them."""
    d = Path(ckpt_dir)
    meta = _load_meta(d)
    k, r = int(meta["k"]), int(meta["r"])
    shards, bad = _scan(d, meta)
    if not bad:
        return []
    if len(bad) > r:
        raise CorruptCheckpoint(
            f"{os.fspath(d)}: {len(bad)} files damaged {bad}, but r = {r} parity files rebuild at most {r}"
        )
    sizes = [int(e["size"]) for e in meta["data"]]
    full = rebuild(shards, k, r, lengths=sizes, backend=backend)
    out = []
    entries = [*meta["data"], *meta["parity"]]
    for i, (ent, s) in enumerate(zip(entries, shards, strict=True)):
        if s is not None:
            continue
        a = np.ascontiguousarray(full[i])
        if a.size != ent["size"] or _crc(a) != ent["crc32"]:  # only if ec.json itself is wrong
            raise CorruptCheckpoint(f"{os.fspath(d / ent['file'])}: rebuilt bytes fail the CRC-32 in {EC_FILE}")
        atomic_write(d / ent["file"], memoryview(a), fsync=fsync)
        out.append(d / ent["file"])
    return out


def overhead_rows(data_bytes: int, k: int, rs: tuple[int, ...] = (1, 2, 3)) -> list[dict[str, Any]]:
    """Extra bytes to survive f lost files of k (each data_bytes / k): Reed–Solomon r = f parity files vs f full
    replicas of every file. Rows: tolerated, ec_bytes, replication_bytes, ec_overhead, replication_overhead."""
    if not is_int(k) or k < 1:
        raise ValueError(f"k: expected an int >= 1, got {k!r}")
    shard = -(-int(data_bytes) // k)
    rows = []
    for f in rs:
        ec, rep = f * shard, f * int(data_bytes)
        rows.append(
            {
                "tolerated": f,
                "k": k,
                "ec_bytes": ec,
                "replication_bytes": rep,
                "ec_overhead": ec / data_bytes,
                "replication_overhead": rep / data_bytes,
            }
        )
    return rows


def bench_erasure(
    nbytes: int = 8 << 20,
    k: int = 4,
    r: int = 2,
    backends_: tuple[str, ...] = ("cpp", "numpy"),
    repeat: int = 5,
    files: bool = True,
) -> list[dict[str, Any]]:
    """Throughput rows {what, backend, MB_s, seconds} (median of ``repeat`` after warm-up, tinylearn.bench.measure):
    encode r parity shards of k data shards holding ``nbytes`` in all, decode with r data shards lost, and with
    ``files`` the file-level protect / repair (r rank files deleted) in a temporary directory (cpp if available,
    includes reads, CRCs, fsync) and, as backend "replication", the same protection by r full copies of every file
    and the restore of the r lost files from their copies; file rows carry bytes_written (and bytes_read)."""
    from .. import backends as _b
    from ..bench import measure

    rng = np.random.default_rng(0)
    size = -(-nbytes // k)
    data = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(k)]
    mb = k * size / 1e6
    rows = []
    parity = encode(data, r)
    lost = [None] * r + data[r:] + parity  # the first r data shards lost
    for b in backends_:
        if b == "cpp" and not _b.C_available("resilience"):
            continue
        reps = repeat if b == "cpp" else max(1, repeat // 2)
        t = measure(lambda b=b: encode(data, r, backend=b), warmup=1, repeat=reps)
        rows.append({"what": f"encode k={k} r={r}", "backend": b, "MB_s": mb / t.median, "seconds": t.median})
        t = measure(lambda b=b: decode(lost, k, r, backend=b), warmup=1, repeat=reps)
        rows.append({"what": f"decode {r} lost", "backend": b, "MB_s": mb / t.median, "seconds": t.median})
    if files:
        b = "cpp" if _b.C_available("resilience") else "numpy"
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            names = [f"rank{i:05d}.bin" for i in range(k)]
            for name, a in zip(names, data, strict=True):
                (d / name).write_bytes(a.tobytes())
            t0 = time.perf_counter()
            protect(d, r, backend=b)
            tp = time.perf_counter() - t0
            for name in names[:r]:
                (d / name).unlink()
            t0 = time.perf_counter()
            rebuilt = repair(d, backend=b)
            tr = time.perf_counter() - t0
            if len(rebuilt) != r:
                raise RuntimeError(f"bench_erasure: repair rebuilt {len(rebuilt)} files, expected {r}")
            # replication to survive the same r lost files: r full copies of every file (written as protect
            # writes its parity: atomic_write, fsync), and a restore copies a lost file's replica back
            rep = d / "replicas"
            rep.mkdir()
            t0 = time.perf_counter()
            for j in range(r):
                for name in names:
                    atomic_write(rep / f"{name}.{j}", (d / name).read_bytes())
            tc = time.perf_counter() - t0
            for name in names[:r]:
                (d / name).unlink()
            t0 = time.perf_counter()
            for name in names[:r]:
                atomic_write(d / name, (rep / f"{name}.0").read_bytes())
            tx = time.perf_counter() - t0
            if any((d / n).read_bytes() != a.tobytes() for n, a in zip(names[:r], data, strict=False)):
                raise RuntimeError("bench_erasure: a restored replica differs from the file")
        rows.append({"what": f"protect files r={r}", "backend": b, "MB_s": mb / tp, "seconds": tp,
                     "bytes_written": r * size})  # fmt: skip
        rows.append({"what": f"repair {r} files", "backend": b, "MB_s": mb / tr, "seconds": tr,
                     "bytes_written": r * size, "bytes_read": k * size})  # fmt: skip
        rows.append({"what": f"protect files r={r}", "backend": "replication", "MB_s": mb / tc, "seconds": tc,
                     "bytes_written": r * k * size})  # fmt: skip
        rows.append({"what": f"repair {r} files", "backend": "replication", "MB_s": mb / tx, "seconds": tx,
                     "bytes_written": r * size, "bytes_read": r * size})  # fmt: skip
    return rows
