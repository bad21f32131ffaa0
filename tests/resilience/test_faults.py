"""Crash consistency on real processes and filesystems: a writer SIGKILLed at a random byte of its rank file never
leaves a loadable half-checkpoint; a full disk (RLIMIT_FSIZE, a small tmpfs) is DiskFull naming the path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tinylearn.resilience import faults
from tinylearn.resilience.manifest import list_checkpoints, step_dir
from tinylearn.resilience.sharded import load_sharded


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_torn_write_at_random_byte(tmp_path: Path, seed: int) -> None:
    out = faults.torn_write_drill(tmp_path, seed, nbytes=1 << 21, piece_bytes=1 << 16, throttle_s=0.004, timeout_s=20)
    assert out["killed"], out  # SIGKILLed before it could commit
    assert out["offset"] <= out["killed_at"] <= out["total"]
    assert out["latest"] == step_dir(tmp_path, 1) and out["equal_step1"]
    steps = {s: why for s, _, why in out["listed"]}
    assert steps[1] == "ok" and "no manifest.json" in steps[2]
    assert len(out["temps_left"]) == 1  # the torn temp file, never a rank00000.bin of step 2
    assert not (step_dir(tmp_path, 2) / "rank00000.bin").exists()


def test_torn_drill_offsets_differ_by_seed(tmp_path: Path) -> None:
    offs = {faults.torn_write_drill(tmp_path, s, nbytes=1 << 18, piece_bytes=1 << 14)["offset"] for s in range(3)}
    assert len(offs) == 3


def test_disk_full_rlimit(tmp_path: Path) -> None:
    out = faults.disk_full_rlimit(tmp_path, nbytes=1 << 21, limit=1 << 20)
    assert out["status"] == "err" and out["error"] == "DiskFull", out
    assert str(step_dir(tmp_path, 2) / "rank00000.bin") in out["message"] and "EFBIG" in out["message"]
    assert out["latest"] == step_dir(tmp_path, 1)
    got = load_sharded(out["latest"])
    ref = faults.drill_state(1, 1 << 21)
    assert got["w"].tobytes() == ref["w"].tobytes() and got["step"] == 1
    assert "no manifest.json" in dict((s, w) for s, _, w in list_checkpoints(tmp_path))[2]


@pytest.mark.parametrize("check_space", [True, False])
def test_disk_full_tmpfs(tmp_path: Path, check_space: bool) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (euid is not 0)")
    out = faults.disk_full_tmpfs(tmp_path / "mnt", size_bytes=1 << 20, check_space=check_space)
    if out["skipped"]:
        pytest.skip(out["skipped"])
    assert out["error"] == "DiskFull", out
    assert str(step_dir(tmp_path / "mnt", 2)) in out["message"]
    assert ("ENOSPC" in out["message"]) == (not check_space)  # the up-front check, else the kernel's ENOSPC
    assert out["latest"] == step_dir(tmp_path / "mnt", 1) and out["equal_step1"]
    assert not os.path.ismount(tmp_path / "mnt")
