"""Tests for exercises/16_long_context_moe (run on stubs by default, on tinylearn with --impl=reference).

(a) the online-softmax merge of two partial attentions over disjoint key sets: equals torch SDPA (and the
log-sum-exp) over the union for random splits, causal too, folds over P ring steps, ignores rows with no key, and
its backward matches torch autograd through SDPA; (b) top-k routing with capacity: the experts and gates of torch's
softmax + topk, ties to the lower expert, the GShard slot priority, checked against a brute-force loop,
tinylearn.nn.moe.route and the output of tinylearn's MoE layer; (c) the block-sparse (window + global) mask:
against a token-by-token definition, tinylearn's pattern layout, and torch SDPA with the mask against
tinylearn.nn.sparse_attention.block_sparse_attention, forward and backward. Bad input raises ValueError naming the
argument."""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.nn import moe
from tinylearn.nn import sparse_attention as sa

FP64 = {"rtol": 1e-7, "atol": 1e-10}
FP32 = {"rtol": 1e-4, "atol": 1e-5}
SDPA = torch.nn.functional.scaled_dot_product_attention


# ------------------------------------------------------------------------------------ (a) online-softmax merge
def _partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allow: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Attention of every query over the keys ``allow`` [Nq, Nk] lets it see: (o, lse), o = 0 and lse = -inf for a
    row that sees none. Differentiable (no NaN in the backward for empty rows)."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~allow, float("-inf"))
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    den = p.sum(-1)
    safe = torch.where(den > 0, den, torch.ones_like(den))
    o = (p @ v) / safe.unsqueeze(-1)
    lse = torch.where(den > 0, m.squeeze(-1) + torch.log(safe), torch.full_like(den, float("-inf")))
    return o, lse


def _qkv(seed: int, shape: tuple[int, ...], n: int, d: int, dv: int, dtype: torch.dtype, grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(*shape, n, d, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(*shape, n, dv, generator=g, dtype=dtype)
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def _full_lse(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.logsumexp(s, -1)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seed", range(4))
def test_merge_random_split_equals_sdpa_over_the_union(impl: ModuleType, causal: bool, seed: int) -> None:
    n = 37
    q, k, v = _qkv(seed, (2, 3), n, 16, 12, torch.float64)
    rng = np.random.default_rng(seed)
    in1 = torch.from_numpy(rng.random(n) < rng.uniform(0.2, 0.8))  # a random key subset and its complement
    base = torch.tril(torch.ones(n, n, dtype=torch.bool)) if causal else torch.ones(n, n, dtype=torch.bool)
    o1, lse1 = _partial(q, k, v, base & in1)
    o2, lse2 = _partial(q, k, v, base & ~in1)
    if causal:  # a causal split leaves some query rows with no key in one of the parts: the -inf path is exercised
        assert bool(torch.isneginf(lse1).any() or torch.isneginf(lse2).any())
    o, lse = impl.merge_partial_attention(o1, lse1, o2, lse2)
    assert o.shape == o1.shape and o.dtype == torch.float64 and lse.shape == lse1.shape
    torch.testing.assert_close(o, SDPA(q, k, v, is_causal=causal), **FP64)
    torch.testing.assert_close(lse, _full_lse(q, k, causal), **FP64)
    o_swapped, lse_swapped = impl.merge_partial_attention(o2, lse2, o1, lse1)  # the merge is symmetric
    torch.testing.assert_close(o_swapped, o, **FP64)
    torch.testing.assert_close(lse_swapped, lse, **FP64)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_merge_folds_over_ring_steps(impl: ModuleType, causal: bool) -> None:
    n, p = 48, 4  # 4 ranks' contiguous K/V chunks, merged in the order a ring delivers them to rank 2
    q, k, v = _qkv(7, (2, 2), n, 8, 8, torch.float64)
    base = torch.tril(torch.ones(n, n, dtype=torch.bool)) if causal else torch.ones(n, n, dtype=torch.bool)
    chunk = torch.arange(n) // (n // p)
    o, lse = None, None
    for step in range(p):
        src = (2 - step) % p
        ob, lb = _partial(q, k, v, base & (chunk == src))
        o, lse = (ob, lb) if o is None else impl.merge_partial_attention(o, lse, ob, lb)
    torch.testing.assert_close(o, SDPA(q, k, v, is_causal=causal), **FP64)
    torch.testing.assert_close(lse, _full_lse(q, k, causal), **FP64)


def test_merge_of_tinylearn_partials_over_key_subsets_fp32(impl: ModuleType) -> None:
    """The partials come from tinylearn's block_sparse_attention (dense pattern, return_lse) on the sliced key sets:
    the (o, lse) convention of the exercise is the library's."""
    q, k, v = (t.numpy() for t in _qkv(3, (3,), 40, 16, 16, torch.float32))
    perm = np.random.default_rng(3).permutation(40)
    idx1, idx2 = np.sort(perm[:13]), np.sort(perm[13:])
    parts = [sa.block_sparse_attention(q, k[:, i], v[:, i], sa.dense(), 8, return_lse=True) for i in (idx1, idx2)]
    (o1, l1), (o2, l2) = ((torch.from_numpy(a), torch.from_numpy(b)) for a, b in parts)
    o, lse = impl.merge_partial_attention(o1, l1, o2, l2)
    assert o.dtype == torch.float32
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    torch.testing.assert_close(o, SDPA(tq, tk, tv), **FP32)
    torch.testing.assert_close(lse, _full_lse(tq, tk, False), **FP32)


def test_merge_empty_rows_are_ignored_even_when_nan(impl: ModuleType) -> None:
    g = torch.Generator().manual_seed(0)
    o1, o2 = torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(5, 4, generator=g, dtype=torch.float64)
    ninf = float("-inf")
    lse1 = torch.tensor([0.3, ninf, 1.0, ninf, 698.0], dtype=torch.float64)
    lse2 = torch.tensor([ninf, 0.5, 1.0, ninf, 740.0], dtype=torch.float64)  # exp(740) overflows float64
    o1[1], o1[3], o2[0], o2[3] = float("nan"), float("nan"), float("nan"), float("nan")  # 0/0 of an empty part
    args = [a.requires_grad_(True) for a in (o1, lse1, o2, lse2)]
    o, lse = impl.merge_partial_attention(*args)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o[0], o1[0], **FP64)  # only part 1 has keys: it passes through
    torch.testing.assert_close(o[1], o2[1], **FP64)
    torch.testing.assert_close(o[2], (o1[2] + o2[2]) / 2, **FP64)  # equal denominators: the plain average
    torch.testing.assert_close(o[3], torch.zeros(4, dtype=torch.float64), **FP64)  # no key anywhere: 0
    w = 1.0 / (1.0 + math.exp(42.0))  # exp(698) / (exp(698) + exp(740)): a stable merge never forms exp(740)
    torch.testing.assert_close(o[4], w * o1[4] + (1 - w) * o2[4], **FP64)
    expected = torch.tensor([0.3, 0.5, 1.0 + math.log(2.0), 740.0 + math.log1p(math.exp(-42.0))], dtype=torch.float64)
    torch.testing.assert_close(lse[[0, 1, 2, 4]], expected, **FP64)
    assert lse[3] == ninf
    (o.sum() + lse[[0, 1, 2, 4]].sum()).backward()  # the backward sees the NaN rows and the -inf entries too
    for a in args:
        assert a.grad is not None and torch.isfinite(a.grad).all()
    assert (o1.grad[[1, 3]] == 0).all() and (o2.grad[[0, 3]] == 0).all()  # ignored rows get no gradient
    torch.testing.assert_close(o1.grad[0], torch.ones(4, dtype=torch.float64), **FP64)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_merge_backward_matches_sdpa_autograd(impl: ModuleType, causal: bool) -> None:
    n = 29
    q, k, v = _qkv(11, (2,), n, 8, 6, torch.float64, grad=True)
    tq, tk, tv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    gen = torch.Generator().manual_seed(5)
    go, gl = torch.randn(2, n, 6, generator=gen, dtype=torch.float64), torch.randn(2, n, generator=gen).double()
    in1 = torch.from_numpy(np.random.default_rng(1).random(n) < 0.5)
    base = torch.tril(torch.ones(n, n, dtype=torch.bool)) if causal else torch.ones(n, n, dtype=torch.bool)
    o, lse = impl.merge_partial_attention(*_partial(q, k, v, base & in1), *_partial(q, k, v, base & ~in1))
    ((o * go).sum() + (lse * gl).sum()).backward()
    ((SDPA(tq, tk, tv, is_causal=causal) * go).sum() + (_full_lse(tq, tk, causal) * gl).sum()).backward()
    for mine, ref in ((q, tq), (k, tk), (v, tv)):
        assert mine.grad is not None and torch.isfinite(mine.grad).all()
        torch.testing.assert_close(mine.grad, ref.grad, **FP64)


def test_merge_gradcheck_fp64(impl: ModuleType) -> None:
    g = torch.Generator().manual_seed(2)
    args = [
        torch.randn(2, 3, 4, generator=g, dtype=torch.float64),
        torch.randn(2, 3, generator=g, dtype=torch.float64),
        torch.randn(2, 3, 4, generator=g, dtype=torch.float64),
        torch.randn(2, 3, generator=g, dtype=torch.float64) * 3,
    ]
    assert torch.autograd.gradcheck(impl.merge_partial_attention, [a.requires_grad_(True) for a in args])


def test_merge_bad_input(impl: ModuleType) -> None:
    o, lse = torch.zeros(2, 3, 4), torch.zeros(2, 3)
    with pytest.raises(ValueError, match="^o1: "):
        impl.merge_partial_attention(o.numpy(), lse, o, lse)
    with pytest.raises(ValueError, match="^lse2: "):
        impl.merge_partial_attention(o, lse, o, torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="^o2: "):
        impl.merge_partial_attention(o, lse, torch.zeros(2, 3, 5), lse)
    with pytest.raises(ValueError, match="^o2: "):
        impl.merge_partial_attention(o, lse, o.double(), lse)
    with pytest.raises(ValueError, match="^lse1: "):
        impl.merge_partial_attention(o, torch.zeros(2, 4), o, lse)
    with pytest.raises(ValueError, match="^lse2: "):
        impl.merge_partial_attention(o, lse, o, torch.zeros(3, 2))
    for bad in (float("nan"), float("inf")):
        lse_bad = lse.clone()
        lse_bad[1, 2] = bad
        with pytest.raises(ValueError, match="^lse1: "):
            impl.merge_partial_attention(o, lse_bad, o, lse)
        with pytest.raises(ValueError, match="^lse2: "):
            impl.merge_partial_attention(o, lse, o, lse_bad)


# --------------------------------------------------------------------------------------- (b) top-k MoE routing
def _brute_route(logits: np.ndarray, top_k: int, capacity: int | None):
    t, e = logits.shape
    z = np.exp(logits.astype(np.float64) - logits.astype(np.float64).max(axis=1, keepdims=True))
    probs = z / z.sum(axis=1, keepdims=True)
    expert = np.zeros((t, top_k), np.int64)
    gate = np.zeros((t, top_k))
    for i in range(t):
        order = sorted(range(e), key=lambda j: (-logits[i, j], j))[:top_k]
        expert[i] = order
        gate[i] = [probs[i, j] for j in order]
        if top_k >= 2:
            gate[i] /= gate[i].sum()
    kept = np.zeros((t, top_k), bool)
    load = [0] * e
    for slot in range(top_k):
        for i in range(t):
            ex = expert[i, slot]
            if capacity is None or load[ex] < capacity:
                kept[i, slot] = True
                load[ex] += 1
    return expert, gate, kept


CASES = [(64, 8, 1, 10), (64, 8, 2, 20), (50, 6, 3, 30), (33, 4, 2, 5), (16, 5, 2, None), (40, 4, 1, 1), (7, 3, 3, 100)]


@pytest.mark.parametrize("t, e, top_k, cap", CASES)
def test_topk_route_matches_brute_force_and_tinylearn(impl: ModuleType, t: int, e: int, top_k: int, cap) -> None:
    rng = np.random.default_rng(t * 100 + e * 10 + top_k)
    logits = rng.standard_normal((t, e)) * 2.0
    logits[:, 0] += 1.0  # a popular expert: some assignments overflow it
    expert, gate, kept = impl.topk_route(logits, top_k, cap)
    assert expert.shape == gate.shape == kept.shape == (t, top_k)
    assert expert.dtype == np.int64 and kept.dtype == np.bool_ and gate.dtype == np.float64
    b_expert, b_gate, b_kept = _brute_route(logits, top_k, cap)
    np.testing.assert_array_equal(expert, b_expert)
    np.testing.assert_allclose(gate, b_gate, **FP64)
    np.testing.assert_array_equal(kept, b_kept)
    z = np.exp(logits - logits.max(1, keepdims=True))
    r = moe.route(z / z.sum(1, keepdims=True), top_k, cap)  # the library's router on the same probabilities
    np.testing.assert_array_equal(expert, r.expert)
    np.testing.assert_array_equal(kept, r.keep)
    if cap is not None:
        assert np.bincount(expert[kept], minlength=e).max() <= cap
        if cap < t:
            assert not kept.all()  # the case was built to overflow the popular expert
    else:
        assert kept.all()


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_topk_route_matches_torch_topk_fp32(impl: ModuleType, top_k: int) -> None:
    logits = np.random.default_rng(top_k).standard_normal((100, 8)).astype(np.float32)
    expert, gate, kept = impl.topk_route(logits, top_k, None)
    assert gate.dtype == np.float32 and kept.all()
    val, idx = torch.topk(torch.softmax(torch.from_numpy(logits), -1), top_k, dim=-1)  # distinct values: no ties
    if top_k >= 2:
        val = val / val.sum(-1, keepdim=True)
    np.testing.assert_array_equal(expert, idx.numpy())
    np.testing.assert_allclose(gate, val.numpy(), **FP32)


def test_topk_route_ties_and_slot_priority(impl: ModuleType) -> None:
    expert, gate, kept = impl.topk_route(np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0]]), 2, 1)  # the docstring example
    np.testing.assert_array_equal(expert, [[0, 1], [1, 2]])
    np.testing.assert_array_equal(kept, [[True, False], [True, True]])  # t1's first choice beats t0's second
    ties = np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 2.0, 2.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    expert, gate, kept = impl.topk_route(ties, 2, None)
    np.testing.assert_array_equal(expert, [[0, 1], [1, 2], [0, 1]])  # ties: the lower expert index first
    np.testing.assert_allclose(gate, 0.5, **FP64)
    # capacity 2, every token's first choice is expert 0: tokens 0 and 1 get its slots, in token order
    same = np.tile([3.0, 2.0, 1.0], (5, 1))
    expert, gate, kept = impl.topk_route(same, 2, 2)
    np.testing.assert_array_equal(kept[:, 0], [True, True, False, False, False])
    np.testing.assert_array_equal(kept[:, 1], [True, True, False, False, False])  # expert 1's two slots
    np.testing.assert_allclose(gate[:, 0], np.exp(3.0) / (np.exp(3.0) + np.exp(2.0)), **FP64)  # renormalised top-2
    expert, gate, kept = impl.topk_route(same, 1, 2)
    np.testing.assert_allclose(gate[:, 0], np.exp(3.0) / np.exp([3.0, 2.0, 1.0]).sum(), **FP64)  # top-1: raw prob
    expert, gate, kept = impl.topk_route(np.zeros((0, 4)), 2, 3)  # no tokens
    assert expert.shape == gate.shape == kept.shape == (0, 2)


@pytest.mark.parametrize("top_k", [1, 2])
def test_topk_route_drives_tinylearn_moe_layer(impl: ModuleType, top_k: int) -> None:
    """y_t = sum_j kept * gate * expert_{e_j}(x_t) with the exercise's routing (experts run in torch) equals the
    output of tinylearn's MoE layer, which routes with the same rules."""
    rng = np.random.default_rng(top_k)
    t, d, f, e = 40, 6, 10, 4
    x = rng.standard_normal((t, d))
    wr = rng.standard_normal((e, d))
    wr[0] += 0.5 * x.mean(0)  # expert 0 is popular: the capacity drops some tokens
    w1, b1 = rng.standard_normal((e, d, f)) * 0.3, rng.standard_normal((e, f)) * 0.1
    w2, b2 = rng.standard_normal((e, f, d)) * 0.3, rng.standard_normal((e, d)) * 0.1
    y_tl, _, _, stats = moe.moe_ffn(*(tl.Tensor(a) for a in (x, wr, w1, b1, w2, b2)), top_k=top_k, capacity_factor=1.0)
    cap = moe.capacity(t, e, top_k, 1.0)
    expert, gate, kept = impl.topk_route(x @ wr.T, top_k, cap)
    assert stats["dropped"] == int((~kept).sum()) > 0
    xt, w1t, b1t, w2t, b2t = (torch.from_numpy(a) for a in (x, w1, b1, w2, b2))
    y = torch.zeros(t, d, dtype=torch.float64)
    for i, j in zip(*np.nonzero(kept), strict=True):
        ex = int(expert[i, j])
        h = torch.nn.functional.gelu(xt[i] @ w1t[ex] + b1t[ex])
        y[i] += float(gate[i, j]) * (h @ w2t[ex] + b2t[ex])
    np.testing.assert_allclose(y_tl.data, y.numpy(), **FP64)  # both gelus are the exact erf form


def test_topk_route_bad_input(impl: ModuleType) -> None:
    good = np.zeros((4, 3))
    for bad in (np.zeros(3), np.zeros((4, 3), np.int64), np.zeros((4, 0)), np.array([[0.0, np.nan, 1.0]])):
        with pytest.raises(ValueError, match="^logits: "):
            impl.topk_route(bad, 1, None)
    with pytest.raises(ValueError, match="^logits: "):
        impl.topk_route(np.array([[0.0, np.inf]]), 1, None)
    for bad in (0, 4, -1, 1.0, True, "2"):
        with pytest.raises(ValueError, match="^top_k: "):
            impl.topk_route(good, bad, None)
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match="^capacity: "):
            impl.topk_route(good, 1, bad)


# ------------------------------------------------------------------------------------ (c) block-sparse mask
def _brute_mask(n: int, block: int, window: int, n_global: int, causal: bool) -> np.ndarray:
    g = -(-n_global // block)
    m = np.zeros((n, n), bool)
    for i in range(n):
        for j in range(n):
            qb, kb = i // block, j // block
            m[i, j] = (abs(qb - kb) <= window or qb < g or kb < g) and (not causal or j <= i)
    return m


MASKS = [(64, 8, 1, 8, False), (70, 16, 1, 20, True), (45, 4, 2, 0, False), (33, 5, 0, 0, True), (20, 32, 1, 3, False)]


@pytest.mark.parametrize("n, block, window, n_global, causal", MASKS)
def test_block_sparse_mask_definition(impl: ModuleType, n: int, block: int, window: int, n_global: int, causal) -> None:
    m = impl.block_sparse_mask(n, block, window, n_global, causal)
    assert m.shape == (n, n) and m.dtype == np.bool_
    np.testing.assert_array_equal(m, _brute_mask(n, block, window, n_global, causal))
    pattern = sa.local(window) | sa.global_tokens(n_global)
    np.testing.assert_array_equal(m, (pattern | sa.causal() if causal else pattern).layout(n, n, block).dense_mask())
    assert m.diagonal().all()


def test_block_sparse_mask_special_cases(impl: ModuleType) -> None:
    n, b = 48, 8
    np.testing.assert_array_equal(impl.block_sparse_mask(n, b, 0, 0), np.kron(np.eye(6, dtype=bool), np.ones((b, b))))
    assert impl.block_sparse_mask(n, b, 5, 0).all()  # a window as wide as the sequence: dense
    assert impl.block_sparse_mask(n, b, 0, n).all()  # every token global: dense
    np.testing.assert_array_equal(impl.block_sparse_mask(n, b, 5, 0, True), np.tril(np.ones((n, n), bool)))
    m = impl.block_sparse_mask(n, b, 0, 1)  # one global token rounds up to the whole first block
    assert m[:b].all() and m[:, :b].all() and not m[b : 2 * b, 2 * b :].any()


@pytest.mark.parametrize("causal", [False, True], ids=["window", "causal"])
def test_block_sparse_mask_sdpa_matches_tinylearn_sparse_attention(impl: ModuleType, causal: bool) -> None:
    n, block, window, n_global = 56, 8, 1, 10
    mask = impl.block_sparse_mask(n, block, window, n_global, causal)
    assert 0.2 < mask.mean() < 0.8  # genuinely sparse, genuinely not empty
    pattern = sa.local(window) | sa.global_tokens(n_global)
    pattern = pattern | sa.causal() if causal else pattern
    q, k, v = (t.numpy() for t in _qkv(9, (2, 2), n, 16, 8, torch.float64))
    gout = np.random.default_rng(9).standard_normal((2, 2, n, 8))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    to = SDPA(tq, tk, tv, attn_mask=torch.from_numpy(mask))
    to.backward(torch.from_numpy(gout))
    xq, xk, xv = (tl.Tensor(a, requires_grad=True) for a in (q, k, v))
    o = sa.block_sparse_attention(xq, xk, xv, pattern, block, backend="numpy")
    o.backward(tl.Tensor(gout))
    np.testing.assert_allclose(o.data, to.detach().numpy(), **FP64)
    for x, t in ((xq, tq), (xk, tk), (xv, tv)):
        gx = x.grad.data if isinstance(x.grad, tl.Tensor) else x.grad
        np.testing.assert_allclose(gx, t.grad.numpy(), **FP64)
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))  # the default backend (C++ when built) in float32
    o32 = sa.block_sparse_attention(q32, k32, v32, pattern, block)
    ref32 = SDPA(*(torch.from_numpy(a) for a in (q32, k32, v32)), attn_mask=torch.from_numpy(mask))
    np.testing.assert_allclose(o32, ref32.numpy(), **FP32)


def test_block_sparse_mask_bad_input(impl: ModuleType) -> None:
    for bad in (0, -1, 2.0, True, "8"):
        with pytest.raises(ValueError, match="^n: "):
            impl.block_sparse_mask(bad, 8, 1, 0)
        with pytest.raises(ValueError, match="^block: "):
            impl.block_sparse_mask(32, bad, 1, 0)
    for bad in (-1, 1.5, False, None):
        with pytest.raises(ValueError, match="^window: "):
            impl.block_sparse_mask(32, 8, bad, 0)
        with pytest.raises(ValueError, match="^n_global: "):
            impl.block_sparse_mask(32, 8, 1, bad)
    for bad in (1, 0, "yes", None):
        with pytest.raises(ValueError, match="^causal: "):
            impl.block_sparse_mask(32, 8, 1, 0, bad)
