"""Quantized layers: int8 Linear/Conv2d on the exact int8 GEMM, int4 weight-only and simulated-FP8 layers, and the
FakeQuantize modules QAT trains through.

Dynamic int8 Linear (torch.ao.quantization.quantize_dynamic): weights quantized and packed once at construction;
activations quantized per call from their own min/max (per tensor, or per row) to uint8 codes 0..255, or 0..127
with ``reduce_range`` (torch's default on x86: 7-bit codes keep AVX2's vpmaddubsw pair sums from saturating);
    y = float((x_q - z_x) @ w_q^T) * (s_x * s_w[j]) + b[j]          (one fused C++ call: int8_dynamic_linear)
registered as op ``quant.int8_dynamic_linear`` (a cpp version per packed kernel + the numpy reference).

The static int8 layers (``QuantizedLinear``, ``QuantizedConv2d``: the requantization arithmetic of the int8 pipeline)
are in ``tinylearn.quant.modules_int8``, the FakeQuantize modules QAT trains through and ``weight_observer`` in
``tinylearn.quant.modules_fake_quant``; this module re-exports them (every ``tinylearn.quant.modules.X`` of before the
split still works).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends
from ..autograd import Tensor
from ..nn import Conv2d, Linear, Module
from .affine import quantize
from .fp8 import fp8_decode, fp8_encode
from .gemm import PACKED_KERNELS, PackedInt8Weight, packed_runs_here, packed_versions
from .int4 import dequantize_groupwise, pack_int4, quantize_groupwise, unpack_int4
from .modules_fake_quant import FakeQuantize, LearnableFakeQuantize, weight_observer  # noqa: F401  (re-exported)
from .modules_int8 import QuantizedConv2d, QuantizedLinear, _Int8Core, _pair, im2col_codes  # noqa: F401  (re-exported)

DYNAMIC_OP = "quant.int8_dynamic_linear"  # DynamicQuantizedLinear.forward: quantize x, packed GEMM, epilogue


def _register_dynamic() -> None:
    """quant.int8_dynamic_linear: one cpp version per packed kernel (the fused C++ call), the numpy reference."""
    for v in PACKED_KERNELS:

        def fn(layer: DynamicQuantizedLinear, x2: np.ndarray, v: str = v) -> tuple[Any, Any, Any, str]:
            pk = layer.w_packed.packed
            return backends.load_C("quant").int8_dynamic_linear(
                x2, pk[0], pk[1], layer.out_features, layer.w_scale, layer.bias_f, layer.reduce_range, layer.per_row, v
            )

        backends.register(DYNAMIC_OP, "cpp", fn, version=v, available=lambda v=v: packed_runs_here(v))

    def example(rng: Any) -> tuple[tuple, dict]:
        w, b = rng.standard_normal((6, 16)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
        return (DynamicQuantizedLinear(w, b), rng.standard_normal((3, 16)).astype(np.float32)), {}

    backends.register(
        DYNAMIC_OP, "numpy", lambda layer, x2: layer._forward_numpy(x2), version="reference", example=example
    )


class DynamicQuantizedLinear(Module):
    """Dynamic int8 Linear, like torch.ao.nn.quantized.dynamic.Linear: float in, float out.

    Weights: symmetric int8, per tensor (torch's default dynamic qconfig) or per output channel, prepacked once.
    Activations: quantized on every call to uint8 with scale/zero point from the batch's min/max (``per_row``:
    one pair per row), 7-bit codes with ``reduce_range`` (torch's x86 default). Bias is added in the fused
    epilogue. ``version`` (keyword-only) picks the C++ kernel (``tl.quant.gemm.packed_versions()``); None = best for
    this CPU. Forward dispatches op ``quant.int8_dynamic_linear`` (``backends.use`` pins it; numpy without _C).
    """

    def __init__(
        self,
        weight: Any,
        bias: Any = None,
        per_channel: bool = False,
        reduce_range: bool = True,
        per_row: bool = False,
        *,
        version: str | None = None,
    ) -> None:
        super().__init__()
        from .affine import calculate_qparams

        w = np.asarray(weight.data if isinstance(weight, Tensor) else weight, np.float32)
        if w.ndim != 2 or w.shape[0] == 0 or w.shape[1] == 0:
            raise ValueError(f"weight: expected a non-empty 2-D [out_features, in_features] array, got {w.shape}")
        if not np.all(np.isfinite(w)):
            raise ValueError("weight: contains NaN or Inf")
        if version is not None and version not in backends.versions(DYNAMIC_OP, "cpp"):
            raise ValueError(f"version: {version!r} is not one of {backends.versions(DYNAMIC_OP, 'cpp')}")
        self.out_features, self.in_features = w.shape
        if per_channel:
            ws, _ = calculate_qparams(w.min(1), w.max(1), "int8", symmetric=True)
            axis = 0
        else:
            ws, _ = calculate_qparams(float(w.min()), float(w.max()), "int8", symmetric=True)
            axis = None
        self.w_scale = np.asarray(ws, np.float32).reshape(-1)
        zp = np.zeros(self.w_scale.shape, np.int64) if per_channel else 0
        self.w_q = quantize(w, self.w_scale if per_channel else float(self.w_scale[0]), zp, "int8", axis=axis)
        self.w_packed = PackedInt8Weight(np.ascontiguousarray(self.w_q.T))  # [K, N], packed once
        b = None if bias is None else np.asarray(bias.data if isinstance(bias, Tensor) else bias, np.float32)
        if b is not None and b.shape != (self.out_features,):
            raise ValueError(f"bias: expected shape ({self.out_features},), got {b.shape}")
        self.bias_f = b
        self.per_channel, self.reduce_range, self.per_row = bool(per_channel), bool(reduce_range), bool(per_row)
        self.version = version
        self.last_kernel: str | None = None  # the C++ kernel the last forward ran
        self.last_act_qparams: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def from_float(
        cls, mod: Linear, per_channel: bool = False, reduce_range: bool = True, per_row: bool = False
    ) -> DynamicQuantizedLinear:
        return cls(mod.weight.data, None if mod.bias is None else mod.bias.data, per_channel, reduce_range, per_row)

    @property
    def weight_bytes(self) -> int:
        return self.w_q.size + 4 * self.w_scale.size + (0 if self.bias_f is None else 4 * self.bias_f.size)

    def int32_accumulators(self, x_codes: np.ndarray, zero_point: int | np.ndarray) -> np.ndarray:
        """(x_codes - zero_point) @ w_q^T with the packed weights (exact int32): the GEMM inside forward."""
        z = np.asarray(zero_point).reshape(-1)
        if z.size == 1:
            return self.w_packed.matmul(x_codes, int(z[0]), version=self.version)
        return self.w_packed.matmul(x_codes, 0, version=self.version) - (z[:, None] * self.w_q.astype(np.int32).sum(1))

    def forward(self, x: Any) -> Tensor:
        xa = x.data if isinstance(x, Tensor) else np.asarray(x, np.float32)
        if xa.ndim < 1 or xa.shape[-1] != self.in_features:
            raise ValueError(f"x: last dimension must be in_features={self.in_features}, got shape {xa.shape}")
        lead = xa.shape[:-1]
        x2 = np.ascontiguousarray(xa.reshape(-1, self.in_features), dtype=np.float32)
        if self.w_packed.packed is None:  # no C++ extension: the same arithmetic in numpy
            y, sx, zx, kern = backends.dispatch(DYNAMIC_OP, self, x2, backend="numpy")
        else:
            if self.version not in (None, "auto") and not packed_runs_here(self.version):
                raise ValueError(f"version: {self.version!r} is above this CPU's level (it runs {packed_versions()})")
            y, sx, zx, kern = backends.dispatch(DYNAMIC_OP, self, x2, version=self.version)
        self.last_kernel, self.last_act_qparams = kern, (sx, zx)
        return Tensor(y.reshape(*lead, self.out_features))

    def act_qparams(self, x2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """torch's dynamic activation qparams (fbgemm ChooseQuantizationParams) for x2 [M, K], per tensor or row."""
        qmax = 127 if self.reduce_range else 255
        rows = x2 if self.per_row else x2.reshape(1, -1)
        if not np.all(np.isfinite(rows)):
            raise ValueError("x: contains NaN or Inf (no finite quantization range)")
        mn = np.minimum(rows.min(1) if rows.size else np.zeros(len(rows)), 0).astype(np.float32)
        mx = np.maximum(rows.max(1) if rows.size else np.zeros(len(rows)), 0).astype(np.float32)
        s = ((mx.astype(np.float64) - mn) / qmax).astype(np.float32)
        s = np.where((s == 0) | ~np.isfinite(np.float32(1) / np.where(s == 0, 1, s)), np.float32(0.1), s)
        s64 = s.astype(np.float64)
        zmin, zmax = -mn / s64, qmax - mx / s64
        emin, emax = np.abs(mn / s64), qmax + np.abs(mx / s64)
        z = np.clip(np.rint(np.where(emin < emax, zmin, zmax)), 0, qmax).astype(np.int32)
        return s.astype(np.float32), z

    def quantize_input(self, x2: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """x2 [M, K] -> (uint8 codes, scales, zero points) exactly as forward quantizes it."""
        s, z = self.act_qparams(x2)
        qmax = 127 if self.reduce_range else 255
        sr = s[:, None] if self.per_row else s[0]
        zr = z[:, None] if self.per_row else z[0]
        q = np.clip(np.rint(x2 * (np.float32(1) / sr)) + zr, 0, qmax).astype(np.uint8)
        return q, s, z

    def _forward_numpy(self, x2: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
        q, s, z = self.quantize_input(x2)
        acc = self.int32_accumulators(q, z if self.per_row else z[0])
        sx = s[:, None] if self.per_row else s[0]
        y = acc.astype(np.float32) * (sx * self.w_scale)
        if self.bias_f is not None:
            y = y + self.bias_f
        return y.astype(np.float32), s, z, "numpy"

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, per_channel={self.per_channel}, "
            f"reduce_range={self.reduce_range}, per_row={self.per_row}"
        )


_register_dynamic()


def quantize_dynamic(
    model: Module, per_channel: bool = False, reduce_range: bool = True, per_row: bool = False
) -> Module:
    """A copy of ``model`` with every ``Linear`` replaced by a ``DynamicQuantizedLinear`` (like torch's
    ``quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)``); the original is left untouched."""
    import copy

    if not isinstance(model, Module):
        raise TypeError(f"model: expected a tinylearn Module, got {type(model).__name__}")
    if isinstance(model, Linear):
        return DynamicQuantizedLinear.from_float(model, per_channel, reduce_range, per_row)
    out = copy.deepcopy(model)

    def swap(mod: Module) -> None:
        for name, child in list(mod._modules.items()):
            if isinstance(child, Linear):
                setattr(mod, name, DynamicQuantizedLinear.from_float(child, per_channel, reduce_range, per_row))
            elif isinstance(child, Module):
                swap(child)

    swap(out)
    return out


class Int4WeightOnlyLinear(Module):
    """Weight-only int4: weights packed two per byte with group-wise scales; activations stay float32.
    y = x @ dequantize_groupwise(w_q)^T + b (the dequantize happens per call, as weight-only kernels do in tiles)."""

    def __init__(
        self,
        weight: np.ndarray,
        bias: np.ndarray | None,
        group_size: int = 128,
        symmetric: bool = True,
        relu: bool = False,
    ) -> None:
        super().__init__()
        w = np.asarray(weight, np.float32)
        shape = w.shape
        w2 = w.reshape(shape[0], -1)
        gs = group_size if w2.shape[1] % group_size == 0 else w2.shape[1]
        q, self.scales, self.zero_points = quantize_groupwise(w2, gs, 4, symmetric)
        self.packed = pack_int4(q if symmetric else q.astype(np.int16) - 8)
        self.symmetric, self.group_size, self.shape2d, self.shape = symmetric, gs, w2.shape, shape
        self.bias_f = None if bias is None else np.asarray(bias, np.float32)
        self.relu = relu

    def dequantized_weight(self) -> np.ndarray:
        q = unpack_int4(self.packed, int(np.prod(self.shape2d))).reshape(self.shape2d)
        if not self.symmetric:
            q = q.astype(np.int16) + 8
        return dequantize_groupwise(q, self.scales, self.zero_points, self.group_size)

    @property
    def weight_bytes(self) -> int:
        return (
            self.packed.size
            + 4 * self.scales.size
            + (0 if self.symmetric else self.zero_points.size)
            + (0 if self.bias_f is None else 4 * self.bias_f.size)
        )

    def _finish(self, y: np.ndarray) -> Tensor:
        return Tensor(np.maximum(y, 0) if self.relu else y)

    def forward(self, x: Tensor) -> Tensor:
        xa = x.data if isinstance(x, Tensor) else np.asarray(x, np.float32)
        y = xa @ self.dequantized_weight().T
        if self.bias_f is not None:
            y = y + self.bias_f
        return self._finish(y.astype(np.float32))


class Int4WeightOnlyConv2d(Int4WeightOnlyLinear):
    def __init__(
        self,
        conv: Conv2d,
        weight: np.ndarray,
        bias: np.ndarray | None,
        group_size: int = 128,
        symmetric: bool = True,
        relu: bool = False,
    ) -> None:
        super().__init__(weight, bias, group_size, symmetric, relu)
        self.conv_args = (conv.stride, conv.padding, conv.dilation)
        self.kernel_size = conv.kernel_size

    def forward(self, x: Tensor) -> Tensor:
        from ..conv import conv2d

        xa = x.data if isinstance(x, Tensor) else np.asarray(x, np.float32)
        w = self.dequantized_weight().reshape(self.shape)
        return self._finish(conv2d(xa, w, self.bias_f, *self.conv_args).astype(np.float32))


class FP8Linear(Module):
    """Simulated FP8 (E4M3) Linear: weights and activations cast to E4M3 with per-tensor scales
    (weights: amax of w; activations: calibrated amax), products accumulated in float32."""

    def __init__(
        self,
        weight: np.ndarray,
        bias: np.ndarray | None,
        act_amax: float,
        relu: bool = False,
        fmt: str = "e4m3",
        conv: Conv2d | None = None,
    ) -> None:
        super().__init__()
        w = np.asarray(weight, np.float32)
        self.fmt, self.relu, self.shape = fmt, relu, w.shape
        fmax = 448.0 if fmt == "e4m3" else 57344.0
        self.w_scale = np.float32(fmax / max(float(np.abs(w).max()), 1e-12))
        self.w_codes = fp8_encode(w * self.w_scale, fmt, saturate=True)
        self.x_scale = np.float32(fmax / max(float(act_amax), 1e-12))
        self.bias_f = None if bias is None else np.asarray(bias, np.float32)
        self.conv_args = None if conv is None else (conv.stride, conv.padding, conv.dilation)

    @property
    def weight_bytes(self) -> int:
        return self.w_codes.size + 4 + (0 if self.bias_f is None else 4 * self.bias_f.size)

    def forward(self, x: Tensor) -> Tensor:
        xa = x.data if isinstance(x, Tensor) else np.asarray(x, np.float32)
        xq = fp8_decode(fp8_encode(xa * self.x_scale, self.fmt, saturate=True), self.fmt)
        w = fp8_decode(self.w_codes, self.fmt)
        if self.conv_args is None:
            y = (xq @ w.T) / (self.x_scale * self.w_scale)
        else:
            from ..conv import conv2d

            y = conv2d(xq, w, None, *self.conv_args) / (self.x_scale * self.w_scale)
        if self.bias_f is not None:
            y = y + (self.bias_f if self.conv_args is None else self.bias_f[None, :, None, None])
        y = y.astype(np.float32)
        return Tensor(np.maximum(y, 0) if self.relu else y)
