"""The ``cuda`` backend: the hand-written kernels in cuda_src/*.cu, compiled at run time by cupy.RawModule.

``load(name)`` (= ``tinylearn.backends.cuda_module``, the one CUDA loader) returns the cupy.RawModule of
``cuda_src/<name>.cu`` and raises RuntimeError when no CUDA device
is usable (``tinylearn.backends.cuda_available()`` is False): nothing here ever pretends a CPU result came from a GPU.
On a CPU-only box the sources are still compiled to PTX by tests/kernels/test_cuda_compile.py (nvcc -ptx -arch=sm_80).

Launch choices (see each .cu header for the kernel versions): softmax v3 (one warp per row, online max/sum with
__shfl_xor_sync, float4 loads), LayerNorm v2 (warp Welford), bias+GELU v2 float4 when cols % 4 == 0 else v1,
flash attention v2 (K/V tiles in shared memory, one thread per query row, D <= 128). ``reduce_sum``:
cuda_src/vector_reduce.cu (grid_stride | block_warp | block_shared).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from .._resources import cuda_source
from ..backends import cuda_available, cuda_module

NATIVE_DTYPES = (np.float32,)
WARPS_PER_BLOCK = 4


def available() -> tuple[bool, str]:
    if not cuda_available():
        return False, "no CUDA device (tinylearn.backends.cuda_available() is False)"
    return True, ""


def source_path(name: str) -> Path:
    """cuda_src/<name>.cu from the checkout, or the copy packaged in the wheel (tinylearn._resources)."""
    return cuda_source(name)


load = cuda_module  # the one CUDA loader lives in tinylearn.backends; this name stays for older callers


def _dev(a: np.ndarray) -> Any:
    import cupy

    return cupy.asarray(np.ascontiguousarray(a, dtype=np.float32))


def _host(a: Any) -> np.ndarray:
    return a.get()


def _row_grid(rows: int) -> tuple[tuple[int], tuple[int]]:
    return ((rows + WARPS_PER_BLOCK - 1) // WARPS_PER_BLOCK,), (32 * WARPS_PER_BLOCK,)


def softmax(x: np.ndarray) -> np.ndarray:
    import cupy

    rows, cols = x.shape
    dx = _dev(x)
    dy = cupy.empty_like(dx)
    grid, block = _row_grid(rows)
    load("kernels_softmax").get_function("softmax_v3_warp_online")(
        grid, block, (dx, dy, np.int32(rows), np.int32(cols))
    )
    return _host(dy)


def softmax_backward(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    import cupy

    rows, cols = y.shape
    gy, gdy = _dev(y), _dev(dy)
    gdx = cupy.empty_like(gy)
    grid, block = _row_grid(rows)
    load("kernels_softmax").get_function("softmax_backward_warp")(
        grid, block, (gy, gdy, gdx, np.int32(rows), np.int32(cols))
    )
    return _host(gdx)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import cupy

    rows, cols = x.shape
    gx, gw, gb = _dev(x), _dev(w), _dev(b)
    gy = cupy.empty_like(gx)
    gm = cupy.empty(rows, dtype=cupy.float32)
    gr = cupy.empty(rows, dtype=cupy.float32)
    grid, block = _row_grid(rows)
    load("kernels_layernorm").get_function("layernorm_forward_v2_welford")(
        grid, block, (gx, gw, gb, gy, gm, gr, np.int32(rows), np.int32(cols), np.float32(eps))
    )
    return _host(gy), _host(gm), _host(gr)


def layer_norm_backward(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray, mean: np.ndarray, rstd: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import cupy

    rows, cols = x.shape
    gdy, gx, gw, gm, gr = _dev(dy), _dev(x), _dev(w), _dev(mean), _dev(rstd)
    gdx = cupy.empty_like(gx)
    gdw = cupy.zeros(cols, dtype=cupy.float32)
    gdb = cupy.zeros(cols, dtype=cupy.float32)
    grid, block = _row_grid(rows)
    load("kernels_layernorm").get_function("layernorm_backward_warp")(
        grid, block, (gdy, gx, gw, gm, gr, gdx, gdw, gdb, np.int32(rows), np.int32(cols))
    )
    return _host(gdx), _host(gdw), _host(gdb)


def bias_gelu(x: np.ndarray, b: np.ndarray, approximate: str = "none") -> np.ndarray:
    import cupy

    rows, cols = x.shape
    gx, gb = _dev(x), _dev(b)
    gy = cupy.empty_like(gx)
    n = rows * cols
    vec = cols % 4 == 0
    name = "bias_gelu_v2_float4" if vec else "bias_gelu_v1"
    work = n // 4 if vec else n
    grid = (max(1, min(65535, (work + 255) // 256)),)
    load("kernels_bias_gelu").get_function(name)(
        grid, (256,), (gx, gb, gy, np.int64(n), np.int32(cols), np.int32(approximate == "tanh"))
    )
    return _host(gy)


def bias_gelu_backward(
    dy: np.ndarray, x: np.ndarray, b: np.ndarray, approximate: str = "none"
) -> tuple[np.ndarray, np.ndarray]:
    import cupy

    rows, cols = x.shape
    gdy, gx, gb = _dev(dy), _dev(x), _dev(b)
    gdx = cupy.empty_like(gx)
    gdb = cupy.zeros(cols, dtype=cupy.float32)
    n = rows * cols
    grid = (max(1, min(65535, (n + 255) // 256)),)
    load("kernels_bias_gelu").get_function("bias_gelu_backward")(
        grid, (256,), (gdy, gx, gb, gdx, gdb, np.int64(n), np.int32(cols), np.int32(approximate == "tanh"))
    )
    return _host(gdx), _host(gdb)


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, block_size: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    import cupy

    bh, nq, d = q.shape
    nk, dv = k.shape[1], v.shape[2]
    if d > 128 or dv > 128:
        raise ValueError(f"q: the cuda flash attention kernel supports head dims <= 128, got D={d}, DV={dv}")
    gq, gk, gv = _dev(q), _dev(k), _dev(v)
    go = cupy.empty((bh, nq, dv), dtype=cupy.float32)
    glse = cupy.empty((bh, nq), dtype=cupy.float32)
    br = max(32, min(128, int(block_size)))
    bc = max(1, min(32, int(block_size)))  # 2 tiles x 32 rows x 128 floats = 32 KiB < the 48 KiB default
    smem = 2 * bc * 128 * 4
    load("kernels_flash_attention").get_function("flash_attention_v2")(
        ((nq + br - 1) // br, bh),
        (br,),
        (
            gq,
            gk,
            gv,
            go,
            glse,
            np.int32(nq),
            np.int32(nk),
            np.int32(d),
            np.int32(dv),
            np.int32(bool(causal)),
            np.float32(1.0 / math.sqrt(d)),
            np.int32(bc),
        ),
        shared_mem=smem,
    )
    return _host(go), _host(glse)


REDUCE_VERSIONS: tuple[str, ...] = ("grid_stride", "block_warp", "block_shared")  # cuda_src/vector_reduce.cu


def reduce_sum(x: np.ndarray, version: str = "grid_stride") -> np.ndarray:
    """float32 sum of every element of ``x`` (a 0-d array) with cuda_src/vector_reduce.cu.

    grid_stride: one launch, 64 x 256 threads, float4 loads, one atomicAdd per block (order-dependent rounding).
    block_warp / block_shared: 512 elements per 256-thread block into per-block partials, summed in float64 on the
    host (the .cu's "reduce the partials on the host")."""
    import cupy

    if version not in REDUCE_VERSIONS:
        raise ValueError(f"version: unknown vector_reduce version {version!r}; known: {list(REDUCE_VERSIONS)}")
    gx = _dev(np.ravel(x))
    n = int(gx.size)
    mod = load("vector_reduce")
    if version == "grid_stride":
        out = cupy.zeros(1, dtype=cupy.float32)
        if n:
            mod.get_function("grid_stride_reduce")((64,), (256,), (gx, out, np.int64(n)))
        return np.asarray(_host(out)[0], dtype=np.float32)
    blocks = max(1, (n + 511) // 512)
    part = cupy.zeros(blocks, dtype=cupy.float32)
    if n:
        name = "block_reduce_warp" if version == "block_warp" else "block_reduce_shared"
        mod.get_function(name)((blocks,), (256,), (gx, part, np.int32(n)), shared_mem=256 * 4)
    return np.asarray(_host(part).astype(np.float64).sum(), dtype=np.float32)
