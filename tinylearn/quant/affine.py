"""Affine (uniform) quantization: the map between reals and a b-bit integer grid.

    q = clamp(round(x / scale) + zero_point, qmin, qmax)          x_hat = (q - zero_point) * scale

``round`` is round-half-to-even. Choosing (scale, zero_point) from an observed range [min, max] follows
torch.ao.quantization's observers exactly (float32 arithmetic, eps = finfo(float32).eps):

    min' = min(min, 0), max' = max(max, 0)                       (zero must be representable exactly)
    affine:    scale = (max' - min') / (qmax - qmin);  zero_point = clamp(qmin - round(min' / scale), qmin, qmax)
    symmetric: scale = max(-min', max') / ((qmax - qmin) / 2);  zero_point = 0 (signed) or the mid code (unsigned)

Bit-exactness with torch: ``torch.quantize_per_tensor`` evaluates ``round(fma(x, 1/scale, zero_point))`` in float32
(the zero point is added *before* rounding, which matters at ties when zero_point is odd), while
``torch.quantize_per_channel`` evaluates ``round(float32(x * (1/scale)) + zero_point)``. Both are reproduced here;
float64 holds the exact product of two float32 numbers, so ``float32(float64(x) * inv + zp)`` is the fused result
(numpy path); large per-tensor inputs go to the C++ kernels (cpp_src/quant_affine.cpp: fma + round-half-even,
versions v0_scalar -> v1_simd (AVX2 / AVX-512, run-time dispatch) -> v2_threads (OpenMP)): ops
``quant.quantize_per_tensor`` / ``quant.dequantize_per_tensor`` in tinylearn.backends, the size threshold is the
C++ registration's ``when=`` predicate.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backends
from .._inputs import as_array

# dtype -> (qmin, qmax, numpy storage dtype)
QRANGES: dict[str, tuple[int, int, type]] = {
    "int8": (-128, 127, np.int8),
    "uint8": (0, 255, np.uint8),
    "int4": (-8, 7, np.int8),
    "uint4": (0, 15, np.uint8),
}
EPS32 = float(np.finfo(np.float32).eps)


def qrange(dtype: str) -> tuple[int, int]:
    """(qmin, qmax) of a quantized dtype name."""
    if not isinstance(dtype, str) or dtype not in QRANGES:
        raise ValueError(f"dtype: unknown quantized dtype {dtype!r}; known: {list(QRANGES)}")
    lo, hi, _ = QRANGES[dtype]
    return lo, hi


def _check_range_args(min_val: Any, max_val: Any) -> tuple[np.ndarray, np.ndarray]:
    lo = np.asarray(min_val, dtype=np.float32)
    hi = np.asarray(max_val, dtype=np.float32)
    if lo.shape != hi.shape:
        raise ValueError(f"min_val/max_val: shapes differ: {lo.shape} vs {hi.shape}")
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ValueError(f"min_val/max_val: must be finite, got min_val={min_val!r}, max_val={max_val!r}")
    if np.any(lo > hi):
        raise ValueError(f"min_val/max_val: min_val must be <= max_val, got min_val={min_val!r}, max_val={max_val!r}")
    return lo, hi


def qparams_for_range(
    min_val: Any,
    max_val: Any,
    quant_min: int,
    quant_max: int,
    symmetric: bool = False,
    signed: bool = True,
    customized_range: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Arrays (scale float32, zero_point int64) for an arbitrary integer range; torch's observer arithmetic."""
    lo, hi = _check_range_args(min_val, max_val)
    if quant_min >= quant_max:
        raise ValueError(f"quant_min/quant_max: need quant_min < quant_max, got {quant_min}, {quant_max}")
    f32 = np.float32
    lo = np.minimum(lo, f32(0))
    hi = np.maximum(hi, f32(0))
    if symmetric:
        amax = np.maximum(-lo, hi)
        scale = (amax / f32(float(quant_max - quant_min) / 2)).astype(f32)
        scale = np.maximum(scale, f32(EPS32))
        if signed:
            zp = np.zeros(scale.shape, np.int64)
        else:
            mid = (quant_min + quant_max) // 2 if customized_range else 128
            zp = np.full(scale.shape, mid, np.int64)
    else:
        scale = ((hi - lo) / f32(quant_max - quant_min)).astype(f32)
        scale = np.maximum(scale, f32(EPS32))
        zp = quant_min - np.rint((lo / scale).astype(f32)).astype(np.int64)
        zp = np.clip(zp, quant_min, quant_max)
    return scale.astype(f32), zp.astype(np.int64)


def calculate_qparams(min_val: Any, max_val: Any, dtype: str = "int8", symmetric: bool = False) -> tuple[Any, Any]:
    """(scale, zero_point) covering [min_val, max_val] (scalars -> (float, int); arrays -> per-channel arrays).

    Matches torch.ao.quantization.MinMaxObserver / PerChannelMinMaxObserver with the same range: int8 is
    torch.qint8 [-128, 127], uint8 is torch.quint8 [0, 255] (symmetric zero point 128), int4/uint4 are the
    customised ranges [-8, 7] / [0, 15] (symmetric unsigned zero point (qmin + qmax) // 2 = 7, as torch does).
    """
    qmin, qmax = qrange(dtype)
    scalar = np.ndim(min_val) == 0 and np.ndim(max_val) == 0
    scale, zp = qparams_for_range(
        min_val,
        max_val,
        qmin,
        qmax,
        symmetric=symmetric,
        signed=dtype.startswith("int"),
        customized_range=dtype not in ("int8", "uint8"),
    )
    if scalar:
        return float(scale), int(zp)
    return scale, zp


_REAL_SCALARS = (float, int, np.floating, np.integer)


def _qparam_array(v: Any, name: str) -> np.ndarray:
    """A scale or zero point as an array; a ragged nested list is a ValueError naming ``name``."""
    try:
        return np.asarray(v)
    except ValueError as e:
        raise ValueError(f"{name}: not a number or a rectangular array of numbers ({e})") from None


def _check_qparams(scale: Any, zero_point: Any, qmin: int, qmax: int, axis: int | None, ndim: int, shape: tuple):
    if (
        axis is None
        and isinstance(scale, _REAL_SCALARS)
        and isinstance(zero_point, int | np.integer)
        and not isinstance(scale, bool)
        and not isinstance(zero_point, bool)
    ):  # fast path for the common per-tensor call (the checks below, on Python scalars)
        sf, zi = float(scale), int(zero_point)
        if not (math.isfinite(sf) and sf > 0):
            raise ValueError(f"scale: must be finite and > 0, got {scale!r}")
        if zi < qmin or zi > qmax:
            raise ValueError(f"zero_point: {zero_point!r} outside the quantized range [{qmin}, {qmax}]")
        return np.float32(sf), zi, None
    if type(zero_point) is float or isinstance(zero_point, bool | np.bool_):  # torch: an int (or an int tensor)
        raise TypeError(f"zero_point: must be an int or an array of ints, got {type(zero_point).__name__}")
    s, z = _qparam_array(scale, "scale"), _qparam_array(zero_point, "zero_point")
    if s.dtype.kind not in "fiu":
        raise TypeError(f"scale: must be a positive number or an array of them, got {scale!r} (dtype {s.dtype})")
    s = s.astype(np.float64)
    if z.dtype.kind == "f":
        if not np.all(np.isfinite(z)) or np.any(z != np.round(z)):
            raise ValueError(f"zero_point: must be integers, got {zero_point!r}")
    elif z.dtype.kind not in "iub":
        raise TypeError(f"zero_point: must be integer(s), got dtype {z.dtype}")
    z = z.astype(np.int64)
    if np.any(~np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(f"scale: must be finite and > 0, got {scale!r}")
    if np.any(z < qmin) or np.any(z > qmax):
        raise ValueError(f"zero_point: {zero_point!r} outside the quantized range [{qmin}, {qmax}]")
    if axis is None:
        if s.size != 1 or z.size != 1:
            raise ValueError(
                f"scale/zero_point: per-tensor quantization (axis=None) needs scalars, got shapes "
                f"{s.shape} and {z.shape}"
            )
        return np.float32(s.reshape(())), int(z.reshape(())), None
    if not isinstance(axis, int | np.integer):
        raise TypeError(f"axis: expected an int or None, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis: {axis} out of range for an input with {ndim} dimensions (shape {shape})")
    ax = int(axis) % ndim
    c = shape[ax]
    s = np.broadcast_to(s.reshape(-1), (c,)) if s.size == 1 else s.reshape(-1)
    z = np.broadcast_to(z.reshape(-1), (c,)) if z.size == 1 else z.reshape(-1)
    if s.shape[0] != c or z.shape[0] != c:
        raise ValueError(
            f"scale/zero_point: per-channel along axis {axis} needs {c} values (input shape {shape}), "
            f"got {s.size} scales and {z.size} zero points"
        )
    view = [1] * ndim
    view[ax] = c
    return s.astype(np.float32).reshape(view), z.reshape(view), ax


# C++ (when built) for every non-empty per-tensor input: with the SIMD rungs it beats numpy at every size measured
# (16 elements: ~4 us vs ~11 us for quantize, loaded 2-core box); both are bit-exact, numpy stays the reference.
CPP_MIN_SIZE = 0
# The C++ versions ladder (cpp_src/quant_affine.cpp), every rung bit-identical; the first one is the default:
#   v2_threads  v1_simd over OpenMP threads (chunks of >= 65536 elements; smaller inputs stay on one thread)
#   v0_scalar   one element at a time (auto-vectorisation off): the baseline
#   v1_simd     AVX-512 / AVX2+FMA chosen at run time (TINYLEARN_CPU_FEATURES=scalar|avx2|avx512 forces a level)
CPP_VERSIONS: tuple[str, ...] = ("v2_threads", "v0_scalar", "v1_simd")


def _large(a: np.ndarray, *_: Any) -> bool:
    """``when=`` predicate of the C++ kernels: worth a call into C++ only above CPP_MIN_SIZE elements."""
    return a.size > CPP_MIN_SIZE


def _cpp_affine() -> bool:
    return backends.C_available("quant_affine")


def simd_level() -> str:
    """The SIMD level the C++ v1_simd / v2_threads rungs take now: 'scalar' | 'avx2' | 'avx512' ('' if not built)."""
    return str(backends.load_C("quant_affine").quant_affine_isa()) if _cpp_affine() else ""


def _quantize_example(rng: Any) -> tuple[tuple, dict]:
    """Values in and beyond the uint8 range (clamping both ends), scale 0.05, zero point 128."""
    return (rng.standard_normal(100).astype(np.float32) * 4, np.float32(0.05), 128, 0, 255), {}


def _dequantize_example(rng: Any) -> tuple[tuple, dict]:
    return (rng.integers(-128, 128, 100, dtype=np.int8), np.float32(0.05), -3), {}


@backends.register("quant.quantize_per_tensor", "numpy", example=_quantize_example)
def _quantize_numpy(xa: np.ndarray, s: np.float32, z: int, qmin: int, qmax: int) -> np.ndarray:
    inv = np.float32(1.0) / s
    with np.errstate(over="ignore", invalid="ignore"):
        t = (xa.astype(np.float64) * np.float64(inv) + z).astype(np.float32)  # fused multiply-add, one rounding
        r = np.clip(np.rint(t), qmin, qmax)
        r = np.where(np.isnan(r), qmax, r)
    return r.astype(np.int8 if qmin < 0 else np.uint8)


@backends.register("quant.dequantize_per_tensor", "numpy", example=_dequantize_example)
def _dequantize_numpy(qa: np.ndarray, s: np.float32, z: int) -> np.ndarray:
    return ((qa.astype(np.float32) - np.float32(z)) * s).astype(np.float32)


def _large_int8(qa: np.ndarray, *_: Any) -> bool:
    return _large(qa) and qa.dtype in (np.int8, np.uint8)


def _register_cpp() -> None:
    for v in CPP_VERSIONS:
        # The wrappers stay cheap (a few us of Python per call is ~10% of a 1M-element dequantize on 2 threads): the
        # C++ output already has the input's shape except for 0-d inputs (ascontiguousarray makes them 1-d), and
        # dtype.type identity avoids numpy's dtype coercion of `qa.dtype in (np.int8, np.uint8)`.
        def quant_cpp(xa: np.ndarray, s: np.float32, z: int, qmin: int, qmax: int, v: str = v) -> np.ndarray:
            C = backends.load_C("quant_affine")
            q = C.quantize_per_tensor(np.ascontiguousarray(xa, np.float32), float(s), int(z), qmin, qmax, v)
            return q if xa.ndim else q.reshape(())

        def dequant_cpp(qa: np.ndarray, s: np.float32, z: int, v: str = v) -> np.ndarray:
            t = qa.dtype.type
            if t is not np.int8 and t is not np.uint8:
                raise TypeError(f"q: backend 'cpp' dequantizes int8/uint8 codes, got dtype {qa.dtype}")
            C = backends.load_C("quant_affine")
            fn = C.dequantize_per_tensor_int8 if t is np.int8 else C.dequantize_per_tensor_uint8
            x = fn(np.ascontiguousarray(qa), float(s), int(z), v)
            return x if qa.ndim else x.reshape(())

        backends.register("quant.quantize_per_tensor", "cpp", quant_cpp, version=v, when=_large, available=_cpp_affine)
        backends.register(
            "quant.dequantize_per_tensor", "cpp", dequant_cpp, version=v, when=_large_int8, available=_cpp_affine
        )


_register_cpp()


def _per_tensor_only(backend: str | None, axis: Any) -> None:
    if axis is not None and backend is not None and backends.canonical(backend) != "numpy":
        raise ValueError(f"backend: per-channel quantization (axis={axis}) runs on numpy only, got {backend!r}")


def quantize(
    x: Any,
    scale: Any,
    zero_point: Any,
    dtype: str = "int8",
    axis: int | None = None,
    *,
    backend: str | None = None,
    version: str | None = None,
) -> np.ndarray:
    """Integer codes q = clamp(round(x / scale) + zero_point, qmin, qmax); per-channel along ``axis`` if given.

    Bit-exact with torch.quantize_per_tensor / torch.quantize_per_channel (see module docstring), including
    saturation of +-inf and NaN handling (per-tensor NaN -> qmax, per-channel NaN -> 0 clamped, like torch).
    backend (per-tensor): None = C++ above CPP_MIN_SIZE elements when built, else numpy; "numpy" | "cpp".
    version (cpp): "v2_threads" (default) | "v0_scalar" | "v1_simd" (the ladder in CPP_VERSIONS, all bit-identical).
    """
    qmin, qmax = qrange(dtype)
    _per_tensor_only(backend, axis)
    xa = as_array(x, "x", dtypes=("f", "i", "u", "b")).astype(np.float32, copy=False)
    s, z, ax = _check_qparams(scale, zero_point, qmin, qmax, axis, xa.ndim, xa.shape)
    if ax is None:
        q = backends.dispatch("quant.quantize_per_tensor", xa, s, z, qmin, qmax, backend=backend, version=version)
        return q.astype(QRANGES[dtype][2], copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        t = (xa * (np.float32(1.0) / s)).astype(np.float32) + z.astype(np.float32)
        r = np.clip(np.rint(t), qmin, qmax)
        r = np.where(np.isnan(r), min(max(0, qmin), qmax), r)
    return r.astype(QRANGES[dtype][2])


def dequantize(
    q: Any,
    scale: Any,
    zero_point: Any,
    axis: int | None = None,
    *,
    backend: str | None = None,
    version: str | None = None,
) -> np.ndarray:
    """x_hat = (q - zero_point) * scale in float32 (torch's dequantize arithmetic).

    backend (per-tensor): None = C++ for int8/uint8 codes above CPP_MIN_SIZE elements when built, else numpy;
    version (cpp): "v2_threads" (default) | "v0_scalar" | "v1_simd"."""
    _per_tensor_only(backend, axis)
    qa = as_array(q, "q", dtypes=("i", "u"))
    s, z, ax = _check_qparams(scale, zero_point, -(2**31), 2**31 - 1, axis, qa.ndim, qa.shape)
    if ax is None:
        return backends.dispatch("quant.dequantize_per_tensor", qa, s, z, backend=backend, version=version)
    return ((qa.astype(np.float32) - z.astype(np.float32)) * s).astype(np.float32)


def quantize_dequantize(
    x: Any, scale: Any, zero_point: Any, dtype: str = "int8", axis: int | None = None
) -> np.ndarray:
    """dequantize(quantize(x)): the value the network actually sees; error = this - x."""
    return dequantize(quantize(x, scale, zero_point, dtype, axis), scale, zero_point, axis)
