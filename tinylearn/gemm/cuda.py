"""The ``cuda`` backend of gemm.matmul: cuda_src/gemm_*.cu through cupy.RawModule (needs a CUDA device).

    version  source              block        grid                       idea
    naive    gemm_naive.cu       (16, 16)     (ceil(N/16), ceil(M/16))   one thread per C element
    smem     gemm_smem.cu        (32, 32)     (ceil(N/32), ceil(M/32))   32 x 32 shared-memory tiles
    regtile  gemm_regtile.cu     256          (ceil(N/64), ceil(M/64))   64 x 64 block tile, 4 x 4 per thread
    vec4     gemm_vec4.cu        256          (ceil(N/64), ceil(M/64))   regtile + float4 loads/stores
``matmul_cuda`` copies to the device, launches, synchronises and copies back (timing it times the transfers too;
the bench times device-resident operands). Sources are loaded with tinylearn.backends.cuda_module (the one CUDA
loader and its cache).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends

LAUNCH: dict[str, tuple[str, tuple[int, ...], int]] = {  # version -> (source, block, tile edge of the grid)
    "naive": ("gemm_naive", (16, 16, 1), 16),
    "smem": ("gemm_smem", (32, 32, 1), 32),
    "regtile": ("gemm_regtile", (256, 1, 1), 64),
    "vec4": ("gemm_vec4", (256, 1, 1), 64),
}


def launch(version: str, da: Any, db: Any, dc: Any) -> None:
    """Launch one kernel on device arrays (float32, C-contiguous; vec4 needs K % 4 == N % 4 == 0)."""
    if version not in LAUNCH:
        raise ValueError(f"version: unknown CUDA gemm version {version!r}; known: {list(LAUNCH)}")
    src, block, tile = LAUNCH[version]
    m, k = da.shape
    n = db.shape[1]
    kern = backends.cuda_module(src).get_function(src)
    grid = (-(-n // tile), -(-m // tile), 1)
    kern(grid, block, (da, db, dc, np.int32(m), np.int32(n), np.int32(k)))


def matmul_cuda(a: np.ndarray, b: np.ndarray, *, version: str = "vec4") -> np.ndarray:
    import cupy

    m, k = a.shape
    n = b.shape[1]
    if version == "vec4" and (k % 4 or n % 4):  # pad K and N to multiples of 4 with zeros (same product)
        k4, n4 = -(-k // 4) * 4, -(-n // 4) * 4
        a = np.pad(a, ((0, 0), (0, k4 - k)))
        b = np.pad(b, ((0, k4 - k), (0, n4 - n)))
    da = cupy.asarray(np.ascontiguousarray(a, dtype=np.float32))
    db = cupy.asarray(np.ascontiguousarray(b, dtype=np.float32))
    dc = cupy.zeros((da.shape[0], db.shape[1]), dtype=cupy.float32)
    launch(version, da, db, dc)
    cupy.cuda.get_current_stream().synchronize()
    return cupy.asnumpy(dc)[:m, :n]
