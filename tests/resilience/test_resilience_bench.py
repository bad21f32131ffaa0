"""``tinylearn bench resilience`` at tiny sizes: every table has its rows with positive times, tinygrad's rows say
why when it cannot run, the erasure rows agree with the overhead arithmetic. No timing is asserted."""

from __future__ import annotations

import pytest

from tinylearn.bench import tinygrad_status
from tinylearn.resilience import bench

pytest.importorskip("torch")


def test_save_load_table_rows() -> None:
    t = bench.save_load_table(save_bytes=(1 << 16,), save_repeat=1)
    impls = {r.impl for r in t.rows}
    assert {"torch.save", "tinylearn", "torch DCP", "tinygrad safe_save", "tinygrad safe_load"} <= impls
    ok, _ = tinygrad_status()
    for r in t.rows:
        if r.impl.startswith("tinygrad") and not ok:
            assert r.median_ms is None and r.note.startswith("n/a")
        else:
            assert r.median_ms is not None and r.median_ms > 0, r
    saves = [r for r in t.rows if r.case.startswith("save") and r.median_ms is not None]
    # every format stores at least the 64 KiB of float32 payload, and none more than twice it
    assert all(1 << 16 <= r.extra["bytes_on_disk"] < 1 << 17 for r in saves), [(r.impl, r.extra) for r in saves]


def test_stall_table_rows() -> None:
    t = bench.stall_table(async_mb=1.0, async_repeat=1, async_steps=2)
    impls = [r.impl for r in t.rows]
    assert {"no checkpoint", "torch", "tinylearn sync", "tinylearn async"} <= set(impls)
    cycles = [r for r in t.rows if r.case == "train cycle"]
    stalls = [r for r in t.rows if r.case.startswith("stall")]
    assert len(cycles) == len(stalls) + 1 and all(r.median_ms > 0 for r in cycles)
    for r in stalls:  # a stall is never negative; its parts are reported
        assert r.median_ms >= 0 and {"in_save_ms", "steps_slowdown_ms"} <= set(r.extra), r
        assert r.extra["in_save_ms"] > 0  # every mode but "no checkpoint" saves in the timed call
    async_row = next(r for r in stalls if r.impl == "tinylearn async")
    assert async_row.extra["copy_ms"] > 0 and async_row.extra["write_ms"] > 0
    assert any("tinygrad" in n for n in t.notes)
    assert any(n.startswith("goal: async stall <= 10%") for n in t.notes)


def test_erasure_table_rows() -> None:
    t = bench.erasure_table(ec_bytes=1 << 16, ec_k=4, ec_r=2, ec_repeat=1)
    whats = {r.case for r in t.rows}
    assert {"encode k=4 r=2", "decode 2 lost", "protect files r=2", "repair 2 files"} <= whats
    assert all(r.median_ms > 0 and r.gbps > 0 for r in t.rows)
    shard = (1 << 16) // 4
    files = {(r.case, r.impl): r.extra for r in t.rows if "files" in r.case}
    ec = next(i for c, i in files if c == "protect files r=2" and i != "replication")
    # bytes: r parity files of one shard each vs r copies of all k files; a repair writes the r lost files either way
    assert files[("protect files r=2", ec)]["bytes_written"] == 2 * shard
    assert files[("protect files r=2", "replication")]["bytes_written"] == 2 * 4 * shard
    assert files[("repair 2 files", ec)]["bytes_read"] == 4 * shard  # k surviving shards are decoded
    assert files[("repair 2 files", "replication")]["bytes_read"] == 2 * shard  # the replicas of the lost files
    assert all(files[(c, "replication")]["time_vs_erasure_coding"] > 0 for c in ("protect files r=2", "repair 2 files"))
    peer = [r for r in t.rows if r.impl.startswith("PeerReplicator")]
    assert len(peer) == 1 and peer[0].median_ms > 0 and peer[0].extra["bytes_sent_per_rank"] == shard
    # r parity files of k: r/k extra bytes; r full replicas: r x the data
    assert "erasure coding stores 50% extra, replication 200%" in " ".join(t.notes)
