"""Tests for exercises/15_resilient_training (run on stubs by default, on tinylearn with --impl=reference).

(a) atomic checkpoint writes: round trips, an old file surviving an interrupted write (an iterable that raises, a
child process SIGKILLed mid-write), ``load_latest`` ignoring a killed writer's temporary file; (b) XOR parity over
unequal shards: every single loss rebuilt bit-exactly, checked against tinylearn.dist.parity's P fragment; (c) the
Young/Daly interval against a numerical scan of the waste, its scaling laws, tinylearn.parallel.checkpoint_interval
and a simulated failure trace."""

from __future__ import annotations

import math
import os
import select
import signal
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import tinylearn
from tinylearn.dist.parity import encode_shards, shard_columns
from tinylearn.parallel.checkpoint_interval import (
    failure_trace,
    simulate_checkpointing,
    waste_rate,
    young_daly_interval,
)

TMP = ".tmp-"  # the temporary-name prefix the exercise prescribes (stubs.TMP_PREFIX)


def _names(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


def _chunks_then_raise(n_ok: int):
    for i in range(n_ok):
        yield bytes([i % 256]) * 1000
    raise RuntimeError("writer died mid-checkpoint")


# --------------------------------------------------------------------------------------- (a) atomic checkpoints
def test_atomic_save_round_trip(impl: ModuleType, tmp_path: Path) -> None:
    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8).tobytes()
    path = tmp_path / "step_00000001.bin"
    assert impl.atomic_save(path, data) == len(data)
    assert path.read_bytes() == data
    chunks = [data[i : i + 4096] for i in range(0, len(data), 4096)]
    assert impl.atomic_save(str(path), (c for c in chunks)) == len(data)  # a generator of chunks, a str path
    assert path.read_bytes() == data
    assert impl.atomic_save(tmp_path / "empty.bin", b"") == 0
    assert (tmp_path / "empty.bin").read_bytes() == b""
    assert _names(tmp_path) == {"step_00000001.bin", "empty.bin"}  # no temporary file left behind


def test_atomic_save_replaces_the_file_instead_of_overwriting_it(impl: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    impl.atomic_save(path, b"old weights " * 100)
    os.link(path, tmp_path / "backup.bin")  # a hard link: the same inode as the old file
    with open(path, "rb") as reader:  # a reader that opened the old checkpoint before the save
        impl.atomic_save(path, b"new weights " * 50)
        assert reader.read() == b"old weights " * 100  # writing in place (open(path, "wb")) would truncate this
    assert path.read_bytes() == b"new weights " * 50
    assert (tmp_path / "backup.bin").read_bytes() == b"old weights " * 100
    assert not os.path.samefile(path, tmp_path / "backup.bin")  # a new inode was renamed over the name
    assert _names(tmp_path) == {"model.bin", "backup.bin"}


def test_atomic_save_interrupted_iterable_keeps_the_old_file(impl: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "step_00000100.bin"
    impl.atomic_save(path, b"step 100 complete")
    with pytest.raises(RuntimeError, match="writer died"):
        impl.atomic_save(path, _chunks_then_raise(5))
    assert path.read_bytes() == b"step 100 complete"
    assert _names(tmp_path) == {"step_00000100.bin"}  # the temporary file was removed
    fresh = tmp_path / "step_00000200.bin"
    with pytest.raises(RuntimeError, match="writer died"):
        impl.atomic_save(fresh, _chunks_then_raise(3))
    assert not fresh.exists()  # no partial file under the final name
    assert impl.load_latest(tmp_path) == (100, b"step 100 complete")


_CHILD = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("tl_exercise_15_child", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)

def chunks():
    yield b"N" * 65536
    print("ready", flush=True)  # the writer has asked for the second chunk: the first one was handed to write()
    time.sleep(120)
    yield b"N" * 65536

mod.atomic_save(sys.argv[2], chunks())
print("finished", flush=True)
"""


def test_atomic_save_survives_sigkill_mid_write(impl: ModuleType, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    path = ckpt / "step_00000007.bin"
    old = b"O" * 70_000
    impl.atomic_save(path, old)
    root = str(Path(tinylearn.__file__).resolve().parents[1])  # the child imports the same tinylearn
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(impl.__file__), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            proc.kill()
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"the child did not reach the middle of its write (got {line!r}); its stderr:\n{err[-2000:]}")
        temps = [n for n in _names(ckpt) if n.startswith(TMP)]
        assert len(temps) == 1, f"expected one {TMP}* file next to the checkpoint while writing, got {_names(ckpt)}"
        assert path.read_bytes() == old  # mid-write, the final name still holds the old checkpoint
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
    assert path.read_bytes() == old  # the old checkpoint is intact
    assert _names(ckpt) == {"step_00000007.bin", *temps}  # only the stale temporary file is left over
    assert impl.load_latest(ckpt) == (7, old)


def test_load_latest_newest_complete_by_step_number(impl: ModuleType, tmp_path: Path) -> None:
    assert impl.load_latest(tmp_path) is None
    (tmp_path / "step_10.bin").write_bytes(b"ten")
    (tmp_path / "step_9.bin").write_bytes(b"nine")  # written later (newer mtime) and larger as a string
    (tmp_path / "step_00000002.bin").write_bytes(b"two")
    (tmp_path / f"{TMP}step_00000500.bin.4242").write_bytes(b"torn")  # a killed writer's leftover
    (tmp_path / "step_600.bin.partial").write_bytes(b"not a checkpoint name")
    (tmp_path / "notes.txt").write_bytes(b"hello")
    (tmp_path / "step_700.bin").mkdir()  # a directory, not a checkpoint file
    assert impl.load_latest(tmp_path) == (10, b"ten")
    assert impl.load_latest(str(tmp_path)) == (10, b"ten")
    with pytest.raises(FileNotFoundError):
        impl.load_latest(tmp_path / "missing")


def test_atomic_save_bad_input(impl: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        impl.atomic_save(tmp_path / "no_such_dir" / "step_1.bin", b"x")
    with pytest.raises(ValueError, match="path"):
        impl.atomic_save(tmp_path / f"{TMP}step_1.bin", b"x")
    assert _names(tmp_path) == set()


# ------------------------------------------------------------------------------------------------ (b) XOR parity
def _shards(seed: int, k: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(0, 300, k)]
    lengths[int(rng.integers(0, k))] = 0  # an empty shard
    lengths[int(rng.integers(0, k))] = 301  # and a unique longest one (it sets the padding)
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]


def _body_oracle(shards: list[bytes]) -> bytes:
    size = max(len(s) for s in shards)
    out = np.zeros(size, dtype=np.uint8)
    for s in shards:
        out[: len(s)] ^= np.frombuffer(s, dtype=np.uint8)
    return out.tobytes()


@pytest.mark.parametrize("seed,k", [(0, 2), (1, 5), (2, 8)])
def test_xor_parity_layout(impl: ModuleType, seed: int, k: int) -> None:
    shards = _shards(seed, k)
    p = impl.xor_parity(shards)
    head = 4 + 8 * k
    assert isinstance(p, bytes) and len(p) == head + max(len(s) for s in shards)
    assert struct.unpack_from(f"<I{k}Q", p) == (k, *(len(s) for s in shards))
    assert p[head:] == _body_oracle(shards)


def test_xor_parity_matches_tinylearn_parity_fragment(impl: ModuleType) -> None:
    w = np.random.default_rng(3).integers(0, 256, (1, 103), dtype=np.uint8)
    for k in (1, 4, 7):  # 103 columns in k blocks: widths differ by one, so the shards are padded
        shards = [s.tobytes() for s in shard_columns(w, k)]
        code = encode_shards(w, k, r=1)
        assert impl.xor_parity(shards)[4 + 8 * k :] == code.fragments[k].tobytes()  # P = d_0 xor ... xor d_{k-1}


@pytest.mark.parametrize("seed,k", [(0, 2), (1, 5), (2, 8), (3, 1)])
def test_rebuild_every_single_loss(impl: ModuleType, seed: int, k: int) -> None:
    shards = _shards(seed, k) if k > 1 else [b"only shard"]
    parity = impl.xor_parity(shards)
    assert impl.rebuild(list(shards), parity) == shards  # nothing lost
    for i in range(k):
        damaged: list[bytes | None] = list(shards)
        damaged[i] = None
        got = impl.rebuild(damaged, parity)
        assert got == shards, f"shard {i} of {k} (length {len(shards[i])}) not rebuilt bit-exactly"
        assert all(isinstance(g, bytes) for g in got) and len(got[i]) == len(shards[i])  # the padding is stripped


def test_rebuild_two_losses_and_bad_input(impl: ModuleType) -> None:
    shards = _shards(4, 5)
    parity = impl.xor_parity(shards)
    damaged: list[bytes | None] = list(shards)
    damaged[1] = damaged[3] = None
    with pytest.raises(ValueError, match="shards") as e:
        impl.rebuild(damaged, parity)
    assert "1" in str(e.value) and "3" in str(e.value)  # names the lost indices
    with pytest.raises(ValueError, match="shards"):
        impl.rebuild([None, *shards[1:4]], parity)  # 4 entries, the parity says 5
    wrong = [shards[0] + b"\x00", None, *shards[2:]]
    with pytest.raises(ValueError, match="shards"):
        impl.rebuild(wrong, parity)  # shard 0 is one byte longer than recorded
    with pytest.raises(ValueError, match="parity"):
        impl.rebuild([None, *shards[1:]], parity[:-1])  # the body lost a byte
    with pytest.raises(ValueError, match="parity"):
        impl.rebuild([None, *shards[1:]], parity[:10])  # not even the header
    with pytest.raises(ValueError, match="shards"):
        impl.xor_parity([])


# ------------------------------------------------------------------------------------------ (c) Young/Daly interval
CASES = [(60.0, 86_400.0), (5.0, 3_600.0), (300.0, 7 * 86_400.0), (0.5, 40.0)]  # (C, MTBF) in seconds


@pytest.mark.parametrize("C,M", CASES)
def test_young_daly_matches_formula_and_tinylearn(impl: ModuleType, C: float, M: float) -> None:
    interval = impl.young_daly(C, M)
    assert interval == pytest.approx(math.sqrt(2 * C * M), rel=1e-12)
    assert interval == pytest.approx(young_daly_interval(1 / M, C), rel=1e-12)  # failure rate = 1 / MTBF
    for i in (0.1 * interval, interval, 7.0 * interval):
        w = impl.expected_waste(i, C, M)
        assert w == pytest.approx(C / i + i / (2 * M), rel=1e-12)
        assert w == pytest.approx(waste_rate(i, 1 / M, C), rel=1e-12)


@pytest.mark.parametrize("C,M", CASES)
def test_young_daly_minimises_the_waste(impl: ModuleType, C: float, M: float) -> None:
    star = impl.young_daly(C, M)
    grid = np.geomspace(star / 100, star * 100, 40_001)  # a scan that does not know where the answer is
    waste = np.array([impl.expected_waste(float(i), C, M) for i in grid])
    best = grid[int(np.argmin(waste))]
    assert best == pytest.approx(star, rel=2e-3)  # within the grid's spacing (ratio 100^(2/40000) ~ 1.0002)
    w_star = impl.expected_waste(star, C, M)
    assert w_star <= waste.min() * (1 + 1e-12)
    assert w_star == pytest.approx(math.sqrt(2 * C / M), rel=1e-12)  # W(I*) = sqrt(2 C / M)
    # the two terms are equal at the optimum: checkpoint overhead = expected lost work
    assert C / star == pytest.approx(star / (2 * M), rel=1e-12)


def test_young_daly_scaling_laws(impl: ModuleType) -> None:
    C, M = 45.0, 50_000.0
    base = impl.young_daly(C, M)
    assert impl.young_daly(4 * C, M) == pytest.approx(2 * base, rel=1e-12)  # x4 checkpoint cost -> x2 interval
    assert impl.young_daly(C, 4 * M) == pytest.approx(2 * base, rel=1e-12)  # x4 MTBF -> x2 interval
    assert impl.young_daly(9 * C, 9 * M) == pytest.approx(9 * base, rel=1e-12)
    # N nodes failing independently: MTBF / N, so the interval shrinks by sqrt(N) and the waste grows by sqrt(N)
    assert impl.young_daly(C, M / 16) == pytest.approx(base / 4, rel=1e-12)
    w = impl.expected_waste(base, C, M)
    assert impl.expected_waste(impl.young_daly(C, M / 16), C, M / 16) == pytest.approx(4 * w, rel=1e-12)


def test_expected_waste_predicts_a_simulated_failure_trace(impl: ModuleType) -> None:
    C, M = 10.0, 100_000.0  # C << I* ~ 1414 s << M: the first-order model's regime
    star = impl.young_daly(C, M)
    fails = failure_trace([(1.3e8, 1 / M)], seed=0)  # ~1300 Poisson failures (the run needs ~1.02e8 s)
    measured = {}
    for f in (0.25, 1.0, 4.0):
        sim = simulate_checkpointing(f * star, fails, C, work_s=1e8)
        measured[f] = sim["waste"]
        assert sim["waste"] == pytest.approx(impl.expected_waste(f * star, C, M), rel=0.1), (f, sim)
    assert measured[1.0] < measured[0.25] and measured[1.0] < measured[4.0]


BAD = [0, -1.0, float("nan"), float("inf"), True, "60"]


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_young_daly_bad_input(impl: ModuleType, bad: object) -> None:
    with pytest.raises(ValueError, match="checkpoint_cost_s"):
        impl.young_daly(bad, 3600.0)
    with pytest.raises(ValueError, match="mtbf_s"):
        impl.young_daly(60.0, bad)
    with pytest.raises(ValueError, match="interval_s"):
        impl.expected_waste(bad, 60.0, 3600.0)
    with pytest.raises(ValueError, match="checkpoint_cost_s"):
        impl.expected_waste(600.0, bad, 3600.0)
    with pytest.raises(ValueError, match="mtbf_s"):
        impl.expected_waste(600.0, 60.0, bad)
