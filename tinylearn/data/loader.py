"""Seeded mini-batch iterator over in-memory arrays.

``DataLoader(X, y, batch_size, shuffle, seed)`` yields ``(Tensor X_batch, Tensor y_batch)`` — the labels are an
int64 Tensor (requires_grad=False; ``.data`` is the numpy array, and ``F.cross_entropy`` accepts it directly).
With shuffle=True epoch e uses the permutation of ``np.random.default_rng(seed + e)``, so iteration order is
reproducible and differs between epochs. ``drop_last`` drops a final incomplete batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .._inputs import as_int
from ..autograd.tensor import Tensor


def _samples(a: Any, name: str) -> np.ndarray:
    """``a`` (an array, a Tensor or a nested sequence) as an array with a first (sample) axis; errors name ``name``."""
    if isinstance(a, Tensor):
        a = a.data
    if isinstance(a, str | bytes | dict) or a is None:
        raise TypeError(f"{name}: expected an array of samples, got {type(a).__name__}")
    try:
        a = np.asarray(a)
    except ValueError as e:  # a ragged nested list
        raise ValueError(f"{name}: not a rectangular array of samples ({e})") from None
    if a.ndim == 0:
        raise ValueError(f"{name}: expected an array of samples (at least 1 dimension), got a scalar {a!r}")
    if a.dtype.kind not in "biufc":  # batches become Tensors: numbers only
        raise TypeError(f"{name}: expected numeric samples, got dtype {a.dtype}")
    return a


class DataLoader:
    def __init__(
        self,
        X: Any,
        y: Any = None,
        batch_size: int = 64,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        X, y = _samples(X, "X"), None if y is None else _samples(y, "y")
        if y is not None and len(y) != len(X):
            raise ValueError(f"y: length {len(y)} does not match X length {len(X)}")
        self.X, self.y = X, y
        self.batch_size = as_int(batch_size, "batch_size", min=1)
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    def __len__(self) -> int:
        n = len(self.X)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        n = len(self.X)
        order = np.random.default_rng(self.seed + self.epoch).permutation(n) if self.shuffle else None
        self.epoch += 1
        for start in range(0, n, self.batch_size):
            stop = min(start + self.batch_size, n)
            if self.drop_last and stop - start < self.batch_size:
                break
            idx = order[start:stop] if order is not None else slice(start, stop)
            xb = Tensor(np.ascontiguousarray(self.X[idx]))
            if self.y is None:
                yield xb
            else:
                yield xb, Tensor(np.ascontiguousarray(self.y[idx]))
