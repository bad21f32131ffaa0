"""tinylearn.longctx.pattern_search [Q132]: the per-layer q/k/v of a TinyGPT (rebuilt into the model's logits with torch
SDPA), the error/cost table against torch masked SDPA, the multiple-choice-knapsack DP against brute force, greedy
and uniform baselines, and bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tinylearn.inference import TinyGPT
from tinylearn.longctx import pattern_search as ps
from tinylearn.nn import sparse_attention as sa

FP32 = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def gpt():
    np.random.seed(0)
    model = TinyGPT(vocab_size=32, d_model=32, n_heads=4, n_layers=2, max_seq_len=64, n_kv_heads=2)
    ids = np.random.default_rng(1).integers(0, 32, (2, 64))
    return model, ids


def test_layer_qkv_rebuilds_the_model_logits(gpt):
    model, ids = gpt
    cal = ps.layer_qkv(model, ids)
    assert len(cal) == 2 and all(a.shape == (2, 4, 64, 8) and a.dtype == np.float32 for t in cal for a in t)
    from tinylearn.autograd import Tensor

    x = model.tok_emb(ids)
    for (q, k, v), blk in zip(cal, model.blocks):
        o = torch.nn.functional.scaled_dot_product_attention(
            *(torch.from_numpy(a) for a in (q, k, v)), is_causal=True
        ).numpy()
        o = o.transpose(0, 2, 1, 3).reshape(2, 64, 32)
        x = x + blk.attn.o_proj(Tensor(o))
        x = x + blk.mlp(blk.ln2(x))
    logits = model.lm_head(model.ln_f(x)).data
    np.testing.assert_allclose(logits, model(ids).data, rtol=1e-4, atol=1e-4)
    assert not np.allclose(cal[0][0], cal[1][0])  # layers differ


def test_layer_qkv_rejects_bad_inputs(gpt):
    model, ids = gpt
    with pytest.raises(TypeError, match="model"):
        ps.layer_qkv(object(), ids)
    with pytest.raises(ValueError, match="ids"):
        ps.layer_qkv(model, np.zeros((1, 65), np.int64))


def _sdpa_masked(q, k, v, mask):
    t = [torch.from_numpy(a).double() for a in (q, k, v)]
    return torch.nn.functional.scaled_dot_product_attention(*t, attn_mask=torch.from_numpy(mask)).numpy()


@pytest.mark.parametrize("is_causal", [False, True])
def test_score_patterns_matches_torch_masked_sdpa(gpt, is_causal):
    model, ids = gpt
    cal = ps.layer_qkv(model, ids)
    cands = [sa.local(0), sa.local(1) | sa.global_tokens(16), sa.strided(2), sa.dense()]
    sc = ps.score_patterns(cal, cands, 16, is_causal=is_causal, time_it=False)
    assert sc.error.shape == sc.nnz.shape == (2, 4) and np.isnan(sc.time_ms).all()
    ref_mask = np.tril(np.ones((64, 64), bool)) if is_causal else np.ones((64, 64), bool)
    for li, (q, k, v) in enumerate(cal):
        ref = _sdpa_masked(q, k, v, ref_mask)
        for ci, p in enumerate(cands):
            lay = ((p | sa.causal()) if is_causal else p).layout(64, 64, 16)
            o = _sdpa_masked(q, k, v, lay.dense_mask())
            want = np.linalg.norm(o - ref) / np.linalg.norm(ref)
            assert sc.error[li, ci] == pytest.approx(want, rel=1e-3, abs=1e-5)
            assert sc.nnz[li, ci] == lay.nnz
    assert (sc.error[:, 3] < 1e-5).all() and (sc.error[:, 0] > 0.01).all()
    assert (sc.density[:, 3] == 1.0).all() and (sc.density[:, 0] < sc.density[:, 1]).all()


def test_score_patterns_times_every_cell(gpt):
    model, ids = gpt
    cal = ps.layer_qkv(model, ids[:1])
    sc = ps.score_patterns(cal, [sa.local(0), sa.dense()], 16, repeat=1, threads=1)
    assert np.isfinite(sc.time_ms).all() and (sc.time_ms > 0).all() and (sc.dense_time_ms > 0).all()


def _table(rng, nl, nc, integer):
    c = np.sort(rng.integers(1, 40, (nl, nc)) if integer else rng.uniform(0.1, 5.0, (nl, nc)), axis=1)
    e = np.sort(rng.uniform(0, 1, (nl, nc)), axis=1)[:, ::-1].copy()  # cheaper -> less accurate
    return e, c.astype(np.float64)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("integer", [True, False])
def test_dp_equals_brute_force(seed, integer):
    rng = np.random.default_rng(seed)
    e, c = _table(rng, 4, 4, integer)
    for frac in (0.3, 0.5, 0.8):
        budget = c.min(1).sum() + frac * (c.max(1).sum() - c.min(1).sum())
        bf = ps.brute_force((e, c), budget)
        dp = ps.search_patterns((e, c), budget, method="dp", resolution=20000)
        gr = ps.search_patterns((e, c), budget, method="greedy")
        un = ps.uniform_choice((e, c), budget)
        assert dp.feasible and gr.feasible and bf.feasible
        if integer:
            assert dp.error == pytest.approx(bf.error, abs=1e-12)
        else:  # the cost grid rounds up: never infeasible, at most a little worse
            assert bf.error - 1e-12 <= dp.error <= bf.error + 0.05
        assert gr.error >= bf.error - 1e-12 and un.error >= bf.error - 1e-12


def test_greedy_can_miss_the_optimum_the_dp_finds():
    # greedy first takes layer 1's better error-per-cost move (0.29 / 3 < 0.8 / 8), still over budget, then must
    # also cut layer 0: error 1.09; the optimum cuts layer 0 alone (0.8)
    e = np.array([[0.0, 0.8], [0.0, 0.29]])
    c = np.array([[10.0, 2.0], [10.0, 7.0]])
    bf, dp = ps.brute_force((e, c), 13), ps.search_patterns((e, c), 13)
    gr = ps.search_patterns((e, c), 13, method="greedy")
    assert dp.choice == bf.choice and dp.error == pytest.approx(bf.error)
    assert dp.choice == (1, 0) and gr.feasible and gr.choice == (1, 1) and gr.error > dp.error + 0.2


def test_infeasible_budget_returns_the_cheapest_marked():
    e, c = np.array([[0.0, 1.0]]), np.array([[5.0, 3.0]])
    for method in ("dp", "greedy"):
        r = ps.search_patterns((e, c), 2, method=method)
        assert r.choice == (1,) and not r.feasible and r.cost == 3.0


def test_search_on_scores_and_patterns(gpt):
    model, ids = gpt
    cal = ps.layer_qkv(model, ids)
    cands = [sa.local(0), sa.local(1), sa.local(1) | sa.global_tokens(16), sa.dense()]
    sc = ps.score_patterns(cal, cands, 16, is_causal=True, time_it=False)
    budget = float(sc.nnz[:, 3].sum()) * 0.7
    r = ps.search_patterns(sc, budget, cost="nnz")
    assert r.feasible and r.cost <= budget and len(r.patterns(sc)) == 2
    assert r.error <= ps.uniform_choice(sc, budget).error + 1e-12
    with pytest.raises(ValueError, match="time_ms"):
        ps.search_patterns(sc, 1.0, cost="time_ms")  # not timed: NaN costs


def test_bad_inputs():
    e, c = np.zeros((2, 2)), np.ones((2, 2))
    with pytest.raises(ValueError, match="budget"):
        ps.search_patterns((e, c), -1)
    with pytest.raises(ValueError, match="budget"):
        ps.search_patterns((e, c), math.inf)
    with pytest.raises(TypeError, match="budget"):
        ps.search_patterns((e, c), "3")
    with pytest.raises(ValueError, match="method"):
        ps.search_patterns((e, c), 3, method="beam")
    with pytest.raises(ValueError, match="cost"):
        ps.search_patterns((e, np.ones((2, 3))), 3)
    with pytest.raises(ValueError, match="costs"):
        ps.search_patterns((e, -c), 3)
    with pytest.raises(TypeError, match="scores"):
        ps.search_patterns([e, c], 3)
    with pytest.raises(ValueError, match="candidates"):
        ps.score_patterns([(e, e, e)], [])
    with pytest.raises(TypeError, match=r"candidates\[0\]"):
        ps.score_patterns([(e, e, e)], ["local"])
    with pytest.raises(ValueError, match="threads"):
        ps.score_patterns([(e, e, e)], [sa.dense()], threads=0)
    with pytest.raises(ValueError, match=r"calibration\[0\]"):
        ps.score_patterns([(e, e)], [sa.dense()])
