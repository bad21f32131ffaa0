"""``tinylearn bench longctx`` at tiny sizes: every table has its rows with positive times, bytes and peak memory
where they belong, tinygrad's rows say why when it cannot run, and the MoE dropped fractions follow the capacity
arithmetic. No timing is asserted."""

from __future__ import annotations

import pytest

from tinylearn import topics
from tinylearn.bench import TOPICS, tinygrad_status
from tinylearn.longctx import bench

pytest.importorskip("torch")


def test_topic_row_and_bench_registry() -> None:
    t = topics.get("16_long_context_moe")
    assert t.name == "longctx" and TOPICS["longctx"] == "tinylearn.longctx.bench"
    assert topics.get("moe") is t


def test_ring_table_rows() -> None:
    t = bench.ring_table(ring_seq=128, ring_worlds=(2,), ring_repeat=1)
    impls = [r.impl for r in t.rows]
    assert impls == ["single (torch SDPA)", "ring (tl, 2 ranks)", "ulysses (tl, 2 ranks)"]
    assert all(r.median_ms > 0 and r.peak_mb > 0 for r in t.rows)
    sent = {r.impl: r.extra["sent_MB_per_rank"] for r in t.rows}
    assert sent["single (torch SDPA)"] == 0 and sent["ring (tl, 2 ranks)"] > 0 and sent["ulysses (tl, 2 ranks)"] > 0
    assert any("tinygrad: n/a" in n for n in t.notes) and any("ring peak per rank" in n for n in t.notes)


def test_moe_table_rows() -> None:
    t = bench.moe_table(moe_tokens=256, moe_repeat=1)
    assert {r.impl for r in t.rows} == {"tl", "torch"}
    assert all(r.median_ms > 0 for r in t.rows)
    for r in t.rows:
        if "dropless" in r.case or "cf 2" in r.case:
            assert r.extra["dropped"] == 0, r  # capacity >= every expert's load at cf 2 here, dropless never drops
        if "cf 0.5" in r.case:
            assert r.extra["dropped"] >= 0.5 - 1e-9, r  # capacity = half the tokens' slots: at least half dropped
    assert all(r.ratio is not None for r in t.rows if r.impl == "tl")


def test_sparse_table_rows() -> None:
    t = bench.sparse_table(sparse_ns=(256,), sparse_repeat=1)
    impls = {r.impl for r in t.rows}
    assert {"tl block-sparse (C++)", "torch SDPA dense", "torch SDPA + mask", "tl flash dense"} <= impls
    tg = [r for r in t.rows if r.impl == "tinygrad SDPA dense"]
    assert len(tg) == 1
    ok, _ = tinygrad_status()
    assert (tg[0].median_ms is not None and tg[0].median_ms > 0) if ok else tg[0].note.startswith("n/a")
    assert all(r.median_ms > 0 for r in t.rows if r.impl != "tinygrad SDPA dense")
