"""numba versions of the sparse kernels (same loops as cpp_src/sparse.cpp, parallel over rows with prange).

    csr_spmv:  y[i] = sum_{k in row i} data[k] * x[indices[k]]
    csr_spmm:  Y[i, :] = sum_{k in row i} data[k] * B[indices[k], :]
    ell_spmv:  y[i] = sum_{slot} data[slot, i] * x[indices[slot, i]]  (padding column -1 skipped)

Compiled on first call (a few seconds, cached on disk). The wrappers are safe on any input (a CSR built with
``check=False`` reaches them unvalidated): they check ``indptr`` first (O(M), ``base.check_compressed``) and the
kernels compare every column with the bounds as they read it (one compare next to a gather), skipping and flagging a
bad one; a flagged row is a ValueError after the loop, never an out-of-bounds access.
"""

from __future__ import annotations

import numba
import numpy as np

from .base import check_compressed


@numba.njit(parallel=True, cache=True)
def _csr_spmv(indptr, indices, data, x, M):  # noqa: ANN001, ANN202
    K = x.shape[0]
    y = np.zeros(M, dtype=data.dtype)
    bad = np.zeros(M, dtype=np.bool_)
    for i in numba.prange(M):
        acc = data.dtype.type(0)
        for k in range(indptr[i], indptr[i + 1]):
            c = indices[k]
            if c < 0 or c >= K:
                bad[i] = True
            else:
                acc += data[k] * x[c]
        y[i] = acc
    return y, bad


@numba.njit(parallel=True, cache=True)
def _csr_spmm(indptr, indices, data, B, M):  # noqa: ANN001, ANN202
    K, N = B.shape
    Y = np.zeros((M, N), dtype=data.dtype)
    bad = np.zeros(M, dtype=np.bool_)
    for i in numba.prange(M):
        for k in range(indptr[i], indptr[i + 1]):
            a = data[k]
            c = indices[k]
            if c < 0 or c >= K:
                bad[i] = True
                continue
            for j in range(N):
                Y[i, j] += a * B[c, j]
    return Y, bad


@numba.njit(parallel=True, cache=True)
def _ell_spmv(indices, data, x):  # noqa: ANN001, ANN202
    W, M = indices.shape
    K = x.shape[0]
    y = np.zeros(M, dtype=data.dtype)
    bad = np.zeros(M, dtype=np.bool_)
    for i in numba.prange(M):
        acc = data.dtype.type(0)
        for k in range(W):
            c = indices[k, i]
            if c >= K or c < -1:
                bad[i] = True
            elif c >= 0:
                acc += data[k, i] * x[c]
        y[i] = acc
    return y, bad


def _refuse_columns(bad: np.ndarray, ncols: int, fn: str) -> None:
    if bad.any():
        raise ValueError(f"indices: row {int(np.argmax(bad))} holds a column out of range for {ncols} columns ({fn})")


def _check_csr(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, M: int, K: int) -> None:
    check_compressed(indptr, indices, data.shape[0] if data.ndim == 1 else -1, (M, K), columns=False)


def csr_spmv(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, x: np.ndarray, M: int) -> np.ndarray:
    _check_csr(indptr, indices, data, M, x.shape[0])
    y, bad = _csr_spmv(indptr, indices, data, x, M)
    _refuse_columns(bad, x.shape[0], "csr_spmv")
    return y


def csr_spmm(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, B: np.ndarray, M: int) -> np.ndarray:
    _check_csr(indptr, indices, data, M, B.shape[0])
    Y, bad = _csr_spmm(indptr, indices, data, B, M)
    _refuse_columns(bad, B.shape[0], "csr_spmm")
    return Y


def ell_spmv(indices: np.ndarray, data: np.ndarray, x: np.ndarray) -> np.ndarray:
    if indices.ndim != 2 or indices.shape != data.shape:
        raise ValueError(f"indices/data: expected equal shapes (W, M), got {indices.shape} and {data.shape}")
    y, bad = _ell_spmv(indices, data, x)
    _refuse_columns(bad, x.shape[0], "ell_spmv")
    return y
