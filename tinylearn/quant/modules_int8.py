"""Static int8 layers: ``QuantizedLinear`` and ``QuantizedConv2d`` on the exact int8 GEMM (``convert()``'s int8 mode).

Int8 layer (static quantization, per-channel symmetric weights, affine int8 activations), for output channel j:
    x_q = quantize(x; s_x, z_x)                      w_q[j] = quantize(w[j]; s_w[j], 0)
    acc = x_q @ w_q^T - z_x * rowsum(w_q) + round(b / (s_x s_w))          (int32, exact: int8_gemm)
    y_q = clamp(round(acc * s_x s_w[j] / s_y) + z_y, qmin_relu, 127)       (requantization; fused ReLU clamps at z_y)
    y   = (y_q - z_y) s_y                                                   (dequantized for the next float op)
Layers hand float tensors to each other: dequantize(y_q) re-quantized with the same (s_y, z_y) by the next int8
layer gives back exactly y_q, so the values equal an all-integer pipeline while pooling/flatten stay float.
Conv2d lowers to the same GEMM by im2col on the int8 codes, padding with z_x (the code of 0.0).

The dynamic int8 Linear, the int4 weight-only and FP8 layers are in ``tinylearn.quant.modules``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..autograd import Tensor
from ..nn import Conv2d, Linear, Module
from .affine import quantize
from .gemm import PackedInt8Weight


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int | np.integer) else (int(v[0]), int(v[1]))


def im2col_codes(
    xq: np.ndarray, kernel_size: tuple[int, int], stride: Any, padding: Any, dilation: Any, pad_value: int
) -> tuple[np.ndarray, int, int]:
    """int8 NCHW codes -> rows [N*OH*OW, C*kh*kw] (torch unfold's column order), padding with ``pad_value``."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, _pair(stride), _pair(padding), _pair(dilation)
    n, c, h, w = xq.shape
    xp = np.pad(xq, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=pad_value)
    eh, ew = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    v = sliding_window_view(xp, (eh, ew), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]  # [N, C, OH, OW, kh, kw]
    oh, ow = v.shape[2], v.shape[3]
    rows = np.ascontiguousarray(v.transpose(0, 2, 3, 1, 4, 5)).reshape(n * oh * ow, c * kh * kw)
    return rows, oh, ow


class _Int8Core:
    """Shared int8 arithmetic: quantized weight [OC, K], input/output qparams, requantization."""

    def setup(
        self,
        w2d: np.ndarray,
        bias: np.ndarray | None,
        w_scale: np.ndarray,
        in_qparams: tuple[float, int],
        out_qparams: tuple[float, int],
        relu: bool,
        w_qrange: tuple[int, int] = (-128, 127),
    ) -> None:
        self.w_scale = np.asarray(w_scale, np.float32).reshape(-1)
        self.w_q = quantize(w2d, self.w_scale, np.zeros_like(self.w_scale, dtype=np.int64), "int8", axis=0)
        self.w_q = np.clip(self.w_q, *w_qrange).astype(np.int8)  # int4 weights are int8 codes in [-8, 7]
        self.w_packed = PackedInt8Weight(np.ascontiguousarray(self.w_q.T))  # [K, OC] for x @ w^T, packed once
        self.w_rowsum = self.w_q.astype(np.int32).sum(1)
        self.s_x, self.z_x = float(in_qparams[0]), int(in_qparams[1])
        self.s_y, self.z_y = float(out_qparams[0]), int(out_qparams[1])
        acc_scale = np.float64(self.s_x) * self.w_scale.astype(np.float64)
        self.bias_q = (
            np.rint(np.asarray(bias, np.float64) / acc_scale).astype(np.int64)
            if bias is not None
            else np.zeros(len(self.w_scale), np.int64)
        )
        self.multiplier = acc_scale / np.float64(self.s_y)
        self.relu = bool(relu)

    def int8_matmul(self, x_rows: np.ndarray) -> np.ndarray:
        """int8 input codes [M, K] -> int8 output codes [M, OC] (GEMM, zero-point and bias terms, requantize)."""
        acc = self.w_packed.matmul(x_rows).astype(np.int64)
        acc += self.bias_q[None, :] - self.z_x * self.w_rowsum[None, :]
        yq = np.rint(acc * self.multiplier[None, :]) + self.z_y
        lo = self.z_y if self.relu else -128
        return np.clip(yq, max(lo, -128), 127).astype(np.int8)

    def dequant_out(self, yq: np.ndarray) -> np.ndarray:
        return ((yq.astype(np.float32) - np.float32(self.z_y)) * np.float32(self.s_y)).astype(np.float32)

    def quant_in(self, x: np.ndarray) -> np.ndarray:
        return quantize(x, self.s_x, self.z_x, "int8")

    @property
    def weight_bytes(self) -> int:
        return self.w_q.size + 4 * self.w_scale.size + 4 * len(self.bias_q)


class QuantizedLinear(Module, _Int8Core):
    """int8 x int8 Linear (per-channel weights) with requantized int8 output; inputs/outputs are float Tensors."""

    def __init__(
        self,
        weight: np.ndarray,
        bias: np.ndarray | None,
        w_scale: np.ndarray,
        in_qparams: tuple,
        out_qparams: tuple,
        relu: bool = False,
        w_qrange: tuple[int, int] = (-128, 127),
    ) -> None:
        Module.__init__(self)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.setup(np.asarray(weight, np.float32), bias, w_scale, in_qparams, out_qparams, relu, w_qrange)

    @classmethod
    def from_float(
        cls,
        mod: Linear,
        w_scale: np.ndarray,
        in_qparams: tuple,
        out_qparams: tuple,
        relu: bool = False,
        w_qrange: tuple[int, int] = (-128, 127),
    ) -> QuantizedLinear:
        b = mod.bias.data if mod.bias is not None else None
        return cls(mod.weight.data, b, w_scale, in_qparams, out_qparams, relu, w_qrange)

    def forward(self, x: Tensor) -> Tensor:
        xa = x.data if isinstance(x, Tensor) else np.asarray(x, np.float32)
        if xa.shape[-1] != self.in_features:
            raise ValueError(f"x: last dimension {xa.shape[-1]} != in_features {self.in_features}")
        lead = xa.shape[:-1]
        yq = self.int8_matmul(self.quant_in(xa.reshape(-1, self.in_features)))
        return Tensor(self.dequant_out(yq).reshape(*lead, self.out_features))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, relu={self.relu}"


class QuantizedConv2d(Module, _Int8Core):
    """int8 Conv2d (groups=1) as im2col on int8 codes + int8 GEMM + requantization."""

    def __init__(
        self,
        conv: Conv2d,
        w_scale: np.ndarray,
        in_qparams: tuple,
        out_qparams: tuple,
        relu: bool = False,
        w_qrange: tuple[int, int] = (-128, 127),
        weight: np.ndarray | None = None,
        bias: np.ndarray | None = None,
    ) -> None:
        Module.__init__(self)
        if conv.groups != 1:
            raise ValueError(f"conv: QuantizedConv2d supports groups=1, got groups={conv.groups}")
        w = conv.weight.data if weight is None else weight
        b = (conv.bias.data if conv.bias is not None else None) if weight is None else bias
        self.out_channels, self.kernel_size = w.shape[0], conv.kernel_size
        self.stride, self.padding, self.dilation = conv.stride, conv.padding, conv.dilation
        self.setup(
            np.asarray(w, np.float32).reshape(w.shape[0], -1), b, w_scale, in_qparams, out_qparams, relu, w_qrange
        )

    def forward(self, x: Tensor) -> Tensor:
        xa = x.data if isinstance(x, Tensor) else np.asarray(x, np.float32)
        if xa.ndim != 4 or xa.shape[1] * self.kernel_size[0] * self.kernel_size[1] != self.w_q.shape[1]:
            raise ValueError(f"x: expected [N, C, H, W] matching weight {self.w_q.shape}, got shape {xa.shape}")
        rows, oh, ow = im2col_codes(
            self.quant_in(xa), self.kernel_size, self.stride, self.padding, self.dilation, self.z_x
        )
        yq = self.int8_matmul(rows)
        y = self.dequant_out(yq).reshape(xa.shape[0], oh, ow, self.out_channels).transpose(0, 3, 1, 2)
        return Tensor(np.ascontiguousarray(y))
