"""int8 GEMM front end: C = A @ B with int8 operands and exact int32 accumulation (C++ in tinylearn._C.quant;
registered as ``quant.int8_gemm`` in tinylearn.backends, one version per SIMD path, plus an exact numpy reference).

Exactness: |sum_k a_ik b_kj| <= K * 128 * 128 = K * 2^14 fits int32 for K <= 2^17. See cpp_src/quant_int8_gemm.cpp
for the kernel versions (AVX-512 VNNI dpbusd with the +128 offset trick, AVX2 int16 madd, scalar) and why the
AVX2 u8 x s8 ``maddubs`` instruction is *not* used for signed x signed products (its int16 pair sums saturate).

Requantization (what an int8 layer does with the int32 accumulator), per output channel j:
    y_q = clamp(round(acc * (s_x * s_w[j] / s_y)) + zp_y, qmin, qmax)
with acc = sum_k (x_q - zp_x) w_q[k, j] (weights symmetric, zp_w = 0) = x_q @ w_q - zp_x * colsum(w_q).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .. import backends
from .._inputs import as_array

VERSIONS = ("auto", "avx512vnni", "avx2", "scalar")  # C++ code paths; "auto" = the best this CPU runs


def _C() -> Any:
    return backends.load_C("quant")


def int8_gemm_paths() -> list[str]:
    """SIMD code paths this CPU can run, best first (e.g. ['avx512vnni', 'avx2', 'scalar'])."""
    return list(_C().int8_gemm_paths())


def _register() -> None:
    for v in VERSIONS:

        def fn(a: np.ndarray, b: np.ndarray, v: str = v) -> np.ndarray:
            return _C().int8_gemm(np.ascontiguousarray(a), np.ascontiguousarray(b), v)

        def runs_here(v: str = v) -> bool:
            return backends.C_available("quant") and (v == "auto" or v in int8_gemm_paths())

        backends.register("quant.int8_gemm", "cpp", fn, version=v, available=runs_here)

    @backends.register("quant.int8_gemm", "numpy", version="int32_matmul")
    def _int8_gemm_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Exact reference: numpy's integer matmul in int32 (no BLAS; exact while K <= 2^17)."""
        return a.astype(np.int32) @ b.astype(np.int32)


_register()


def _check_int8(arr: Any, name: str) -> np.ndarray:
    return as_array(arr, name, dtypes=(np.int8,), ndim=2)


def int8_gemm(
    a_int8: Any, b_int8: Any, version: str | None = None, backend: str | None = None, path: str | None = None
) -> np.ndarray:
    """Exact int8 x int8 -> int32 matrix product of a [M, K] and b [K, N] (any strides).

    backend: None (C++ when built, else numpy) | "cpp" | "numpy". version (cpp): "auto" (default) | "avx512vnni" |
    "avx2" | "scalar" (``int8_gemm_paths()`` lists those this CPU runs). ``path=`` is the old name of ``version=``
    (deprecated alias)."""
    if path is not None:
        warnings.warn("int8_gemm(path=) is deprecated; use version=", DeprecationWarning, stacklevel=2)
        if version is not None and version != path:
            raise ValueError(f"version: {version!r} conflicts with the deprecated path={path!r}; pass only version=")
        version = path
    a, b = _check_int8(a_int8, "a_int8"), _check_int8(b_int8, "b_int8")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"int8_gemm: inner dimensions differ: a_int8 {a.shape} @ b_int8 {b.shape}")
    return backends.dispatch("quant.int8_gemm", a, b, backend=backend, version=version)


def requantize(acc: np.ndarray, multiplier: Any, zero_point: int, quant_min: int, quant_max: int) -> np.ndarray:
    """int32 accumulator -> integer codes: clamp(round(acc * multiplier) + zero_point) (multiplier per column ok).

    Output dtype int8 when quant_min < 0 else uint8; [quant_min, quant_max] must fit it, zero_point must lie in it,
    multiplier must be finite and > 0 (ValueError naming the argument otherwise).
    """
    for name, v in (("zero_point", zero_point), ("quant_min", quant_min), ("quant_max", quant_max)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__} {v!r}")
    if quant_min > quant_max:
        raise ValueError(f"quant_min: {quant_min} > quant_max {quant_max}")
    lo, hi = (-128, 127) if quant_min < 0 else (0, 255)
    if quant_min < lo or quant_max > hi:
        raise ValueError(
            f"quant_min/quant_max: range [{quant_min}, {quant_max}] does not fit the output dtype [{lo}, {hi}]"
        )
    if not quant_min <= zero_point <= quant_max:
        raise ValueError(f"zero_point: {zero_point} outside [quant_min, quant_max] = [{quant_min}, {quant_max}]")
    m = np.asarray(multiplier, np.float64)
    if m.size == 0 or not np.all(np.isfinite(m)) or not np.all(m > 0):
        raise ValueError(f"multiplier: must be finite and > 0, got {multiplier!r}")
    r = np.rint(acc.astype(np.float64) * m) + zero_point
    return np.clip(r, quant_min, quant_max).astype(np.int8 if quant_min < 0 else np.uint8)


class PackedInt8Weight:
    """B [K, N] int8 packed once for repeated exact products A @ B (the AVX-512 VNNI panel layout, with the
    column sums the +128 offset trick needs); falls back to plain int8_gemm on CPUs without VNNI."""

    def __init__(self, b_int8: np.ndarray) -> None:
        b_int8 = _check_int8(b_int8, "b_int8")
        self.k, self.n = b_int8.shape
        self.b = np.ascontiguousarray(b_int8)
        self.packed = None
        if "avx512vnni" in int8_gemm_paths() and self.n > 0:
            self.packed = _C().int8_pack_b(self.b)

    def matmul(self, a_int8: np.ndarray) -> np.ndarray:
        a_int8 = _check_int8(a_int8, "a_int8")
        if a_int8.shape[1] != self.k:
            raise ValueError(f"a_int8: inner dimension {a_int8.shape[1]} != packed K {self.k}")
        if self.packed is None:
            return int8_gemm(a_int8, self.b)
        return _C().int8_gemm_prepacked(np.ascontiguousarray(a_int8), self.packed[0], self.packed[1], self.n)
