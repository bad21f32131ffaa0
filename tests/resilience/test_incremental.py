"""Delta checkpoints (blocks + hashes, chains, compact) and XOR-diff activation checkpoints."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tinylearn.resilience.atomic import CorruptCheckpoint, IncompleteCheckpoint
from tinylearn.resilience.incremental import (
    DeltaCheckpointer,
    XorChain,
    chain,
    compact,
    list_deltas,
    restore,
    xor_apply,
    xor_delta,
    xor_ratio,
)

BS = 4096


def _copy(st: dict) -> dict:
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in st.items()}


def _run(tmp_path, steps=7, full_every=3):
    rng = np.random.default_rng(0)
    st = {"w": rng.standard_normal((300, 100)).astype(np.float32), "b": rng.standard_normal(33), "epoch": 0}
    ck = DeltaCheckpointer(tmp_path, block_size=BS, full_every=full_every)
    snaps, stats = {}, []
    for s in range(1, steps + 1):
        st["w"][rng.integers(300)] += 1.0  # one row changes: one block (400 bytes inside a 4 KiB block)
        st["epoch"] = s
        stats.append(ck.save(st, s))
        snaps[s] = _copy(st)
    return ck, snaps, stats


def _eq(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(b[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k
        else:
            assert a[k] == b[k], k


def test_delta_writes_only_changed_blocks_and_restores_bitwise(tmp_path):
    ck, snaps, stats = _run(tmp_path)
    assert [s["kind"] for s in stats] == ["full", "delta", "delta", "full", "delta", "delta", "full"]
    full_bytes = 300 * 100 * 4 + 33 * 8
    assert stats[0]["bytes_written"] == full_bytes
    for s in stats:
        if s["kind"] == "delta":
            assert 1 <= s["blocks_written"] <= 2 and s["bytes_written"] <= 2 * BS
    for s, st in snaps.items():
        _eq(restore(tmp_path, s), st)
    assert chain(tmp_path, 6) == [6, 5, 4]


def test_torch_values_and_dtype_change(tmp_path):
    ck = DeltaCheckpointer(tmp_path, block_size=BS, full_every=10)
    ck.save({"t": torch.arange(5000, dtype=torch.float32)}, 0)
    s = ck.save({"t": torch.arange(5000, dtype=torch.float64)}, 1)  # another dtype: every block is new
    assert s["blocks_written"] == s["blocks_total"]
    np.testing.assert_array_equal(restore(tmp_path, 1)["t"], np.arange(5000, dtype=np.float64))


def test_compact_folds_chain_and_deletes_only_unreferenced(tmp_path):
    ck, snaps, _ = _run(tmp_path, steps=6, full_every=10)  # 1 full + 5 deltas
    out = compact(tmp_path, 6)
    assert sorted(out["deleted"]) == [f"step_{s:08d}" for s in range(1, 6)]
    assert list_deltas(tmp_path) == [6] and chain(tmp_path) == [6]
    _eq(restore(tmp_path), snaps[6])
    assert sorted(os.listdir(tmp_path / "step_00000006")) == ["data_full.bin", "index.json"]


def test_compact_middle_keeps_what_a_newer_delta_needs(tmp_path):
    ck, snaps, _ = _run(tmp_path, steps=6, full_every=10)
    out = compact(tmp_path, 4)  # 5 and 6 are deltas whose blocks live in 1..4: those directories stay
    assert "step_00000001" not in out["deleted"]  # the full base: most blocks of 5 and 6 live there
    assert set(out["deleted"]) <= {"step_00000002", "step_00000003"}  # only directories no kept chain names
    for s in (4, 5, 6):
        _eq(restore(tmp_path, s), snaps[s])
    assert chain(tmp_path, 6) == [6, 5, 4]
    st = _copy(snaps[6])
    st["w"][0] += 2
    ck.save(st, 7)  # the checkpointer re-reads the compacted index
    _eq(restore(tmp_path, 7), st)
    compact(tmp_path, 7, keep=[4])
    assert list_deltas(tmp_path) == [4, 7]
    _eq(restore(tmp_path, 4), snaps[4])
    _eq(restore(tmp_path, 7), st)


def test_missing_parent_and_corrupt_block(tmp_path):
    _run(tmp_path, steps=3, full_every=10)
    (tmp_path / "step_00000002" / "index.json").unlink()
    with pytest.raises(CorruptCheckpoint, match=r"step_00000002/index.json.*parent of checkpoint 3"):
        restore(tmp_path, 3)
    with pytest.raises(IncompleteCheckpoint):
        restore(tmp_path, 2)
    data = tmp_path / "step_00000001" / "data.bin"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpoint, match="digest"):
        restore(tmp_path, 1)
    data.unlink()
    with pytest.raises(CorruptCheckpoint, match="data.bin: missing"):
        restore(tmp_path, 1)


def test_bad_input(tmp_path):
    for bs in (0, -5):
        with pytest.raises(ValueError, match=f"block_size.*{bs}"):
            DeltaCheckpointer(tmp_path, block_size=bs)
    ck = DeltaCheckpointer(tmp_path, block_size=BS)
    with pytest.raises(ValueError, match="-3"):
        ck.save({"a": np.zeros(3)}, -3)
    ck.save({"a": np.zeros(3)}, 4)
    with pytest.raises(ValueError, match="step 4 is not newer than the last checkpoint step 4"):
        ck.save({"a": np.zeros(3)}, 4)
    with pytest.raises(ValueError, match="step 2 is not newer"):
        ck.save({"a": np.zeros(3)}, 2)
    with pytest.raises(ValueError, match="shape"):
        xor_delta(np.zeros(3), np.zeros(4))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
@pytest.mark.parametrize("shuffle", [True, False])
def test_xor_delta_is_bit_exact(dtype, shuffle):
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((17, 9)) * 100).astype(dtype)
    b = (a.astype(np.float64) * 1.001).astype(dtype)
    b[0, 0] = np.array(-0.0).astype(dtype) if np.dtype(dtype).kind == "f" else 7
    out = xor_apply(a, xor_delta(a, b, shuffle=shuffle), shuffle=shuffle)
    assert out.dtype == b.dtype and out.shape == b.shape and out.tobytes() == b.tobytes()


def test_xor_chain_merge_and_squash_bit_exact():
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal(5000).astype(np.float32)]
    for _ in range(6):
        xs.append(xs[-1] + np.float32(1e-3) * rng.standard_normal(5000).astype(np.float32))
    c = XorChain(xs[0])
    for x in xs[1:]:
        c.append(x)
    for i, x in enumerate(xs):
        assert c.get(i).tobytes() == x.tobytes()
    assert xor_apply(xs[2], c.merge(2, 5)).tobytes() == xs[5].tobytes()
    c.squash()
    assert len(c.deltas) == 1 and c.get(1).tobytes() == xs[-1].tobytes()
    assert c.stored_bytes < c.raw_bytes


def test_xor_nearby_compresses_better_than_unrelated():
    rng = np.random.default_rng(5)
    a = rng.standard_normal(1 << 15).astype(np.float32)
    near = a + np.float32(1e-4) * rng.standard_normal(a.size).astype(np.float32)
    far = rng.standard_normal(a.size).astype(np.float32)
    assert xor_ratio(a, near) > 1.5 > 1.2 > xor_ratio(a, far)
    assert xor_ratio(a, a) > 100  # identical: all zeros


def test_measured_patterns_on_real_training():
    """Deterministic byte counts (no timing): fine-tuning writes a fraction, Adam everywhere writes everything."""
    from tinylearn.resilience.bench_async import delta_bytes, xor_activation_ratios

    ft = delta_bytes("finetune", size_mb=4.0, steps=2, block_size=64 * 1024)  # 4 layers, 1 trains
    adam = delta_bytes("adam", size_mb=4.0, steps=2, block_size=64 * 1024)
    assert 0 < ft["fraction"] < 0.5 and adam["fraction"] == 1.0
    with pytest.raises(ValueError, match="'sgd'"):
        delta_bytes("sgd")
    r = xor_activation_ratios()
    assert r["nearby"] > r["unrelated"] and r["identical"] > r["nearby"]
