"""Reference answers for exercises/03_quantization: thin adapters over tinylearn.quant."""

from __future__ import annotations

import numpy as np

import tinylearn as tl
from tinylearn.quant.affine import QRANGES, qparams_for_range
from tinylearn.quant.fp8 import fp8_encode
from tinylearn.quant.gemm import strassen_reference, winograd_reference
from tinylearn.quant.int4 import pack_int4 as _pack
from tinylearn.quant.int4 import unpack_int4 as _unpack
from tinylearn.quant.observers import kl_threshold as _kl


def calculate_qparams(
    min_val: float, max_val: float, quant_min: int, quant_max: int, symmetric: bool = False
) -> tuple[float, int]:
    s, z = qparams_for_range(
        np.float32(min_val),
        np.float32(max_val),
        quant_min,
        quant_max,
        symmetric,
        signed=quant_min < 0,
        customized_range=(quant_min, quant_max) not in ((-128, 127), (0, 255)),
    )
    return float(s), int(z)


def _dtype_of_range(quant_min: int, quant_max: int) -> str:
    """The quantized dtype name ("int8", "uint4", ...) whose code range is [quant_min, quant_max]."""
    names = {(lo, hi): name for name, (lo, hi, _) in QRANGES.items()}
    if (quant_min, quant_max) not in names:
        raise ValueError(f"quant_min/quant_max: ({quant_min}, {quant_max}) is none of {sorted(names)}")
    return names[(quant_min, quant_max)]


def quantize(x: np.ndarray, scale: float, zero_point: int, quant_min: int, quant_max: int) -> np.ndarray:
    return tl.quant.quantize(x, scale, zero_point, _dtype_of_range(quant_min, quant_max)).astype(np.int64)


def dequantize(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    return tl.quant.dequantize(q, scale, zero_point)


def fake_quantize_backward(
    x: np.ndarray, scale: float, zero_point: int, quant_min: int, quant_max: int, grad_out: np.ndarray
) -> np.ndarray:
    t = tl.Tensor(np.asarray(x, np.float32), requires_grad=True)
    tl.quant.fake_quantize(t, scale, zero_point, quant_min, quant_max).backward(tl.Tensor(grad_out))
    return t.grad.numpy()


def kl_threshold(hist: np.ndarray, edges: np.ndarray, num_levels: int = 128) -> float:
    return _kl(hist, edges, num_levels)[0]


def fp8_e4m3_encode(x: np.ndarray) -> np.ndarray:
    return fp8_encode(x, "e4m3")


def pack_int4(q: np.ndarray) -> np.ndarray:
    return _pack(q)


def unpack_int4(packed: np.ndarray, n: int) -> np.ndarray:
    return _unpack(packed, n)


def winograd_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return winograd_reference(a, b)[0]


def strassen_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return strassen_reference(np.asarray(a, np.int64), np.asarray(b, np.int64), 1)[0]
