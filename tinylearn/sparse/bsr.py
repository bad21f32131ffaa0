"""BSR (block sparse row): CSR over dense (R x C) blocks; construction from dense, back to dense, SpMV/SpMM.

Invariant: ``indptr`` (M/R + 1,), ``indices`` block columns, ``data`` (nblocks, R, C) dense blocks; a block is stored
when any of its entries is nonzero. Dense blocks turn SpMM into small GEMMs. Kernels: numpy and cpp (no numba).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends
from .._inputs import as_int, is_int
from .base import SparseMatrix, as_2d, check_compressed, check_shape, example_input, index_array, register_matmul


class BSR(SparseMatrix):
    """Block sparse row: CSR over dense (R, C) blocks; ``data`` has shape (nblocks, R, C)."""

    format = "bsr"
    op = "sparse.bsr_matmul"

    def __init__(self, indptr: Any, indices: Any, data: Any, shape: tuple[int, int], check: bool = True) -> None:
        self.indptr = index_array(indptr, "indptr", np.int64)
        self.indices = index_array(indices, "indices")
        self.data = np.ascontiguousarray(data)
        self.shape = check_shape(shape)
        if self.data.ndim != 3:
            raise ValueError(f"data: expected shape (nblocks, R, C), got {self.data.shape}")
        self.block_size = (int(self.data.shape[1]), int(self.data.shape[2]))
        if check:
            self.check_arrays()

    def check_arrays(self, columns: bool = True) -> None:
        """The block size divides the shape and indptr/indices form a valid CSR over the blocks (``check_compressed``:
        O(M/R) for indptr, O(nblocks) for the block columns). ``check=False`` skips it at construction only:
        ``matmul`` (both backends) and ``to_dense`` run it (or its C++ twin) first."""
        R, C = self.block_size
        if R < 1 or C < 1 or self.shape[0] % R or self.shape[1] % C:
            raise ValueError(f"block_size: {self.block_size} must divide shape {self.shape}")
        check_compressed(
            self.indptr, self.indices, self.data.shape[0], (self.shape[0] // R, self.shape[1] // C), columns=columns
        )

    @classmethod
    def from_dense(cls, a: Any, block_size: int | tuple[int, int]) -> BSR:
        a = as_2d(a)
        if is_int(block_size):
            block_size = (block_size, block_size)
        if not isinstance(block_size, tuple | list) or len(block_size) != 2 or not all(map(is_int, block_size)):
            raise TypeError(f"block_size: expected an int or a pair (R, C) of ints, got {block_size!r}")
        R, C = (as_int(b, "block_size") for b in block_size)
        if R < 1 or C < 1:
            raise ValueError(f"block_size: expected a positive int or (R, C), got {block_size}")
        M, K = a.shape
        if M % R or K % C:
            raise ValueError(f"block_size: {(R, C)} must divide the matrix shape {a.shape}")
        blocks = a.reshape(M // R, R, K // C, C).transpose(0, 2, 1, 3)  # (MB, KB, R, C)
        present = np.any(blocks != 0, axis=(2, 3))
        brow, bcol = np.nonzero(present)
        indptr = np.zeros(M // R + 1, dtype=np.int64)
        np.cumsum(np.bincount(brow, minlength=M // R), out=indptr[1:])
        data = np.ascontiguousarray(blocks[brow, bcol]).reshape(-1, R, C)
        return cls(indptr, bcol, data, a.shape, check=False)

    @property
    def nblocks(self) -> int:
        return int(self.indices.size)

    @property
    def nnz(self) -> int:
        """Stored entries (every entry of every stored block, zeros inside blocks included)."""
        return int(self.data.size)

    def block_rows(self) -> np.ndarray:
        """Block-row index of every stored block."""
        self.check_arrays(columns=False)
        return np.repeat(np.arange(self.shape[0] // self.block_size[0]), np.diff(self.indptr))

    def to_dense(self) -> np.ndarray:
        self.check_arrays()
        R, C = self.block_size
        M, K = self.shape
        blocks = np.zeros((M // R, K // C, R, C), dtype=self.data.dtype)
        blocks[self.block_rows(), self.indices] = self.data
        return blocks.transpose(0, 2, 1, 3).reshape(M, K)

    def __repr__(self) -> str:
        return f"BSR(shape={self.shape}, block_size={self.block_size}, nblocks={self.nblocks}, dtype={self.dtype})"


def _matmul_numpy(A: BSR, x: np.ndarray, dt: np.dtype) -> np.ndarray:
    A.check_arrays()  # a negative block column would wrap silently
    (M, K), (R, C) = A.shape, A.block_size
    x2 = x[:, None] if x.ndim == 1 else x
    xb = x2.reshape(K // C, C, -1)[A.indices]  # (nb, C, N)
    prod = np.einsum("brc,bcn->brn", A.data.astype(dt), xb)
    out = np.zeros((M // R, R, x2.shape[1]), dtype=dt)
    np.add.at(out, A.block_rows(), prod)
    out = out.reshape(M, -1)
    return out[:, 0] if x.ndim == 1 else out


def _matmul_cpp(A: BSR, x: np.ndarray, dt: np.dtype) -> np.ndarray:
    x2 = x[:, None] if x.ndim == 1 else x
    out = backends.load_C("sparse").bsr_spmm(
        A.indptr, A.indices, A.data.astype(dt, copy=False), np.ascontiguousarray(x2), A.shape[0]
    )
    return out[:, 0] if x.ndim == 1 else out


register_matmul(
    BSR.op, _matmul_numpy, _matmul_cpp, example=lambda rng: example_input(lambda a: BSR.from_dense(a, 2), rng)
)
