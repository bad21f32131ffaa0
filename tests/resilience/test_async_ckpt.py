"""AsyncCheckpointer: snapshots are private copies, versions skip unchanged keys, back-pressure, writer errors --
every test with the writer process and with the writer thread; a killed writer process; the two writers' files."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.resilience.async_ckpt import (
    AsyncCheckpointer,
    latest_async_checkpoint,
    load_async,
    step_dir,
    torch_versions,
)
from tinylearn.resilience.async_process import ProcessWriter
from tinylearn.resilience.async_writer import WriterDied, write_direct
from tinylearn.resilience.atomic import CheckpointError, CorruptCheckpoint, IncompleteCheckpoint

both = pytest.mark.parametrize("writer", ["process", "thread"])


def _state(rng: np.random.Generator) -> dict:
    return {
        "w": rng.standard_normal((64, 32)).astype(np.float32),
        "t": torch.randn(10, generator=torch.Generator().manual_seed(1)),
        "tl": tl.Tensor(rng.standard_normal(7)),
        "opt": {"m": np.arange(5, dtype=np.int64), "lr": 0.01, "name": "adam"},
    }


@both
def test_roundtrip_all_tensor_kinds_and_objects(tmp_path, writer):
    st = _state(np.random.default_rng(0))
    with AsyncCheckpointer(tmp_path, writer=writer) as ck:
        ck.save(st, 0)
    out = load_async(tmp_path)
    np.testing.assert_array_equal(out["w"], st["w"])
    np.testing.assert_array_equal(out["t"], st["t"].numpy())
    np.testing.assert_array_equal(out["tl"], st["tl"].data)
    np.testing.assert_array_equal(out["opt.m"], st["opt"]["m"])
    assert out["opt.lr"] == 0.01 and out["opt.name"] == "adam"


@both
def test_snapshot_is_a_copy_training_may_overwrite_at_once(tmp_path, writer):
    w = np.ones(1 << 16, np.float32)
    t = torch.ones(100)
    ck = AsyncCheckpointer(tmp_path, writer=writer)
    ck.save({"w": w, "t": t}, 1)
    w[:] = 5.0  # the caller overwrites right after save returned, while the writer may still run
    t.add_(3.0)
    ck.close()
    out = load_async(tmp_path, 1)
    assert (out["w"] == 1.0).all() and (out["t"] == 1.0).all()


@both
def test_versions_write_only_changed_keys_and_reference_the_rest(tmp_path, writer):
    rng = np.random.default_rng(2)
    st = {f"layer{i}": rng.standard_normal(1000).astype(np.float32) for i in range(4)}
    ver = dict.fromkeys(st, 0)
    ck = AsyncCheckpointer(tmp_path, full_every=100, writer=writer)
    ck.save(st, 1, versions=ver)
    old3 = st["layer3"].copy()
    st["layer3"] += 1
    ver["layer3"] += 1
    s2 = ck.save(st, 2, versions=ver)
    ck.wait()
    assert s2["copied_bytes"] == 4000  # only the changed key was copied
    assert s2["keys_written"] == 1 and s2["keys_referenced"] == 3 and s2["bytes_written"] == 4000
    files = sorted(p.name for p in step_dir(tmp_path, 2).iterdir())
    assert len(files) == 2 and "manifest.json" in files
    ck.close()
    out = load_async(tmp_path, 2)
    for k, v in st.items():
        np.testing.assert_array_equal(out[k], v)
    np.testing.assert_array_equal(load_async(tmp_path, 1)["layer3"], old3)


@both
def test_hash_mode_skips_unchanged_writes_and_full_every_rewrites(tmp_path, writer):
    st = {"a": np.zeros(100), "b": np.ones(100)}
    ck = AsyncCheckpointer(tmp_path, full_every=3, writer=writer)
    stats = []
    for step in range(1, 5):
        st["b"] = st["b"] + 1
        stats.append(ck.save(st, step))
    ck.close()
    assert [s["full"] for s in stats] == [True, False, False, True]
    assert [s["keys_written"] for s in stats] == [2, 1, 1, 2]
    np.testing.assert_array_equal(load_async(tmp_path)["b"], st["b"])


@both
@pytest.mark.parametrize("max_pending", [1, 2])
def test_back_pressure_bounds_snapshots_in_flight(tmp_path, max_pending, writer):
    ck = AsyncCheckpointer(tmp_path, max_pending=max_pending, writer=writer)
    for step in range(1, 7):
        ck.save({"a": np.full(1 << 16, step, np.float32)}, step)
    ck.close()
    st = ck.stats
    for k in range(max_pending, len(st)):  # snapshot k is taken only after write k - max_pending finished
        assert st[k]["t_snap"] >= st[k - max_pending]["t_done"]
    assert all(s["wait_s"] >= 0 for s in st)
    np.testing.assert_array_equal(load_async(tmp_path)["a"], np.full(1 << 16, 6, np.float32))


@both
def test_writer_error_is_raised_on_next_call_and_not_lost(tmp_path, writer):
    ck = AsyncCheckpointer(tmp_path, max_pending=2, full_every=100, writer=writer)
    st = {"a": np.zeros(10), "b": np.ones(10)}
    ver = {"a": 0, "b": 0}
    ck.save(st, 1, versions=ver)
    ck.wait()
    step_dir(tmp_path, 2).write_bytes(b"")  # a real fault: a file where the writer must create a directory
    ver["a"] = 1
    st["a"] = st["a"] + 1
    ck.save(st, 2, versions=ver)
    with pytest.raises(CheckpointError, match="FileExistsError"):
        ck.wait()
    ck.wait()  # raised once, then cleared
    s3 = ck.save(st, 3, versions=ver)  # "a" changed since the last SUCCESSFUL checkpoint (1): written again
    ck.close()
    assert s3["keys_written"] == 1 and s3["keys_referenced"] == 1
    np.testing.assert_array_equal(load_async(tmp_path)["a"], st["a"])


@both
def test_error_drops_snapshots_queued_behind_it(tmp_path, writer):
    ck = AsyncCheckpointer(tmp_path, max_pending=3, full_every=100, writer=writer)
    step_dir(tmp_path, 1).write_bytes(b"")
    ck.save({"a": np.zeros(1 << 18)}, 1, versions={"a": 0})
    try:
        ck.save({"a": np.zeros(1 << 18)}, 2, versions={"a": 0})  # references 1's file, which never appears
        queued = True
    except CheckpointError:  # the writer had already failed: save raised and submitted nothing
        queued = False
    if queued:
        with pytest.raises(CheckpointError):
            ck.wait()
        assert ck.stats[1].get("dropped") is True
    ck.close()
    assert latest_async_checkpoint(tmp_path) is None


@both
def test_resume_references_files_on_disk(tmp_path, writer):
    st = {"a": np.arange(10.0), "b": np.zeros(3)}
    with AsyncCheckpointer(tmp_path, full_every=10, writer=writer) as ck:
        ck.save(st, 1, versions={"a": 0, "b": 0})
    with AsyncCheckpointer(tmp_path, full_every=10, writer=writer) as ck:
        with pytest.raises(ValueError, match="not newer"):
            ck.save(st, 1)
        s = ck.save(st, 2, versions={"a": 0, "b": 0})
    assert s["keys_written"] == 0
    np.testing.assert_array_equal(load_async(tmp_path, 2)["a"], st["a"])


@both
def test_bad_input_and_corruption(tmp_path, writer):
    with pytest.raises(ValueError, match="max_pending"):
        AsyncCheckpointer(tmp_path, max_pending=0, writer=writer)
    ck = AsyncCheckpointer(tmp_path, writer=writer)
    with pytest.raises(ValueError, match="-1"):
        ck.save({"a": np.zeros(2)}, -1)
    ck.save({"a": np.zeros(2)}, 5)
    with pytest.raises(ValueError, match="step 5 is not newer"):
        ck.save({"a": np.zeros(2)}, 5)
    ck.close()
    with pytest.raises(IncompleteCheckpoint):
        load_async(tmp_path, 6)
    (step_dir(tmp_path, 7)).mkdir()  # torn: no manifest
    assert latest_async_checkpoint(tmp_path) == step_dir(tmp_path, 5)
    f = next(p for p in step_dir(tmp_path, 5).iterdir() if p.suffix == ".bin")
    f.write_bytes(b"\0" * 15 + b"\1")
    with pytest.raises(CorruptCheckpoint, match=f.name):
        load_async(tmp_path, 5)
    f.unlink()
    with pytest.raises(CorruptCheckpoint, match="missing"):
        load_async(tmp_path, 5)


@both
def test_prune_keeps_referenced_directories(tmp_path, writer):
    st = {"a": np.zeros(4), "b": np.zeros(4)}
    ck = AsyncCheckpointer(tmp_path, full_every=100, writer=writer)
    for s in range(1, 5):
        st["b"] = st["b"] + 1
        ck.save(st, s, versions={"a": 0, "b": s})
    gone = ck.prune(keep_last=1)
    ck.close()
    assert [d.name for d in gone] == ["step_00000002", "step_00000003"]  # step 1 holds "a", still referenced
    np.testing.assert_array_equal(load_async(tmp_path)["a"], st["a"])


@both
def test_torch_version_counters_skip_frozen_layers(tmp_path, writer):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for p in model[0].parameters():
        p.requires_grad_(False)  # fine-tuning: only the head trains
    ck = AsyncCheckpointer(tmp_path, full_every=100, writer=writer)
    stats = []
    for step in range(3):
        sd = model.state_dict()
        stats.append(ck.save(sd, step, versions=torch_versions(sd)))
        model(torch.randn(8, 32)).sum().backward()
        with torch.no_grad():  # an SGD step on the head, in place (as torch.optim.SGD; that one imports dynamo)
            for p in model[2].parameters():
                p.sub_(0.1 * p.grad)
                p.grad = None
    ck.close()
    assert [s["keys_written"] for s in stats] == [4, 2, 2]  # after the first: the head's weight and bias only
    head = 32 * 4 * 4 + 4 * 4
    assert stats[1]["copied_bytes"] == head
    out = load_async(tmp_path)
    np.testing.assert_array_equal(out["0.weight"], model[0].weight.detach().numpy())
    assert not np.array_equal(out["2.weight"], model[2].weight.detach().numpy())  # saved before the last step


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux only")
@both
def test_idle_writer_waits_under_sched_batch(tmp_path, writer):
    """The writer (thread, or the process's main thread) waits for work under SCHED_BATCH (woken by save(), it does
    not preempt the caller) and the caller's own policy is untouched."""
    ck = AsyncCheckpointer(tmp_path, writer=writer)
    try:
        ck.save({"a": np.arange(1000.0)}, 1)
        ck.wait()
        tid = ck._writer_tid if writer == "thread" else ck.writer_pid
        deadline = time.monotonic() + 5
        while os.sched_getscheduler(tid) != os.SCHED_BATCH and time.monotonic() < deadline:
            time.sleep(0.01)  # the writer re-enters its wait right after the write
        assert os.sched_getscheduler(tid) == os.SCHED_BATCH
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    finally:
        ck.close()
    np.testing.assert_array_equal(load_async(tmp_path)["a"], np.arange(1000.0))


def test_writer_argument_is_validated(tmp_path):
    with pytest.raises(ValueError, match="writer.*'fork'"):
        AsyncCheckpointer(tmp_path, writer="fork")


def test_both_writers_write_the_same_bytes(tmp_path):
    """Same on-disk format: data.bin and manifest.json of the process writer equal the thread writer's, byte for
    byte (the process writes data.bin from its shared-memory buffer, with O_DIRECT where the filesystem allows)."""
    rng = np.random.default_rng(3)
    st = {"w": rng.standard_normal((33, 7)).astype(np.float32), "i": torch.arange(5, dtype=torch.int16),
          "z": np.zeros((0, 3)), "s": np.float64(2.5) * np.ones(()), "f": np.asfortranarray(rng.random((4, 5))),
          "o": {"lr": 0.1, "tag": "x"}}  # fmt: skip
    stats = {}
    for w in ("thread", "process"):
        with AsyncCheckpointer(tmp_path / w, writer=w) as ck:
            stats[w] = ck.save(st, 7, meta={"epoch": 1})
    assert stats["process"]["data_write"] in ("direct", "buffered")
    for name in ("data.bin", "manifest.json"):
        a = (step_dir(tmp_path / "thread", 7) / name).read_bytes()
        assert a == (step_dir(tmp_path / "process", 7) / name).read_bytes()
    out = load_async(tmp_path / "process")
    np.testing.assert_array_equal(out["f"], st["f"])
    assert out["z"].shape == (0, 3) and out["o.tag"] == "x"


def test_process_buffers_grow_are_reused_and_removed(tmp_path):
    ck = AsyncCheckpointer(tmp_path, writer="process")
    assert isinstance(ck._pw, ProcessWriter) and ck._pw.pool == [None]  # no buffer before the first save
    ck.save({"a": np.ones(10, np.float32)}, 1)
    ck.wait()
    small = ck._pw.pool[0]
    ck.save({"a": np.full(1 << 16, 2.0, np.float32)}, 2)  # the state grew: a larger buffer replaces the first
    ck.wait()
    big = ck._pw.pool[0]
    assert big is not small and big.size >= 1 << 18 and not os.path.exists(small.path)
    ck.save({"a": np.full(100, 3.0, np.float32)}, 3)  # fits: the same buffer again
    ck.close()
    assert ck._pw.pool == [None] and not os.path.exists(big.path)
    np.testing.assert_array_equal(load_async(tmp_path, 2)["a"], np.full(1 << 16, 2.0, np.float32))
    np.testing.assert_array_equal(load_async(tmp_path)["a"], np.full(100, 3.0, np.float32))


@both
def test_unserialisable_object_fails_the_write_not_the_save(tmp_path, writer):
    ck = AsyncCheckpointer(tmp_path, writer=writer)
    ck.save({"a": np.zeros(3), "o": object()}, 1)  # the manifest is JSON: the writer fails, the next call raises
    with pytest.raises(CheckpointError, match="JSON serializable"):
        ck.wait()
    ck.save({"a": np.ones(3), "o": 1}, 2)
    ck.close()
    assert load_async(tmp_path)["o"] == 1 and latest_async_checkpoint(tmp_path) == step_dir(tmp_path, 2)


@both
def test_close_is_idempotent_and_save_after_close_raises(tmp_path, writer):
    ck = AsyncCheckpointer(tmp_path, writer=writer)
    ck.save({"a": np.zeros(3)}, 1)
    ck.close()
    ck.close()
    with pytest.raises(CheckpointError, match="closed"):
        ck.save({"a": np.zeros(3)}, 2)
    if writer == "process":
        assert ck.writer_pid is None


def test_killed_writer_process_raises_naming_pid_and_restarts(tmp_path):
    ck = AsyncCheckpointer(tmp_path, writer="process", full_every=100)
    ck.save({"a": np.arange(4.0), "b": np.zeros(2)}, 1, versions={"a": 0, "b": 0})
    ck.wait()
    pid, proc = ck.writer_pid, ck._pw.proc
    os.kill(pid, signal.SIGKILL)
    proc.wait(10)
    with pytest.raises(WriterDied, match=rf"pid {pid}\).*signal 9"):
        ck.save({"a": np.arange(4.0), "b": np.ones(2)}, 2, versions={"a": 0, "b": 1})
    s3 = ck.save({"a": np.arange(4.0), "b": np.ones(2)}, 3, versions={"a": 0, "b": 1})  # a new writer
    ck.close()
    assert ck.stats[-1] is s3 and s3["keys_written"] == 1 and s3["keys_referenced"] == 1  # "a" still from step 1
    out = load_async(tmp_path)
    np.testing.assert_array_equal(out["b"], np.ones(2))
    np.testing.assert_array_equal(out["a"], np.arange(4.0))


def test_writer_killed_with_snapshots_in_flight_never_hangs(tmp_path):
    ck = AsyncCheckpointer(tmp_path, writer="process", max_pending=2)
    ck.save({"a": np.zeros(1 << 16)}, 1)
    pid, proc = ck.writer_pid, ck._pw.proc
    os.kill(pid, signal.SIGKILL)  # before or after it wrote step 1: either way the caller learns of it
    proc.wait(10)
    with pytest.raises(WriterDied, match=f"pid {pid}"):
        ck.wait()
    ck.wait()  # raised once
    ck.close()
    ck.close()
    assert latest_async_checkpoint(tmp_path) in (None, step_dir(tmp_path, 1))


def test_many_keys_large_messages_do_not_deadlock(tmp_path):
    """Messages and replies larger than the socket buffers (thousands of keys), two snapshots in flight."""
    st = {f"k{i}": np.full(3, i, np.int32) for i in range(6000)}
    with AsyncCheckpointer(tmp_path, writer="process", max_pending=2, full_every=1) as ck:
        for step in range(1, 4):
            st["k0"] = st["k0"] + 1
            ck.save(st, step, meta={"note": "x" * 300_000})
    out = load_async(tmp_path)
    assert out["k5999"].tolist() == [5999] * 3 and out["k0"].tolist() == [3] * 3


def test_writer_process_exits_and_removes_its_buffers_when_its_caller_is_killed(tmp_path):
    import subprocess
    import sys

    code = (
        "import os, numpy as np\n"
        "from tinylearn.resilience.async_ckpt import AsyncCheckpointer\n"
        f"ck = AsyncCheckpointer({str(tmp_path)!r})\n"
        "ck.save({'a': np.ones(1000)}, 1); ck.wait()\n"
        "print(ck.writer_pid, ck._pw.pool[0].path, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    pid, path = out.stdout.split()
    deadline = time.monotonic() + 20
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)  # the orphaned writer reads EOF, unlinks its buffer and exits
    assert not os.path.exists(path)
    np.testing.assert_array_equal(load_async(tmp_path)["a"], np.ones(1000))


def test_write_direct_falls_back_where_o_direct_is_refused(tmp_path):
    """O_DIRECT needs an aligned buffer; tmpfs (/dev/shm) refuses it at open: the page-cache path instead."""
    import mmap

    buf = mmap.mmap(-1, 8192)
    buf[:5000] = bytes(range(256)) * 19 + bytes(136)
    for d in [tmp_path] + ([Path("/dev/shm")] if os.path.isdir("/dev/shm") else []):
        f = d / f"tl-test-direct-{os.getpid()}.bin"
        try:
            assert write_direct(f, memoryview(buf), 5000) == 5000
            assert f.read_bytes() == buf[:5000]
        finally:
            f.unlink(missing_ok=True)
