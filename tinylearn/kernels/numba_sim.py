"""The GPU execution model in numba.cuda, run by numba's CUDA *simulator* on a CPU box (NUMBA_ENABLE_CUDASIM=1).

Grid of blocks, block of threads, each thread finds its work from ``cuda.blockIdx`` / ``cuda.threadIdx``;
threads of one block share ``cuda.shared.array`` memory and meet at ``cuda.syncthreads()``. The simulator runs
every thread as a Python thread: slow, but barriers and shared memory behave as on a GPU (and a missing barrier
shows up as a wrong answer). It has no warp shuffles, so every reduction here is a shared-memory tree:

    for s in (T/2, T/4, ..., 1):  if tid < s: buf[tid] += buf[tid + s];  syncthreads()     # log2(T) steps

Kernels (validated against numpy in tests/kernels/test_kernels_numba.py):
  block_reduce_sum_kernel   tiled reduction: block b sums x[b*2T : (b+1)*2T] (two loads per thread), writes out[b]
  softmax_rows_kernel       one block per row: strided max -> tree max, strided exp-sum -> tree sum, write

The simulator must be chosen before numba is imported. Importing this module sets NUMBA_ENABLE_CUDASIM=1 when
numba is not imported yet and no GPU is present; if numba was already imported without it, ``block_reduce_sum``
and ``softmax_rows`` raise RuntimeError — use ``run_in_subprocess(...)`` (what the tests do).
"""

from __future__ import annotations

import numpy as np

from .. import _cudasim

SIMULATED = _cudasim.select()  # before numba is imported: whether the simulator is on

from numba import cuda  # noqa: E402

THREADS = 32  # threads per block (a power of two); shared arrays below are sized with it


def _usable() -> None:
    _cudasim.check_usable(__name__, SIMULATED)


@cuda.jit(device=True)
def _block_reduce(buf, tid, v, take_max):
    """Every thread of the block passes its value ``v`` and gets back the block's max (``take_max``) or sum, by the
    shared-memory tree over ``buf`` (log2(THREADS) steps, a barrier after each)."""
    buf[tid] = v
    cuda.syncthreads()
    s = THREADS // 2
    while s > 0:
        if tid < s:
            buf[tid] = max(buf[tid], buf[tid + s]) if take_max else buf[tid] + buf[tid + s]
        cuda.syncthreads()
        s //= 2
    return buf[0]


@cuda.jit
def block_reduce_sum_kernel(x, out):
    buf = cuda.shared.array(THREADS, dtype=np.float32)
    tid = cuda.threadIdx.x
    i = cuda.blockIdx.x * (2 * THREADS) + tid
    v = np.float32(0.0)
    if i < x.shape[0]:
        v += x[i]
    if i + THREADS < x.shape[0]:
        v += x[i + THREADS]
    total = _block_reduce(buf, tid, v, False)
    if tid == 0:
        out[cuda.blockIdx.x] = total


@cuda.jit
def softmax_rows_kernel(x, y):
    buf = cuda.shared.array(THREADS, dtype=np.float32)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    cols = x.shape[1]
    m = -np.inf
    for c in range(tid, cols, THREADS):
        m = max(m, x[row, c])
    m = _block_reduce(buf, tid, m, True)
    cuda.syncthreads()  # everyone has read the max before buf is reused
    acc = np.float32(0.0)
    for c in range(tid, cols, THREADS):
        acc += np.exp(x[row, c] - m)
    total = _block_reduce(buf, tid, acc, False)
    for c in range(tid, cols, THREADS):
        y[row, c] = np.exp(x[row, c] - m) / total


def block_reduce_sum(x: np.ndarray) -> float:
    """Sum a 1-D float32 array: one launch of ceil(n / 2T) blocks gives partial sums, repeated until one is left."""
    _usable()
    x = np.ascontiguousarray(x, dtype=np.float32).ravel()
    if x.size == 0:
        return 0.0
    while x.size > 1:
        blocks = (x.size + 2 * THREADS - 1) // (2 * THREADS)
        out = np.zeros(blocks, dtype=np.float32)
        block_reduce_sum_kernel[blocks, THREADS](x, out)
        x = out
    return float(x[0])


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """Row softmax of a 2-D float32 array, one block of THREADS threads per row."""
    _usable()
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"x: softmax_rows expects a 2-D array, got shape {x.shape}")
    y = np.empty_like(x)
    softmax_rows_kernel[x.shape[0], THREADS](x, y)
    return y


_FUNCS = ("block_reduce_sum", "softmax_rows")


def run_in_subprocess(func: str, *arrays: np.ndarray, timeout_s: float = 300) -> np.ndarray:
    """Run ``func`` (``'block_reduce_sum'`` or ``'softmax_rows'``) in a fresh interpreter with the simulator on."""
    return _cudasim.run_in_subprocess(__name__, func, _FUNCS, *arrays, timeout_s=timeout_s)
