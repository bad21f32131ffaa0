"""A learnable per-channel activation shift / scale that makes a skewed activation fit one per-tensor grid, trained
with the model and folded into the neighbouring Linear layers for inference (no run-time cost).

Skewed activations (channels with their own offset and spread: LayerNorm outputs of LLMs, linear bottlenecks) waste
a per-tensor grid: the step is set by the widest channel's range, so narrow channels land on a few codes. Per-channel
activation scales would fix it but cannot be factored out of an int8 GEMM's K-sum. The module

    y = (x - shift) / scale          (per channel, last dim)     ->     y_hat = fake_quant(y)   (per tensor)
    x_hat = y_hat * scale + shift                                (what the consumer sees)

learns ``shift`` and ``scale`` (as log_scale, so scale > 0) by back-propagation through the straight-through fake
quantizer together with the model's weights. Unlike BatchNorm it normalises nothing per batch: it is a fixed affine
map at inference, and it is an *equivalence* around the quantizer (the float function is unchanged), like
OmniQuant's "learnable equivalent transformation" / Outlier Suppression+. Folding (exact in real arithmetic):

    producer  W_p' = diag(1/scale) W_p,   b_p' = (b_p - shift) / scale      (it now outputs y)
    consumer  W_c' = W_c diag(scale),     b_c' = b_c + W_c shift            (it now consumes y_hat)

so the deployed network is producer' -> per-tensor quantize -> consumer', with nothing in between; this needs no
nonlinearity between producer and consumer (a positive scale alone also passes through ReLU).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from .._inputs import as_array, is_int
from ..autograd import Tensor
from ..nn import Linear, Module, Parameter
from .affine import calculate_qparams, qrange, quantize
from .fake_quant import fake_quantize


class LearnableShiftScale(Module):
    """Learnable per-channel shift / scale around a per-tensor fake quantizer (see module docstring).

    ``init_from(x)`` sets shift to each channel's mid-range and scale to its half-range over the widest one (so every
    channel spans about the same interval of y) and fits the quantizer's per-tensor qparams to y; ``calibrate(x)``
    refits only the quantizer. forward(x) -> x_hat (float, fake-quantized), differentiable in x, shift, log_scale.
    """

    def __init__(self, num_features: int, dtype: str = "int8", symmetric: bool = True) -> None:
        super().__init__()
        if not is_int(num_features) or num_features < 1:
            raise ValueError(f"num_features: must be an int >= 1, got {num_features!r}")
        num_features = int(num_features)
        self.quant_min, self.quant_max = qrange(dtype)
        self.dtype, self.symmetric, self.num_features = dtype, bool(symmetric), num_features
        self.shift = Parameter(np.zeros(num_features, np.float32))
        self.log_scale = Parameter(np.zeros(num_features, np.float32))
        self.q_scale: float | None = None
        self.q_zero_point: int = 0

    def _check(self, x: Any) -> np.ndarray:
        a = as_array(x, "x", dtypes=("f",)).astype(np.float32, copy=False)
        if a.ndim < 1 or a.shape[-1] != self.num_features or a.size == 0:
            raise ValueError(f"x: expected shape [..., {self.num_features}] (channels last), got {a.shape}")
        return a

    @property
    def scale(self) -> np.ndarray:
        return np.exp(self.log_scale.data).astype(np.float32)

    def transform(self, x: Any) -> np.ndarray:
        """y = (x - shift) / scale as numpy (what the folded producer outputs)."""
        a = self._check(x)
        return ((a - self.shift.data) / self.scale).astype(np.float32)

    def calibrate(self, x: Any) -> tuple[float, int]:
        """Fit the per-tensor quantizer to the min / max of y = transform(x)."""
        y = self.transform(x)
        s, z = calculate_qparams(y.min(), y.max(), self.dtype, self.symmetric)
        self.q_scale, self.q_zero_point = float(s), int(z)
        return self.q_scale, self.q_zero_point

    def init_from(self, x: Any) -> LearnableShiftScale:
        a = self._check(x).reshape(-1, self.num_features)
        lo, hi = a.min(0), a.max(0)
        half = np.maximum((hi - lo) / 2, np.float32(1e-6))
        self.shift.data = ((hi + lo) / 2).astype(np.float32)
        self.log_scale.data = np.log(half / half.max()).astype(np.float32)
        self.calibrate(a)
        return self

    def forward(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor):
            x = Tensor(self._check(x))
        if self.q_scale is None:
            self.calibrate(x.data)
        s = self.log_scale.exp()
        y = (x - self.shift) / s
        yq = fake_quantize(y, self.q_scale, self.q_zero_point, self.quant_min, self.quant_max)
        return yq * s + self.shift

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, dtype={self.dtype!r}, q_scale={self.q_scale}"


def _check_linear(m: Any, name: str) -> None:
    if not isinstance(m, Linear):
        raise ValueError(f"{name}: expected a tinylearn.nn.Linear, got {type(m).__name__}")


def fold_shift_scale(producer: Linear, module: LearnableShiftScale, consumer: Linear) -> tuple[Linear, Linear]:
    """(producer', consumer'): copies with the module's transform folded into ``producer`` (it outputs y) and its
    inverse into ``consumer`` (it consumes y_hat); quantize producer'(x) with ``module.q_scale`` /
    ``module.q_zero_point`` in between (``quantized_block``)."""
    _check_linear(producer, "producer")
    _check_linear(consumer, "consumer")
    if not isinstance(module, LearnableShiftScale):
        raise ValueError(f"module: expected a LearnableShiftScale, got {type(module).__name__}")
    c = module.num_features
    if producer.out_features != c or consumer.in_features != c:
        raise ValueError(
            f"module: {c} channels, but producer.out_features={producer.out_features} and "
            f"consumer.in_features={consumer.in_features}"
        )
    s = module.scale.astype(np.float64)
    d = module.shift.data.astype(np.float64)
    p, q = copy.deepcopy(producer), copy.deepcopy(consumer)
    bp = producer.bias.data.astype(np.float64) if producer.bias is not None else np.zeros(c)
    p.weight.data = (producer.weight.data.astype(np.float64) / s[:, None]).astype(np.float32)
    if p.bias is None:
        p.bias = Parameter(np.zeros(c, np.float32))
    p.bias.data = ((bp - d) / s).astype(np.float32)
    wc = consumer.weight.data.astype(np.float64)
    q.weight.data = (wc * s[None, :]).astype(np.float32)
    bc = consumer.bias.data.astype(np.float64) if consumer.bias is not None else np.zeros(consumer.out_features)
    if q.bias is None:
        q.bias = Parameter(np.zeros(consumer.out_features, np.float32))
    q.bias.data = (bc + wc @ d).astype(np.float32)
    return p, q


def quantized_block(producer: Linear, consumer: Linear, x: Any, scale: float, zero_point: int, dtype: str = "int8"):
    """consumer(dequantize(quantize(producer(x)))) with per-tensor (scale, zero_point): the deployed folded block.
    Returns (output, codes) as numpy arrays."""
    _check_linear(producer, "producer")
    _check_linear(consumer, "consumer")
    xa = as_array(x, "x", dtypes=("f",)).astype(np.float32, copy=False)
    if xa.ndim != 2 or xa.shape[1] != producer.in_features:
        raise ValueError(f"x: expected shape [N, {producer.in_features}], got {xa.shape}")
    y = producer(Tensor(xa)).data
    codes = quantize(y, scale, zero_point, dtype)
    yhat = (codes.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)
    return consumer(Tensor(yhat)).data, codes
