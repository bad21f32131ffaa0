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

from ..autograd.tensor import Tensor


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
        X = X.data if isinstance(X, Tensor) else np.asarray(X)
        if y is not None:
            y = y.data if isinstance(y, Tensor) else np.asarray(y)
            if len(y) != len(X):
                raise ValueError(f"y: length {len(y)} does not match X length {len(X)}")
        if not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise ValueError(f"batch_size: must be a positive integer, got {batch_size!r}")
        self.X, self.y = X, y
        self.batch_size, self.shuffle, self.seed, self.drop_last = int(batch_size), shuffle, seed, drop_last
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
