"""AsyncCheckpointer: snapshots are private copies, versions skip unchanged keys, back-pressure, writer errors."""

from __future__ import annotations

import os
import time

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
from tinylearn.resilience.atomic import CheckpointError, CorruptCheckpoint, IncompleteCheckpoint


def _state(rng: np.random.Generator) -> dict:
    return {
        "w": rng.standard_normal((64, 32)).astype(np.float32),
        "t": torch.randn(10, generator=torch.Generator().manual_seed(1)),
        "tl": tl.Tensor(rng.standard_normal(7)),
        "opt": {"m": np.arange(5, dtype=np.int64), "lr": 0.01, "name": "adam"},
    }


def test_roundtrip_all_tensor_kinds_and_objects(tmp_path):
    st = _state(np.random.default_rng(0))
    with AsyncCheckpointer(tmp_path) as ck:
        ck.save(st, 0)
    out = load_async(tmp_path)
    np.testing.assert_array_equal(out["w"], st["w"])
    np.testing.assert_array_equal(out["t"], st["t"].numpy())
    np.testing.assert_array_equal(out["tl"], st["tl"].data)
    np.testing.assert_array_equal(out["opt.m"], st["opt"]["m"])
    assert out["opt.lr"] == 0.01 and out["opt.name"] == "adam"


def test_snapshot_is_a_copy_training_may_overwrite_at_once(tmp_path):
    w = np.ones(1 << 16, np.float32)
    t = torch.ones(100)
    ck = AsyncCheckpointer(tmp_path)
    ck.save({"w": w, "t": t}, 1)
    w[:] = 5.0  # the caller overwrites right after save returned, while the writer may still run
    t.add_(3.0)
    ck.close()
    out = load_async(tmp_path, 1)
    assert (out["w"] == 1.0).all() and (out["t"] == 1.0).all()


def test_versions_write_only_changed_keys_and_reference_the_rest(tmp_path):
    rng = np.random.default_rng(2)
    st = {f"layer{i}": rng.standard_normal(1000).astype(np.float32) for i in range(4)}
    ver = dict.fromkeys(st, 0)
    ck = AsyncCheckpointer(tmp_path, full_every=100)
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


def test_hash_mode_skips_unchanged_writes_and_full_every_rewrites(tmp_path):
    st = {"a": np.zeros(100), "b": np.ones(100)}
    ck = AsyncCheckpointer(tmp_path, full_every=3)
    stats = []
    for step in range(1, 5):
        st["b"] = st["b"] + 1
        stats.append(ck.save(st, step))
    ck.close()
    assert [s["full"] for s in stats] == [True, False, False, True]
    assert [s["keys_written"] for s in stats] == [2, 1, 1, 2]
    np.testing.assert_array_equal(load_async(tmp_path)["b"], st["b"])


@pytest.mark.parametrize("max_pending", [1, 2])
def test_back_pressure_bounds_snapshots_in_flight(tmp_path, max_pending):
    ck = AsyncCheckpointer(tmp_path, max_pending=max_pending)
    for step in range(1, 7):
        ck.save({"a": np.full(1 << 16, step, np.float32)}, step)
    ck.close()
    st = ck.stats
    for k in range(max_pending, len(st)):  # snapshot k is taken only after write k - max_pending finished
        assert st[k]["t_snap"] >= st[k - max_pending]["t_done"]
    assert all(s["wait_s"] >= 0 for s in st)
    np.testing.assert_array_equal(load_async(tmp_path)["a"], np.full(1 << 16, 6, np.float32))


def test_writer_error_is_raised_on_next_call_and_not_lost(tmp_path):
    ck = AsyncCheckpointer(tmp_path, max_pending=2, full_every=100)
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


def test_error_drops_snapshots_queued_behind_it(tmp_path):
    ck = AsyncCheckpointer(tmp_path, max_pending=3, full_every=100)
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


def test_resume_references_files_on_disk(tmp_path):
    st = {"a": np.arange(10.0), "b": np.zeros(3)}
    with AsyncCheckpointer(tmp_path, full_every=10) as ck:
        ck.save(st, 1, versions={"a": 0, "b": 0})
    with AsyncCheckpointer(tmp_path, full_every=10) as ck:
        with pytest.raises(ValueError, match="not newer"):
            ck.save(st, 1)
        s = ck.save(st, 2, versions={"a": 0, "b": 0})
    assert s["keys_written"] == 0
    np.testing.assert_array_equal(load_async(tmp_path, 2)["a"], st["a"])


def test_bad_input_and_corruption(tmp_path):
    with pytest.raises(ValueError, match="max_pending"):
        AsyncCheckpointer(tmp_path, max_pending=0)
    ck = AsyncCheckpointer(tmp_path)
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


def test_prune_keeps_referenced_directories(tmp_path):
    st = {"a": np.zeros(4), "b": np.zeros(4)}
    ck = AsyncCheckpointer(tmp_path, full_every=100)
    for s in range(1, 5):
        st["b"] = st["b"] + 1
        ck.save(st, s, versions={"a": 0, "b": s})
    gone = ck.prune(keep_last=1)
    ck.close()
    assert [d.name for d in gone] == ["step_00000002", "step_00000003"]  # step 1 holds "a", still referenced
    np.testing.assert_array_equal(load_async(tmp_path)["a"], st["a"])


def test_torch_version_counters_skip_frozen_layers(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for p in model[0].parameters():
        p.requires_grad_(False)  # fine-tuning: only the head trains
    ck = AsyncCheckpointer(tmp_path, full_every=100)
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
def test_idle_writer_waits_under_sched_batch(tmp_path):
    """The writer thread waits for work under SCHED_BATCH (woken by save(), it does not preempt the caller) and
    the caller's own policy is untouched."""
    ck = AsyncCheckpointer(tmp_path)
    try:
        ck.save({"a": np.arange(1000.0)}, 1)
        ck.wait()
        deadline = time.monotonic() + 5
        while os.sched_getscheduler(ck._writer_tid) != os.SCHED_BATCH and time.monotonic() < deadline:
            time.sleep(0.01)  # the writer re-enters its wait right after the write
        assert os.sched_getscheduler(ck._writer_tid) == os.SCHED_BATCH
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    finally:
        ck.close()
    np.testing.assert_array_equal(load_async(tmp_path)["a"], np.arange(1000.0))
