"""Peer replication in memory (tinylearn.resilience.replication) on 3 real processes (tinylearn.dist.launch)."""

from __future__ import annotations

import time

import pytest

from tinylearn.dist import launch
from tinylearn.resilience import replication_workers as w
from tinylearn.resilience.replication import PeerReplicator


def test_replicate_ring_and_restore_restarted_rank() -> None:
    out = launch(w.replicate_and_restore, 3, 5000, 1, 10.0, timeout_s=60)
    for rank, res in enumerate(out):
        assert res["rank"] == rank
        assert res["held_crc"] == res["expected_prev_crc"]  # rank r holds rank (r-1)'s shard, bit-exact
        assert res["held_bytes"] == 5000 + 17 * ((rank - 1) % 3)
    # rank 1 forgot its shard (fresh replicator); rank 2 held it and sent it back
    assert out[1]["recovered_crc"] == out[1]["mine_crc"]
    assert out[2]["recovered_crc"] == out[1]["mine_crc"]
    assert out[0]["recovered_crc"] is None


def test_stuck_peer_raises_naming_a_rank_within_timeout() -> None:
    t0 = time.monotonic()
    out = launch(w.replicate_with_silent_peer, 3, 2, 1.5, timeout_s=30)
    survivors = [r for r in out if r["rank"] != 2]
    for res in survivors:
        assert res["error"] is not None and f"rank {res['rank']}:" in res["error"]
        assert res["elapsed_s"] < 1.5 + 3.0  # the replicator's timeout plus slack, never a hang
    # rank 0 receives from rank 2 and rank 1 sends to rank 2: at least one names the silent rank
    assert any("rank 2" in res["error"] for res in survivors)
    assert time.monotonic() - t0 < 30


def test_dead_peer_is_reported_not_hung() -> None:
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 2"):
        launch(w.replicate_with_dead_peer, 3, 2, 3.0, timeout_s=20)
    assert time.monotonic() - t0 < 40


def test_needs_an_initialised_group() -> None:
    with pytest.raises(RuntimeError, match="not initialised"):
        PeerReplicator()
