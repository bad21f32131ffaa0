"""int8 GEMM front end: C = A @ B with int8 operands and exact int32 accumulation (C++ in tinylearn._C.quant).

Two ops in tinylearn.backends, each with an exact numpy reference beside its C++ ladder (one version per kernel):
``quant.int8_gemm`` (``int8_gemm``: A and B per call) and ``quant.int8_packed_gemm`` (``PackedInt8Weight.matmul``:
B packed once); ``backends.use(op, backend=..., version=...)`` pins either. ``int8_gemm_paths``,
``int8_gemm_versions`` and ``packed_versions`` are aliases of ``backends.versions(op, "cpp")`` narrowed to what this
CPU runs, best first.

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
    avx2_strassen one level of Strassen's algorithm (1969) on the avx2_wino kernel: A and B split into 2 x 2 blocks,
                  seven block products instead of eight (7/8 of the multiply-accumulates), exact because every step
                  is integer arithmetic mod 2^32 (``strassen_reference`` is the algebra in numpy). Its seven B
                  operands are widened once and cached by ``PackedInt8Weight`` (1.75x the int16 size of B).
``PackedInt8Weight`` packs B once (the byte layout + column sums) and runs the packed kernels: avx512vnni,
avx2_madd16, avx2_u7 (vpmaddubsw: only for uint8 codes <= 127, where its int16 pair sums cannot saturate),
avx2_wino and scalar; uint8 activations with a zero point go straight in (``matmul(a_u8, zero_point=z)``).
"auto" picks avx512vnni, else on AVX2 avx2_wino where the core's integer multiplier is the bottleneck (measured
once: ``avx2_choice()``; 7-bit codes with few rows keep avx2_u7), else avx2_u7 for 7-bit codes, else avx2_madd16;
else scalar. For PackedInt8Weight.matmul, "auto" runs avx2_strassen where avx2_wino is the choice and the shape
is in the range where it measured faster (``strassen_auto``).

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
from .._inputs import as_array, as_int, is_int
from . import cuda

GEMM_OP = "quant.int8_gemm"  # int8_gemm: A and B per call
PACKED_OP = "quant.int8_packed_gemm"  # PackedInt8Weight.matmul: B packed once
VERSIONS = ("auto", "avx512vnni", "avx2_madd16", "avx2", "scalar")  # C++ code paths; "auto" = best this CPU runs
# PackedInt8Weight.matmul kernels
PACKED_KERNELS = ("auto", "avx512vnni", "avx2_madd16", "avx2_u7", "avx2_wino", "scalar")  # the C++ packed kernels
PACKED_VERSIONS = (*PACKED_KERNELS[:5], "avx2_strassen", "scalar")  # + avx2_strassen (its own prepared B)
# "auto" runs avx2_strassen for M >= 64, K, N >= 512 and K * N <= 2^21: measured on Zen 2 (2 threads) it took 0.88-0.93x
# avx2_wino's time at K = N = 512 and 1024 (M 64-1024), 0.95-1.0x at K * N = 4M (its seven widened B operands,
# 3.5x the int8 B, outgrow the caches) and up to 1.06x at K = N = 256
STRASSEN_AUTO_MIN_M, STRASSEN_AUTO_MIN_KN, STRASSEN_AUTO_MAX_KXN = 64, 512, 1 << 21


def _on_this_cpu(op: str, best_first: Any) -> list[str]:
    """The registered cpp versions of ``op`` (``backends.versions(op, "cpp")``) that this CPU runs, in the order
    the C++ side ranks them (``best_first``, best first)."""
    rungs = backends.versions(op, "cpp")
    return [v for v in best_first if v in rungs]


def int8_gemm_paths() -> list[str]:
    """Alias of ``backends.versions("quant.int8_gemm", "cpp")`` narrowed to the SIMD code paths this CPU runs,
    best first (e.g. ['avx512vnni', 'avx2', 'scalar'])."""
    return _on_this_cpu(GEMM_OP, backends.load_C("quant").int8_gemm_paths())


def packed_versions() -> list[str]:
    """Alias of ``backends.versions("quant.int8_packed_gemm", "cpp")`` narrowed to the packed-B kernels this CPU
    runs, best first (e.g. ['avx512vnni', 'avx2_madd16', 'avx2_u7', 'scalar'])."""
    return _on_this_cpu(PACKED_OP, backends.load_C("quant").int8_packed_versions())


def avx2_choice() -> dict[str, Any]:
    """What "auto" runs on AVX2 without VNNI and why, measured once per process: {"kernel": "avx2_wino" or
    "avx2_madd16 / avx2_u7", "madd16_over_fma": MAC rate of a vpmaddwd + vpaddd stream / that of an fp32 FMA stream,
    "wino_min_rows_7bit": below this many rows 7-bit codes keep avx2_u7}. Winograd is chosen below 1.5 (the
    integer multiplier is the bottleneck, e.g. Zen 2: 1.0); it widens B per call, which few rows do not repay."""
    return dict(backends.load_C("quant").int8_avx2_choice())


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


def strassen_shape_error(m: int, k: int, n: int) -> str:
    """Why avx2_strassen cannot take A [m, k] @ B [k, n] ("" when it can): the blocks must be whole k quads and whole
    64-column panels, so M even, K a multiple of 8, N a multiple of 128."""
    why = []
    if m < 2 or m % 2:
        why.append(f"M={m} is not even and >= 2")
    if k < 8 or k % 8:
        why.append(f"K={k} is not a multiple of 8")
    if n < 128 or n % 128:
        why.append(f"N={n} is not a multiple of 128")
    return "; ".join(why)


def strassen_auto(m: int, k: int, n: int) -> bool:
    """Whether PackedInt8Weight.matmul's "auto" runs avx2_strassen for this shape on this CPU: avx2_wino is the
    AVX2 choice (no VNNI; the integer multiplier is the bottleneck), the shape fits, and it is in the measured range
    (STRASSEN_AUTO_*)."""
    if not backends.C_available("quant") or strassen_shape_error(m, k, n):
        return False
    if packed_versions()[:1] != ["avx2_wino"]:
        return False
    return m >= STRASSEN_AUTO_MIN_M and min(k, n) >= STRASSEN_AUTO_MIN_KN and k * n <= STRASSEN_AUTO_MAX_KXN


def strassen_signs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(SA, SB, SC), each int [7, 4]: product i multiplies sum_q SA[i, q] A_q by sum_q SB[i, q] B_q and adds
    SC[i, q] times the product to C_q, quadrants q = 11, 12, 21, 22 (the C++ kernel's tables equal these:
    ``_C.quant.int8_strassen_signs()``, tested)."""
    return tuple(np.array(t, np.int64) for t in (_STRASSEN_SA, _STRASSEN_SB, _STRASSEN_SC))  # type: ignore[return-value]


# Strassen (1969): M1 = (A11 + A22)(B11 + B22), M2 = (A21 + A22) B11, M3 = A11 (B12 - B22), M4 = A22 (B21 - B11),
# M5 = (A11 + A12) B22, M6 = (A21 - A11)(B11 + B12), M7 = (A12 - A22)(B21 + B22);
# C11 = M1 + M4 - M5 + M7, C12 = M3 + M5, C21 = M2 + M4, C22 = M1 - M2 + M3 + M6
_STRASSEN_SA = ((1, 0, 0, 1), (0, 0, 1, 1), (1, 0, 0, 0), (0, 0, 0, 1), (1, 1, 0, 0), (-1, 0, 1, 0), (0, 1, 0, -1))
_STRASSEN_SB = ((1, 0, 0, 1), (1, 0, 0, 0), (0, 1, 0, -1), (-1, 0, 1, 0), (0, 0, 0, 1), (1, 1, 0, 0), (0, 0, 1, 1))
_STRASSEN_SC = ((1, 0, 0, 1), (0, 0, 1, -1), (0, 1, 0, 1), (1, 0, 1, 0), (-1, 1, 0, 0), (0, 0, 0, 1), (1, 0, 0, 0))


def strassen_reference(a: Any, b: Any, levels: int = 1) -> tuple[np.ndarray, int]:
    """a @ b by ``levels`` levels of Strassen's algorithm in numpy, in a's dtype (int64 for exact integers, float32
    to see the rounding the operand sums add), ordinary matmul below. Returns (C, the number of scalar
    multiplications: 7^levels block products of (M/2^l)(K/2^l)(N/2^l), against M K N). Needs every dimension
    divisible by 2^levels."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"strassen_reference: a [M, K] and b [K, N] needed, got a {a.shape} and b {b.shape}")
    if not is_int(levels) or levels < 0:
        raise ValueError(f"levels: expected an int >= 0, got {levels!r}")
    levels = int(levels)
    m, k = a.shape
    n = b.shape[1]
    if levels == 0:
        return a @ b, m * k * n
    if m % 2 or k % 2 or n % 2:
        raise ValueError(f"strassen_reference: shape (M, K, N) = ({m}, {k}, {n}) is not divisible by 2 at this level")
    aq = [a[: m // 2, : k // 2], a[: m // 2, k // 2 :], a[m // 2 :, : k // 2], a[m // 2 :, k // 2 :]]
    bq = [b[: k // 2, : n // 2], b[: k // 2, n // 2 :], b[k // 2 :, : n // 2], b[k // 2 :, n // 2 :]]
    cq = [np.zeros((m // 2, n // 2), np.result_type(a, b)) for _ in range(4)]
    mults = 0
    for sa, sb, sc in zip(_STRASSEN_SA, _STRASSEN_SB, _STRASSEN_SC, strict=True):
        ai = sum(s * x for s, x in zip(sa, aq, strict=True) if s)
        bi = sum(s * x for s, x in zip(sb, bq, strict=True) if s)
        p, cnt = strassen_reference(ai, bi, levels - 1)
        mults += cnt
        for q, s in enumerate(sc):
            if s:
                cq[q] = cq[q] + s * p
    return np.block([[cq[0], cq[1]], [cq[2], cq[3]]]), mults


def cache_oblivious_matmul(a: Any, b: Any, leaf: int = 32) -> tuple[np.ndarray, list[int]]:
    """a @ b by recursive halving, the cache-oblivious GEMM (Frigo, Leiserson, Prokop, Ramachandran 1999).

    Split the largest of M, K, N in two (K: C = A1 B1 + A2 B2; M or N: two independent halves) until all three are
    <= ``leaf``; the leaves are ordinary numpy matmuls in a's dtype (int64: exact). No cache size appears anywhere:
    some depth of the recursion has blocks that fit each cache level, whatever its size. Returns (C, ws) with
    ``ws[d]`` the largest working set in elements (M K + K N + M N of one block) at recursion depth d; each depth
    shrinks it by at most 2x, so every cache between the leaf's working set and the whole problem's is met within a
    factor of 2.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"cache_oblivious_matmul: a [M, K] and b [K, N] needed, got a {a.shape} and b {b.shape}")
    if not is_int(leaf) or leaf < 1:
        raise ValueError(f"leaf: expected an int >= 1, got {leaf!r}")
    leaf = int(leaf)
    c = np.zeros((a.shape[0], b.shape[1]), np.result_type(a, b))
    ws: list[int] = []

    def rec(i0: int, i1: int, k0: int, k1: int, j0: int, j1: int, depth: int) -> None:
        m, k, n = i1 - i0, k1 - k0, j1 - j0
        if depth == len(ws):
            ws.append(0)
        ws[depth] = max(ws[depth], m * k + k * n + m * n)
        if max(m, k, n) <= leaf or min(m, k, n) == 0:
            c[i0:i1, j0:j1] += a[i0:i1, k0:k1] @ b[k0:k1, j0:j1]
        elif m >= k and m >= n:
            rec(i0, i0 + m // 2, k0, k1, j0, j1, depth + 1)
            rec(i0 + m // 2, i1, k0, k1, j0, j1, depth + 1)
        elif n >= k:
            rec(i0, i1, k0, k1, j0, j0 + n // 2, depth + 1)
            rec(i0, i1, k0, k1, j0 + n // 2, j1, depth + 1)
        else:
            rec(i0, i1, k0, k0 + k // 2, j0, j1, depth + 1)
            rec(i0, i1, k0 + k // 2, k1, j0, j1, depth + 1)

    rec(0, a.shape[0], 0, a.shape[1], 0, b.shape[1], 0)
    return c, ws


def int8_gemm_versions() -> list[str]:
    """Alias of ``backends.versions("quant.int8_gemm", "cpp")`` narrowed to the explicit versions this CPU runs,
    best first (the paths plus the packed-layout avx2_madd16 before avx2)."""
    paths = list(backends.load_C("quant").int8_gemm_paths())
    if "avx2" in paths:
        paths.insert(paths.index("avx2"), "avx2_madd16")
    return _on_this_cpu(GEMM_OP, paths)


def packed_runs_here(version: str) -> bool:
    """Whether the packed kernel ``version`` runs on this CPU (at its TINYLEARN_CPU_FEATURES level): "auto" always,
    avx2_strassen where avx2_wino does, the others when ``packed_versions()`` lists them."""
    if not backends.C_available("quant"):
        return False
    if version == "auto":
        return True
    return ("avx2_wino" if version == "avx2_strassen" else version) in packed_versions()


def _gemm_example(rng: Any) -> tuple[tuple, dict]:
    return (rng.integers(-128, 128, (5, 70), dtype=np.int8), rng.integers(-128, 128, (70, 6), dtype=np.int8)), {}


def _packed_example(rng: Any) -> tuple[tuple, dict]:
    """7-bit uint8 codes with a zero point (every kernel takes them), a shape avx2_strassen takes."""
    w = PackedInt8Weight(rng.integers(-128, 128, (16, 128), dtype=np.int8))
    return (w, rng.integers(0, 128, (4, 16), dtype=np.uint8), 3), {}


def _register() -> None:
    """quant.int8_gemm (A and B per call) and quant.int8_packed_gemm (B packed once): every C++ rung a cpp version,
    the exact numpy products the reference."""
    for v in VERSIONS:

        def fn(a: np.ndarray, b: np.ndarray, v: str = v) -> np.ndarray:
            a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
            C = backends.load_C("quant")
            if v == "avx2_madd16":  # the packed-layout AVX2 kernel, B packed per call
                if b.shape[1] == 0 or a.shape[0] == 0:
                    return np.zeros((a.shape[0], b.shape[1]), np.int32)
                packed, colsum = C.int8_pack(b)
                return C.int8_gemm_packed(a, packed, colsum, b.shape[1], v)
            return C.int8_gemm(a, b, v)

        def runs_here(v: str = v) -> bool:
            return backends.C_available("quant") and (v == "auto" or v in int8_gemm_versions())

        backends.register(GEMM_OP, "cpp", fn, version=v, available=runs_here)

    @backends.register(GEMM_OP, "numpy", version="int32_matmul", example=_gemm_example)
    def _int8_gemm_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Exact reference: numpy's integer matmul in int32 (no BLAS; exact while K <= 2^17)."""
        return a.astype(np.int32) @ b.astype(np.int32)

    cuda.register(GEMM_OP)  # cuda_src/quant_int8_gemm_dp4a.cu: versions dp4a_naive, dp4a_tiled (GPU only)

    # the packed kernels take (weight: PackedInt8Weight, a, zero_point)
    for v in dict.fromkeys(PACKED_VERSIONS):

        def packed_fn(w: PackedInt8Weight, a: np.ndarray, zero_point: int, v: str = v) -> np.ndarray:
            if w.packed is None:  # N == 0: nothing was packed
                return np.zeros((a.shape[0], w.n), np.int32)
            a = np.ascontiguousarray(a)
            C = backends.load_C("quant")
            if v == "avx2_strassen":
                wide, terms = w.strassen_operands()
                return C.int8_gemm_strassen(a, wide, terms, w.k, w.n, zero_point)
            return C.int8_gemm_packed(a, w.packed[0], w.packed[1], w.n, v, zero_point)

        backends.register(PACKED_OP, "cpp", packed_fn, version=v, available=lambda v=v: packed_runs_here(v))

    @backends.register(PACKED_OP, "numpy", version="int64_matmul", example=_packed_example)
    def _packed_numpy(w: PackedInt8Weight, a: np.ndarray, zero_point: int) -> np.ndarray:
        """Exact reference: (a - zero_point) @ B in int64 numpy."""
        return ((a.astype(np.int64) - zero_point) @ w.b.astype(np.int64)).astype(np.int32)


def _check_int8(arr: Any, name: str) -> np.ndarray:
    return as_array(arr, name, dtypes=(np.int8,), ndim=2)


def int8_gemm(
    a_int8: Any, b_int8: Any, *, version: str | None = None, backend: str | None = None, path: str | None = None
) -> np.ndarray:
    """Exact int8 x int8 -> int32 matrix product of a [M, K] and b [K, N] (any strides).

    backend: None (C++ when built, else numpy) | "cpp" | "numpy" | "cuda" (dp4a: "dp4a_tiled" | "dp4a_naive"; GPU
    only, quant/cuda.py). version (cpp): "auto" (default) | "avx512vnni" |
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
    return backends.dispatch(GEMM_OP, a, b, backend=backend, version=version)


def requantize(acc: np.ndarray, multiplier: Any, zero_point: int, quant_min: int, quant_max: int) -> np.ndarray:
    """int32 accumulator -> integer codes: clamp(round(acc * multiplier) + zero_point) (multiplier per column ok).

    Output dtype int8 when quant_min < 0 else uint8; [quant_min, quant_max] must fit it, zero_point must lie in it,
    multiplier must be finite and > 0 (ValueError naming the argument otherwise).
    """
    zero_point, quant_min, quant_max = (
        as_int(zero_point, "zero_point"),
        as_int(quant_min, "quant_min"),
        as_int(quant_max, "quant_max"),
    )
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
    return backends.load_C("quant").int8_gemm_maddubs_saturating(np.ascontiguousarray(a), np.ascontiguousarray(b))


class PackedInt8Weight:
    """B [K, N] int8 packed once for repeated exact products A @ B: bytes in 64-column panels of 4-deep K quads
    (the vpdpbusd layout, which the AVX2 and scalar kernels read too) plus the column sums the zero-point/offset
    correction needs. ``packed`` is (bytes, colsum); without the C++ extension matmul falls back to numpy."""

    def __init__(self, b_int8: np.ndarray) -> None:
        b_int8 = _check_int8(b_int8, "b_int8")
        self.k, self.n = b_int8.shape
        self.b = np.ascontiguousarray(b_int8)
        self.packed = None
        self._strassen: tuple[np.ndarray, np.ndarray] | None = None  # avx2_strassen's B operands, made on first use
        self.last_version: str | None = None  # what the last matmul ran: "avx2_strassen", or the version passed on
        if backends.C_available("quant") and self.n > 0:
            self.packed = backends.load_C("quant").int8_pack(self.b)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed B, plus avx2_strassen's widened operands once a matmul made them."""
        if self.packed is None:
            return 0
        extra = 0 if self._strassen is None else self._strassen[0].nbytes + self._strassen[1].nbytes
        return int(self.packed[0].nbytes + self.packed[1].nbytes + extra)

    def strassen_operands(self) -> tuple[np.ndarray, np.ndarray]:
        """avx2_strassen's prepared B (made once, then cached): the seven B block combinations widened to int16 in
        the Winograd kernel's layout, and their int32 column terms."""
        if self._strassen is None:
            why = strassen_shape_error(2, self.k, self.n)
            if why:
                raise ValueError(f"version: avx2_strassen cannot take this B of shape ({self.k}, {self.n}): {why}")
            self._strassen = backends.load_C("quant").int8_strassen_pack(self.b)
        return self._strassen

    def matmul(
        self, a: Any, zero_point: int = 0, *, version: str | None = None, backend: str | None = None
    ) -> np.ndarray:
        """(a - zero_point) @ B, exact int32. ``a``: int8 [M, K], or uint8 [M, K] codes with ``zero_point``.
        version (cpp, op ``quant.int8_packed_gemm``): None/"auto" | "avx512vnni" | "avx2_madd16" | "avx2_u7" (uint8
        codes <= 127 only) | "avx2_wino" | "avx2_strassen" (M even, K % 8 == 0, N % 128 == 0) | "scalar".
        backend: None (cpp when the C++ extension packed B, else the numpy reference) | "cpp" | "numpy".
        ``last_version`` says what ran."""
        a = as_array(a, "a_int8", dtypes=(np.int8, np.uint8), ndim=2)
        if a.shape[1] != self.k:
            raise ValueError(f"a_int8: inner dimension {a.shape[1]} != packed K {self.k}")
        zero_point = as_int(zero_point, "zero_point")
        if a.dtype == np.int8 and zero_point != 0:
            raise ValueError(f"zero_point: {zero_point} given for int8 a_int8 (only uint8 codes take a zero point)")
        if not 0 <= zero_point <= 255:
            raise ValueError(f"zero_point: {zero_point} is outside [0, 255], the range of uint8 codes")
        v = "auto" if version is None else version
        if v not in PACKED_VERSIONS:
            raise ValueError(f"version: {version!r} is not one of {PACKED_VERSIONS}")
        pin = backends.pinned(PACKED_OP) if backend is None else None
        if pin is not None:  # backends.use(...) pins this op: decide with the pinned names
            backend, version = pin[0], version if version is not None else pin[1]
            v = "auto" if version is None else version
        on_numpy = backend is not None and backends.canonical(backend) == "numpy"
        if backend is None and self.packed is None:  # no C++ extension (or N == 0): the numpy reference
            backend, on_numpy = "numpy", True
        m = a.shape[0]
        if not on_numpy and self.packed is not None and v not in ("auto", "avx2_strassen") and not packed_runs_here(v):
            raise ValueError(f"version: {v!r} is above this CPU's level (it runs {packed_versions()})")
        if v == "avx2_strassen" and (not on_numpy or self.packed is None):
            if self.packed is None or "avx2_wino" not in packed_versions():
                raise ValueError(
                    "version: avx2_strassen needs the C++ extension and AVX2, which this CPU (or level) lacks"
                )
            why = strassen_shape_error(m, self.k, self.n)
            if why:
                raise ValueError(f"version: avx2_strassen cannot take a_int8 {a.shape} @ B ({self.k}, {self.n}): {why}")
        if not on_numpy and v == "auto" and strassen_auto(m, self.k, self.n):
            v = version = "avx2_strassen"
        self.last_version = v
        return backends.dispatch(
            PACKED_OP, self, a, int(zero_point), backend=backend, version=None if on_numpy else version
        )


_register()
