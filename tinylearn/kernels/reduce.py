"""``reduce_sum``: the reduction lesson of cuda_src/vector_reduce.cu as a registered op ``kernels.reduce_sum``.

numpy (float64 accumulation) is the reference; the .cu's three versions (grid_stride, block_warp, block_shared;
``tinylearn.kernels.cuda.reduce_sum``) are its cuda backend, run only where a CUDA device exists."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends
from .ops import _as_float


def _reduce_sum_numpy(x: np.ndarray) -> np.ndarray:
    """float32 sum of every element, accumulated in float64 (the reference the CUDA versions are compared with)."""
    return np.asarray(np.asarray(x, dtype=np.float64).sum(), dtype=np.float32)


def _reduce_sum_cuda(version: str) -> Any:
    def run(x: np.ndarray) -> np.ndarray:
        from . import cuda

        return cuda.reduce_sum(x, version)

    return run


backends.register(
    "kernels.reduce_sum",
    "numpy",
    _reduce_sum_numpy,
    example=lambda rng: ((rng.standard_normal(1000).astype(np.float32),), {}),
)
for _v in ("grid_stride", "block_warp", "block_shared"):  # tinylearn.kernels.cuda.REDUCE_VERSIONS
    backends.register("kernels.reduce_sum", "cuda", _reduce_sum_cuda(_v), version=_v)


def reduce_sum(x: np.ndarray, *, backend: str | None = None, version: str | None = None) -> np.ndarray:
    """Sum of every element of a float32 array as a 0-d float32 array: numpy (float64 accumulation) or cuda
    (cuda_src/vector_reduce.cu: grid_stride | block_warp | block_shared; only with a CUDA device)."""
    x = _as_float(x, "x")
    return backends.dispatch(
        "kernels.reduce_sum", np.ascontiguousarray(x, dtype=np.float32), backend=backend, version=version
    )
