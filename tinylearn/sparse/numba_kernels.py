"""numba versions of the sparse kernels (same loops as cpp_src/sparse.cpp, parallel over rows with prange).

    csr_spmv:  y[i] = sum_{k in row i} data[k] * x[indices[k]]
    csr_spmm:  Y[i, :] = sum_{k in row i} data[k] * B[indices[k], :]
    ell_spmv:  y[i] = sum_{slot} data[slot, i] * x[indices[slot, i]]  (padding column -1 skipped)

Compiled on first call (a few seconds, cached on disk). Inputs are validated by the callers (csr.py, ell.py).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(parallel=True, cache=True)
def _csr_spmv(indptr, indices, data, x, M):  # noqa: ANN001, ANN202
    y = np.zeros(M, dtype=data.dtype)
    for i in numba.prange(M):
        acc = data.dtype.type(0)
        for k in range(indptr[i], indptr[i + 1]):
            acc += data[k] * x[indices[k]]
        y[i] = acc
    return y


@numba.njit(parallel=True, cache=True)
def _csr_spmm(indptr, indices, data, B, M):  # noqa: ANN001, ANN202
    N = B.shape[1]
    Y = np.zeros((M, N), dtype=data.dtype)
    for i in numba.prange(M):
        for k in range(indptr[i], indptr[i + 1]):
            a = data[k]
            c = indices[k]
            for j in range(N):
                Y[i, j] += a * B[c, j]
    return Y


@numba.njit(parallel=True, cache=True)
def _ell_spmv(indices, data, x):  # noqa: ANN001, ANN202
    W, M = indices.shape
    y = np.zeros(M, dtype=data.dtype)
    for i in numba.prange(M):
        acc = data.dtype.type(0)
        for k in range(W):
            c = indices[k, i]
            if c >= 0:
                acc += data[k, i] * x[c]
        y[i] = acc
    return y


def csr_spmv(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, x: np.ndarray, M: int) -> np.ndarray:
    return _csr_spmv(indptr, indices, data, x, M)


def csr_spmm(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, B: np.ndarray, M: int) -> np.ndarray:
    return _csr_spmm(indptr, indices, data, B, M)


def ell_spmv(indices: np.ndarray, data: np.ndarray, x: np.ndarray) -> np.ndarray:
    return _ell_spmv(indices, data, x)
