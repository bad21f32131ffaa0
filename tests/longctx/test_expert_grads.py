"""Sparse / uneven expert-gradient communication (Q112, Q121) on real processes (tl.dist.launch, gloo, 2 ranks):
mode "active" (idle experts skipped, union-active rows bucketed and all-reduced) equals the dense mean exactly and
sends fewer bytes; top-k with ratio 1 and PowerSGD with full rank equal the dense mean; top-k with error feedback
satisfies sum_t out_t = mean_r(sum_t g_t - e_T); the measured bytes (traffic_meter) equal the computed ones; a
small MoE training run with top-k / PowerSGD converges like dense."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.longctx import expert_grads as EG
from tinylearn.parallel.moe_parallel import TorchMoE

WORLD = 2
RTOL, ATOL = 1e-4, 1e-5


def _dense_mean(res: list[dict], step: int) -> np.ndarray:
    return np.mean([r["rows"][step] for r in res], axis=0)


def _run(mode: str, **kw: object) -> list[dict]:
    return tl.dist.launch(EG.sync_check_worker, WORLD, mode, 3, 0, 6, kw.get("ratio", 0.1), kw.get("rank", 2))


def test_active_mode_exact_and_cheaper() -> None:
    res = _run("active")
    for t in range(3):
        for r in res:
            np.testing.assert_allclose(r["out"][t], _dense_mean(res, t), rtol=RTOL, atol=ATOL)
        assert res[0]["active"][t] == 4  # experts 1 and 4 idle on both ranks, expert 2 active on rank 1 only
    for r in res:
        assert r["bytes"] == r["measured"]
        assert max(r["bytes"]) < r["dense_bytes"]
        np.testing.assert_array_equal(r["out"][0][[1, 4]], 0)


def test_dense_mode_bytes_and_values() -> None:
    res = _run("dense")
    np.testing.assert_allclose(res[1]["out"][2], _dense_mean(res, 2), rtol=RTOL, atol=ATOL)
    assert res[0]["bytes"] == res[0]["measured"] == [res[0]["dense_bytes"]] * 3


def test_topk_full_ratio_equals_dense() -> None:
    res = _run("topk", ratio=1.0)
    for t in range(3):
        np.testing.assert_allclose(res[0]["out"][t], _dense_mean(res, t), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(res[0]["residual"], 0, atol=0)


def test_topk_error_feedback_telescopes() -> None:
    res = _run("topk", ratio=0.1)
    sent = np.sum(res[0]["out"], axis=0)
    truth = np.mean([np.sum(r["rows"], axis=0) - r["residual"] for r in res], axis=0)
    np.testing.assert_allclose(sent, truth, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(res[0]["out"], res[1]["out"])  # every rank applies the same update
    for r in res:
        assert r["bytes"] == r["measured"]
        assert max(r["bytes"]) < 0.5 * r["dense_bytes"]
    assert np.abs(res[0]["residual"]).sum() > 0


def test_powersgd_full_rank_equals_dense() -> None:
    res = _run("powersgd", rank=4)  # min(O, I) = 4 for both matrices: P spans the column space
    for t in range(3):
        np.testing.assert_allclose(res[0]["out"][t], _dense_mean(res, t), rtol=RTOL, atol=1e-4)
    assert res[0]["bytes"] == res[0]["measured"]


def test_powersgd_low_rank_error_feedback() -> None:
    res = _run("powersgd", rank=1)
    sent = np.sum(res[0]["out"], axis=0)
    truth = np.mean([np.sum(r["rows"], axis=0) - r["residual"] for r in res], axis=0)
    np.testing.assert_allclose(sent, truth, rtol=RTOL, atol=1e-4)
    assert np.linalg.norm(res[0]["out"][0] - _dense_mean(res, 0)) > 1e-3  # rank 1 is lossy


def test_training_converges_like_dense() -> None:
    kw = (12, 0, 8, 8, 16, 8, 1.0, 0.1, 2, 4.0)
    finals = {}
    for mode in ("dense", "topk", "powersgd"):
        res = tl.dist.launch(EG.train_worker, WORLD, mode, *kw)
        assert res[0]["param_digest"] == pytest.approx(res[1]["param_digest"], rel=1e-6)
        assert res[0]["loss"][-1] < res[0]["loss"][0]
        finals[mode] = (res[0]["loss"][-1], sum(res[0]["bytes"]))
    for mode in ("topk", "powersgd"):
        assert finals[mode][0] == pytest.approx(finals["dense"][0], rel=0.1)
        assert finals[mode][1] < finals["dense"][1]


def test_rows_roundtrip_and_idle_experts() -> None:
    torch.manual_seed(0)
    moe = TorchMoE(4, 6, 5, top_k=1, dropless=True)
    x = torch.randn(3, 4)
    moe(x).sum().backward()
    rows = EG.expert_grad_rows(moe)
    assert rows.shape == (5, 4 * 6 + 6 + 6 * 4 + 4)
    used = {e for e in range(5) if moe.last_stats["tokens_per_expert"][e] > 0}
    np.testing.assert_array_equal(EG.active_experts(rows).numpy(), [e in used for e in range(5)])
    w1 = moe.w1.grad.clone()
    EG.set_expert_grads(moe, rows * 2)
    torch.testing.assert_close(moe.w1.grad, 2 * w1)


def test_buckets_and_bad_inputs() -> None:
    assert EG.make_buckets([0, 2, 3, 5], 10, 25) == [[0, 2], [3, 5]]
    assert EG.make_buckets([1, 2], 30, 25) == [[1], [2]]
    with pytest.raises(ValueError, match="bucket_numel"):
        EG.make_buckets([0], 10, 0)
    with pytest.raises(ValueError, match="mode"):
        EG.ExpertGradSync([(2, 2)], 2, mode="zip")
    with pytest.raises(ValueError, match="ratio"):
        EG.ExpertGradSync([(2, 2)], 2, ratio=0.0)
    with pytest.raises(ValueError, match="rank"):
        EG.ExpertGradSync([(2, 2)], 2, mode="powersgd", rank=0)
    with pytest.raises(ValueError, match="rows"):
        EG.ExpertGradSync([(2, 2)], 2).sync(torch.zeros(3, 4))


def test_single_process_modes() -> None:
    rows = torch.randn(3, 4 * 6 + 6 + 6 * 4 + 4, generator=torch.Generator().manual_seed(2))
    rows[1] = 0
    shapes = [(4, 6), (6,), (6, 4), (4,)]
    for mode, kw in (("active", {}), ("topk", {"ratio": 1.0}), ("powersgd", {"rank": 4})):
        sync = EG.ExpertGradSync(shapes, 3, mode=mode, **kw)
        torch.testing.assert_close(sync.sync(rows), rows, rtol=1e-5, atol=1e-5)
        assert sync.last["active"] == 2 and sync.last["bytes"] == 0
