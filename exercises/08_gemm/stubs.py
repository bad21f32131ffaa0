"""Exercises for notebook 08 (GEMM). Replace each ``raise NotImplementedError`` with your code, then run

    pytest exercises/08_gemm                     # your answers
    pytest exercises/08_gemm --impl=reference    # tinylearn's answers

Reference solutions: tinylearn/gemm/packing.py (blocked_matmul, pack_a, pack_b), tinylearn/gemm/roofline.py
(roofline), tinylearn/gemm/occupancy.py (occupancy). Matrices are 2-D numpy float arrays, row-major math.
"""

from __future__ import annotations

import numpy as np


def blocked_matmul(a: np.ndarray, b: np.ndarray, mc: int = 64, kc: int = 256, nc: int = 512) -> np.ndarray:
    """C = a @ b computed block by block: loop jc over N in steps of nc, pc over K in steps of kc, ic over M in
    steps of mc, and accumulate a[ic:ic+mc, pc:pc+kc] @ b[pc:pc+kc, jc:jc+nc] into C. Any sizes (edge blocks are
    smaller). Why this order: the kc x nc block of B is reused by every row block of A while it sits in cache.
    (tinylearn/gemm/packing.py: blocked_matmul)"""
    raise NotImplementedError


def pack_a(a: np.ndarray, mr: int) -> np.ndarray:
    """Pack A (M, K) into micro-panels of mr rows: result shape (ceil(M/mr), K, mr) where
    out[p, k, i] = a[p*mr + i, k] (0 past the last row). The micro-kernel then reads mr values per k, contiguously.
    (tinylearn/gemm/packing.py: pack_a)"""
    raise NotImplementedError


def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
    """Pack B (K, N) into micro-panels of nr columns: result (ceil(N/nr), K, nr), out[p, k, j] = b[k, p*nr + j]
    (0 past the last column). (tinylearn/gemm/packing.py: pack_b)"""
    raise NotImplementedError


def roofline(flops: float, nbytes: float, peak_gflops: float, bandwidth_gbs: float) -> dict:
    """Return dict(intensity=flops/nbytes [FLOP/byte], attainable_gflops=min(peak, intensity*bandwidth),
    bound="memory" if intensity*bandwidth < peak else "compute"). ValueError if nbytes <= 0 or flops < 0.
    (tinylearn/gemm/roofline.py: roofline)"""
    raise NotImplementedError


def occupancy(threads_per_block: int, registers_per_thread: int, shared_bytes_per_block: int) -> dict:
    """CUDA occupancy on sm_80: return dict(blocks_per_sm, warps_per_sm, occupancy, limiter) where limiter is one
    of "threads", "blocks", "registers", "shared" (on a tie: the first in that order). Rules per SM:
    64 warps, 32 blocks; a warp of a block uses ceil(regs*32/256)*256 registers, the 65536-register file is split
    into 4 sub-partitions of 16384 (warps/SM by registers = 4 * (16384 // regs_per_warp)); a block uses
    ceil((shared + 1024 reserved) / 128) * 128 bytes of the 167936 bytes (164 KB) of shared memory.
    occupancy = warps_per_sm / 64. (tinylearn/gemm/occupancy.py: occupancy)"""
    raise NotImplementedError
