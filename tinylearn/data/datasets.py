"""Datasets that ship with the dependencies (no download): scikit-learn's 8x8 handwritten digits.

load_digits(): 1797 images of 8x8 pixels with values 0..16, returned as float32 [N, 1, 8, 8] scaled to [0, 1]
(divided by 16) and int64 labels 0..9.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits as _sk

    d = _sk()
    X = (d.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    X.setflags(write=False)
    y.setflags(write=False)
    return X, y


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(X float32 [1797, 1, 8, 8] in [0, 1], y int64 [1797]) — fresh writable copies."""
    X, y = _digits()
    return X.copy(), y.copy()


def train_test_split(
    X: np.ndarray, y: np.ndarray, test_size: float = 0.25, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seeded random split -> (X_train, X_test, y_train, y_test) (sklearn's order). test_size: fraction or count."""
    X, y = np.asarray(X), np.asarray(y)
    n = len(X)
    if len(y) != n:
        raise ValueError(f"y: length {len(y)} does not match X length {n}")
    if isinstance(test_size, bool) or not isinstance(test_size, int | float | np.integer | np.floating):
        raise TypeError(f"test_size: expected a fraction in (0, 1) or an int count, got {type(test_size).__name__}")
    if isinstance(test_size, float | np.floating) and not 0.0 < test_size < 1.0:
        raise ValueError(f"test_size: a fraction must be in (0, 1), got {test_size}")
    n_test = int(round(test_size * n)) if isinstance(test_size, float | np.floating) else int(test_size)
    if not 0 < n_test < n:
        raise ValueError(f"test_size: {test_size} leaves an empty train or test set for {n} samples")
    perm = np.random.default_rng(seed).permutation(n)
    te, tr = perm[:n_test], perm[n_test:]
    return X[tr], X[te], y[tr], y[te]
