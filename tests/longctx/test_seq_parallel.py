"""Megatron sequence parallelism (tinylearn.parallel.seq_parallel) on 2 real processes (tl.dist.launch, gloo).

SequenceParallelMLP (LN -> Column -> GeLU -> Row on sequence shards) must equal nn.LayerNorm + DenseMLP on the full
sequence: output shard, input-gradient shard and every parameter gradient (LN and Row bias after
allreduce_sp_grads), at the fp32 tolerance. The activation bytes each rank sends (measured on dist.isend) equal the
tensor-parallel version's (all-gather + reduce-scatter = ring all-reduce), and the LayerNorm region saves 1/P of
the activations.
"""

from __future__ import annotations

from typing import Any

import pytest

import tinylearn as tl
from tinylearn.parallel import longctx_workers
from tinylearn.parallel.seq_parallel import sp_bytes

B, S, H, FFN = 2, 8, 16, 32


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return tl.dist.launch(longctx_workers.sp_checks, 2, B, S, H, FFN, timeout_s=40)


def test_matches_dense_ln_mlp(ranks: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(ranks):
        for key in ("out", "dx", "ln_weight", "ln_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "tp_out"):
            assert r[key] <= 1.0, (rank, key, r[key])


def test_same_bytes_as_tensor_parallel(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        f = r["formula"]
        assert r["sp_fwd_bytes"] == r["tp_fwd_bytes"] == f["sp_fwd_bytes"] == B * S * H * 4  # 2·(P-1)/P·bsH, P=2
        assert r["sp_bwd_bytes"] == r["tp_bwd_bytes"] == f["sp_bwd_bytes"]
        assert r["sp_counts"] == {"all_gather": 2, "reduce_scatter": 2, "all_reduce": 1}
        assert r["sp_param_grad_bytes"] == 3 * H * 4  # LN weight+bias, Row bias: ring all-reduce of 3H, 2·(P-1)/P = 1


def test_layernorm_region_memory_divided_by_p(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert r["ln_saved_bytes_sp"] * 2 == r["ln_saved_bytes_tp"] > 0, r


def test_uneven_sequence_raises(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert r["seq_error"].startswith(f"seq: length {S + 1}") and "world size 2" in r["seq_error"]


def test_formula() -> None:
    # 2·(P-1)/P of b·s·H fp32 elements per direction, P = 4: 2 · 3/4 · 256 · 4 bytes
    assert sp_bytes(2, 8, 16, 4) == dict.fromkeys(
        ("tp_fwd_bytes", "tp_bwd_bytes", "sp_fwd_bytes", "sp_bwd_bytes"), 1536
    )
