"""ARX and LSTM next-step predictors [Q123]: the LSTM cell equals torch.nn.LSTMCell forward and backward, ARX
recovers known coefficients, the predictors run on real step times of a tinylearn loop, batch-size picking
respects the budget, bad input is rejected. No timing is asserted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tinylearn.autograd import Tensor
from tinylearn.tune import ar_predict as ap


def test_lstm_cell_matches_torch_forward_and_backward() -> None:
    torch.manual_seed(0)
    ref = torch.nn.LSTMCell(3, 5).double()
    cell = ap.LSTMCell.from_torch(ref)
    rng = np.random.default_rng(0)
    x, h, c = rng.standard_normal((4, 3)), rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    tx, th, tc = (torch.tensor(a, requires_grad=True) for a in (x, h, c))
    h2, c2 = ref(tx, (th, tc))
    (h2.sum() * 2 + (c2**2).sum()).backward()
    lx, lh, lc = (Tensor(a, requires_grad=True) for a in (x, h, c))
    g2, d2 = cell(lx, (lh, lc))
    (g2.sum() * 2 + (d2**2).sum()).backward()
    np.testing.assert_allclose(g2.numpy(), h2.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(d2.numpy(), c2.detach().numpy(), rtol=1e-10, atol=1e-12)
    for mine, theirs in ((lx, tx), (lh, th), (lc, tc)):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-9, atol=1e-12)
    w_grad = np.concatenate([ref.weight_ih.grad.numpy(), ref.weight_hh.grad.numpy()], 1).T
    np.testing.assert_allclose(cell.W.grad.numpy(), w_grad, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(cell.b.grad.numpy(), ref.bias_ih.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_arx_recovers_coefficients() -> None:
    rng = np.random.default_rng(1)
    n, bs = 300, rng.choice([16.0, 32.0, 64.0, 128.0], 300)
    z = np.zeros(n)
    for t in range(1, n):
        z[t] = -6.0 + 0.3 * (z[t - 1] + 6.0) + 0.01 * bs[t]
    y = np.exp(z)
    p = ap.ARPredictor(order=1, exog=("batch_size",), log=True).fit(y[1:], {"batch_size": bs[1:]})
    np.testing.assert_allclose(p.coef[1:], [0.3, 0.01], rtol=1e-6)
    assert p.predict_next(y[:50], None, [bs[50]]) == pytest.approx(y[50], rel=1e-8)


def test_predictors_on_measured_step_times() -> None:
    y, feats = ap.collect_step_times(steps=60, seed=0)
    assert y.shape == (60,) and (y > 0).all() and set(np.unique(feats["batch_size"])) <= {16, 32, 64, 128, 256}
    assert len(np.unique(feats["batch_size"])) >= 2 and feats["loss_scale"].min() > 0
    lstm = ap.LSTMPredictor(window=4, hidden=4, epochs=30)
    rows = ap.compare_predictors([ap.LastValue(), ap.ARPredictor(1), lstm], y, feats, train_fraction=0.6)
    assert [r["predictor"] for r in rows][0] == "last value" and all(r["n"] >= 15 for r in rows)
    assert all(np.isfinite(r["mae_s"]) and r["mape"] >= 0 for r in rows)
    assert lstm.losses[-1] < lstm.losses[0]  # training lowers the loss


def test_pick_batch_size_respects_the_predicted_budget() -> None:
    y, feats = ap.collect_step_times(steps=40, seed=2)
    p = ap.ARPredictor(order=1).fit(y, feats)
    cands = [16, 32, 64, 128, 256]
    preds = {b: p.predict_next(y, feats, [b]) for b in cands}
    budget = sorted(preds.values())[2] * 1.0000001
    pick = ap.pick_batch_size(p, y, feats, cands, budget)
    assert pick is not None and preds[pick] <= budget
    assert all(preds[b] > budget for b in cands if b > pick)
    assert ap.pick_batch_size(p, y, feats, cands, min(preds.values()) * 0.5) is None


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="^order: "):
        ap.ARPredictor(order=-1)
    with pytest.raises(ValueError, match="^y: "):
        ap.ARPredictor(order=2).fit([1.0, 2.0], {"batch_size": [1, 2]})
    with pytest.raises(ValueError, match="^features: "):
        ap.ARPredictor(order=1).fit(np.ones(10), {"other": np.ones(10)})
    with pytest.raises(ValueError, match="^y: "):
        ap.ARPredictor(order=1).fit(-np.ones(10), {"batch_size": np.ones(10)})
    with pytest.raises(ValueError, match="^self: "):
        ap.ARPredictor(order=1).predict_next([1.0, 1.0], None, [1.0])
    with pytest.raises(ValueError, match="^hidden_size: "):
        ap.LSTMCell(3, 0)
    with pytest.raises(ValueError, match="^steps: "):
        ap.collect_step_times(steps=True)
    with pytest.raises(ValueError, match="^threads: "):
        ap.collect_step_times(steps=8, threads=0)
    with pytest.raises(ValueError, match="^budget_s: "):
        ap.pick_batch_size(ap.LastValue(), [1.0], {}, [1], 0)
