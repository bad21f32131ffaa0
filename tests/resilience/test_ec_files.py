"""Erasure-coded checkpoint files (tinylearn.resilience.ec_files): protect, damage any <= r files, repair."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from tinylearn.resilience import ec_files
from tinylearn.resilience.atomic import CheckpointError, CorruptCheckpoint


def _make_checkpoint(d: Path, k: int, seed: int = 0) -> dict[str, bytes]:
    """A checkpoint directory with k rank files of different sizes: through STORAGE's save_sharded when it exists
    (one Shard per rank of a 1-D tensor), else rank files written directly in the same layout."""
    rng = np.random.default_rng(seed)
    try:
        from tinylearn.resilience.sharded import Shard, save_sharded
    except ImportError:
        save_sharded = None
    if save_sharded is not None:
        sizes = [1000 + 37 * i for i in range(k)]
        total = sum(sizes)
        full = rng.standard_normal(total).astype(np.float32)
        offs = np.cumsum([0, *sizes])
        for r in range(k):
            state = {"w": Shard(full[offs[r] : offs[r + 1]], (int(offs[r]),), (total,))}
            save_sharded(state, d, rank=r, world_size=k, step=1)
    else:
        d.mkdir(parents=True, exist_ok=True)
        for r in range(k):
            (d / f"rank{r:05d}.bin").write_bytes(rng.integers(0, 256, 3000 + 113 * r, dtype=np.uint8).tobytes())
    files = sorted(d.glob("rank*.bin"))
    assert len(files) == k
    return {p.name: p.read_bytes() for p in files}


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.suffix == ".bin"}


def test_protect_writes_parity_and_ec_json(tmp_path: Path) -> None:
    d = tmp_path / "step_00000001"
    orig = _make_checkpoint(d, 4)
    meta = ec_files.protect(d, r=2)
    ec = json.loads((d / ec_files.EC_FILE).read_text())
    assert ec == meta and ec["k"] == 4 and ec["r"] == 2
    assert [e["file"] for e in ec["data"]] == sorted(orig)
    assert [e["size"] for e in ec["data"]] == [len(orig[n]) for n in sorted(orig)]
    longest = max(len(b) for b in orig.values())
    assert all((d / f"parity{j}.bin").stat().st_size == longest for j in range(2))
    assert ec_files.damaged_files(d) == [] and ec_files.repair(d) == []
    # r = 1: the parity file is the XOR of the zero-padded rank files
    ec_files.protect(d, r=1)
    assert not (d / "parity1.bin").exists()  # stale parity of r = 2 removed
    pad = [np.frombuffer(b.ljust(longest, b"\0"), np.uint8) for b in orig.values()]
    assert (d / "parity0.bin").read_bytes() == np.bitwise_xor.reduce(np.stack(pad)).tobytes()


def test_repair_any_r_deleted_or_corrupted(tmp_path: Path) -> None:
    k, r = 4, 2
    d = tmp_path / "ckpt"
    _make_checkpoint(d, k, seed=1)
    ec_files.protect(d, r)
    good = _snapshot(d)
    names = sorted(good)
    for n_bad in (1, 2):
        for bad in itertools.combinations(names, n_bad):
            for i, name in enumerate(bad):
                p = d / name
                if i % 2 == 0:
                    p.unlink()
                else:  # flip one byte in place: same size, CRC mismatch
                    b = bytearray(p.read_bytes())
                    b[len(b) // 2] ^= 0x40
                    p.write_bytes(bytes(b))
            assert sorted(ec_files.damaged_files(d)) == sorted(bad)
            rebuilt = ec_files.repair(d)
            assert sorted(p.name for p in rebuilt) == sorted(bad)
            assert _snapshot(d) == good, bad


def test_more_than_r_damaged_names_the_files(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    _make_checkpoint(d, 3, seed=2)
    ec_files.protect(d, r=1)
    (d / "rank00000.bin").unlink()
    (d / "parity0.bin").write_bytes(b"short")
    with pytest.raises(CorruptCheckpoint, match=r"2 files damaged .*rank00000.bin.*parity0.bin.* r = 1"):
        ec_files.repair(d)


def test_unprotected_and_bad_arguments(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    _make_checkpoint(d, 2, seed=3)
    with pytest.raises(CheckpointError, match="not protected"):
        ec_files.repair(d)
    with pytest.raises(ValueError, match="r: expected an int >= 1"):
        ec_files.protect(d, r=0)
    with pytest.raises(FileNotFoundError, match="ckpt_dir"):
        ec_files.protect(tmp_path / "nope", r=1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no rank"):
        ec_files.protect(tmp_path / "empty", r=1)
    ec_files.protect(d, 1)
    (d / ec_files.EC_FILE).write_text("{not json")
    with pytest.raises(CorruptCheckpoint, match="unreadable"):
        ec_files.repair(d)


def test_overhead_rows_ec_vs_replication() -> None:
    rows = ec_files.overhead_rows(8 << 20, k=8, rs=(1, 2, 4))
    for row in rows:
        f = row["tolerated"]
        assert row["ec_bytes"] == f * (1 << 20) and row["replication_bytes"] == f * (8 << 20)
        assert row["ec_overhead"] == pytest.approx(f / 8) and row["replication_overhead"] == f


def test_bench_erasure_rows() -> None:
    rows = ec_files.bench_erasure(nbytes=1 << 16, k=4, r=2, repeat=2)
    whats = {(row["what"], row["backend"]) for row in rows}
    assert ("encode k=4 r=2", "numpy") in whats and any(w.startswith("repair") for w, _ in whats)
    assert all(row["MB_s"] > 0 and row["seconds"] > 0 for row in rows)
