"""Exercises for notebook 03 (quantization). Replace each ``raise NotImplementedError`` with your code.

Run the tests:  pytest exercises/03_quantization                    (your stubs)
                pytest exercises/03_quantization --impl=reference   (tinylearn's answers)

The tests compare with torch (torch.quantize_per_tensor, torch.fake_quantize_per_tensor_affine,
torch.ao.quantization.MinMaxObserver, .to(torch.float8_e4m3fn)), so the conventions are torch's.

Each stub's NotImplementedError names the library function its reference answer (reference.py) calls.
"""

from __future__ import annotations

import numpy as np


def calculate_qparams(
    min_val: float, max_val: float, quant_min: int, quant_max: int, symmetric: bool = False
) -> tuple[float, int]:
    """(scale, zero_point) for the observed range [min_val, max_val], as torch's MinMaxObserver computes them.

    Work in float32. Extend the range to include 0 (min' = min(min_val, 0), max' = max(max_val, 0)).
    affine:    scale = (max' - min') / (quant_max - quant_min);  zero_point = quant_min - round(min' / scale),
               clamped to [quant_min, quant_max]
    symmetric: scale = max(-min', max') / ((quant_max - quant_min) / 2);  zero_point = 0 (signed ranges)
    Either way scale is at least float32 eps (np.finfo(np.float32).eps). round = round half to even.
    """
    raise NotImplementedError("reference solution: tinylearn/quant/affine.py:qparams_for_range")


def quantize(x: np.ndarray, scale: float, zero_point: int, quant_min: int, quant_max: int) -> np.ndarray:
    """int64 codes clamp(round(x / scale) + zero_point, quant_min, quant_max), round half to even.

    Hint: torch rounds round(x * (1/scale) + zero_point) with one rounding (a fused multiply-add in float32):
    compute x * inv_scale + zero_point in float64 (exact for float32 inputs), cast to float32, then np.rint.
    """
    raise NotImplementedError("reference solution: tinylearn/quant/affine.py:_quantize_numpy")


def dequantize(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """float32 (q - zero_point) * scale."""
    raise NotImplementedError("reference solution: tinylearn/quant/affine.py:_dequantize_numpy")


def fake_quantize_backward(
    x: np.ndarray, scale: float, zero_point: int, quant_min: int, quant_max: int, grad_out: np.ndarray
) -> np.ndarray:
    """Straight-through estimator: dL/dx for y = fake_quantize(x), given dL/dy = grad_out.

    r = round(float32(x * (1/scale))) + zero_point; the gradient passes where quant_min <= r <= quant_max and is 0
    where the value was clipped (that is torch.fake_quantize_per_tensor_affine's backward).
    """
    raise NotImplementedError("reference solution: tinylearn/quant/fake_quant.py:FakeQuantizeSTE.backward")


def kl_threshold(hist: np.ndarray, edges: np.ndarray, num_levels: int = 128) -> float:
    """TensorRT entropy calibration on a histogram of |x| (len(edges) = len(hist) + 1): the clip threshold.

    For every candidate i in [num_levels, len(hist)]:
      P = hist[:i] copied, with the clipped mass sum(hist[i:]) added to P[i-1]
      Q = hist[:i] merged into num_levels levels: bin j belongs to level (j * num_levels) // i; each level's total
          is spread evenly over its *non-empty* bins (empty bins stay 0)
      normalise both; KL = sum over P > 0 of P * log(P / Q), where a Q of 0 is replaced by 1e-12
    Return edges[i] for the i with the smallest KL (the first one on ties): the upper edge of the last kept bin.
    """
    raise NotImplementedError("reference solution: tinylearn/quant/observers.py:kl_threshold")


def fp8_e4m3_encode(x: np.ndarray) -> np.ndarray:
    """uint8 E4M3 (bias 7, 3 mantissa bits, max 448, no inf, NaN = 0x7F | sign) codes, round to nearest even.

    Must equal torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8) for float32 x, including
    subnormals (code = round(|x| / 2^-9) below 2^-6), a mantissa that rounds up into the next exponent, and
    torch's out-of-range rule: |x| too large and +-inf saturate to +-448 (0x7E / 0xFE); NaN -> 0x7F (sign kept).
    """
    raise NotImplementedError("reference solution: tinylearn/quant/fp8.py:fp8_encode")


def pack_int4(q: np.ndarray) -> np.ndarray:
    """Pack int values in [-8, 7] two per byte: element 2i in the low nibble of byte i, 2i+1 in the high nibble
    (two's complement nibbles); an odd count pads the last high nibble with 0. Returns uint8 of size ceil(n/2)."""
    raise NotImplementedError("reference solution: tinylearn/quant/int4.py:pack_int4")


def unpack_int4(packed: np.ndarray, n: int) -> np.ndarray:
    """Inverse of pack_int4: the first n values as int8 in [-8, 7]."""
    raise NotImplementedError("reference solution: tinylearn/quant/int4.py:unpack_int4")


def winograd_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b (int64) for integer a [M, K], b [K, N] with Winograd's inner product: about half the multiplies.

    For each pair of k (2p, 2p + 1):  (a_2p + b_2p+1)(a_2p+1 + b_2p) = a_2p b_2p + a_2p+1 b_2p+1 + a_2p a_2p+1
    + b_2p b_2p+1. So C = sum_p (a[:, 2p, None] + b[None, 2p+1, :]) * (a[:, 2p+1, None] + b[None, 2p, :])
    minus the row term sum_p a_2p a_2p+1 (one per row of a) minus the column term sum_p b_2p b_2p+1 (one per
    column of b). Odd K: pad a with a zero column and b with a zero row. Work in int64. Do not call a @ b.
    """
    raise NotImplementedError("reference solution: tinylearn/quant/gemm.py:winograd_reference")


def strassen_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b (int64) for integer a [M, K], b [K, N] (M, K, N even) by one level of Strassen: 7 block products.

    Split a and b into 2 x 2 blocks (A11 = a[:M/2, :K/2], A12 = a[:M/2, K/2:], ...). With ordinary matmul for the
    blocks: M1 = (A11 + A22)(B11 + B22), M2 = (A21 + A22) B11, M3 = A11 (B12 - B22), M4 = A22 (B21 - B11),
    M5 = (A11 + A12) B22, M6 = (A21 - A11)(B11 + B12), M7 = (A12 - A22)(B21 + B22); then C11 = M1 + M4 - M5 + M7,
    C12 = M3 + M5, C21 = M2 + M4, C22 = M1 - M2 + M3 + M6. Work in int64 (exact); call @ only on the blocks.
    """
    raise NotImplementedError("reference solution: tinylearn/quant/gemm.py:strassen_reference")
