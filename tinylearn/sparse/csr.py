"""CSR (compressed sparse row): construction from dense, back to dense, torch conversion, SpMV/SpMM.

Invariant (checked by ``validate``): ``indptr`` (M+1,) int64 non-decreasing from 0 to nnz; row i owns
``data[indptr[i]:indptr[i+1]]`` at columns ``indices[...]`` (int32, in [0, K), increasing within a row when built by
``from_dense``). ``to_dense()[i, indices[k]] == data[k]``; storage 8 bytes per fp32 nonzero (value + int32 column)
+ 8 per row. SpMM costs 2*nnz*N flops against 2*M*K*N for the dense product, but each flop reads an index and a
gathered row of B, so it only wins at high sparsity (see notebook 04).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends
from . import cuda
from .base import SparseMatrix, as_2d, check_shape, example_input, index_array, register_matmul


class CSR(SparseMatrix):
    """Compressed sparse row matrix (see the module docstring for the invariant)."""

    format = "csr"
    op = "sparse.csr_matmul"

    def __init__(self, indptr: Any, indices: Any, data: Any, shape: tuple[int, int], check: bool = True) -> None:
        self.indptr = index_array(indptr, "indptr", np.int64)
        self.indices = index_array(indices, "indices")
        self.data = np.ascontiguousarray(data)
        self.shape = check_shape(shape)
        if check:
            self.validate()

    def validate(self) -> None:
        M, K = self.shape
        if M < 0 or K < 0:
            raise ValueError(f"shape: negative dimension in {self.shape}")
        if self.indptr.shape != (M + 1,):
            raise ValueError(f"indptr: expected shape ({M + 1},) for {M} rows, got {self.indptr.shape}")
        if self.indices.ndim != 1 or self.data.shape != self.indices.shape:
            raise ValueError(
                f"indices/data: must be 1-D of equal length, got {self.indices.shape} and {self.data.shape}"
            )
        if self.indptr[0] != 0 or self.indptr[-1] != self.indices.size or np.any(np.diff(self.indptr) < 0):
            raise ValueError(
                f"indptr: must rise from 0 to nnz={self.indices.size}, got {self.indptr[0]}..{self.indptr[-1]}"
            )
        if self.indices.size and (self.indices.min() < 0 or self.indices.max() >= K):
            bad = self.indices[(self.indices < 0) | (self.indices >= K)][0]
            raise ValueError(f"indices: column {bad} out of range for {K} columns")

    @classmethod
    def from_dense(cls, a: Any) -> CSR:
        """Keep the entries with a != 0 (NaN counts as nonzero), row by row in column order."""
        a = as_2d(a)
        rows, cols = np.nonzero(a)
        if cols.size and a.shape[1] > np.iinfo(np.int32).max:
            raise ValueError(f"a: {a.shape[1]} columns do not fit int32 indices")
        indptr = np.zeros(a.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=a.shape[0]), out=indptr[1:])
        return cls(indptr, cols, a[rows, cols], a.shape, check=False)

    @property
    def nnz(self) -> int:
        return int(self.indices.size)

    @property
    def density(self) -> float:
        n = self.shape[0] * self.shape[1]
        return self.nnz / n if n else 0.0

    @property
    def nbytes(self) -> int:
        return self.indptr.nbytes + self.indices.nbytes + self.data.nbytes

    def row_ids(self) -> np.ndarray:
        """Row index of every stored entry (the COO view)."""
        return np.repeat(np.arange(self.shape[0], dtype=np.int64), np.diff(self.indptr))

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=self.data.dtype)
        out[self.row_ids(), self.indices] = self.data
        return out

    def to_torch(self) -> Any:
        """The same matrix as a ``torch.sparse_csr_tensor`` (shares no memory)."""
        import warnings

        import torch

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            return torch.sparse_csr_tensor(
                torch.from_numpy(self.indptr.copy()),
                torch.from_numpy(self.indices.astype(np.int64)),
                torch.from_numpy(self.data.copy()),
                size=self.shape,
                check_invariants=True,
            )

    def __repr__(self) -> str:
        return f"CSR(shape={self.shape}, nnz={self.nnz}, dtype={self.dtype})"


def _matmul_numpy(A: CSR, x: np.ndarray, dt: np.dtype) -> np.ndarray:
    out = np.zeros((A.shape[0],) + x.shape[1:], dtype=dt)
    prod = A.data[:, None] * x[A.indices] if x.ndim == 2 else A.data * x[A.indices]
    np.add.at(out, A.row_ids(), prod.astype(dt, copy=False))
    return out


def _matmul_cpp(A: CSR, x: np.ndarray, dt: np.dtype) -> np.ndarray:
    k = backends.load_C("sparse")
    fn = k.csr_spmv if x.ndim == 1 else k.csr_spmm
    return fn(A.indptr, A.indices, A.data.astype(dt, copy=False), x, A.shape[0])


def _matmul_numba(A: CSR, x: np.ndarray, dt: np.dtype) -> np.ndarray:
    from . import numba_kernels as nk

    fn = nk.csr_spmv if x.ndim == 1 else nk.csr_spmm
    return fn(A.indptr, A.indices, A.data.astype(dt, copy=False), x, A.shape[0])


register_matmul(
    CSR.op, _matmul_numpy, _matmul_cpp, _matmul_numba, example=lambda rng: example_input(CSR.from_dense, rng)
)
cuda.register(CSR.op)  # cuda_src/sparse_csr_spmv.cu: versions scalar, vector (GPU only)
