"""tinylearn.data (digits, split, DataLoader) and the shared digits models + training loop."""

from __future__ import annotations

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.data import DataLoader, load_digits, train_test_split
from tinylearn.nn.models import DigitsCNN, DigitsMLP
from tinylearn.nn.training import evaluate, fit


def test_load_digits_shapes_and_range():
    X, y = load_digits()
    assert X.shape == (1797, 1, 8, 8) and X.dtype == np.float32
    assert y.shape == (1797,) and y.dtype == np.int64
    assert X.min() == 0.0 and X.max() == 1.0 and set(np.unique(y)) == set(range(10))
    X[0] = 5  # a copy: the cache is untouched
    assert load_digits()[0].max() == 1.0


def test_split_is_seeded_and_disjoint():
    X, y = load_digits()
    a = train_test_split(X, y, test_size=0.25, seed=0)
    b = train_test_split(X, y, test_size=0.25, seed=0)
    c = train_test_split(X, y, test_size=0.25, seed=1)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not np.array_equal(a[3], c[3])
    assert len(a[1]) == 449 and len(a[0]) == 1348
    with pytest.raises(ValueError, match="test_size"):
        train_test_split(X, y, test_size=0.0)


def test_dataloader_batches_shuffle_and_errors():
    X = np.arange(10, dtype=np.float32).reshape(10, 1)
    y = np.arange(10)
    dl = DataLoader(X, y, batch_size=4, shuffle=True, seed=3)
    assert len(dl) == 3
    e1 = [yb.data.tolist() for _, yb in dl]
    e2 = [yb.data.tolist() for _, yb in dl]
    assert sorted(sum(e1, [])) == list(range(10)) and e1 != e2
    assert [len(b) for b in e1] == [4, 4, 2]
    e1b = [yb.data.tolist() for _, yb in DataLoader(X, y, batch_size=4, shuffle=True, seed=3)]
    assert e1 == e1b
    xb, yb = next(iter(DataLoader(X, y, batch_size=4)))
    assert isinstance(xb, tl.Tensor) and yb.dtype == np.int64 and np.array_equal(xb.data[:, 0], yb.data)
    assert len(DataLoader(X, y, batch_size=4, drop_last=True)) == 2
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(X, y, batch_size=0)
    with pytest.raises(ValueError, match="length"):
        DataLoader(X, y[:5])


def test_digits_mlp_reaches_97_percent():
    X, y = load_digits()
    Xtr, Xte, ytr, yte = train_test_split(X, y, seed=0)
    tl.manual_seed(0)
    model = DigitsMLP(hidden=128)
    hist = fit(model, Xtr, ytr, epochs=20, lr=3e-3, batch_size=64, seed=0)
    assert hist["loss"][-1] < hist["loss"][0] and len(hist["acc"]) == 20
    assert evaluate(model, Xte, yte) >= 0.97


def test_digits_cnn_trains():
    X, y = load_digits()
    Xtr, Xte, ytr, yte = train_test_split(X, y, seed=0)
    tl.manual_seed(0)
    model = DigitsCNN(c1=8, c2=16)
    fit(model, Xtr, ytr, epochs=4, lr=3e-3, batch_size=64, seed=0)
    assert evaluate(model, Xte, yte) >= 0.93
    assert not model.training


def test_fit_errors():
    X, y = load_digits()
    with pytest.raises(ValueError, match="optimizer"):
        fit(DigitsMLP(), X[:10], y[:10], epochs=1, optimizer="lbfgs")
    with pytest.raises(ValueError, match="epochs"):
        fit(DigitsMLP(), X[:10], y[:10], epochs=0)
