"""CSR (compressed sparse row): construction from dense, back to dense, torch conversion, SpMV/SpMM.

Invariant (checked by ``validate``; ``check=False`` skips only that construction-time pass: every matmul backend and
``to_dense`` still check ``indptr`` (O(M)) and the column range before touching memory, so a corrupt matrix is a
ValueError, never a crash): ``indptr`` (M+1,) int64 non-decreasing from 0 to nnz; row i owns
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
from .base import SparseMatrix, as_2d, check_compressed, check_shape, example_input, index_array, register_matmul


class CSR(SparseMatrix):
    """Compressed sparse row matrix (see the module docstring for the invariant).

    ``check=False`` skips only the construction-time ``validate`` (for arrays known to be valid, as ``from_dense``
    builds them); the kernels still refuse a corrupt ``indptr`` or column with a ValueError."""

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
        """The full invariant (O(M + nnz)); ``check=False`` skips it at construction, but every ``matmul`` backend and
        ``to_dense`` still run ``check_compressed`` (O(M) for indptr, one O(nnz) read for the columns) first."""
        self.check_arrays()

    def check_arrays(self, columns: bool = True) -> None:
        """What a kernel relies on: indptr (M+1,) from 0 to nnz, monotone; with ``columns``, columns in [0, K)."""
        n_data = self.data.shape[0] if self.data.ndim == 1 else -1
        check_compressed(self.indptr, self.indices, n_data, self.shape, columns=columns)

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
        self.check_arrays(columns=False)
        return np.repeat(np.arange(self.shape[0], dtype=np.int64), np.diff(self.indptr))

    def to_dense(self) -> np.ndarray:
        self.check_arrays()
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
    A.check_arrays()  # a negative column would wrap silently in x[A.indices]
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

    A.check_arrays(columns=False)  # O(M); the kernels check each column as they read it
    fn = nk.csr_spmv if x.ndim == 1 else nk.csr_spmm
    return fn(A.indptr, A.indices, A.data.astype(dt, copy=False), x, A.shape[0])


register_matmul(
    CSR.op, _matmul_numpy, _matmul_cpp, _matmul_numba, example=lambda rng: example_input(CSR.from_dense, rng)
)
cuda.register(CSR.op)  # cuda_src/sparse_csr_spmv.cu: versions scalar, vector (GPU only)
