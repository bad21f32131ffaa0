"""bfloat16 kernels behind ``tl.autocast(dtype="bfloat16")``: the GEMM and the casts, registered ops (``backends``).

    amp.bf16_matmul   C = a @ b for 2-D bfloat16 a, b -> bfloat16 (one rounding of the fp32 result)
                      numpy  reference: widen both to float32 (exact), sgemm, round to nearest even
                      cpp    simd / parallel* (cpp_src/gemm.cpp ``bf16_matmul``): the packed SIMD GEMM. On a CPU
                             with AVX512_BF16 (Zen 4, Sapphire Rapids) it packs bf16 pairs and runs ``vdpbf16ps``
                             (two k per instruction, half the packed bytes); otherwise the packing widens bf16 to
                             fp32 and the fp32 micro-kernel accumulates products of the bf16 values (AVX-512 / AVX2
                             FMA, scalar; TINYLEARN_CPU_FEATURES forces a path, ``_C.gemm.bf16_dot_path()`` says
                             which runs). (* default). On the scalar level (no AVX2) the portable packed kernel runs
                             (baseline SSE2 vectorisation by the compiler): the same memory as the SIMD path, unlike
                             numpy's fp32 copies
    amp.to_bf16       float32 -> bfloat16, round to nearest even (torch's rule; NaN -> quiet NaN)
                      numpy  ml_dtypes' astype        cpp  cpp_src/amp_bf16.cpp (AVX2, scalar), C-contiguous input
    amp.round_bf16    float32 -> float32 rounded to bfloat16 (to_bf16 then from_bf16: autocast's rounding of an
                      emulated op's fp32 inputs and gradients, AutocastRound)
                      numpy  the two astypes                cpp  cpp_src/amp_bf16.cpp, one pass, C-contiguous input
    amp.bf16_sum_rows the bf16 column sums of a 2-D bfloat16 array, accumulated in fp32 over the rows in order and
                      rounded once (a bf16 Linear's bias gradient)
                      numpy  np.add.reduce(dtype=float32)   cpp  cpp_src/amp_bf16.cpp (24 -> ~4 us at 256 x 512)
    amp.from_bf16     bfloat16 -> float32 (exact: 16 zero bits appended)
                      numpy  ml_dtypes' astype        cpp  cpp_src/amp_bf16.cpp, C-contiguous input ([128, 16, 8, 8]:
                                                           6 us vs astype's 27 us; autocast's casts up and its
                                                           rounding of emulated ops' inputs run it)

Numerics: every implementation computes the same thing, fp32 accumulation of the products of bf16-rounded inputs
followed by one rounding to bf16 (exact products: 8-bit x 8-bit significands fit in fp32's 24); they differ only in
the order of the fp32 sums, except that ``vdpbf16ps`` treats subnormal bf16 inputs (|x| < 2^-126) as zero and
flushes subnormal fp32 results, as torch's oneDNN bf16 GEMM on the same CPUs does.
Autocast routes ``Linear`` / ``MatMul`` with two 2-D bf16 operands here (``autograd/linalg.py``), and ReLU on bf16
arrays to ``_C.amp.relu`` (``autograd/relu.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends
from .dtypes import bfloat16

BF16_MATMUL = "amp.bf16_matmul"
TO_BF16 = "amp.to_bf16"
FROM_BF16 = "amp.from_bf16"
ROUND_BF16 = "amp.round_bf16"
SUM_ROWS = "amp.bf16_sum_rows"


def _check_matmul(a: Any, b: Any) -> None:
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name}: must be a numpy.ndarray, got {type(x).__name__}")
        if x.dtype != bfloat16:
            raise TypeError(f"{name}: dtype must be bfloat16, got {x.dtype}")
        if x.ndim != 2:
            raise ValueError(f"{name}: must be 2-D, got shape {x.shape}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"b: inner dimensions differ: a is {a.shape}, b is {b.shape} (need a.shape[1] == b.shape[0])")


def bf16_matmul(
    a: np.ndarray,
    b: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    backend: str | None = None,
    version: str | None = None,
) -> np.ndarray:
    """a @ b (+ bias) for 2-D bfloat16 arrays (any strides): products accumulated in fp32, the bias [N] added to the
    fp32 sums, the result rounded once to bf16 (torch's addmm epilogue).

    backend: None (cpp when built, else numpy) | "numpy" | "cpp"; version: cpp "simd" (one thread) | "parallel"."""
    _check_matmul(a, b)
    if bias is not None:
        if not isinstance(bias, np.ndarray) or bias.dtype != bfloat16:
            got = bias.dtype if isinstance(bias, np.ndarray) else type(bias).__name__
            raise TypeError(f"bias: expected a bfloat16 numpy.ndarray or None, got {got}")
        if bias.shape != (b.shape[1],):
            raise ValueError(f"bias: expected shape ({b.shape[1]},) for b of shape {b.shape}, got {bias.shape}")
    return backends.dispatch(BF16_MATMUL, a, b, bias, backend=backend, version=version)


def _need(x: Any, dtype: Any) -> np.ndarray:
    """``x`` when it is a numpy array of ``dtype``; TypeError naming ``x`` and what it got otherwise."""
    if not isinstance(x, np.ndarray) or x.dtype != dtype:
        got = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        raise TypeError(f"x: expected a {np.dtype(dtype).name} numpy.ndarray, got {got}")
    return x


def to_bf16(x: Any, *, backend: str | None = None) -> np.ndarray:
    """float32 array -> bfloat16 array, round to nearest even (``x.astype(bfloat16)``'s values, faster)."""
    return backends.dispatch(TO_BF16, _need(x, np.float32), backend=backend)


def from_bf16(x: Any, *, backend: str | None = None) -> np.ndarray:
    """bfloat16 array -> float32 array (exact; ``x.astype(numpy.float32)``, faster)."""
    return backends.dispatch(FROM_BF16, _need(x, bfloat16), backend=backend)


def round_bf16(x: Any, *, backend: str | None = None) -> np.ndarray:
    """float32 array -> float32 array of its values rounded to the nearest bfloat16 (ties to even)."""
    return backends.dispatch(ROUND_BF16, _need(x, np.float32), backend=backend)


def bf16_sum_rows(x: Any, *, backend: str | None = None) -> np.ndarray:
    """Column sums of a 2-D bfloat16 array: fp32 accumulation over the rows, one rounding to bfloat16 ([N])."""
    if _need(x, bfloat16).ndim != 2:
        raise ValueError(f"x: must be 2-D, got shape {x.shape}")
    return backends.dispatch(SUM_ROWS, x, backend=backend)


# ------------------------------------------------------------------------------------------------ implementations
def _matmul_numpy(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    c = a.astype(np.float32) @ b.astype(np.float32)
    if bias is not None:
        c += bias.astype(np.float32)
    return c.astype(bfloat16)


def _matmul_cpp(threads: int) -> Any:
    def fn(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        g = backends.load_C("gemm")
        bits = None if bias is None else bias.view(np.uint16)
        c = g.bf16_matmul(a.view(np.uint16), b.view(np.uint16), out="bfloat16", threads=threads, bias=bits)
        return c.view(bfloat16)

    fn.__name__ = f"bf16_matmul_cpp_{'parallel' if threads == 0 else 'simd'}"
    return fn


def _to_bf16_numpy(x: np.ndarray) -> np.ndarray:
    return x.astype(bfloat16)


def _to_bf16_cpp(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, np.uint16)
    backends.load_C("amp").to_bf16(x, out)
    return out.view(bfloat16)


def _from_bf16_numpy(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32)


def _from_bf16_cpp(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, np.float32)
    backends.load_C("amp").from_bf16(x.view(np.uint16), out)
    return out


def _round_numpy(x: np.ndarray) -> np.ndarray:
    return x.astype(bfloat16).astype(np.float32)


def _round_cpp(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, np.float32)
    backends.load_C("amp").round_bf16(x, out)
    return out


def _sum_rows_numpy(x: np.ndarray) -> np.ndarray:
    return np.add.reduce(x, axis=0, dtype=np.float32).astype(bfloat16)


def _sum_rows_cpp(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape[1], np.uint16)
    backends.load_C("amp").sum_rows(x.view(np.uint16), out)
    return out.view(bfloat16)


def _contiguous_bf16_2d(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == bfloat16 and x.ndim == 2 and x.flags.c_contiguous


def _example_sum_rows(rng: Any) -> tuple[tuple, dict]:
    """Small integers: every fp32 sum is exact, so both implementations agree bit for bit."""
    return (rng.integers(-8, 9, (37, 45)).astype(bfloat16),), {}


def _contiguous_f32(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous


def _contiguous_bf16(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == bfloat16 and x.flags.c_contiguous


def _example_matmul(rng: Any) -> tuple[tuple, dict]:
    """Conformance input: edges no tile size divides, B a transposed view; small integers, so every fp32 sum is exact
    whatever its order and all implementations must agree bit for bit."""
    a = rng.integers(-4, 5, (17, 33)).astype(bfloat16)
    b = rng.integers(-4, 5, (9, 33)).astype(bfloat16).T
    return (a, b, rng.integers(-8, 9, 9).astype(bfloat16)), {}


def _example_cast(rng: Any) -> tuple[tuple, dict]:
    return (rng.standard_normal((7, 45)).astype(np.float32) * np.float32(100),), {}


def _example_widen(rng: Any) -> tuple[tuple, dict]:
    return ((rng.standard_normal((7, 45)) * 100).astype(bfloat16),), {}


def _compared(out: np.ndarray) -> np.ndarray:
    return out.astype(np.float32)


def _has(sub: str, name: str) -> Any:
    return lambda: backends.C_available(sub) and hasattr(backends.load_C(sub), name)


backends.register(BF16_MATMUL, "numpy", _matmul_numpy, example=_example_matmul, compared=_compared)


_cpp_ok = _has("gemm", "bf16_matmul")
backends.register(BF16_MATMUL, "cpp", _matmul_cpp(1), version="simd", available=_cpp_ok)
backends.register(BF16_MATMUL, "cpp", _matmul_cpp(0), version="parallel", default=True, available=_cpp_ok)
backends.register(TO_BF16, "numpy", _to_bf16_numpy, example=_example_cast, compared=_compared)
backends.register(TO_BF16, "cpp", _to_bf16_cpp, when=_contiguous_f32, available=_has("amp", "to_bf16"))
backends.register(ROUND_BF16, "numpy", _round_numpy, example=_example_cast)
backends.register(ROUND_BF16, "cpp", _round_cpp, when=_contiguous_f32, available=_has("amp", "round_bf16"))
backends.register(SUM_ROWS, "numpy", _sum_rows_numpy, example=_example_sum_rows, compared=_compared)
backends.register(SUM_ROWS, "cpp", _sum_rows_cpp, when=_contiguous_bf16_2d, available=_has("amp", "sum_rows"))
backends.register(FROM_BF16, "numpy", _from_bf16_numpy, example=_example_widen)
backends.register(FROM_BF16, "cpp", _from_bf16_cpp, when=_contiguous_bf16, available=_has("amp", "from_bf16"))
