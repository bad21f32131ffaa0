"""int8 GEMM front end: C = A @ B with int8 operands and exact int32 accumulation (C++ in tinylearn._C.quant;
registered as ``quant.int8_gemm`` in tinylearn.backends, one version per SIMD path, plus an exact numpy reference).

Versions ladder (cpp_src/quant_int8_gemm.cpp), all exact:
    scalar        portable loops
    avx2          B re-packed per call as int16 pairs, vpmaddwd (int16 x int16 pairs -> int32)
    avx512vnni    B packed per call as bytes, vpdpbusd (u8 x s8 quads -> int32) with A offset by +128
    avx2_madd16   the byte-packed B (one layout for every packed path) sign-extended to int16 once per call and
                  K block (a buffer the threads share), vpmaddwd
    avx2_wino     the same B regrouped for Winograd's inner product (1968): per k quad and column,
                  (a0 + b1)(a1 + b0) + (a2 + b3)(a3 + b2) - (a0 a1 + a2 a3) - (b0 b1 + b2 b3) = a . b, so one vpmaddwd
                  lane covers 4 products (half the multiplies of madd16, two vpaddw more); the row and column terms
                  are computed once per row / per B block. ``winograd_reference`` is the same algebra in numpy.
``PackedInt8Weight`` packs B once (the byte layout + column sums) and runs the packed kernels: avx512vnni,
avx2_madd16, avx2_u7 (vpmaddubsw: only for uint8 codes <= 127, where its int16 pair sums cannot saturate),
avx2_wino and scalar; uint8 activations with a zero point go straight in (``matmul(a_u8, zero_point=z)``).
"auto" picks avx512vnni, else on AVX2 avx2_wino where the core's integer multiplier is the bottleneck (measured
once: ``avx2_choice()``; 7-bit codes with few rows keep avx2_u7), else avx2_u7 for 7-bit codes, else avx2_madd16;
else scalar.

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

VERSIONS = ("auto", "avx512vnni", "avx2_madd16", "avx2", "scalar")  # C++ code paths; "auto" = best this CPU runs
# PackedInt8Weight.matmul kernels
PACKED_VERSIONS = ("auto", "avx512vnni", "avx2_madd16", "avx2_u7", "avx2_wino", "scalar")


def _C() -> Any:
    return backends.load_C("quant")


def int8_gemm_paths() -> list[str]:
    """SIMD code paths this CPU can run, best first (e.g. ['avx512vnni', 'avx2', 'scalar'])."""
    return list(_C().int8_gemm_paths())


def packed_versions() -> list[str]:
    """Packed-B kernels this CPU runs, best first (e.g. ['avx512vnni', 'avx2_madd16', 'avx2_u7', 'scalar'])."""
    return list(_C().int8_packed_versions())


def avx2_choice() -> dict[str, Any]:
    """What "auto" runs on AVX2 without VNNI and why, measured once per process: {"kernel": "avx2_wino" or
    "avx2_madd16 / avx2_u7", "madd16_over_fma": MAC rate of a vpmaddwd + vpaddd stream / that of an fp32 FMA stream,
    "wino_min_rows_7bit": below this many rows 7-bit codes keep avx2_u7}. Winograd is chosen below 1.5 (the
    integer multiplier is the bottleneck, e.g. Zen 2: 1.0); it widens B per call, which few rows do not repay."""
    return dict(_C().int8_avx2_choice())


def winograd_reference(a: Any, b: Any) -> tuple[np.ndarray, int]:
    """a @ b for integer a [M, K], b [K, N] through Winograd's inner-product identity, in int64 numpy: K padded to
    even, then for each pair (a_2p, a_2p+1) x column (b_2p, b_2p+1):
        (a_2p + b_2p+1)(a_2p+1 + b_2p) = a_2p b_2p + a_2p+1 b_2p+1 + a_2p a_2p+1 + b_2p b_2p+1
    so C = sum_p (a_2p + b_2p+1)(a_2p+1 + b_2p) - rowterm(a) - colterm(b). Returns (C as int64, the number of
    multiplications: M N K/2 for the main sum + (M + N) K/2 for the terms, against M N K for the textbook product)."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"winograd_reference: a [M, K] and b [K, N] needed, got a {a.shape} and b {b.shape}")
    if a.shape[1] % 2:
        a = np.pad(a, ((0, 0), (0, 1)))
        b = np.pad(b, ((0, 1), (0, 0)))
    m, k = a.shape
    n = b.shape[1]
    row = (a[:, 0::2] * a[:, 1::2]).sum(1)  # M x K/2 multiplications
    col = (b[0::2] * b[1::2]).sum(0)  # N x K/2
    main = ((a[:, 0::2, None] + b[None, 1::2, :]) * (a[:, 1::2, None] + b[None, 0::2, :])).sum(1)  # M N K/2
    return main - row[:, None] - col[None, :], (m * n + m + n) * (k // 2)


def int8_gemm_versions() -> list[str]:
    """Every explicit ``int8_gemm`` version this CPU runs (the paths plus the packed-layout avx2_madd16)."""
    out = int8_gemm_paths()
    if "avx2" in out:
        out.insert(out.index("avx2"), "avx2_madd16")
    return out


def _register() -> None:
    for v in VERSIONS:

        def fn(a: np.ndarray, b: np.ndarray, v: str = v) -> np.ndarray:
            a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
            if v == "avx2_madd16":  # the packed-layout AVX2 kernel, B packed per call
                if b.shape[1] == 0 or a.shape[0] == 0:
                    return np.zeros((a.shape[0], b.shape[1]), np.int32)
                packed, colsum = _C().int8_pack(b)
                return _C().int8_gemm_packed(a, packed, colsum, b.shape[1], v)
            return _C().int8_gemm(a, b, v)

        def runs_here(v: str = v) -> bool:
            return backends.C_available("quant") and (v == "auto" or v in int8_gemm_versions())

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
    "avx2_madd16" | "avx2" | "scalar" (``int8_gemm_versions()`` lists those this CPU runs). ``path=`` is the old
    name of ``version=`` (deprecated alias)."""
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


def maddubs_reference(a_u8: np.ndarray, b_s8: np.ndarray) -> np.ndarray:
    """What AVX2 ``vpmaddubsw`` + ``vpmaddwd``(ones) + ``vpaddd`` compute for u8 A [M, K] x s8 B [K, N], in numpy:
    adjacent products a[2t] b[2t] + a[2t+1] b[2t+1] summed and **saturated to int16**, then summed exactly in int32.
    Equal to A @ B exactly when no pair leaves [-32768, 32767] (always so for codes <= 127)."""
    a = as_array(a_u8, "a_u8", dtypes=(np.uint8,), ndim=2).astype(np.int64)
    b = as_array(b_s8, "b_s8", dtypes=(np.int8,), ndim=2).astype(np.int64)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"maddubs_reference: inner dimensions differ: a_u8 {a.shape} @ b_s8 {b.shape}")
    if a.shape[1] % 2:
        a = np.pad(a, ((0, 0), (0, 1)))
        b = np.pad(b, ((0, 1), (0, 0)))
    pair = a[:, 0::2, None] * b[None, 0::2, :] + a[:, 1::2, None] * b[None, 1::2, :]  # [M, K/2, N]
    return np.clip(pair, -32768, 32767).sum(1).astype(np.int32)


def int8_gemm_maddubs_saturating(a_u8: Any, b_s8: Any) -> np.ndarray:
    """Teaching rung: u8 A x s8 B through the real ``vpmaddubsw`` kernel *without* the 7-bit check, i.e. with
    int16-saturated pair sums (equal to ``maddubs_reference``; wrong vs A @ B when pairs saturate). Needs AVX2."""
    a = as_array(a_u8, "a_u8", dtypes=(np.uint8,), ndim=2)
    b = as_array(b_s8, "b_s8", dtypes=(np.int8,), ndim=2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"int8_gemm_maddubs_saturating: inner dimensions differ: a_u8 {a.shape} @ b_s8 {b.shape}")
    return _C().int8_gemm_maddubs_saturating(np.ascontiguousarray(a), np.ascontiguousarray(b))


class PackedInt8Weight:
    """B [K, N] int8 packed once for repeated exact products A @ B: bytes in 64-column panels of 4-deep K quads
    (the vpdpbusd layout, which the AVX2 and scalar kernels read too) plus the column sums the zero-point/offset
    correction needs. ``packed`` is (bytes, colsum); without the C++ extension matmul falls back to numpy."""

    def __init__(self, b_int8: np.ndarray) -> None:
        b_int8 = _check_int8(b_int8, "b_int8")
        self.k, self.n = b_int8.shape
        self.b = np.ascontiguousarray(b_int8)
        self.packed = None
        if backends.C_available("quant") and self.n > 0:
            self.packed = _C().int8_pack(self.b)

    @property
    def nbytes(self) -> int:
        return 0 if self.packed is None else int(self.packed[0].nbytes + self.packed[1].nbytes)

    def matmul(self, a: Any, zero_point: int = 0, version: str | None = None) -> np.ndarray:
        """(a - zero_point) @ B, exact int32. ``a``: int8 [M, K], or uint8 [M, K] codes with ``zero_point``.
        version: None/"auto" | "avx512vnni" | "avx2_madd16" | "avx2_u7" (uint8 codes <= 127 only) | "avx2_wino" |
        "scalar"."""
        a = as_array(a, "a_int8", dtypes=(np.int8, np.uint8), ndim=2)
        if a.shape[1] != self.k:
            raise ValueError(f"a_int8: inner dimension {a.shape[1]} != packed K {self.k}")
        if isinstance(zero_point, bool) or not isinstance(zero_point, int | np.integer):
            raise TypeError(f"zero_point: expected an int, got {type(zero_point).__name__}")
        if a.dtype == np.int8 and zero_point != 0:
            raise ValueError(f"zero_point: {zero_point} given for int8 a_int8 (only uint8 codes take a zero point)")
        v = "auto" if version is None else version
        if v not in PACKED_VERSIONS:
            raise ValueError(f"version: {version!r} is not one of {PACKED_VERSIONS}")
        if self.packed is None:
            return ((a.astype(np.int64) - zero_point) @ self.b.astype(np.int64)).astype(np.int32)
        a = np.ascontiguousarray(a)
        return _C().int8_gemm_packed(a, self.packed[0], self.packed[1], self.n, v, int(zero_point))
