"""``tinylearn bench serving`` (tinylearn/serve/bench.py) on tiny sizes: every row is there, the numbers are positive,
and the static-batching baseline (HF transformers on the same weights) produces exactly the engine's greedy tokens,
so the throughput comparison compares the same work. No timing is asserted."""

from __future__ import annotations

import importlib
import inspect

import pytest

pytest.importorskip("transformers")
pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from tinylearn import topics  # noqa: E402
from tinylearn.inference import generate  # noqa: E402
from tinylearn.serve import bench  # noqa: E402
from tinylearn.serve.hf import to_hf_gpt2  # noqa: E402

TINY = dict(n_requests=8, prompt_len=(8, 40), output_len=(8, 24), prefix_len=32, suffix_len=(2, 8), batch_size=4,
            repeat=1, num_blocks=5, online_n=6, rates=(50.0,), duration_s=30.0)  # fmt: skip


def test_bench_is_registered_for_the_serve_topic() -> None:
    t = topics.get("serve")
    assert t.bench == "tinylearn.serve.bench" and "test_serve_bench" in t.tests
    mod = importlib.import_module(t.bench)
    assert list(inspect.signature(mod.run).parameters) == ["full", "progress"]


def test_static_baseline_matches_generate_alone() -> None:
    """Left padding + attention mask + per-batch max_new_tokens must not change any request's greedy tokens."""
    model = bench.bench_model()
    reqs = bench.workload("random", 5, (3, 20), (2, 9), seed=3)
    toks = bench.static_generate(to_hf_gpt2(model), reqs, batch_size=3)
    for r, t in zip(reqs, toks):
        assert t == generate(model, r["prompt"], r["max_tokens"], temperature=0)


def test_offline_table_rows_and_same_tokens() -> None:
    seen: list[str] = []
    table = bench.offline_table(progress=seen.append, **TINY)
    random_case, shared_case = table.cases()
    assert random_case.startswith("random") and shared_case.startswith("shared prefix")
    impls = {c: [r.impl for r in table.rows if r.case == c] for c in table.cases()}
    assert impls[random_case] == [bench.BASELINE, "continuous batching", "+ chunked prefill",
                                  "preempt recompute (5 blocks)", "preempt swap (5 blocks)", "tinygrad"]  # fmt: skip
    assert impls[shared_case] == [bench.BASELINE, "+ chunked prefill", "+ prefix caching"]
    assert len(seen) == 8  # one progress message per measured row
    for r in table.rows:
        if r.impl == "tinygrad":
            assert r.median_ms is None and r.note.startswith("n/a") and "serving engine" in r.note
            continue
        assert r.median_ms > 0 and r.extra["wall s"] > 0 and r.extra["out tok/s"] > 0, r
        assert r.ratio is not None and r.ratio > 0 and r.extra["tok/s x static"] > 0, r
        for k in ("TTFT", "TPOT", "e2e"):  # per-request latencies of every row, static's included
            assert 0 < r.extra[f"{k} p50 ms"] <= r.extra[f"{k} p99 ms"], (k, r)
        # a request's first token comes before its end, which comes within the run's wall time
        assert (
            r.extra["TTFT p50 ms"] < r.extra["e2e p50 ms"] and r.extra["e2e p99 ms"] <= r.extra["wall s"] * 1e3 * 1.01
        )
        assert 0 <= r.extra["goodput req/s"] <= TINY["n_requests"] / r.extra["wall s"] * 1.01, r
        if r.impl != bench.BASELINE:  # the same greedy tokens as static batching, request by request
            assert r.extra["same tokens"] == f"{TINY['n_requests']}/{TINY['n_requests']}", r
            assert r.extra["steps"] > 0
    rows = {(r.case, r.impl): r for r in table.rows}
    for mode in ("recompute", "swap"):
        assert rows[(random_case, f"preempt {mode} (5 blocks)")].extra["preemptions"] > 0  # the pool was too small
    assert rows[(random_case, "+ chunked prefill")].extra["preemptions"] == 0
    assert rows[(shared_case, "+ prefix caching")].extra["prefix hit rate"] > 0
    assert rows[(shared_case, "+ chunked prefill")].extra["prefix hit rate"] == 0
    assert "same tokens" in table.to_text()


def test_online_table_rows() -> None:
    table = bench.online_table(**TINY)
    assert [(r.case.split(" ")[0], r.impl) for r in table.rows] == [
        ("random", "engine (chunked prefill + prefix caching)"),
        ("shared", "prefix caching off"),
        ("shared", "prefix caching on"),
    ]
    for r in table.rows:
        assert r.extra["ok"] == f"{TINY['online_n']}/{TINY['online_n']}", r  # every request answered 200
        assert r.median_ms > 0 and r.extra["TTFT p50 ms"] > 0 and r.extra["TTFT p99 ms"] >= r.extra["TTFT p50 ms"]
        assert r.extra["TPOT p50 ms"] > 0 and r.extra["out tok/s"] > 0 and r.extra["goodput req/s"] >= 0
        assert r.extra["e2e p99 ms"] >= r.median_ms
    off, on = table.rows[1], table.rows[2]
    assert off.extra["prefix hit rate"] == 0 and on.extra["prefix hit rate"] > 0
    assert on.extra["TTFT p50 x off"] > 0 and on.ratio is not None


def test_latency_summary_by_hand() -> None:
    t = [dict(ttft_s=0.1, e2e_s=0.5, n=5), dict(ttft_s=0.3, e2e_s=0.3, n=1), dict(ttft_s=0.2, e2e_s=1.2, n=3)]
    s = bench.latency_summary(t, wall_s=2.0, slo_ttft_s=0.25, slo_tpot_s=0.2)
    # TPOT: 0.4 / 4 = 0.1 s and 1.0 / 2 = 0.5 s (the 1-token request has none); SLO met by request 1 only
    assert s["TTFT p50 ms"] == pytest.approx(200) and s["e2e p50 ms"] == pytest.approx(500)
    assert s["TPOT p50 ms"] == pytest.approx(300) and s["goodput req/s"] == pytest.approx(0.5)


def test_workload_is_seeded() -> None:
    a = bench.workload("shared-prefix", 4, (2, 5), (1, 3), prefix_len=8, seed=1)
    assert a == bench.workload("shared-prefix", 4, (2, 5), (1, 3), prefix_len=8, seed=1)
    assert all(r["prompt"][:8] == a[0]["prompt"][:8] for r in a)
