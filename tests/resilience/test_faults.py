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


@pytest.mark.parametrize("writer", faults.SEQUENCE_WRITERS)
def test_torn_at_every_point_of_the_save_sequence(tmp_path: Path, writer: str) -> None:
    """SIGKILL at each crash point of a whole save (2 ranks' data files and indexes + the manifest for the sharded
    writers; data + manifest/index for the async and delta writers): before the commit record's rename step 1 loads
    bitwise, after it the complete step 2 -- never a mix, never an error."""
    root = tmp_path / writer
    events = faults.sequence_events(writer, root)
    files = {name for _, name, _ in events}
    commit = "index.json" if writer == "delta" else "manifest.json"
    if writer.startswith("sharded"):  # both ranks' data and index files, then the manifest, are in the sequence
        assert {"rank00000.bin", "rank00001.bin", "rank00000.json", "rank00001.json", commit} <= files
    else:
        assert {"data.bin", commit} <= files
    assert events[-2][:2] == ("rename", commit)  # the commit record is renamed last (then the directory fsync)
    kinds = {k for k, _, _ in events}
    assert kinds == {"open", "write", "fsync", "rename", "fsync_dir"}
    seen = set()
    for k in range(1, len(events) + 1):
        out = faults.torn_sequence_drill(root, writer, kill_at=k, events=events)
        assert out["killed"], out
        assert out["loaded_step"] == out["expected_step"] and out["equal"], out
        assert out["expected_step"] == (1 if k <= out["commit_at"] else 2)
        seen.add(out["expected_step"])
    assert seen == {1, 2}


def test_torn_sequence_random_points(tmp_path: Path) -> None:
    events = faults.sequence_events("sharded", tmp_path)
    outs = [faults.torn_sequence_drill(tmp_path, "sharded", seed=s, events=events) for s in range(4)]
    assert len({o["kill_at"] for o in outs}) > 1  # the seed draws the point
    for o in outs:
        assert o["killed"] and o["equal"] and o["loaded_step"] == o["expected_step"], o
    with pytest.raises(ValueError, match="kill_at"):
        faults.torn_sequence_drill(tmp_path, "sharded", kill_at=len(events) + 1, events=events)
    with pytest.raises(ValueError, match="writer"):
        faults.sequence_events("nope", tmp_path)
