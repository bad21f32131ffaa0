"""Ulysses attention (tinylearn.parallel.ulysses) on real processes (tl.dist.launch, gloo), P = 2 and 4.

Each rank compares its sequence shard of the output and of dq/dk/dv with torch SDPA + autograd on the full sequence
(DESIGN.md tolerance, ratio <= 1; fp64 cases at 1e-10 / 1e-7 stand in for gradcheck), checks the bytes it sent
against the formula and the wire, and both all-to-all implementations (P-1 isend/irecv pairs, gloo's
all_to_all_single) against each other through the oracle.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import tinylearn as tl
from tinylearn.parallel import longctx_workers
from tinylearn.parallel.ulysses import ulysses_attention, ulysses_bytes


def _cases(world: int) -> list[dict[str, Any]]:
    cases = [
        dict(b=2, h=2 * world, n=4 * world, d=8, causal=causal, impl=impl, dtype="float32")
        for causal in (False, True)
        for impl in ("p2p", "gloo")
    ]
    cases.append(dict(b=1, h=world, n=2 * world, d=4, causal=True, impl="p2p", dtype="float64"))
    return cases


@pytest.fixture(scope="module")
def runs() -> dict[int, list[dict[str, Any]]]:
    return {p: tl.dist.launch(longctx_workers.ulysses_checks, p, _cases(p), timeout_s=40) for p in (2, 4)}


def test_gloo_has_all_to_all_single_on_cpu(runs: dict[int, list]) -> None:
    for ranks in runs.values():
        for r in ranks:
            assert r["gloo_all_to_all_single"] == "ok", r["gloo_all_to_all_single"]


def test_matches_single_process_attention_fwd_and_bwd(runs: dict[int, list]) -> None:
    for p, ranks in runs.items():
        for rank, r in enumerate(ranks):
            assert len(r["cases"]) == len(_cases(p))
            for c in r["cases"]:
                for key in ("out", "dq", "dk", "dv"):
                    assert c[key] <= 1.0, (p, rank, c["case"], key, c[key])


def test_bytes_sent_match_the_formula_and_the_wire(runs: dict[int, list]) -> None:
    for ranks in runs.values():
        for r in ranks:
            for c in r["cases"]:
                counts, f = c["counts"], c["formula"]
                assert counts["fwd_bytes"] == f["fwd_bytes"] and counts["bwd_bytes"] == f["bwd_bytes"], c
                assert counts["all_to_all"] == 4  # qkv and out forward; their inverses backward
                assert c["meter_fwd_bytes"] == counts["fwd_bytes"], c  # isend (p2p) or all_to_all_single (gloo)
                assert c["meter_total_bytes"] == counts["bytes_sent"] == 2 * f["fwd_bytes"], c


def test_heads_not_divisible_raise(runs: dict[int, list]) -> None:
    for p, ranks in runs.items():
        for r in ranks:
            msg = r["errors"]["heads"]
            assert f"heads: {p + 1} attention heads are not divisible by world size {p}" in msg, msg


def test_formula_and_local_checks() -> None:
    # 4 tensors of b·h·n·d fp32, (P-1)/P of each leaves the rank
    assert ulysses_bytes(1, 4, 8, 2, 4) == {"fwd_bytes": 4 * 64 * 4 * 3 // 4, "bwd_bytes": 4 * 64 * 4 * 3 // 4}
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"q, k, v: shapes must match"):
        ulysses_attention(q, q, torch.randn(1, 2, 4, 4))
    with pytest.raises(ValueError, match="impl: expected one of"):
        ulysses_attention(q, q, q, impl="nccl")
