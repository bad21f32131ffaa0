"""The ``cuda`` backend of ``quant.int8_gemm``: cuda_src/quant_int8_gemm_dp4a.cu through ``backends.cuda_module``.

    version     kernel                 block     grid                        idea
    dp4a_naive  int8_gemm_dp4a_naive   (16, 16)  (ceil(N/16), ceil(M/16))    one thread per C element
    dp4a_tiled  int8_gemm_dp4a_tiled   (32, 8)   (ceil(N/32), ceil(M/32))    32 x 32 tile, K staged in shared memory

Exact int8 x int8 -> int32 (``__dp4a``, sm_61+). The kernels read 4 k values as one int32, so A and B^T are
zero-padded to K4 = ceil(K / 4) words per row on the host. Each call copies to the device and back.
"""

from __future__ import annotations

import numpy as np

from .. import backends

SOURCE = "quant_int8_gemm_dp4a"
LAUNCH: dict[str, tuple[tuple[int, int], int]] = {  # version -> (block, tile edge of the grid)
    "dp4a_naive": ((16, 16), 16),
    "dp4a_tiled": ((32, 8), 32),
}


def _words(rows: np.ndarray, k4: int) -> np.ndarray:
    """int8 rows [R, K] -> int32 words [R, K4] (little-endian bytes k..k+3, zero-padded)."""
    out = np.zeros((rows.shape[0], 4 * k4), np.int8)
    out[:, : rows.shape[1]] = rows
    return out.view(np.int32)


def int8_gemm_dp4a(a: np.ndarray, b: np.ndarray, *, version: str = "dp4a_tiled") -> np.ndarray:
    """Exact int32 a @ b for int8 a [M, K] and b [K, N] on the GPU."""
    if version not in LAUNCH:
        raise ValueError(f"version: unknown CUDA int8 GEMM version {version!r}; known: {list(LAUNCH)}")
    import cupy

    (m, k), n = a.shape, b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return np.zeros((m, n), np.int32)
    k4 = -(-k // 4)
    block, tile = LAUNCH[version]
    da, dbt = cupy.asarray(_words(a, k4)), cupy.asarray(_words(np.ascontiguousarray(b.T), k4))
    dc = cupy.zeros((m, n), cupy.int32)
    backends.cuda_module(SOURCE).get_function(f"int8_gemm_{version}")(
        (-(-n // tile), -(-m // tile)), block, (da, dbt, dc, np.int32(m), np.int32(n), np.int32(k4))
    )
    return cupy.asnumpy(dc)


def register(op: str) -> None:
    """Register both kernels as ``cuda`` versions of ``op`` (priority 1: used only when named)."""
    for v in LAUNCH:

        def fn(a: np.ndarray, b: np.ndarray, v: str = v) -> np.ndarray:
            return int8_gemm_dp4a(a, b, version=v)

        fn.__name__ = f"int8_gemm_cuda_{v}"
        backends.register(op, "cuda", fn, version=v, default=v == "dp4a_tiled", priority=1)
