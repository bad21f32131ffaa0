"""The ``triton`` backend of gemm.matmul: the classic tiled Triton matmul (one program per BLOCK_M x BLOCK_N tile of
C, a loop over K in BLOCK_K steps, ``tl.dot`` on the tiles, masked edges).

On a CPU-only machine it runs in Triton's interpreter (TRITON_INTERPRET=1, set at ``import tinylearn``): numpy
executes each program, so only small sizes are practical — it checks the algorithm, never the speed.
"""

from __future__ import annotations

import os

import numpy as np

if os.environ.get("TRITON_INTERPRET") is None:
    from ..backends import cuda_available

    if not cuda_available():
        os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        a = tl.load(
            a_ptr + rm[:, None] * stride_am + ks[None, :] * stride_ak,
            mask=(rm[:, None] < M) & (ks[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + ks[:, None] * stride_bk + rn[None, :] * stride_bn,
            mask=(ks[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        acc += tl.dot(a, b, allow_tf32=False)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul_triton(a: np.ndarray, b: np.ndarray, block_m: int = 16, block_n: int = 16, block_k: int = 16) -> np.ndarray:
    """C = a @ b (float32, any strides: the kernel takes element strides) with the tiled Triton kernel."""
    dev = "cpu" if INTERPRETED else "cuda"
    ta = torch.from_numpy(np.asarray(a, dtype=np.float32).copy()).to(dev)
    tb = torch.from_numpy(np.asarray(b, dtype=np.float32).copy()).to(dev)
    if a.strides[0] < a.strides[1]:  # keep a transposed layout transposed: exercises the stride arguments
        ta = ta.t().contiguous().t()
    m, k = ta.shape
    n = tb.shape[1]
    tc = torch.empty((m, n), dtype=torch.float32, device=dev)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    matmul_kernel[grid](
        ta, tb, tc, m, n, k,
        ta.stride(0), ta.stride(1), tb.stride(0), tb.stride(1), tc.stride(0), tc.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip
    return tc.cpu().numpy()
