"""FP8 formats E4M3 (OCP "fn": finite + NaN) and E5M2 (IEEE-like), round-to-nearest-even, and delayed scaling.

A code is s | e (E bits) | m (M bits).  value = (-1)^s * 2^(e - bias) * (1 + m / 2^M) for e > 0,
                                           (-1)^s * 2^(1 - bias) * (m / 2^M)     for e = 0 (subnormal).

    E4M3: bias 7,  max 448 = 1.75 * 2^8 (s.1111.110), no infinities, NaN = s.1111.111 (0x7F / 0xFF) only
    E5M2: bias 15, max 57344 = 1.75 * 2^15, inf = s.11111.00, NaN = s.11111.{01,10,11}

Encoding = round |x| to the grid with spacing 2^(max(floor(log2|x|), 1 - bias) - M) (round half to even); done on
the float32 bits, a mantissa carry (1.111b -> 10.000b) propagates into the exponent field by plain integer addition.

Out-of-range behaviour is torch's (verified bit-exactly against ``.to(torch.float8_e4m3fn / float8_e5m2)``):
E4M3 (no inf) saturates: |x| rounding above 448, and +-inf, give +-448 (0x7E / 0xFE); E5M2 overflows to +-inf.
NaN keeps its sign: 0x7F / 0xFF in both formats.  ``saturate=True`` (FP8 training recipes) also clamps E5M2
overflow and +-inf to +-57344.

Kernels: the numpy functions here are the reference; inputs above CPP_MIN_SIZE elements go to cpp_src/quant_fp8.cpp
when tinylearn._C is built (ops ``quant.fp8_encode`` / ``quant.fp8_decode`` in tinylearn.backends, versions
v0_scalar -> v1_simd (AVX2 / AVX-512 chosen at run time, TINYLEARN_CPU_FEATURES forces one) -> v2_threads
(OpenMP)), bit-identical to the numpy path and to torch (decode also keeps torch's NaN bit patterns).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import backends
from .._inputs import as_array

# fmt -> (exponent bits, mantissa bits, bias, max finite)
FORMATS: dict[str, tuple[int, int, int, float]] = {
    "e4m3": (4, 3, 7, 448.0),
    "e5m2": (5, 2, 15, 57344.0),
}


def _fmt(fmt: str) -> tuple[int, int, int, float]:
    if not isinstance(fmt, str) or fmt.lower() not in FORMATS:
        raise ValueError(f"fmt: unknown FP8 format {fmt!r}; known: {list(FORMATS)}")
    return FORMATS[fmt.lower()]


def fp8_table(fmt: str = "e4m3") -> np.ndarray:
    """float32 value of every code 0..255 (NaN codes -> nan, E5M2 inf codes -> +-inf)."""
    ebits, mbits, bias, _ = _fmt(fmt)
    codes = np.arange(256)
    s = np.where(codes >> 7, -1.0, 1.0)
    e = (codes >> mbits) & ((1 << ebits) - 1)
    m = codes & ((1 << mbits) - 1)
    mag = np.where(e > 0, np.ldexp(1.0 + m / 2**mbits, e - bias), np.ldexp(m / 2**mbits, 1 - bias))
    emax = (1 << ebits) - 1
    if fmt.lower() == "e4m3":
        mag = np.where((e == emax) & (m == (1 << mbits) - 1), np.nan, mag)
    else:
        mag = np.where(e == emax, np.where(m == 0, np.inf, np.nan), mag)
    return (s * mag).astype(np.float32)


CPP_VERSIONS: tuple[str, ...] = ("v2_threads", "v0_scalar", "v1_simd")  # cpp_src/quant_fp8.cpp; first = default
CPP_MIN_SIZE = 0  # C++ for every non-empty input when built (16 elements: ~3 us vs ~40 us for numpy encode)


def _cpp_fp8() -> bool:
    return backends.C_available("quant_fp8")


def _large(a: np.ndarray, *_: Any) -> bool:
    return a.size > CPP_MIN_SIZE


def simd_level() -> str:
    """The SIMD level the C++ v1_simd / v2_threads rungs take now: 'scalar' | 'avx2' | 'avx512' ('' if not built)."""
    return str(backends.load_C("quant_fp8").fp8_isa()) if _cpp_fp8() else ""


def _check_codes(codes: Any) -> np.ndarray:
    c = as_array(codes, "codes", dtypes=("i", "u"))
    if c.dtype != np.uint8:
        if c.size and (c.min() < 0 or c.max() > 255):
            raise TypeError(f"codes: expected uint8 FP8 codes (0..255), got dtype {c.dtype} with values outside")
        c = c.astype(np.uint8)
    return c


def _decode_example(rng: Any) -> tuple[tuple, dict]:
    return (np.arange(256, dtype=np.uint8), "e4m3"), {}  # every code, NaNs included


def _encode_example(rng: Any) -> tuple[tuple, dict]:
    """Normals, subnormals, overflow and inf (NaN compared separately: its payload is backend-defined)."""
    x = np.concatenate([rng.standard_normal(64) * 64, rng.standard_normal(16) * 2.0**-9, [1e6, -np.inf, np.inf]])
    return (x.astype(np.float32), "e5m2", False), {}


@backends.register("quant.fp8_decode", "numpy", example=_decode_example)
def _decode_numpy(c: np.ndarray, fmt: str) -> np.ndarray:
    return fp8_table(fmt)[c]


def fp8_decode(codes: Any, fmt: str = "e4m3", *, backend: str | None = None, version: str | None = None) -> np.ndarray:
    """float32 values of uint8 FP8 codes (exact: every FP8 value is a float32).

    backend: None (C++ above CPP_MIN_SIZE codes when built, else numpy) | "numpy" | "cpp"; version (cpp):
    "v2_threads" (default) | "v0_scalar" | "v1_simd". The C++ path also reproduces torch's NaN bit patterns."""
    _fmt(fmt)
    c = _check_codes(codes)
    return backends.dispatch("quant.fp8_decode", c, fmt.lower(), backend=backend, version=version)


@backends.register("quant.fp8_encode", "numpy", example=_encode_example)
def _encode_numpy(x32: np.ndarray, fmt: str, saturate: bool) -> np.ndarray:
    """Reference: the integer algorithm of fp8_encode's docstring on the float32 bit patterns, in numpy."""
    ebits, mbits, bias, fmax = _fmt(fmt)
    shape = x32.shape
    x32 = np.ascontiguousarray(x32, dtype=np.float32).reshape(-1)
    u = x32.view(np.uint32)
    sign = ((u >> 24) & 0x80).astype(np.uint8)
    a = u & np.uint32(0x7FFFFFFF)
    shift = 23 - mbits
    min_normal = np.uint32((127 + 1 - bias) << 23)  # bits of 2^(1 - bias)
    # normal path (values below min_normal are handled by the subnormal path; clamp avoids wrap-around)
    r = np.maximum(a, min_normal) - np.uint32((127 - bias) << 23)
    r = (r + np.uint32((1 << (shift - 1)) - 1) + ((r >> shift) & 1)) >> shift
    # subnormal path: exact power-of-two scaling in float32, then RNE
    with np.errstate(over="ignore", invalid="ignore"):
        sub = np.rint(np.where(a < min_normal, x32, 0).astype(np.float32) * np.float32(2.0 ** (bias - 1 + mbits)))
    code = np.where(a < min_normal, np.abs(sub).astype(np.uint32), r)
    max_code = int(np.argmax(fp8_table(fmt)[:128] == fmax))
    over = (code > max_code) | (a >= np.uint32(0x7F800000))  # includes +-inf (NaN fixed below)
    if fmt.lower() == "e4m3" or saturate:
        code = np.where(over, max_code, code)
    else:
        code = np.where(over, ((1 << ebits) - 1) << mbits, code)  # inf
    code = np.where(a > np.uint32(0x7F800000), 0x7F, code)  # NaN keeps its sign
    return (code.astype(np.uint8) | sign).reshape(shape)


def _register_cpp() -> None:
    for v in CPP_VERSIONS:

        def enc(x32: np.ndarray, fmt: str, saturate: bool, v: str = v) -> np.ndarray:
            c = backends.load_C("quant_fp8").fp8_encode(np.ascontiguousarray(x32), fmt, bool(saturate), v)
            return c.reshape(x32.shape)  # ascontiguousarray makes 0-d inputs 1-d

        def dec(c: np.ndarray, fmt: str, v: str = v) -> np.ndarray:
            return backends.load_C("quant_fp8").fp8_decode(np.ascontiguousarray(c), fmt, v).reshape(c.shape)

        backends.register("quant.fp8_encode", "cpp", enc, version=v, when=_large, available=_cpp_fp8)
        backends.register("quant.fp8_decode", "cpp", dec, version=v, when=_large, available=_cpp_fp8)


_register_cpp()


def fp8_encode(
    x: Any, fmt: str = "e4m3", saturate: bool = False, *, backend: str | None = None, version: str | None = None
) -> np.ndarray:
    """uint8 FP8 codes of float32(x) with round-to-nearest-even; bit-exact with torch's float8 casts.

    Integer arithmetic on the float32 bit pattern a = |x| bits (exponent e32, 23 mantissa bits):
      normal FP8 range:  rebias the exponent (a - (127 - bias) << 23), then drop 23 - M mantissa bits with RNE:
                         (r + 2^(shift-1) - 1 + lsb) >> shift — a carry out of the mantissa bumps the exponent
      subnormal range:   code = rint(|x| * 2^(bias - 1 + M)) (exact scaling, RNE; 2^M is the smallest normal code)
    saturate: E5M2 overflow and +-inf -> +-57344 instead of +-inf (E4M3 always saturates, like torch's cast).
    backend: None (C++ above CPP_MIN_SIZE elements when built, else numpy) | "numpy" | "cpp"; version (cpp):
    "v2_threads" (default) | "v0_scalar" | "v1_simd" (cpp_src/quant_fp8.cpp, all bit-identical).
    """
    fmt = fmt.lower() if isinstance(fmt, str) else fmt
    _fmt(fmt)
    if not isinstance(saturate, bool | np.bool_):
        raise TypeError(f"saturate: expected a bool, got {type(saturate).__name__} {saturate!r}")
    xa = as_array(x, "x", dtypes=("f", "i", "u", "b"))
    x32 = xa.astype(np.float32, copy=False)
    return backends.dispatch("quant.fp8_encode", x32, fmt, bool(saturate), backend=backend, version=version)


def fp8_quantize(x: Any, fmt: str = "e4m3", saturate: bool = True) -> np.ndarray:
    """decode(encode(x)): the float32 value after a round trip through FP8."""
    return fp8_decode(fp8_encode(x, fmt, saturate), fmt)


@dataclass
class DelayedScaling:
    """Per-tensor delayed scaling for FP8 (Transformer-Engine style): the scale for step t comes from the amax
    history of the previous ``history_len`` steps, so no extra pass over the current tensor is needed.

        scale = fmax / (max(amax_history) * 2^margin);   x_fp8 = encode(x * scale, saturate=True);  x ~ decode / scale
    Before any history exists the scale is 1. ``update(x)`` records amax(|x|) after the cast (for the next step).
    """

    fmt: str = "e4m3"
    history_len: int = 16
    margin: int = 0

    def __post_init__(self) -> None:
        _fmt(self.fmt)
        if self.history_len < 1:
            raise ValueError(f"history_len: must be >= 1, got {self.history_len}")
        self.history: deque[float] = deque(maxlen=self.history_len)

    @property
    def scale(self) -> float:
        fmax = FORMATS[self.fmt][3]
        amax = max(self.history) if self.history else 0.0
        if amax <= 0.0 or not np.isfinite(amax):
            return 1.0
        return float(fmax / (amax * 2.0**self.margin))

    def update(self, x: Any) -> None:
        self.history.append(float(np.max(np.abs(np.asarray(x, np.float32)))) if np.size(x) else 0.0)

    def quantize(self, x: Any) -> tuple[np.ndarray, float]:
        """(codes, scale) for x with the current (delayed) scale; then records amax(x) into the history."""
        s = self.scale
        codes = fp8_encode(np.asarray(x, np.float32) * np.float32(s), self.fmt, saturate=True)
        self.update(x)
        return codes, s

    def fake_quantize(self, x: Any) -> np.ndarray:
        """x -> decode(encode(x * scale)) / scale (float32), updating the history."""
        codes, s = self.quantize(x)
        return (fp8_decode(codes, self.fmt) / np.float32(s)).astype(np.float32)


def fp8_matmul(
    a: Any, b: Any, fmt_a: str = "e4m3", fmt_b: str = "e4m3", sa: float = 1.0, sb: float = 1.0
) -> np.ndarray:
    """Simulated FP8 GEMM: both operands cast to FP8 with per-tensor scales, products accumulated in float32."""
    qa = fp8_decode(fp8_encode(np.asarray(a, np.float32) * np.float32(sa), fmt_a, saturate=True), fmt_a)
    qb = fp8_decode(fp8_encode(np.asarray(b, np.float32) * np.float32(sb), fmt_b, saturate=True), fmt_b)
    return ((qa @ qb) / np.float32(sa * sb)).astype(np.float32)
