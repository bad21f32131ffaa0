"""tinylearn.nn.token_merge (ToMe bipartite soft matching) [Q233]: shapes, exact merging of identical tokens, size
conservation, unmerge after merge, and the merge against a torch transcription of ToMe's reference code."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.nn import token_merge as tm


def _tome_reference(metric: torch.Tensor, r: int, class_token: bool = False):
    """ToMe's bipartite_soft_matching + merge_wavg (facebookresearch/ToMe, tome/merge.py), transcribed."""
    protected = int(class_token)
    t = metric.shape[1]
    r = min(r, (t - protected) // 2)
    with torch.no_grad():
        metric = metric / metric.norm(dim=-1, keepdim=True)
        a, b = metric[..., ::2, :], metric[..., 1::2, :]
        scores = a @ b.transpose(-1, -2)
        if class_token:
            scores[..., 0, :] = -math.inf
        node_max, node_idx = scores.max(dim=-1)
        edge_idx = node_max.argsort(dim=-1, descending=True, stable=True)[..., None]
        unm_idx = edge_idx[..., r:, :]
        src_idx = edge_idx[..., :r, :]
        dst_idx = node_idx[..., None].gather(dim=-2, index=src_idx)
        if class_token:
            unm_idx = unm_idx.sort(dim=1)[0]

    def merge(x: torch.Tensor, mode: str = "mean") -> torch.Tensor:
        src, dst = x[..., ::2, :], x[..., 1::2, :]
        n, t1, c = src.shape
        unm = src.gather(dim=-2, index=unm_idx.expand(n, t1 - r, c))
        src = src.gather(dim=-2, index=src_idx.expand(n, r, c))
        dst = dst.scatter_reduce(-2, dst_idx.expand(n, r, c), src, reduce=mode)
        return torch.cat([unm, dst], dim=1)

    def merge_wavg(x: torch.Tensor, size: torch.Tensor | None = None):
        if size is None:
            size = torch.ones_like(x[..., 0, None])
        x = merge(x * size, mode="sum")
        size = merge(size, mode="sum")
        return x / size, size

    return merge, merge_wavg


@pytest.mark.parametrize("n,r,protected", [(16, 4, 0), (17, 8, 0), (197, 16, 1), (10, 50, 0)])
def test_shapes_and_sizes(n: int, r: int, protected: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3, n, 12))
    m = tm.bipartite_soft_matching(x, r, protected=protected)
    r_eff = min(r, (n + 1) // 2 - protected)
    assert m.r == r_eff and m.n_out == n - r_eff
    y, size = tm.merge_wavg(x, m)
    assert y.shape == (3, n - r_eff, 12) and size.shape == (3, n - r_eff, 1)
    assert np.allclose(size.sum(axis=1), n)  # sizes sum preserved
    assert tm.unmerge(y, m).shape == x.shape
    # a second layer: sizes carried and still summing to n
    m2 = tm.bipartite_soft_matching(y, 2)
    y2, size2 = tm.merge_wavg(y, m2, size)
    assert y2.shape[1] == y.shape[1] - m2.r and np.allclose(size2.sum(axis=1), n)
    if protected:
        assert (m.unm_idx[:, 0] == 0).all() and (y[:, 0] == x[:, 0]).all()  # the class token is never merged


@pytest.mark.parametrize("class_token", [False, True])
def test_matches_tome_reference(class_token: bool) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 33, 16))
    keys = rng.standard_normal((2, 33, 8))
    size = rng.integers(1, 4, (2, 33, 1)).astype(np.float64)
    merge_ref, wavg_ref = _tome_reference(torch.from_numpy(keys), 9, class_token)
    m = tm.bipartite_soft_matching(keys, 9, protected=int(class_token))
    for mode in ("sum", "mean"):
        np.testing.assert_allclose(tm.merge(x, m, mode), merge_ref(torch.from_numpy(x), mode).numpy(), 1e-12, 1e-12)
    y, s = tm.merge_wavg(x, m, size)
    yr, sr = wavg_ref(torch.from_numpy(x), torch.from_numpy(size))
    np.testing.assert_allclose(y, yr.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s, sr.numpy(), rtol=0, atol=0)


def test_merging_identical_tokens_is_exact_and_unmerge_inverts() -> None:
    rng = np.random.default_rng(1)
    base = rng.standard_normal((2, 8, 6))
    x = np.repeat(base, 2, axis=1)  # tokens 2i and 2i+1 identical: each A token's best match is its twin
    x = x + 0.0
    m = tm.bipartite_soft_matching(x, 8)
    assert m.r == 8
    np.testing.assert_array_equal(m.dst_idx, m.src_idx)  # A token i merged into its twin B token i
    y, size = tm.merge_wavg(x, m)
    np.testing.assert_array_equal(y, base)  # B tokens in order, each the (exact) average of two equal tokens
    np.testing.assert_array_equal(size, np.full((2, 8, 1), 2.0))
    np.testing.assert_array_equal(tm.unmerge(y, m), x)  # unmerge(merge(x)) == x exactly
    np.testing.assert_array_equal(tm.merge(x, m, "mean"), base)
    # partial merging (r < the pairs): unmerge still inverts on identical pairs
    m4 = tm.bipartite_soft_matching(x, 4)
    np.testing.assert_array_equal(tm.unmerge(tm.merge(x, m4, "mean"), m4), x)


def test_unmerge_general_and_matrices() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 15, 4))
    m = tm.bipartite_soft_matching(x, 5)
    y = tm.merge(x, m, "mean")
    u = tm.unmerge(y, m)
    mm = m.merge_matrix()
    assert mm.shape == (2, 10, 15) and (mm.sum(axis=1) == 1).all()  # every input goes to exactly one output
    np.testing.assert_allclose(mm @ x, tm.merge(x, m, "sum"), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m.unmerge_matrix() @ y, u, rtol=1e-12, atol=1e-12)
    # every position gets the value of the output token it went into
    dest = mm.argmax(axis=1)
    np.testing.assert_array_equal(u, np.take_along_axis(y, dest[..., None], axis=1))


def test_tl_tensor_path_differentiable() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 12, 5))
    m = tm.bipartite_soft_matching(x, 4)
    xt = tl.Tensor(x, requires_grad=True)
    y, s = tm.merge_wavg(xt, m)
    assert isinstance(y, tl.Tensor)
    np.testing.assert_allclose(y.data, tm.merge_wavg(x, m)[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tm.unmerge(y, m).data, tm.unmerge(y.data, m), rtol=1e-12, atol=1e-12)
    assert tl.autograd.gradcheck(lambda a: tm.unmerge(tm.merge_wavg(a, m)[0], m), [tl.Tensor(x, requires_grad=True)])
    tx = torch.tensor(x, requires_grad=True)
    _, wavg_ref = _tome_reference(torch.from_numpy(x), 4)
    wavg_ref(tx)[0].pow(2).sum().backward()
    (y * y).sum().backward()
    np.testing.assert_allclose(xt.grad.data, tx.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_proportional_attention_bias() -> None:
    size = np.array([[[1.0], [2.0], [4.0]]])
    b = tm.proportional_attention_bias(size)
    assert b.shape == (1, 1, 3)
    np.testing.assert_allclose(b, np.log([[[1, 2, 4]]]))
    # softmax(s + log size) equals weighting exp(s) by size
    s = np.array([[[0.3, -0.2, 0.5]]])
    p = np.exp(s + b) / np.exp(s + b).sum(-1, keepdims=True)
    w = size[..., 0][:, None] * np.exp(s)
    np.testing.assert_allclose(p, w / w.sum(-1, keepdims=True), rtol=1e-12)


def test_bad_input() -> None:
    x = np.zeros((2, 8, 4))
    with pytest.raises(ValueError, match="metric"):
        tm.bipartite_soft_matching(np.zeros(5), 1)
    with pytest.raises(ValueError, match="r"):
        tm.bipartite_soft_matching(x, -1)
    with pytest.raises(ValueError, match="protected"):
        tm.bipartite_soft_matching(x, 1, protected=9)
    m = tm.bipartite_soft_matching(np.random.default_rng(0).standard_normal((2, 8, 4)), 2)
    with pytest.raises(ValueError, match="x: must be"):
        tm.merge(np.zeros((2, 7, 4)), m)
    with pytest.raises(ValueError, match="mode"):
        tm.merge(x, m, "max")
    with pytest.raises(ValueError, match="x: must be"):
        tm.unmerge(x, m)
    with pytest.raises(ValueError, match="size"):
        tm.merge_wavg(x, m, np.zeros((2, 8, 1)))
    with pytest.raises(TypeError, match="matching"):
        tm.merge(x, "m")
