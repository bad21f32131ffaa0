"""ELL (ELLPACK, column-major padded): construction from dense, back to dense, SpMV/SpMM.

Invariant (checked by ``validate``): ``indices``/``data`` of shape (W, M), W = max nonzeros per row; slot k of row
i is ``[k, i]``, so consecutive rows are adjacent in memory (coalesced loads when one GPU thread owns one row);
padding slots hold column -1 and value 0. Storage W*M, so one long row makes every row pay for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends
from .base import SparseMatrix, as_2d, check_shape, example_input, index_array, register_matmul
from .csr import CSR


class ELL(SparseMatrix):
    """ELLPACK, column-major padded: ``indices``/``data`` of shape (W, M); padding column is -1."""

    format = "ell"
    op = "sparse.ell_matmul"

    def __init__(self, indices: Any, data: Any, shape: tuple[int, int], check: bool = True) -> None:
        self.indices = index_array(indices, "indices")
        self.data = np.ascontiguousarray(data)
        self.shape = check_shape(shape)
        if check:
            self.validate()

    def validate(self) -> None:
        M, K = self.shape
        if self.indices.ndim != 2 or self.indices.shape != self.data.shape or self.indices.shape[1] != M:
            raise ValueError(
                f"indices/data: expected equal shapes (W, {M}), got {self.indices.shape} and {self.data.shape}"
            )
        if self.indices.size and (self.indices.min() < -1 or self.indices.max() >= K):
            raise ValueError(f"indices: column out of range for {K} columns (padding is -1)")
        if np.any(self.data[self.indices < 0] != 0):
            raise ValueError("data: padding slots (column -1) must hold 0")

    @classmethod
    def from_dense(cls, a: Any) -> ELL:
        a = as_2d(a)
        csr = CSR.from_dense(a)
        counts = np.diff(csr.indptr)
        W = int(counts.max()) if counts.size else 0
        M = a.shape[0]
        indices = np.full((W, M), -1, dtype=np.int32)
        data = np.zeros((W, M), dtype=a.dtype)
        rows = csr.row_ids()
        slot = np.arange(csr.nnz, dtype=np.int64) - csr.indptr[rows]
        indices[slot, rows] = csr.indices
        data[slot, rows] = csr.data
        return cls(indices, data, a.shape, check=False)

    @property
    def width(self) -> int:
        return int(self.indices.shape[0])

    @property
    def nnz(self) -> int:
        return int(np.count_nonzero(self.indices >= 0))

    @property
    def padding_fraction(self) -> float:
        """Share of the W*M slots that are padding (wasted loads)."""
        return 1.0 - self.nnz / self.indices.size if self.indices.size else 0.0

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=self.data.dtype)
        k, i = np.nonzero(self.indices >= 0)
        out[i, self.indices[k, i]] = self.data[k, i]
        return out

    def __repr__(self) -> str:
        return f"ELL(shape={self.shape}, width={self.width}, nnz={self.nnz}, dtype={self.dtype})"


def _matmul_numpy(A: ELL, x: np.ndarray, dt: np.dtype) -> np.ndarray:
    valid = A.indices >= 0
    safe = np.where(valid, A.indices, 0)
    out = np.zeros((A.shape[0],) + x.shape[1:], dtype=dt)
    for k in range(A.width):
        g = x[safe[k]]
        w = np.where(valid[k], A.data[k], 0).astype(dt)
        out += (w[:, None] * np.where(valid[k][:, None], g, 0)) if x.ndim == 2 else w * np.where(valid[k], g, 0)
    return out


def _by_columns(spmv: Any, A: ELL, x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """The compiled ELL kernels are SpMV; a 2-D ``x`` runs them column by column."""
    data = A.data.astype(dt, copy=False)
    if x.ndim == 1:
        return spmv(A.indices, data, x)
    cols = [spmv(A.indices, data, np.ascontiguousarray(x[:, j])) for j in range(x.shape[1])]
    return np.stack(cols, axis=1) if cols else np.zeros((A.shape[0], 0), dtype=dt)


def _matmul_cpp(A: ELL, x: np.ndarray, dt: np.dtype) -> np.ndarray:
    return _by_columns(backends.load_C("sparse").ell_spmv, A, x, dt)


def _matmul_numba(A: ELL, x: np.ndarray, dt: np.dtype) -> np.ndarray:
    from . import numba_kernels as nk

    return _by_columns(nk.ell_spmv, A, x, dt)


register_matmul(
    ELL.op, _matmul_numpy, _matmul_cpp, _matmul_numba, example=lambda rng: example_input(ELL.from_dense, rng)
)
