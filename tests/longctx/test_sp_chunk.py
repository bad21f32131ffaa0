"""Chunk-size selection for a ring pass (tinylearn.parallel.sp_chunk).

The fitting and choosing parts are checked on synthetic data with known answers (exact line recovery, brute force
over candidates, the closed-form smooth optimum); the chunked pass and the probe run on 2 real processes
(tl.dist.launch, gloo): output vs the single-process reference at the fp32 tolerance, bytes sent vs the formula,
the measured peak bytes linear in the chunk with the predicted slope. No timing is asserted.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist

import tinylearn as tl
from tinylearn.parallel import sp_chunk as sc
from tinylearn.parallel.bench_longctx import TensorMeter, traffic_meter
from tinylearn.parallel.ring_attention import attention_reference, ring_bytes, shard_sequence
from tinylearn.tolerance import tolerance


# ------------------------------------------------------------------------------------------------ pure parts
def test_fit_linear_recovers_a_line_and_clamps_the_intercept() -> None:
    xs = [16, 64, 256, 1024]
    a, b = sc.fit_linear(xs, [3e-4 + 2e-7 * x for x in xs])
    assert a == pytest.approx(3e-4, rel=1e-9) and b == pytest.approx(2e-7, rel=1e-9)
    a, b = sc.fit_linear(xs, [5 * x - 40 for x in xs])  # negative intercept -> 0, slope through the origin
    assert a == 0.0 and b == pytest.approx(sum(x * (5 * x - 40) for x in xs) / sum(x * x for x in xs))
    with pytest.raises(ValueError, match="send_s: need measurements at >= 2 distinct sizes"):
        sc.fit_linear([8, 8], [1.0, 2.0], "send_s")
    with pytest.raises(ValueError, match="y: 2 x values but 3 y values"):
        sc.fit_linear([1, 2], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="non-finite"):
        sc.fit_linear([1, 2], [1.0, math.nan])


def test_chunk_bytes_keeps_the_ring_volume() -> None:
    for b, h, n, d, p in ((1, 4, 512, 32, 2), (2, 3, 96, 8, 4), (1, 1, 7, 5, 3)):
        for c in sc.divisors(n):
            cb = sc.chunk_bytes(b, h, n, d, p, c)
            assert cb["bytes_sent"] == ring_bytes(b, h, n, d, p)["fwd_bytes"]
            assert cb["messages"] == (p - 1) * n // c and cb["score_tile_bytes"] == b * h * n * c * 4
    assert sc.divisors(12) == [1, 2, 3, 4, 6, 12]
    with pytest.raises(ValueError, match="chunk: 5 does not divide seq_local=512"):
        sc.chunk_bytes(1, 4, 512, 32, 2, 5)
    with pytest.raises(ValueError, match="chunk"):
        sc.chunk_bytes(1, 4, 512, 32, 2, 0)


def _model(**kw: Any) -> sc.ChunkModel:
    base = dict(
        seq_local=5040, world_size=4, bytes_per_token=1024, alpha=2e-3, beta=1e-9, t0=1e-4, t1=1e-7, m0=1e6, m1=1e4
    )
    base.update(kw)
    return sc.ChunkModel(**base)


def test_time_model_regimes() -> None:
    m = _model()
    c = 8  # comm-bound: T_s = 2e-3 + 8.192e-6 > T_c = 1.008e-4
    ts, tc = 2e-3 + 1e-9 * 1024 * c, 1e-4 + 1e-7 * c
    assert m.time_s(c) == pytest.approx(5040 // c * (3 * ts + tc))
    assert m.exposed_comm_s(c) == pytest.approx(5040 // c * 3 * (ts - tc))
    m2 = _model(alpha=0.0, beta=0.0, t1=1e-3)  # compute-bound: nothing exposed
    assert m2.exposed_comm_s(c) == 0.0 and m2.time_s(c) == pytest.approx(5040 // c * 4 * (1e-4 + 1e-3 * c))
    m3 = _model(s0=1e-3, s1=2e-6)
    assert m3.time_s(c) - m.time_s(c) == pytest.approx(5040 // c * (1e-3 + 2e-6 * c))
    with pytest.raises(ValueError, match="chunk: 11 does not divide seq_local=5040"):
        m.time_s(11)


def test_choose_chunk_is_the_brute_force_optimum_under_the_budget() -> None:
    m = _model()
    for w in (0.0, 1e-9, 1e-7, 1e-5):
        for budget in (None, 2e6, 1.2e7):
            got = sc.choose_chunk(m, mem_budget=budget, mem_weight=w)
            feas = [c for c in sc.divisors(5040) if budget is None or m.memory_bytes(c) <= budget]
            best = min(feas, key=lambda c: (m.time_s(c) + w * m.memory_bytes(c), c))
            assert got.chunk == best and (budget is None or got.memory_bytes <= budget)
            assert len(got.rows) == len(sc.divisors(5040))
    # no price: T falls like 1/c, so the largest chunk under the budget wins
    assert sc.choose_chunk(m, mem_budget=2e6).chunk == max(c for c in sc.divisors(5040) if 1e6 + 1e4 * c <= 2e6)
    assert sc.choose_chunk(m).chunk == 5040
    # restricted candidates
    assert sc.choose_chunk(m, candidates=[8, 16, 20]).chunk == 20


def test_smooth_optimum_brackets_the_discrete_choice() -> None:
    m = _model()  # comm-bound at every c up to ~2000 tokens
    w = 1e-8
    cstar = m.smooth_optimum(w)
    assert cstar == pytest.approx(math.sqrt(5040 * (3 * 2e-3 + 1e-4) / (w * 1e4)))
    got = sc.choose_chunk(m, mem_weight=w).chunk
    divs = sc.divisors(5040)
    below, above = max(c for c in divs if c <= cstar), min(c for c in divs if c >= cstar)
    assert got in (below, above)
    with pytest.raises(ValueError, match="mem_weight"):
        m.smooth_optimum(0.0)


def test_choose_chunk_bad_input() -> None:
    m = _model()
    with pytest.raises(ValueError, match=r"mem_budget: 1000 bytes fits no candidate; the smallest \(chunk 1\) needs"):
        sc.choose_chunk(m, mem_budget=1000)
    with pytest.raises(ValueError, match="mem_weight: expected a number >= 0"):
        sc.choose_chunk(m, mem_weight=-1.0)
    with pytest.raises(ValueError, match="mem_budget: expected None or bytes > 0"):
        sc.choose_chunk(m, mem_budget=0)
    with pytest.raises(ValueError, match="chunk: 11 does not divide seq_local=5040"):
        sc.choose_chunk(m, candidates=[8, 11])
    with pytest.raises(TypeError, match="model: expected a ChunkModel"):
        sc.choose_chunk("model")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="jobs\\[0\\]"):
        sc.run_rank_jobs([("no_colon", ())])


# ------------------------------------------------------------------------------------------------ 2 real ranks
def chunk_rank_checks(b: int, h: int, n: int, d: int, chunks: list[int]) -> dict[str, Any]:
    """Rank function: the chunked pass vs the single-process reference, bytes, peak bytes; bad inputs."""
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(b, h, n, d, generator=gen) for _ in range(3))
    k = k * 3  # peaked softmax rows: the online max matters
    ref = attention_reference(q, k, v)
    ql, kl, vl = (shard_sequence(t, rank, world) for t in (q, k, v))
    atol, rtol = tolerance(torch.float32, n)
    res: dict[str, Any] = {"ratio": [], "sent": [], "messages": [], "peak": [], "largest": []}
    for c in chunks:
        meter = TensorMeter()
        with traffic_meter() as traffic, meter:
            out = sc.chunked_ring_forward(ql, kl, vl, chunk=c)
        e = shard_sequence(ref, rank, world)
        res["ratio"].append(float(((out - e).abs() / (atol + rtol * e.abs())).max()))
        res["sent"].append(traffic["p2p_bytes"])
        res["messages"].append(traffic["p2p_messages"])
        res["peak"].append(meter.peak_bytes)
        res["largest"].append(meter.largest_bytes)
    # a non-contiguous (transposed-back) input gives the same result
    qt = ql.transpose(2, 3).contiguous().transpose(2, 3)
    assert not qt.is_contiguous()
    out_t = sc.chunked_ring_forward(qt, kl, vl, chunk=chunks[0])
    res["noncontig"] = float(((out_t - e).abs() / (atol + rtol * e.abs())).max())
    res["no_grad"] = not sc.chunked_ring_forward(ql.requires_grad_(), kl, vl, chunk=chunks[0]).requires_grad
    errs: dict[str, str] = {}
    try:
        sc.chunked_ring_forward(ql, kl, vl, chunk=3)
    except ValueError as ex:
        errs["chunk"] = str(ex)
    try:  # ranks disagree on the chunk
        sc.chunked_ring_forward(ql, kl, vl, chunk=chunks[0] if rank == 0 else chunks[1])
    except ValueError as ex:
        errs["mismatch"] = str(ex)
    try:
        sc.chunked_ring_forward(ql, kl[:, :, :-1], vl, chunk=1)
    except ValueError as ex:
        errs["shape"] = str(ex)
    res["errors"] = errs
    return res


@pytest.fixture(scope="module", params=[2, 3])
def world_ranks(request: pytest.FixtureRequest) -> tuple[int, list[dict[str, Any]]]:
    p = request.param  # 32 tokens per rank at every world size; P = 3 exercises the middle hops of the ring
    return p, tl.dist.launch(chunk_rank_checks, p, 1, 2, 32 * p, 8, [4, 8, 16, 32], timeout_s=60)


@pytest.fixture
def ranks(world_ranks: tuple[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return world_ranks[1]


def test_chunked_pass_equals_single_process(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert max(r["ratio"]) <= 1.0
        assert r["noncontig"] <= 1.0 and r["no_grad"]


def test_chunked_pass_bytes_and_memory(world_ranks: tuple[int, list[dict[str, Any]]]) -> None:
    chunks, b, h, nl, d = [4, 8, 16, 32], 1, 2, 32, 8
    p, ranks = world_ranks
    assert len(ranks) == p
    for r in ranks:
        for i, c in enumerate(chunks):
            cb = sc.chunk_bytes(b, h, nl, d, p, c)
            assert r["sent"][i] == cb["bytes_sent"] and r["messages"][i] == cb["messages"]
            assert r["largest"][i] <= max(cb["score_tile_bytes"], b * h * nl * d * 4)
        # peak linear in c with slope = the score tile + two K/V chunks (4·b·h·n + 16·b·h·d bytes per token)
        a0, slope = sc.fit_linear(chunks, r["peak"])
        assert slope == pytest.approx(4 * b * h * nl + 16 * b * h * d, rel=1e-9)
        assert all(abs(a0 + slope * c - p) < 1e-6 * p for c, p in zip(chunks, r["peak"], strict=True))


def test_chunked_pass_bad_input(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert "chunk: 3 does not divide seq_local=32" in r["errors"]["chunk"]
        assert r["errors"]["mismatch"].startswith("chunk: mismatch across ranks: rank 0 has 4, rank 1 has 8")
        assert "q, k, v: shapes/dtypes must match" in r["errors"]["shape"]


def test_probe_fits_a_model_and_chooses() -> None:
    m = sc.probe_chunks(batch=1, heads=2, seq=128, head_dim=8, sizes=(4, 16, 64), holdout=(8,), repeat=2, warmup=1)
    pr = m.probe
    assert pr["sizes"] == [4, 8, 16, 64] and pr["fit_sizes"] == [4, 16, 64]
    assert m.seq_local == 64 and m.world_size == 2 and m.bytes_per_token == 2 * 2 * 8 * 4
    assert all(math.isfinite(getattr(m, key)) for key in ("alpha", "beta", "t0", "t1", "s0", "s1"))
    assert m.alpha >= 0.0 and m.t0 >= 0.0 and m.s1 >= 0.0  # intercepts clamped: no negative latency
    assert m.m1 == pytest.approx(4 * 2 * 64 + 16 * 2 * 8, rel=1e-9)  # measured peaks: exactly linear
    assert all(s == ring_bytes(1, 2, 64, 8, 2)["fwd_bytes"] for s in pr["sent"])
    assert max(pr["err"]) < 1e-4
    budget = m.memory_bytes(16) + 1
    ch = sc.choose_chunk(m, mem_budget=budget)
    assert ch.chunk <= 16 and ch.memory_bytes <= budget
    with pytest.raises(ValueError, match="holdout"):
        sc.probe_chunks(seq=128, sizes=(4, 16), holdout=(4,))
    with pytest.raises(ValueError, match="sizes: expected >= 2 distinct"):
        sc.probe_chunks(seq=128, sizes=(4, 4))
    with pytest.raises(ValueError, match="chunk: 5 does not divide seq_local=64"):
        sc.probe_chunks(seq=128, sizes=(4, 5))
