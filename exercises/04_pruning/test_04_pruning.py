"""Exercise tests for 04_pruning: every answer is checked against torch or an independent formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.utils.prune as tprune


def test_l1_mask_matches_torch(impl):
    rng = np.random.default_rng(0)
    for shape, amount in (((6, 7), 0.3), ((4, 3, 2, 2), 0.5), ((50,), 0.9), ((5, 5), 0.0)):
        w = rng.standard_normal(shape).astype(np.float32)
        lin = torch.nn.Linear(1, 1)
        lin.weight = torch.nn.Parameter(torch.from_numpy(w.copy()))
        tprune.l1_unstructured(lin, "weight", amount)
        mask = impl.l1_mask(w, amount)
        assert mask.shape == w.shape
        np.testing.assert_array_equal(mask, lin.weight_mask.numpy())


def test_l1_mask_ties_lower_index_first(impl):
    np.testing.assert_array_equal(impl.l1_mask(np.ones(6, np.float32), 0.5), [0, 0, 0, 1, 1, 1])


def test_global_masks_match_torch(impl):
    rng = np.random.default_rng(1)
    ws = [rng.standard_normal((8, 5)).astype(np.float32), 0.1 * rng.standard_normal((3, 8)).astype(np.float32)]
    mods = []
    for w in ws:
        lin = torch.nn.Linear(1, 1)
        lin.weight = torch.nn.Parameter(torch.from_numpy(w.copy()))
        mods.append(lin)
    tprune.global_unstructured([(m, "weight") for m in mods], pruning_method=tprune.L1Unstructured, amount=0.6)
    masks = impl.global_l1_masks(ws, 0.6)
    for m, mk in zip(mods, masks):
        np.testing.assert_array_equal(mk, m.weight_mask.numpy())
    assert masks[1].mean() < masks[0].mean()  # the small-weight layer loses more


@pytest.mark.parametrize("n,m", [(2, 4), (1, 4), (4, 8)])
def test_n_m_mask_invariant(impl, n, m):
    w = np.random.default_rng(2).standard_normal((6, 16)).astype(np.float32)
    mask = impl.n_m_mask(w, n, m)
    g = mask.reshape(6, 16 // m, m)
    assert np.all(g.sum(-1) == n)
    aw = np.abs(w).reshape(6, 16 // m, m)
    assert np.all(np.where(g == 1, aw, np.inf).min(-1) >= np.where(g == 0, aw, -np.inf).max(-1))


def test_n_m_mask_errors(impl):
    w = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="5"):
        impl.n_m_mask(w, 5, 4)
    with pytest.raises(ValueError, match="3"):
        impl.n_m_mask(w, 2, 3)


def test_agp_formula(impl):
    def expected(t, si, sf, t0, t1, f):
        if t < t0:
            return si
        if t >= t1:
            return sf
        tt = t0 + (t - t0) // f * f
        return sf + (si - sf) * (1 - (tt - t0) / (t1 - t0)) ** 3

    for t in (0, 5, 10, 11, 37, 50, 99, 100, 150):
        assert impl.agp_sparsity(t, 0.1, 0.9, 10, 100, 10) == pytest.approx(expected(t, 0.1, 0.9, 10, 100, 10))
    vals = [impl.agp_sparsity(t, 0.0, 0.8, 0, 100, 1) for t in range(101)]
    assert vals[0] == 0.0 and vals[-1] == pytest.approx(0.8)
    assert all(b >= a for a, b in zip(vals, vals[1:]))
    assert vals[10] - vals[0] > vals[100] - vals[90]


def test_csr_from_dense_matches_torch(impl):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((9, 7)).astype(np.float32)
    a[rng.random(a.shape) < 0.7] = 0
    a[2] = 0
    indptr, indices, data = impl.csr_from_dense(a)
    t = torch.from_numpy(a).to_sparse_csr()
    np.testing.assert_array_equal(indptr, t.crow_indices().numpy())
    np.testing.assert_array_equal(indices, t.col_indices().numpy())
    np.testing.assert_array_equal(data, t.values().numpy())
    z = impl.csr_from_dense(np.zeros((3, 4), np.float32))
    np.testing.assert_array_equal(z[0], [0, 0, 0, 0])
    assert len(z[1]) == 0 and len(z[2]) == 0


def test_csr_spmv_vs_dense(impl):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((11, 6)).astype(np.float32)
    a[rng.random(a.shape) < 0.6] = 0
    a[[0, 10]] = 0
    x = rng.standard_normal(6).astype(np.float32)
    t = torch.from_numpy(a).to_sparse_csr()
    y = impl.csr_spmv(t.crow_indices().numpy(), t.col_indices().numpy(), t.values().numpy(), x)
    np.testing.assert_allclose(y, a @ x, rtol=1e-5, atol=1e-6)
