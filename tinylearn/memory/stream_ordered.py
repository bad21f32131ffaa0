"""Op ``memory.stream_ordered_checksum``: the steady-state loop of cuda_src/memory_stream_ordered_alloc.cu.

    y = zeros(n); repeat iters times: x = alloc(n floats); x[i] = i; y += 1.0 * x; free(x)
    return float32(sum(y))          # in float64, like the .cu's host driver; expected iters * n * (n - 1) / 2

Every iteration allocates and frees the same size, so a caching allocator serves iterations 2.. from its cache:

    numpy  (reference) x is a view of a ``CachingAllocator`` block (the host-side pool, tinylearn.memory)
    cuda   the .cu's host driver ``tl_stream_ordered_demo``: cudaMallocFromPoolAsync / cudaFreeAsync on one stream
           from a cudaMemPool_t that keeps freed memory (release threshold UINT64_MAX); GPU and nvcc only

The source has a host function, which NVRTC rejects, so the cuda backend cannot go through
``backends.cuda_module`` (cupy.RawModule): it is built once with ``nvcc -shared`` into the user cache folder and
called through ctypes. Registered with priority 1: used only when named (``backend="cuda"``).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from .. import backends
from .base import check_int
from .caching import CachingAllocator

OP = "memory.stream_ordered_checksum"
SOURCE = "memory_stream_ordered_alloc"


def stream_ordered_checksum(n: int, iters: int, *, backend: str | None = None, version: str | None = None) -> float:
    """float32 sum of y after ``iters`` rounds of {allocate x, x = arange(n), y += x, free x} (see module doc).

    backend: None (the registry picks: numpy here) | "numpy" | "cuda" (GPU with nvcc only)."""
    n, iters = check_int("n", n), check_int("iters", iters)
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    if iters < 0:
        raise ValueError(f"iters: must be >= 0, got {iters}")
    return float(backends.dispatch(OP, n, iters, backend=backend, version=version))


def _numpy(n: int, iters: int) -> np.float32:
    """Reference: the same float32 updates in the same order, x drawn from a host caching allocator."""
    alloc = CachingAllocator(max(1 << 20, 4 * n * 4), backend="python")
    y = np.zeros(n, np.float32)
    for _ in range(iters):
        off = alloc.malloc(4 * n)
        x = alloc.view(off, n, np.float32)
        x[:] = np.arange(n, dtype=np.float32)
        y += np.float32(1.0) * x
        alloc.free(off)
    return np.float32(y.astype(np.float64).sum())


@functools.cache
def _library() -> Any:
    """ctypes handle of the .cu built with ``nvcc -shared`` (``backends.cuda_library``: NVRTC rejects host code)."""
    so = backends.cuda_library(SOURCE)
    so.tl_stream_ordered_demo.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_float))
    so.tl_stream_ordered_demo.restype = ctypes.c_int
    return so


def _cuda(n: int, iters: int) -> np.float32:
    out = ctypes.c_float()
    err = _library().tl_stream_ordered_demo(n, iters, ctypes.byref(out))
    if err != 0:
        raise RuntimeError(f"cuda: tl_stream_ordered_demo(n={n}, iters={iters}) failed with cudaError_t {err}")
    return np.float32(out.value)


def _example(rng: Any) -> tuple[tuple, dict]:
    return (int(rng.integers(900, 1100)), 5), {}


backends.register(OP, "numpy", _numpy, example=_example)
backends.register(OP, "cuda", _cuda, version="mempool_async", priority=1, available=backends.nvcc_available)
