"""The ``cuda`` backend of ``sparse.csr_matmul``: cuda_src/sparse_csr_spmv.cu through ``backends.cuda_module``.

    version  kernel            launch (block 256)          idea
    scalar   csr_spmv_scalar   grid ceil(M / 256)          one thread per row (short rows)
    vector   csr_spmv_vector   grid ceil(32 M / 256)       one warp per row, shuffle-tree sum (long rows)

The kernels are SpMV in float32; a 2-D ``x`` (SpMM) runs them column by column on the device. Each call copies
A and x to the device and y back (timing it times the transfers too). Registered with priority 1: used only when
named (``backend="cuda"``), never picked by ``backend=None`` for a host array.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends

SOURCE = "sparse_csr_spmv"
VERSIONS: tuple[str, ...] = ("scalar", "vector")
BLOCK = 256


def csr_matmul_cuda(A: Any, x: np.ndarray, dt: np.dtype, *, version: str = "scalar") -> np.ndarray:
    """A @ x on the GPU for a tinylearn.sparse.CSR ``A`` and float32 ``x`` of shape (K,) or (K, N)."""
    if version not in VERSIONS:
        raise ValueError(f"version: unknown CUDA CSR SpMV version {version!r}; known: {list(VERSIONS)}")
    if np.dtype(dt) != np.float32:
        raise TypeError(f"backend='cuda': sparse_csr_spmv.cu is float32 only, got dtype {np.dtype(dt)}")
    A.check_arrays()  # the kernels trust indptr and the columns: a bad one is an illegal address on the device
    import cupy

    kernel = backends.cuda_module(SOURCE).get_function(f"csr_spmv_{version}")
    M = A.shape[0]
    threads = M * (32 if version == "vector" else 1)
    grid = (max(1, -(-threads // BLOCK)),)
    operands = (
        cupy.asarray(A.indptr),
        cupy.asarray(A.indices),
        cupy.asarray(np.ascontiguousarray(A.data, dtype=np.float32)),
    )
    x2 = x[:, None] if x.ndim == 1 else x
    out = np.empty((M, x2.shape[1]), dtype=np.float32)
    for j in range(x2.shape[1]):
        dx = cupy.asarray(np.ascontiguousarray(x2[:, j], dtype=np.float32))
        dy = cupy.zeros(M, dtype=cupy.float32)
        if M:
            kernel(grid, (BLOCK,), (*operands, dx, dy, np.int64(M)))
        out[:, j] = cupy.asnumpy(dy)
    return out[:, 0] if x.ndim == 1 else out


def register(op: str) -> None:
    """Register each kernel as a ``cuda`` version of ``op`` (float32 only; ``scalar`` the default)."""
    for v in VERSIONS:

        def fn(A: Any, x: np.ndarray, dt: np.dtype, v: str = v) -> np.ndarray:
            return csr_matmul_cuda(A, x, dt, version=v)

        fn.__name__ = f"csr_matmul_cuda_{v}"
        backends.register(op, "cuda", fn, version=v, priority=1, when=lambda A, x, dt: dt == np.float32)
