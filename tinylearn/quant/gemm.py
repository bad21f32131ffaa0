"""int8 GEMM front end: C = A @ B with int8 operands and exact int32 accumulation (C++ in tinylearn._C.quant).

Exactness: |sum_k a_ik b_kj| <= K * 128 * 128 = K * 2^14 fits int32 for K <= 2^17. See cpp_src/quant_int8_gemm.cpp
for the kernel versions (AVX-512 VNNI dpbusd with the +128 offset trick, AVX2 int16 madd, scalar) and why the
AVX2 u8 x s8 ``maddubs`` instruction is *not* used for signed x signed products (its int16 pair sums saturate).

Requantization (what an int8 layer does with the int32 accumulator), per output channel j:
    y_q = clamp(round(acc * (s_x * s_w[j] / s_y)) + zp_y, qmin, qmax)
with acc = sum_k (x_q - zp_x) w_q[k, j] (weights symmetric, zp_w = 0) = x_q @ w_q - zp_x * colsum(w_q).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _C() -> Any:
    try:
        from .._C import quant
    except ImportError as e:  # pragma: no cover - build missing
        raise RuntimeError(
            f"int8_gemm: the compiled extension tinylearn._C is unavailable ({e}); run tools/build.sh"
        ) from e
    return quant


def int8_gemm_paths() -> list[str]:
    """SIMD code paths this CPU can run, best first (e.g. ['avx512vnni', 'avx2', 'scalar'])."""
    return list(_C().int8_gemm_paths())


def int8_gemm(a_int8: Any, b_int8: Any, path: str = "auto") -> np.ndarray:
    """Exact int8 x int8 -> int32 matrix product of a [M, K] and b [K, N] (any strides)."""
    for name, arr in (("a_int8", a_int8), ("b_int8", b_int8)):
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"{name}: expected a numpy int8 array, got {type(arr).__name__}")
        if arr.dtype != np.int8:
            raise TypeError(f"{name}: expected dtype int8, got {arr.dtype}")
        if arr.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D array, got shape {arr.shape}")
    if a_int8.shape[1] != b_int8.shape[0]:
        raise ValueError(f"int8_gemm: inner dimensions differ: a_int8 {a_int8.shape} @ b_int8 {b_int8.shape}")
    return _C().int8_gemm(np.ascontiguousarray(a_int8), np.ascontiguousarray(b_int8), path)


def requantize(acc: np.ndarray, multiplier: Any, zero_point: int, quant_min: int, quant_max: int) -> np.ndarray:
    """int32 accumulator -> integer codes: clamp(round(acc * multiplier) + zero_point) (multiplier per column ok)."""
    m = np.asarray(multiplier, np.float64)
    r = np.rint(acc.astype(np.float64) * m) + zero_point
    return np.clip(r, quant_min, quant_max).astype(np.int8 if quant_min < 0 else np.uint8)


class PackedInt8Weight:
    """B [K, N] int8 packed once for repeated exact products A @ B (the AVX-512 VNNI panel layout, with the
    column sums the +128 offset trick needs); falls back to plain int8_gemm on CPUs without VNNI."""

    def __init__(self, b_int8: np.ndarray) -> None:
        if not isinstance(b_int8, np.ndarray) or b_int8.dtype != np.int8 or b_int8.ndim != 2:
            raise TypeError(f"b_int8: expected a 2-D int8 numpy array, got {getattr(b_int8, 'dtype', type(b_int8))}")
        self.k, self.n = b_int8.shape
        self.b = np.ascontiguousarray(b_int8)
        self.packed = None
        if "avx512vnni" in int8_gemm_paths() and self.n > 0:
            self.packed = _C().int8_pack_b(self.b)

    def matmul(self, a_int8: np.ndarray) -> np.ndarray:
        if not isinstance(a_int8, np.ndarray) or a_int8.dtype != np.int8 or a_int8.ndim != 2:
            raise TypeError(f"a_int8: expected a 2-D int8 numpy array, got {getattr(a_int8, 'dtype', type(a_int8))}")
        if a_int8.shape[1] != self.k:
            raise ValueError(f"a_int8: inner dimension {a_int8.shape[1]} != packed K {self.k}")
        if self.packed is None:
            return int8_gemm(a_int8, self.b)
        return _C().int8_gemm_prepacked(np.ascontiguousarray(a_int8), self.packed[0], self.packed[1], self.n)
