"""Reference answers for exercises/03_quantization: thin adapters over tinylearn.quant."""

from __future__ import annotations

import numpy as np

from tinylearn.quant.affine import qparams_for_range
from tinylearn.quant.fake_quant import fake_quantize_array
from tinylearn.quant.fp8 import fp8_encode
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


def quantize(x: np.ndarray, scale: float, zero_point: int, quant_min: int, quant_max: int) -> np.ndarray:
    inv = np.float32(1.0) / np.float32(scale)
    t = (np.asarray(x, np.float32).astype(np.float64) * np.float64(inv) + zero_point).astype(np.float32)
    return np.clip(np.rint(t), quant_min, quant_max).astype(np.int64)


def dequantize(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    return ((np.asarray(q).astype(np.float32) - np.float32(zero_point)) * np.float32(scale)).astype(np.float32)


def fake_quantize_backward(
    x: np.ndarray, scale: float, zero_point: int, quant_min: int, quant_max: int, grad_out: np.ndarray
) -> np.ndarray:
    _, r = fake_quantize_array(
        np.asarray(x, np.float32), np.float32(scale), np.float32(zero_point), quant_min, quant_max
    )
    return (grad_out * ((r >= quant_min) & (r <= quant_max))).astype(np.float32)


def kl_threshold(hist: np.ndarray, edges: np.ndarray, num_levels: int = 128) -> float:
    return _kl(hist, edges, num_levels)[0]


def fp8_e4m3_encode(x: np.ndarray) -> np.ndarray:
    return fp8_encode(x, "e4m3")


def pack_int4(q: np.ndarray) -> np.ndarray:
    return _pack(q)


def unpack_int4(packed: np.ndarray, n: int) -> np.ndarray:
    return _unpack(packed, n)
