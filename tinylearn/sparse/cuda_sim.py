"""CSR SpMV written for the GPU in numba.cuda: the same scalar kernel as cuda_src/sparse_csr_spmv.cu.

One thread per row: ``y[row] = sum_{k in [indptr[row], indptr[row+1])} data[k] * x[indices[k]]``.
Without a GPU it runs only under the numba CUDA simulator: set ``NUMBA_ENABLE_CUDASIM=1`` *before numba is first
imported* (tests do it in a subprocess). The simulator runs each thread in Python, so it is for correctness only;
no timing from it means anything.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda


@cuda.jit
def csr_spmv_scalar_kernel(indptr, indices, data, x, y):  # noqa: ANN001, ANN201
    row = cuda.grid(1)
    if row < y.shape[0]:
        acc = 0.0
        for k in range(indptr[row], indptr[row + 1]):
            acc += data[k] * x[indices[k]]
        y[row] = acc


def csr_spmv(a_csr: Any, x: np.ndarray, threads_per_block: int = 32) -> np.ndarray:
    """Launch the scalar kernel on ``a_csr`` (a tinylearn.sparse.CSR) and a float32 vector ``x``."""
    M, K = a_csr.shape
    a_csr.check_arrays()  # the kernel trusts indptr and the columns
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape != (K,):
        raise ValueError(f"x: expected shape ({K},), got {x.shape}")
    y = np.zeros(M, dtype=np.float32)
    blocks = max(1, (M + threads_per_block - 1) // threads_per_block)
    # copies: numba's implicit transfer copies every argument back, and the index arrays are read-only
    ip, ix = a_csr.indptr.copy(), a_csr.indices.copy()
    csr_spmv_scalar_kernel[blocks, threads_per_block](ip, ix, a_csr.data.astype(np.float32), x, y)
    return y
