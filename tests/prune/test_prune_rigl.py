"""RigL-style prune-and-regrow: the drop/grow rule, constant sparsity, zero-initialised regrowth, training."""

import math

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.data import load_digits, train_test_split
from tinylearn.nn.models import DigitsMLP
from tinylearn.nn.training import evaluate
from tinylearn.prune import rigl


def test_cosine_fraction():
    assert rigl.cosine_update_fraction(0, 0.3, 100) == pytest.approx(0.3)
    assert rigl.cosine_update_fraction(50, 0.3, 100) == pytest.approx(0.15)
    assert rigl.cosine_update_fraction(25, 0.3, 100) == pytest.approx(0.15 * (1 + math.cos(math.pi / 4)))
    assert rigl.cosine_update_fraction(100, 0.3, 100) == 0.0
    with pytest.raises(ValueError, match="alpha"):
        rigl.cosine_update_fraction(0, 0.0, 100)
    with pytest.raises(ValueError, match="t_end"):
        rigl.cosine_update_fraction(0, 0.3, 0)


def test_drop_and_grow_rule():
    w = np.array([[0.1, -2.0, 0.0, 0.5], [0.0, 0.0, -0.05, 3.0]])
    mask = w != 0
    g = np.array([[9.0, 9.0, 0.2, 9.0], [-5.0, 1.0, 9.0, 9.0]])
    new, dropped, grown = rigl.drop_and_grow(w, mask, g, 2)
    assert sorted(dropped.tolist()) == [0, 6]  # |w| = 0.1 and 0.05: the two smallest active
    # inactive after drop: 0, 2, 4, 5, 6 with |g| 9, 0.2, 5, 1, 9 -> grow 0 and 6 (ties: lower index first)
    assert sorted(grown.tolist()) == [0, 6]
    assert new.sum() == mask.sum()
    new, dropped, grown = rigl.drop_and_grow(w, mask, np.where(mask, 0, np.abs(g) * [[1, 1, 1, 1], [1, 1, 0, 1]]), 2)
    assert sorted(grown.tolist()) == [4, 5]  # just-dropped entries (score 0 here) are candidates but lose
    with pytest.raises(ValueError, match="k"):
        rigl.drop_and_grow(w, mask, g, 6)
    with pytest.raises(ValueError, match="shape"):
        rigl.drop_and_grow(w, mask[:1], g, 1)


def test_update_keeps_sparsity_and_zeroes_grown():
    tl.manual_seed(0)
    m = DigitsMLP([32])
    ws = [mod.weight for mod in m.modules() if isinstance(mod, tl.nn.Linear)]
    r = rigl.RigL(ws, 0.8, delta_t=1, t_end=10, alpha=0.5, grow="gradient")
    before = [mk.copy() for mk in r.masks]
    for w in ws:
        w.grad = tl.Tensor(np.random.default_rng(1).standard_normal(w.data.shape).astype(np.float32))
    rec = r.update(1)
    assert rec["swapped"] > 0.3
    for w, mk, old in zip(ws, r.masks, before):
        assert mk.sum() == old.sum()
        assert np.all(w.data[~mk] == 0)
        assert np.all(w.data[mk & ~old] == 0)  # regrown start at zero
    assert r.global_sparsity() == pytest.approx(0.8, abs=1e-3)
    with pytest.raises(ValueError, match="grow"):
        rigl.RigL(ws, 0.5, grow="bogus")
    with pytest.raises(ValueError, match="sparsity"):
        rigl.RigL(ws, 1.0)


def _train(Xtr, ytr, sparsity, grow, t_end):
    tl.manual_seed(0)
    m = DigitsMLP([128])
    ws = [mod.weight for mod in m.modules() if isinstance(mod, tl.nn.Linear)]
    r = rigl.RigL(ws, sparsity, delta_t=10, t_end=t_end, alpha=0.3, grow=grow)
    h = rigl.train_rigl(m, r, Xtr, ytr, epochs=8, lr=3e-3)
    return m, ws, r, h


def test_training_regrows_and_beats_a_static_mask():
    X, y = load_digits()
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, seed=0)
    m, ws, r, h = _train(Xtr, ytr, 0.9, "gradient", 120)
    assert all(abs(s - r.global_sparsity()) < 1e-12 for s in h["sparsity"])
    assert r.global_sparsity() == pytest.approx(0.9, abs=1e-3)
    assert len(r.history) == 11 and all(rec["swapped"] > 0 for rec in r.history)
    assert all(np.all(w.data[~mk] == 0) for w, mk in zip(ws, r.masks))
    static, *_ = _train(Xtr, ytr, 0.9, "gradient", 1)  # t_end=1: no update ever -> the random initial mask
    acc_rigl, acc_static = evaluate(m, Xte, yte), evaluate(static, Xte, yte)
    assert acc_rigl > acc_static + 0.05, (acc_rigl, acc_static)


def test_update_zeroes_grown_weights_of_a_transposed_weight():
    """A non-C-contiguous weight (here a transposed view): the grown entries are zeroed in the weight itself."""
    rng = np.random.default_rng(0)
    w = tl.nn.Parameter(np.ones((6, 5), np.float32))
    w.data = np.ascontiguousarray(rng.standard_normal((5, 6)).astype(np.float32) + 3.0).T  # all |w| > 0
    assert not w.data.flags.c_contiguous
    r = rigl.RigL([w], 0.5, delta_t=1, t_end=10, alpha=0.9, grow="gradient", seed=1)
    old = r.masks[0].copy()
    w.data += np.where(old, 0.0, 7.0).astype(np.float32)  # pruned entries nonzero again (as after a dense step)
    w.grad = tl.Tensor(np.where(old, 0.0, 1.0 + rng.random((6, 5))).astype(np.float32))
    r.update(1)
    grown = r.masks[0] & ~old
    assert grown.sum() > 0
    assert np.all(w.data[grown] == 0)  # without the fix: 7 + original value
    assert np.all(w.data[~r.masks[0]] == 0)
    assert not w.data.flags.c_contiguous  # still the same (strided) array, not replaced


@pytest.mark.parametrize("sparsity", [0.95, 0.99, 0.9999])
def test_every_layer_keeps_an_active_weight(sparsity):
    small = tl.nn.Parameter(np.ones((2, 5), np.float32))  # round(0.95 * 10) = 10 would prune all of it
    big = tl.nn.Parameter(np.ones((40, 50), np.float32))
    r = rigl.RigL([small, big], sparsity, delta_t=1, t_end=10, grow="random")
    assert [int(m.sum()) for m in r.masks] == [1, max(1, 2000 - round(sparsity * 2000))]
    assert np.count_nonzero(small.data) == 1
    for w in (small, big):
        w.grad = tl.Tensor(np.ones(w.data.shape, np.float32))
    r.update(1)
    assert [int(m.sum()) for m in r.masks] == [1, max(1, 2000 - round(sparsity * 2000))]
