"""LoRA (Hu et al. 2021) on ``tl.nn.Linear``: a frozen base weight plus a trainable low-rank update [Q100].

    y = x W^T + b + dropout(x) A^T B^T * (alpha / r)        A [r, in], B [out, r], scaling = alpha / r

Why it works: the weight *update* of fine-tuning has low intrinsic rank, so learning B.A (r (in + out) numbers)
instead of W (in * out) reaches nearly the same loss with a fraction of the trainable parameters and of the
optimizer state. Initialisation is peft's default: A kaiming-uniform with a = sqrt(5) (U(+-1/sqrt(in))), B = 0,
so the wrapped model starts exactly at the base model and the first step only moves B.

    LoRALinear(base, r, alpha, dropout)   wraps a Linear; ``base`` keeps its Parameters (frozen by apply_lora)
    merge() / unmerge()                   W += scaling B.A (inference: zero extra latency) / W -= scaling B.A;
                                          merging twice or unmerging an unmerged layer raises RuntimeError
    apply_lora(model, target_modules, r, alpha)   replaces matching Linear submodules in place (a name matches
                                          when it equals a target or ends with "." + target, as peft matches) and
                                          sets requires_grad False on every non-adapter parameter
    lora_state_dict / load_lora_state_dict        only the adapter tensors ("<path>.lora_A", "<path>.lora_B")
    trainable_parameters(model)           {"trainable", "total", "fraction"}

Backward runs through tinylearn autograd: grads reach A and B (and x); the frozen base gets none.
peft's names and state_dict format: ``tinylearn.compress.peft_compat``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..autograd.tensor import Tensor
from ..nn import functional as F
from ..nn import init
from ..nn.layers import Linear
from ..nn.module import Module
from ..nn.parameter import Parameter


def _check_rank(r: Any, in_features: int, out_features: int, where: str = "") -> int:
    if isinstance(r, bool) or not isinstance(r, int | np.integer):
        raise TypeError(f"r: expected an int rank, got {type(r).__name__} {r!r}")
    if not 1 <= r <= min(in_features, out_features):
        raise ValueError(
            f"r: rank must be in [1, min(in_features, out_features) = {min(in_features, out_features)}]{where}, got {r}"
        )
    return int(r)


def _check_alpha(alpha: Any) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float | np.integer | np.floating):
        raise TypeError(f"alpha: expected a number, got {type(alpha).__name__} {alpha!r}")
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha: must be a finite number > 0, got {alpha}")
    return float(alpha)


def _check_dropout(p: Any) -> float:
    if isinstance(p, bool) or not isinstance(p, int | float | np.integer | np.floating) or not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: probability must be in [0, 1), got {p!r}")
    return float(p)


def init_adapter(layer: Module, base: Linear, r: int, alpha: float, dropout: float, dtype: Any) -> None:
    """Validate (r, alpha, dropout) against ``base`` and give ``layer`` its LoRA pair, as peft does: in/out_features,
    r, alpha, dropout_p, scaling = alpha / r, lora_A [r, in] kaiming-uniform(a=sqrt(5)), lora_B [out, r] zeros
    (so the adapted layer starts exactly at the base). Shared by LoRALinear and QLoRALinear."""
    layer.in_features, layer.out_features = base.in_features, base.out_features
    layer.r = _check_rank(r, base.in_features, base.out_features)
    layer.alpha = _check_alpha(alpha)
    layer.dropout_p = _check_dropout(dropout)
    layer.scaling = layer.alpha / layer.r
    layer.lora_A = Parameter(np.zeros((layer.r, layer.in_features), dtype=dtype))
    layer.lora_B = Parameter(np.zeros((layer.out_features, layer.r), dtype=dtype))
    init.kaiming_uniform_(layer.lora_A, a=math.sqrt(5))


class LoRALinear(Module):
    """``base(x) + dropout(x) A^T B^T * alpha / r`` with A [r, in] kaiming-uniform(a=sqrt(5)), B [out, r] zeros."""

    def __init__(self, base: Linear, r: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(base, Linear):
            raise TypeError(f"base: expected a tinylearn.nn.Linear, got {type(base).__name__}")
        _check_rank(r, base.in_features, base.out_features)  # before anything is registered
        self.base_layer = base
        init_adapter(self, base, r, alpha, dropout, base.weight.data.dtype)
        self.merged = False
        self.disabled = False  # True: forward is the base path only (GatedLoRA's fallback)

    def delta_weight(self) -> np.ndarray:
        """scaling * B @ A as a numpy array [out, in] (the update merge() adds to W)."""
        return (self.scaling * (self.lora_B.data @ self.lora_A.data)).astype(self.base_layer.weight.data.dtype)

    def forward(self, x: Tensor) -> Tensor:
        y = self.base_layer(x)
        if self.merged or self.disabled:
            if self.disabled and self.merged:
                raise RuntimeError("forward: a merged LoRALinear cannot be disabled (unmerge it first)")
            return y
        h = F.dropout(x, self.dropout_p, self.training) if self.dropout_p > 0 else x
        return y + (h @ self.lora_A.T) @ self.lora_B.T * self.scaling

    def merge(self) -> None:
        if self.merged:
            raise RuntimeError("merge: this LoRALinear is already merged (call unmerge() first)")
        w = self.base_layer.weight
        w.data = w.data + self.delta_weight()
        self.merged = True

    def unmerge(self) -> None:
        if not self.merged:
            raise RuntimeError("unmerge: this LoRALinear is not merged")
        w = self.base_layer.weight
        w.data = w.data - self.delta_weight()
        self.merged = False

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, r={self.r}, alpha={self.alpha}, "
            f"dropout={self.dropout_p}, merged={self.merged}"
        )


def lora_layers(model: Module) -> list[tuple[str, LoRALinear]]:
    """(dotted name, layer) for every LoRALinear in ``model``."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]


def _linear_names(model: Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, Linear)]


def _matches(name: str, targets: Iterable[str]) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def check_targets(model: Any, target_modules: Any, alpha: Any, dropout: Any) -> list[str]:
    """The arguments apply_lora and apply_qlora share, checked: a Module, a non-empty list of names (one str is a
    list of one), alpha and dropout; returns the target names."""
    if not isinstance(model, Module):
        raise TypeError(f"model: expected a tinylearn.nn.Module, got {type(model).__name__}")
    targets = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"target_modules: expected a non-empty list of module names, got {targets!r}")
    _check_alpha(alpha)
    _check_dropout(dropout)
    return targets


def apply_lora(
    model: Module, target_modules: Iterable[str], r: int = 8, alpha: float = 8.0, dropout: float = 0.0
) -> Module:
    """Wrap every Linear whose dotted name equals or ends with ``"." + target`` in a LoRALinear; freeze the rest."""
    targets = check_targets(model, target_modules, alpha, dropout)
    inside_lora = {n + ".base_layer" for n, _ in lora_layers(model)}
    hits = [(n, m) for n, m in model.named_modules() if isinstance(m, Linear) and n and n not in inside_lora]
    hits = [(n, m) for n, m in hits if _matches(n, targets)]
    if not hits:
        raise ValueError(
            f"target_modules: {targets} match no Linear module; Linear modules in the model: {_linear_names(model)}"
        )
    for n, m in hits:  # validate every rank before modifying anything
        _check_rank(r, m.in_features, m.out_features, f" for {n!r} ({m.out_features}x{m.in_features})")
    for p in model.parameters():
        p.requires_grad = False
    for n, m in hits:
        parent_name, _, child = n.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(m, r, alpha, dropout))
    for _, layer in lora_layers(model):
        layer.lora_A.requires_grad = True
        layer.lora_B.requires_grad = True
    return model


def trainable_parameters(model: Module) -> dict[str, Any]:
    """{"trainable": #elements with requires_grad, "total": #elements, "fraction": trainable / total}."""
    total = trainable = 0
    for p in model.parameters():
        total += p.data.size
        trainable += p.data.size if p.requires_grad else 0
    return {"trainable": trainable, "total": total, "fraction": trainable / total if total else 0.0}


def lora_state_dict(model: Module) -> OrderedDict[str, Tensor]:
    """Only the adapter tensors: "<path>.lora_A" [r, in] and "<path>.lora_B" [out, r] (detached, shared storage)."""
    out: OrderedDict[str, Tensor] = OrderedDict()
    for n, layer in lora_layers(model):
        pre = n + "." if n else ""
        out[pre + "lora_A"] = layer.lora_A.detach()
        out[pre + "lora_B"] = layer.lora_B.detach()
    return out


def load_lora_state_dict(model: Module, sd: Mapping[str, Any]) -> Module:
    """Copy adapter tensors into ``model``'s LoRA layers; keys and shapes must match exactly (merged layers refused)."""
    own = lora_state_dict(model)
    missing, unexpected = [k for k in own if k not in sd], [k for k in sd if k not in own]
    if missing or unexpected:
        raise KeyError(f"sd: missing adapter keys {missing}, unexpected keys {unexpected}")
    for n, layer in lora_layers(model):
        if layer.merged:
            raise RuntimeError(f"load_lora_state_dict: layer {n!r} is merged; unmerge it first")
    for k, t in own.items():
        v = sd[k]
        arr = np.asarray(v.detach().cpu().numpy() if hasattr(v, "cpu") else getattr(v, "data", v))
        if arr.shape != t.shape:
            raise ValueError(f"sd[{k!r}]: shape {arr.shape} does not match the adapter's {t.shape}")
        np.copyto(t.data, arr, casting="unsafe")
    return model


def merge_lora(model: Module) -> Module:
    for _, layer in lora_layers(model):
        layer.merge()
    return model


def unmerge_lora(model: Module) -> Module:
    for _, layer in lora_layers(model):
        layer.unmerge()
    return model
