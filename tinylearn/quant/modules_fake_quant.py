"""The fake-quantization modules QAT trains through (torch.ao.quantization's ``FakeQuantize`` and the LSQ
``LearnableFakeQuantize``) and ``weight_observer``, the per-channel symmetric weight observer ``prepare`` and
``convert`` use for int8 and int4 codes. The functional forms are in ``tinylearn.quant.fake_quant``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._inputs import is_int
from ..autograd import Tensor
from ..nn import Module, Parameter
from .fake_quant import fake_quantize, fake_quantize_learnable
from .observers import PerChannelMinMaxObserver


class FakeQuantize(Module):
    """torch.ao.quantization.FakeQuantize: observe (if enabled), recompute qparams, fake-quantize with STE."""

    def __init__(self, observer: Any, ch_axis: int | None = None) -> None:
        super().__init__()
        self.activation_post_process = observer
        self.quant_min, self.quant_max = observer.quant_min, observer.quant_max
        self.ch_axis = ch_axis
        self.observer_enabled, self.fake_quant_enabled = True, True
        self.scale: Any = None
        self.zero_point: Any = None

    def calculate_qparams(self) -> tuple[Any, Any]:
        return self.activation_post_process.calculate_qparams()

    def forward(self, x: Tensor) -> Tensor:
        if self.observer_enabled:
            self.activation_post_process(x.data)
            self.scale, self.zero_point = self.calculate_qparams()
        if not self.fake_quant_enabled or self.scale is None:
            return x
        return fake_quantize(x, self.scale, self.zero_point, self.quant_min, self.quant_max, axis=self.ch_axis)


class LearnableFakeQuantize(Module):
    """LSQ: the scale (and optionally the zero point) is a Parameter, initialised from the observer on the first
    batch and then learned with the LSQ gradient (grad_factor = 1/sqrt(numel * quant_max), as in the paper).
    ``channels``: number of per-channel scales (weights: out_channels) or 1 (per-tensor activations)."""

    def __init__(
        self, observer: Any, ch_axis: int | None = None, learn_zero_point: bool = False, channels: int = 1
    ) -> None:
        super().__init__()
        self.activation_post_process = observer
        self.quant_min, self.quant_max = observer.quant_min, observer.quant_max
        self.ch_axis, self.learn_zero_point = ch_axis, learn_zero_point
        n = 1 if ch_axis is None else int(channels)
        self.scale = Parameter(np.ones(n, np.float32))  # created now so optimizers built before forward see it
        zp = np.zeros(n, np.float32)
        if learn_zero_point:
            self.zero_point = Parameter(zp)
        else:
            self.zero_point = Tensor(zp)
        self.initialized = False
        self.fake_quant_enabled = True

    def calculate_qparams(self) -> tuple[Any, Any]:
        s = np.abs(self.scale.data).astype(np.float32) + np.float32(1e-9)
        z = np.clip(np.rint(self.zero_point.data), self.quant_min, self.quant_max).astype(np.int64)
        return (float(s[0]), int(z[0])) if self.ch_axis is None else (s, z)

    def forward(self, x: Tensor) -> Tensor:
        if not self.initialized:
            self.activation_post_process(x.data)
            s, z = self.activation_post_process.calculate_qparams()
            n = self.scale.data.size
            self.scale.data = np.broadcast_to(np.asarray(s, np.float32).reshape(-1), (n,)).copy()
            self.zero_point.data = np.broadcast_to(np.asarray(z, np.float32).reshape(-1), (n,)).copy()
            self.initialized = True
        if not self.fake_quant_enabled:
            return x
        n = x.data.size if self.ch_axis is None else x.data.size // x.data.shape[self.ch_axis]
        gf = 1.0 / np.sqrt(max(n, 1) * max(self.quant_max, 1))
        if np.any(self.scale.data <= 0):
            self.scale.data = np.maximum(np.abs(self.scale.data), np.float32(1e-6))
        return fake_quantize_learnable(
            x, self.scale, self.zero_point, self.quant_min, self.quant_max, axis=self.ch_axis, grad_factor=gf
        )


def weight_observer(bits: int = 8, ch_axis: int = 0) -> PerChannelMinMaxObserver:
    """Per-channel symmetric weight observer for int8 ([-128, 127]) or int4 ([-8, 7]) codes (``bits`` 8 or 4)."""
    if not is_int(bits) or bits not in (4, 8):
        raise ValueError(f"bits: weight_observer supports 4 or 8 bits, got {bits!r}")
    return PerChannelMinMaxObserver(ch_axis, "int8" if bits == 8 else "int4", symmetric=True, averaging_constant=1.0)
