"""Post-training quantization and QAT on tinylearn.nn models, shaped like torch.ao.quantization (eager mode):

    prepared = prepare(model, qconfig)        # copy, fold BatchNorm into the conv, fuse ReLU, attach observers
    calibrate(prepared, X_calib)              # run data through: observers record ranges
    qmodel = convert(prepared)                # swap Linear/Conv2d(+ReLU) for int8 (or int4 / fp8) layers

    qat = prepare_qat(model, qconfig)         # fake-quant weights (per channel) and activations, STE gradients
    fit(qat, X, y, ...)                       # fine-tune through the quantization noise
    qmodel = convert(qat)

QConfig.mode: "int8" (static W8A8, the int8 GEMM), "int4_weight" (weight-only int4, group-wise, float activations),
"w4a8" (int4 weights as int8 codes in [-8, 7] on the int8 GEMM), "fp8" (simulated E4M3 weights + activations).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..autograd import Tensor, no_grad
from ..nn import BatchNorm2d, Conv2d, Identity, Linear, Module, Parameter, ReLU, Sequential
from .modules import (
    FakeQuantize,
    FP8Linear,
    Int4WeightOnlyConv2d,
    Int4WeightOnlyLinear,
    LearnableFakeQuantize,
    QuantizedConv2d,
    QuantizedLinear,
    weight_observer,
)
from .observers import HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver, PerChannelMinMaxObserver

MODES = ("int8", "int4_weight", "w4a8", "fp8")


@dataclass
class QConfig:
    """What to observe and how to convert. ``activation()`` / ``weight()`` build fresh observers."""

    activation: Callable[[], Any] = field(default=lambda: MinMaxObserver("int8", symmetric=False))
    weight: Callable[[], Any] = field(default=lambda: weight_observer(8))
    mode: str = "int8"
    group_size: int = 32  # int4_weight only
    learnable: bool = False  # QAT with LSQ scales

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"qconfig.mode: unknown mode {self.mode!r}; known: {MODES}")


def default_qconfig(mode: str = "int8", activation: str = "minmax", learnable: bool = False) -> QConfig:
    """Presets: activation observer "minmax" | "histogram" (KL) | "moving_average"; weights per-channel symmetric."""
    acts = {
        "minmax": lambda: MinMaxObserver("int8"),
        "histogram": lambda: HistogramObserver(method="kl", dtype="int8", symmetric=False),
        "moving_average": lambda: MovingAverageMinMaxObserver(0.01, "int8"),
    }
    if activation not in acts:
        raise ValueError(f"activation: unknown observer preset {activation!r}; known: {list(acts)}")
    bits = 4 if mode in ("w4a8", "int4_weight") else 8
    return QConfig(activation=acts[activation], weight=lambda: weight_observer(bits), mode=mode, learnable=learnable)


# ------------------------------------------------------------------------------------------ fusion
def _children(m: Module) -> list[tuple[str, Module]]:
    return [(k, v) for k, v in m._modules.items() if v is not None]


def fuse_modules(model: Module) -> Module:
    """In place: Conv2d followed by BatchNorm2d -> Conv2d with folded weights (BN -> Identity); a Linear/Conv2d
    followed by ReLU gets ``_fused_relu = True`` (the int8 layer clamps at its zero point, so its output range is
    observed after the ReLU; the ReLU module stays and is then a no-op). The float model's outputs are unchanged."""
    from ..conv import fold_batchnorm

    for mod in list(model.modules()):
        if not isinstance(mod, Sequential):
            continue
        kids = _children(mod)
        for (_, a), (n1, b) in zip(kids, kids[1:]):
            if isinstance(a, Conv2d) and isinstance(b, BatchNorm2d):
                bias = a.bias.data if a.bias is not None else np.zeros(a.out_channels, np.float32)
                gamma = b.weight.data if b.weight is not None else np.ones(b.num_features, np.float32)
                beta = b.bias.data if b.bias is not None else np.zeros(b.num_features, np.float32)
                w, bb = fold_batchnorm(a.weight.data, bias, b.running_mean.data, b.running_var.data, gamma, beta, b.eps)
                a.weight = Parameter(np.asarray(w, np.float32))
                a.bias = Parameter(np.asarray(bb, np.float32))
                mod._modules[n1] = Identity()
        kids = _children(mod)
        nonid = [(n, k) for n, k in kids if not isinstance(k, Identity)]
        for (_, a), (_, b) in zip(nonid, nonid[1:]):
            if isinstance(a, Linear | Conv2d) and isinstance(b, ReLU):
                object.__setattr__(a, "_fused_relu", True)  # the ReLU stays: a no-op after the clamped layer
    return model


# ------------------------------------------------------------------------------------------ observed / QAT wrappers
class _WrappedLayer(Module):
    """What the PTQ and QAT wrappers of a float Linear/Conv2d share: the layer, its qconfig and fused ReLU, the
    running input |max| (``amax_in``) and the output observer ``out_obs`` that ``convert`` reads."""

    out_obs: Any

    def __init__(self, mod: Module, qconfig: QConfig) -> None:
        super().__init__()
        self.mod = mod
        self.qconfig = qconfig
        self.relu = bool(getattr(mod, "_fused_relu", False))
        self.amax_in = 0.0

    def _track_input(self, x: Tensor) -> None:
        self.amax_in = max(self.amax_in, float(np.abs(x.data).max()) if x.data.size else 0.0)

    def _output(self, y: Tensor) -> Tensor:
        """The layer's output ``y`` through the fused ReLU, seen by the output observer."""
        if self.relu:
            y = y.relu()
        self.out_obs(y.data)
        return y


class ObservedModule(_WrappedLayer):
    """A float Linear/Conv2d with observers on its input, output and weight (PTQ calibration)."""

    def __init__(self, mod: Module, qconfig: QConfig) -> None:
        super().__init__(mod, qconfig)
        self.in_obs, self.out_obs, self.w_obs = qconfig.activation(), qconfig.activation(), qconfig.weight()

    def forward(self, x: Tensor) -> Tensor:
        self.in_obs(x.data)
        self._track_input(x)
        return self._output(self.mod(x))


class QATModule(_WrappedLayer):
    """A float Linear/Conv2d trained through fake quantization of its weight (per channel) and input."""

    def __init__(self, mod: Module, qconfig: QConfig) -> None:
        super().__init__(mod, qconfig)
        w_obs = qconfig.weight()
        ch = 0 if isinstance(w_obs, PerChannelMinMaxObserver) else None
        if qconfig.learnable:
            self.w_fq = LearnableFakeQuantize(w_obs, ch_axis=ch, channels=mod.weight.shape[0])
            self.in_fq = LearnableFakeQuantize(qconfig.activation()) if qconfig.mode != "int4_weight" else None
        else:
            self.w_fq = FakeQuantize(w_obs, ch_axis=ch)
            self.in_fq = FakeQuantize(qconfig.activation()) if qconfig.mode != "int4_weight" else None
        self.out_obs = qconfig.activation()  # output range for the int8 layer after convert

    def forward(self, x: Tensor) -> Tensor:
        from ..nn import functional as F

        self._track_input(x)
        if self.in_fq is not None:
            x = self.in_fq(x)
        w = self.w_fq(self.mod.weight)
        m = self.mod
        if isinstance(m, Linear):
            y = F.linear(x, w, m.bias)
        else:
            y = F.conv2d(x, w, m.bias, m.stride, m.padding, m.dilation, m.groups)
        return self._output(y)


def _swap(model: Module, fn: Callable[[Module], Module | None]) -> Module:
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            new = fn(child)
            if new is not None:
                parent._modules[name] = new
    return model


def _resolve(qconfig: QConfig | str | None) -> QConfig:
    if qconfig is None:
        return default_qconfig()
    if isinstance(qconfig, str):  # torch-style backend names mean the default int8 config
        if qconfig in MODES:
            return default_qconfig(qconfig)
        if qconfig in ("fbgemm", "x86", "qnnpack", "onednn", "default"):
            return default_qconfig("int8")
        raise ValueError(f"qconfig: unknown name {qconfig!r}; use a QConfig or one of {MODES}")
    if not isinstance(qconfig, QConfig):
        raise TypeError(f"qconfig: expected a QConfig, a mode name or None, got {type(qconfig).__name__}")
    return qconfig


def _wrap_layers(model: Module, qconfig: QConfig | str | None, inplace: bool, wrapper: type[_WrappedLayer]) -> Module:
    """``model`` (copied unless inplace) in eval mode, fused, with every Linear/Conv2d wrapped in ``wrapper``."""
    qconfig = _resolve(qconfig)
    if not isinstance(model, Module):
        raise TypeError(f"model: expected a tinylearn.nn.Module, got {type(model).__name__}")
    m = model if inplace else copy.deepcopy(model)
    m.eval()
    fuse_modules(m)
    return _swap(m, lambda c: wrapper(c, qconfig) if isinstance(c, Linear | Conv2d) else None)


def prepare(model: Module, qconfig: QConfig | str | None = None, inplace: bool = False) -> Module:
    """Copy (unless inplace), fuse Conv+BN(+ReLU) / Linear+ReLU, wrap every Linear/Conv2d with observers."""
    return _wrap_layers(model, qconfig, inplace, ObservedModule)


def prepare_qat(model: Module, qconfig: QConfig | str | None = None, inplace: bool = False) -> Module:
    """Copy, fold BN (running stats) and fuse ReLU, then wrap Linear/Conv2d for quantization-aware training."""
    m = _wrap_layers(model, qconfig, inplace, QATModule)
    m.train()
    return m


def calibrate(model: Module, X: Any, batch_size: int = 256) -> Module:
    """Run calibration data through a prepared model without gradients. ``X``: an array / Tensor [N, ...]
    (batched by ``batch_size``) or an iterable of batches (arrays, Tensors, or (x, y) tuples as a DataLoader gives)."""
    model.eval()
    if isinstance(X, Tensor):
        X = X.data
    if isinstance(X, np.ndarray):
        batches: Any = (X[i : i + batch_size] for i in range(0, len(X), batch_size))
    else:
        batches = X
    with no_grad():
        for xb in batches:
            if isinstance(xb, tuple | list):
                xb = xb[0]
            model(xb if isinstance(xb, Tensor) else Tensor(np.asarray(xb, np.float32)))
    return model


def _convert_one(w: Module) -> Module | None:
    if not isinstance(w, ObservedModule | QATModule):
        return None
    m, qc = w.mod, w.qconfig
    weight = m.weight.data
    bias = m.bias.data if m.bias is not None else None
    is_conv = isinstance(m, Conv2d)
    if qc.mode == "int4_weight":
        if is_conv:
            return Int4WeightOnlyConv2d(m, weight, bias, qc.group_size, relu=w.relu)
        return Int4WeightOnlyLinear(weight, bias, qc.group_size, relu=w.relu)
    if qc.mode == "fp8":
        return FP8Linear(weight, bias, w.amax_in, relu=w.relu, conv=m if is_conv else None)
    # int8 / w4a8 on the int8 GEMM
    if isinstance(w, QATModule):
        w_scale, _ = w.w_fq.calculate_qparams()
        in_qp = w.in_fq.calculate_qparams()
    else:
        w.w_obs(weight)
        w_scale, _ = w.w_obs.calculate_qparams()
        in_qp = w.in_obs.calculate_qparams()
    out_qp = w.out_obs.calculate_qparams()
    wr = (-8, 7) if qc.mode == "w4a8" else (-128, 127)
    if is_conv:
        return QuantizedConv2d(m, w_scale, in_qp, out_qp, relu=w.relu, w_qrange=wr)
    return QuantizedLinear.from_float(m, w_scale, in_qp, out_qp, relu=w.relu, w_qrange=wr)


def convert(model: Module, inplace: bool = True) -> Module:
    """Swap every observed / QAT layer for its quantized version (qconfig.mode decides which); eval mode."""
    m = model if inplace else copy.deepcopy(model)
    if not any(isinstance(c, ObservedModule | QATModule) for c in m.modules()):
        raise ValueError("model: nothing to convert — call prepare() or prepare_qat() (and calibrate) first")
    _swap(m, _convert_one)
    m.eval()
    return m


def model_size_bytes(model: Module) -> int:
    """Bytes of weights as stored: float parameters at 4 B, quantized layers at their packed size."""
    total = 0
    for mod in model.modules():
        if hasattr(mod, "weight_bytes"):
            total += int(mod.weight_bytes)
        else:
            total += sum(p.data.nbytes for p in mod._parameters.values() if p is not None)
    return total
