"""GEMM in numba.cuda, run by numba's CUDA simulator on a CPU box (NUMBA_ENABLE_CUDASIM=1), plus two small kernels
that write, per thread of a warp, the address of a textbook access pattern (their index formulas are typed in
here: they illustrate ``gpu_model``, they do not record the CUDA ladder; ``cuda_trace`` replays the accesses of the
real cuda_src/gemm_*.cu kernels).

  tiled_matmul_kernel   TILE x TILE threads per block, A and B tiles staged in cuda.shared.array, syncthreads
  record_global_kernel  thread (ty, tx) of the naive kernel writes the A and B element index it loads at step k
  record_shared_kernel  each thread writes the shared word it reads for tile[ty][tx] vs tile[tx][ty] (with a pad)

The simulator must be chosen before numba is imported: ``run_in_subprocess(name, *arrays)`` runs a function here in
a fresh interpreter with NUMBA_ENABLE_CUDASIM=1 (what the tests and the notebook do). Slow (every thread is a
Python thread): small sizes only.
"""

from __future__ import annotations

import numpy as np

from .. import _cudasim

SIMULATED = _cudasim.select()  # before numba is imported: whether the simulator is on

from numba import cuda  # noqa: E402

TILE = 8


@cuda.jit
def tiled_matmul_kernel(a, b, c):
    sa = cuda.shared.array((TILE, TILE), dtype=np.float32)
    sb = cuda.shared.array((TILE, TILE), dtype=np.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    m, k = a.shape
    n = b.shape[1]
    acc = np.float32(0.0)
    for t in range(0, k, TILE):
        sa[ty, tx] = a[row, t + tx] if row < m and t + tx < k else np.float32(0.0)
        sb[ty, tx] = b[t + ty, col] if t + ty < k and col < n else np.float32(0.0)
        cuda.syncthreads()
        for kk in range(TILE):
            acc += sa[ty, kk] * sb[kk, tx]
        cuda.syncthreads()
    if row < m and col < n:
        c[row, col] = acc


@cuda.jit
def record_global_kernel(n, k, out_a, out_b):
    # one 32-thread warp of the naive kernel: block (32, 1), thread tx computes C[0, tx] (layout "row") or
    # C[tx, 0] (layout "col" = threadIdx.x mapped to rows); records the flat element index of its loads at step k
    tx = cuda.threadIdx.x
    out_a[0, tx] = 0 * k + k  # row layout: A[0, k] (the same element for every thread: broadcast)
    out_b[0, tx] = k * n + tx  # B[k, tx]: consecutive
    out_a[1, tx] = tx * n + k  # col layout: A[tx, k]: stride n (K = n here)
    out_b[1, tx] = k * n + 0  # B[k, 0]: broadcast


@cuda.jit
def record_shared_kernel(width, out):
    # thread tx of one warp reads tile[0][tx] (row), tile[tx][0] (column) of a row-major tile with `width` columns
    tx = cuda.threadIdx.x
    out[0, tx] = 0 * width + tx
    out[1, tx] = tx * width + 0


def _usable() -> None:
    _cudasim.check_usable(__name__, SIMULATED)


def tiled_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = a @ b (float32) with the shared-memory tiled kernel (grid covers C with TILE x TILE blocks)."""
    _usable()
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    c = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    grid = (-(-b.shape[1] // TILE), -(-a.shape[0] // TILE))
    tiled_matmul_kernel[grid, (TILE, TILE)](a, b, c)
    return c


def record_global(n: int = 64, k: int = 3) -> np.ndarray:
    """(2 layouts, A/B, 32 threads) element indices one warp of the naive kernel loads at step k."""
    _usable()
    out_a = np.zeros((2, 32), dtype=np.int64)
    out_b = np.zeros((2, 32), dtype=np.int64)
    record_global_kernel[1, 32](n, k, out_a, out_b)
    return np.stack([out_a, out_b], axis=1)


def record_shared(width: int = 32) -> np.ndarray:
    """(row/column, 32 threads) shared-memory word indices for a tile with ``width`` words per row."""
    _usable()
    out = np.zeros((2, 32), dtype=np.int64)
    record_shared_kernel[1, 32](width, out)
    return out


_FUNCS = ("tiled_matmul", "record_global", "record_shared")


def run_in_subprocess(func: str, *args: np.ndarray | int, timeout_s: float = 300) -> np.ndarray:
    """Run ``func`` (one of tiled_matmul, record_global, record_shared) in a fresh interpreter with the simulator."""
    return _cudasim.run_in_subprocess(__name__, func, _FUNCS, *args, timeout_s=timeout_s)
