"""Sparse matrix formats CSR, ELL and BSR: construction from dense, back to dense, and sparse x dense products.

Invariants (checked by ``validate`` on construction, exercised by tests/test_sparse.py):

- CSR  ``indptr`` (M+1,) int64 non-decreasing from 0 to nnz; row i owns ``data[indptr[i]:indptr[i+1]]`` at columns
  ``indices[...]`` (int32, in [0, K), increasing within a row when built by ``from_dense``).
  ``to_dense()[i, indices[k]] == data[k]``; storage 8 bytes per fp32 nonzero (value + int32 column) + 8 per row.
- ELL  ``indices``/``data`` of shape (W, M), W = max nonzeros per row, **column-major padded**: slot k of row i is
  ``[k, i]``, so consecutive rows are adjacent in memory (coalesced loads when one GPU thread owns one row);
  padding slots hold column -1 and value 0. Storage W*M, so one long row makes every row pay for it.
- BSR  CSR over (R x C) blocks: ``indptr`` (M/R + 1,), ``indices`` block columns, ``data`` (nblocks, R, C) dense
  blocks; a block is stored when any of its entries is nonzero. Dense blocks turn SpMM into small GEMMs.

``matmul(dense)`` computes A @ dense for 1-D (SpMV) or 2-D (SpMM) ``dense``; backends: "cpp" (tinylearn._C.sparse,
OpenMP), "numba", "numpy" (reference, scatter-add). SpMM costs 2*nnz*N flops against 2*M*K*N for the dense product,
but each flop reads an index and a gathered row of B, so it only wins at high sparsity (see notebook 04).
"""

from __future__ import annotations

from typing import Any

import numpy as np

_BACKENDS = ("cpp", "numba", "numpy")


def _to_numpy(a: Any) -> np.ndarray:
    """numpy view of a numpy array, torch tensor or tinylearn Tensor."""
    if type(a).__module__.startswith("torch"):
        return a.detach().cpu().numpy()
    if isinstance(getattr(a, "data", None), np.ndarray):  # tinylearn Tensor
        return a.data
    return np.asarray(a)


def _as_2d(a: Any, name: str = "a") -> np.ndarray:
    a = _to_numpy(a)
    if a.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D matrix, got shape {a.shape}")
    if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
        raise TypeError(f"{name}: expected a numeric array, got dtype {a.dtype}")
    return a


def _check_backend(backend: str) -> str:
    if backend not in _BACKENDS:
        raise ValueError(f"backend: unknown backend {backend!r}; known: {list(_BACKENDS)}")
    return backend


def _cpp() -> Any:
    try:
        from .. import _C  # type: ignore[attr-defined]
    except ImportError as e:
        raise RuntimeError(f"backend='cpp': tinylearn._C is not built ({e}); run tools/build.sh") from e
    if "sparse" not in _C.submodules:
        raise RuntimeError("backend='cpp': tinylearn._C has no 'sparse' submodule; run tools/build.sh")
    return _C.sparse


def _prepare_dense(data_dtype: np.dtype, dense: Any, K: int, backend: str) -> tuple[np.ndarray, np.dtype]:
    """Check the right-hand side; returns it (C-contiguous, compute dtype for compiled backends) and the dtype."""
    dense = _to_numpy(dense)
    if dense.ndim not in (1, 2):
        raise ValueError(f"dense: expected a 1-D vector or 2-D matrix, got shape {dense.shape}")
    if dense.shape[0] != K:
        raise ValueError(f"dense: first dimension must equal the sparse matrix's {K} columns, got shape {dense.shape}")
    out_dtype = np.result_type(data_dtype, dense.dtype)
    if backend != "numpy":
        if out_dtype not in (np.float32, np.float64):
            raise TypeError(
                f"backend={backend!r}: supports float32/float64 only, got dtype {out_dtype}; use backend='numpy'"
            )
        dense = np.ascontiguousarray(dense, dtype=out_dtype)
    return dense, out_dtype


class CSR:
    """Compressed sparse row matrix (see the module docstring for the invariant)."""

    format = "csr"

    def __init__(self, indptr: Any, indices: Any, data: Any, shape: tuple[int, int], check: bool = True) -> None:
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(indices, dtype=np.int32)
        self.data = np.ascontiguousarray(data)
        self.shape = (int(shape[0]), int(shape[1]))
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
        a = _as_2d(a)
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
    def dtype(self) -> np.dtype:
        return self.data.dtype

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

    def matmul(self, dense: Any, backend: str = "cpp") -> np.ndarray:
        """A @ dense for 1-D ``dense`` (SpMV, shape (K,)) or 2-D (SpMM, shape (K, N))."""
        _check_backend(backend)
        M, K = self.shape
        x, dt = _prepare_dense(self.data.dtype, dense, K, backend)
        if backend == "numpy":
            rows = self.row_ids()
            out = np.zeros((M,) + x.shape[1:], dtype=dt)
            prod = self.data[:, None] * x[self.indices] if x.ndim == 2 else self.data * x[self.indices]
            np.add.at(out, rows, prod.astype(dt, copy=False))
            return out
        data = self.data.astype(dt, copy=False)
        if backend == "cpp":
            k = _cpp()
            fn = k.csr_spmv if x.ndim == 1 else k.csr_spmm
            return fn(self.indptr, self.indices, data, x, M)
        from . import numba_kernels as nk

        fn = nk.csr_spmv if x.ndim == 1 else nk.csr_spmm
        return fn(self.indptr, self.indices, data, x, M)

    __matmul__ = matmul

    def __repr__(self) -> str:
        return f"CSR(shape={self.shape}, nnz={self.nnz}, dtype={self.dtype})"


class ELL:
    """ELLPACK, column-major padded: ``indices``/``data`` of shape (W, M); padding column is -1."""

    format = "ell"

    def __init__(self, indices: Any, data: Any, shape: tuple[int, int], check: bool = True) -> None:
        self.indices = np.ascontiguousarray(indices, dtype=np.int32)
        self.data = np.ascontiguousarray(data)
        self.shape = (int(shape[0]), int(shape[1]))
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
        a = _as_2d(a)
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
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def padding_fraction(self) -> float:
        """Share of the W*M slots that are padding (wasted loads)."""
        return 1.0 - self.nnz / self.indices.size if self.indices.size else 0.0

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=self.data.dtype)
        k, i = np.nonzero(self.indices >= 0)
        out[i, self.indices[k, i]] = self.data[k, i]
        return out

    def matmul(self, dense: Any, backend: str = "cpp") -> np.ndarray:
        """A @ dense. The compiled kernels are SpMV (1-D ``dense``); 2-D ``dense`` loops over columns in C++/numba."""
        _check_backend(backend)
        M, K = self.shape
        x, dt = _prepare_dense(self.data.dtype, dense, K, backend)
        if backend == "numpy":
            valid = self.indices >= 0
            safe = np.where(valid, self.indices, 0)
            out = np.zeros((M,) + x.shape[1:], dtype=dt)
            for k in range(self.width):
                g = x[safe[k]]
                w = np.where(valid[k], self.data[k], 0).astype(dt)
                out += (w[:, None] * np.where(valid[k][:, None], g, 0)) if x.ndim == 2 else w * np.where(valid[k], g, 0)
            return out
        data = self.data.astype(dt, copy=False)
        if backend == "cpp":
            fn = _cpp().ell_spmv
        else:
            from . import numba_kernels as nk

            fn = nk.ell_spmv
        if x.ndim == 1:
            return fn(self.indices, data, x)
        cols = [fn(self.indices, data, np.ascontiguousarray(x[:, j])) for j in range(x.shape[1])]
        return np.stack(cols, axis=1) if cols else np.zeros((M, 0), dtype=dt)

    __matmul__ = matmul

    def __repr__(self) -> str:
        return f"ELL(shape={self.shape}, width={self.width}, nnz={self.nnz}, dtype={self.dtype})"


class BSR:
    """Block sparse row: CSR over dense (R, C) blocks; ``data`` has shape (nblocks, R, C)."""

    format = "bsr"

    def __init__(self, indptr: Any, indices: Any, data: Any, shape: tuple[int, int], check: bool = True) -> None:
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(indices, dtype=np.int32)
        self.data = np.ascontiguousarray(data)
        self.shape = (int(shape[0]), int(shape[1]))
        if self.data.ndim != 3:
            raise ValueError(f"data: expected shape (nblocks, R, C), got {self.data.shape}")
        self.block_size = (int(self.data.shape[1]), int(self.data.shape[2]))
        if check:
            R, C = self.block_size
            if R < 1 or C < 1 or self.shape[0] % R or self.shape[1] % C:
                raise ValueError(f"block_size: {self.block_size} must divide shape {self.shape}")
            CSR(self.indptr, self.indices, np.zeros(self.indices.size), (self.shape[0] // R, self.shape[1] // C))

    @classmethod
    def from_dense(cls, a: Any, block_size: int | tuple[int, int]) -> BSR:
        a = _as_2d(a)
        if isinstance(block_size, int | np.integer):
            block_size = (int(block_size), int(block_size))
        if len(block_size) != 2 or any(int(b) < 1 for b in block_size):
            raise ValueError(f"block_size: expected a positive int or (R, C), got {block_size}")
        R, C = int(block_size[0]), int(block_size[1])
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

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    def to_dense(self) -> np.ndarray:
        R, C = self.block_size
        M, K = self.shape
        blocks = np.zeros((M // R, K // C, R, C), dtype=self.data.dtype)
        brow = np.repeat(np.arange(M // R), np.diff(self.indptr))
        blocks[brow, self.indices] = self.data
        return blocks.transpose(0, 2, 1, 3).reshape(M, K)

    def matmul(self, dense: Any, backend: str = "cpp") -> np.ndarray:
        _check_backend(backend)
        if backend == "numba":
            raise ValueError("backend: BSR has 'cpp' and 'numpy' kernels, not 'numba'")
        M, K = self.shape
        R, C = self.block_size
        x, dt = _prepare_dense(self.data.dtype, dense, K, backend)
        vec = x.ndim == 1
        x2 = x[:, None] if vec else x
        if backend == "numpy":
            brow = np.repeat(np.arange(M // R), np.diff(self.indptr))
            xb = x2.reshape(K // C, C, -1)[self.indices]  # (nb, C, N)
            prod = np.einsum("brc,bcn->brn", self.data.astype(dt), xb)
            out = np.zeros((M // R, R, x2.shape[1]), dtype=dt)
            np.add.at(out, brow, prod)
            out = out.reshape(M, -1)
        else:
            out = _cpp().bsr_spmm(
                self.indptr, self.indices, self.data.astype(dt, copy=False), np.ascontiguousarray(x2), M
            )
        return out[:, 0] if vec else out

    __matmul__ = matmul

    def __repr__(self) -> str:
        return f"BSR(shape={self.shape}, block_size={self.block_size}, nblocks={self.nblocks}, dtype={self.dtype})"
