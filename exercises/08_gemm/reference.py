"""Reference answers for exercises/08_gemm: thin calls into tinylearn.gemm."""

from __future__ import annotations

import numpy as np

import tinylearn as tl


def blocked_matmul(a: np.ndarray, b: np.ndarray, mc: int = 64, kc: int = 256, nc: int = 512) -> np.ndarray:
    return tl.gemm.blocked_matmul(a, b, mc=mc, kc=kc, nc=nc)


def pack_a(a: np.ndarray, mr: int) -> np.ndarray:
    return tl.gemm.pack_a(a, mr)


def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
    return tl.gemm.pack_b(b, nr)


def roofline(flops: float, nbytes: float, peak_gflops: float, bandwidth_gbs: float) -> dict:
    return tl.gemm.roofline(flops, nbytes, peak_gflops=peak_gflops, bandwidth_gbs=bandwidth_gbs)


def occupancy(threads_per_block: int, registers_per_thread: int, shared_bytes_per_block: int) -> dict:
    return tl.gemm.occupancy(threads_per_block, registers_per_thread, shared_bytes_per_block, arch="sm_80")
