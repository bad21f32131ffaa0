"""tinylearn.nn.attention_pruning [Q231]: EMA head / token statistics, plans that never prune the first/last tokens,
pruned attention equal to masked torch SDPA forward and backward, FLOP counts, and importance beating random."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tinylearn.nn import attention_pruning as ap


def _qkv(b=2, h=4, n=24, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def _heavy(b, h, n, d, seed, heavy=(5, 11, 17), weak_heads=(1,)):
    """MODEL batch: a few key positions attract most attention, some heads have small values."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g)
    k = torch.randn(b, h, n, d, generator=g) * 0.3
    u = torch.randn(d, generator=g.manual_seed(99))
    q = q + 2 * u
    k[:, :, list(heavy)] += 2 * u
    v = torch.randn(b, h, n, d, generator=g.manual_seed(seed + 1000))
    v[:, list(weak_heads)] *= 0.05
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
def test_pruned_equals_masked_sdpa_fwd_bwd(causal):
    q, k, v = _qkv()
    pr = ap.AttentionPruner(4, 32)
    pr.observe(q, k, v, causal)
    plan = pr.plan(24, keep_ratio=0.5, head_keep=0.5)
    out = ap.pruned_attention(q, k, v, plan, causal)
    ref = ap.pruned_reference(q, k, v, plan, causal)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-7)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g), strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-7)
    dropped = sorted(set(range(4)) - set(plan.heads.tolist()))
    assert torch.all(out[:, dropped] == 0)


def test_no_pruning_is_sdpa():
    q, k, v = _qkv()
    pr = ap.AttentionPruner(4, 24)
    pr.observe(q, k, v)
    plan = pr.plan(24)
    for causal in (False, True):
        torch.testing.assert_close(
            ap.pruned_attention(q, k, v, plan, causal), F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        )


@pytest.mark.parametrize("strategy", ["importance", "random"])
def test_first_and_last_tokens_kept(strategy):
    q, k, v = _qkv(n=40)
    pr = ap.AttentionPruner(4, 40, keep_first=2, keep_last=3)
    pr.observe(q, k, v)
    for r in (0.01, 0.2, 0.5, 1.0):
        plan = pr.plan(40, keep_ratio=r, strategy=strategy, seed=3)
        keys = plan.keys.tolist()
        assert {0, 1, 37, 38, 39} <= set(keys)
        assert len(keys) == max(5, -(-int(r * 40 * 1000) // 1000))
        assert keys == sorted(set(keys))


def test_ema_statistics():
    pr = ap.AttentionPruner(2, 8, decay=0.5)
    q, k, v = (t.detach() for t in _qkv(1, 2, 8, 4))
    pr.observe(q, k, v)
    p = torch.softmax(q @ k.transpose(-1, -2) / 2, -1)
    h0 = (p @ v).norm(dim=-1).mean(dim=(0, 2))
    torch.testing.assert_close(pr.head_score, h0)
    torch.testing.assert_close(pr.token_score, p.sum(2).mean((0, 1)) / 8)
    torch.testing.assert_close(pr.token_score.sum(), torch.tensor(1.0, dtype=torch.float64))
    pr.observe(2 * q, k, 3 * v)
    p2 = torch.softmax(2 * q @ k.transpose(-1, -2) / 2, -1)
    torch.testing.assert_close(pr.head_score, 0.5 * h0 + 0.5 * (p2 @ (3 * v)).norm(dim=-1).mean(dim=(0, 2)))


def test_statistics_beat_random_and_flops():
    b, h, n, d = 2, 4, 32, 16
    pr = ap.AttentionPruner(h, n, decay=0.8)
    for s in range(5):
        pr.observe(*_heavy(b, h, n, d, s))
    q, k, v = _heavy(b, h, n, d, 50)  # a new batch: the statistics come from other batches
    dense = F.scaled_dot_product_attention(q, k, v)
    plan = pr.plan(n, keep_ratio=0.25, head_keep=0.75)
    assert {5, 11, 17} <= set(plan.keys.tolist())
    assert 1 not in plan.heads.tolist()
    err = ((ap.pruned_attention(q, k, v, plan) - dense).norm() / dense.norm()).item()
    rnd = [
        ((ap.pruned_attention(q, k, v, pr.plan(n, 0.25, 0.75, "random", s)) - dense).norm() / dense.norm()).item()
        for s in range(5)
    ]
    assert err < 0.5 * min(rnd)
    assert plan.flops(b, d) == 4 * b * 3 * n * 8 * d
    assert plan.dense_flops(b, d) == 4 * b * h * n * n * d


def test_bad_inputs():
    q, k, v = _qkv()
    pr = ap.AttentionPruner(4, 24)
    with pytest.raises(RuntimeError, match="observe"):
        pr.plan(24, 0.5)
    pr.observe(q, k, v)
    with pytest.raises(ValueError, match="keep_ratio"):
        pr.plan(24, 0.0)
    with pytest.raises(ValueError, match="head_keep"):
        pr.plan(24, 0.5, 1.5)
    with pytest.raises(ValueError, match="n"):
        pr.plan(30, 0.5)
    with pytest.raises(ValueError, match="strategy"):
        pr.plan(24, 0.5, strategy="magic")
    with pytest.raises(ValueError, match="decay"):
        ap.AttentionPruner(4, 24, decay=1.0)
    with pytest.raises(ValueError, match="heads"):
        pr.observe(q[:, :2], k[:, :2], v[:, :2])
    with pytest.raises(ValueError, match="plan"):
        ap.pruned_attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], pr.plan(24, 0.5))
    nofirst = ap.AttentionPruner(4, 24, keep_first=0, keep_last=0)
    nofirst.observe(q, k, v)
    plan = nofirst.plan(24, 0.1, strategy="random", seed=1)
    if 0 not in plan.keys.tolist():
        with pytest.raises(ValueError, match="key 0"):
            ap.pruned_attention(q, k, v, plan, causal=True)
