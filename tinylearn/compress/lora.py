"""LoRA (Hu et al. 2021) on ``tl.nn.Linear``: a frozen base weight plus a trainable low-rank update [Q100].

    y = x W^T + b + dropout(x) A^T B^T * (alpha / r)        A [r, in], B [out, r], scaling = alpha / r

Why it works: the weight *update* of fine-tuning has low intrinsic rank, so learning B.A (r (in + out) numbers)
instead of W (in * out) reaches nearly the same loss with a fraction of the trainable parameters and of the
optimizer state. Initialisation is peft's default: A kaiming-uniform with a = sqrt(5) (U(+-1/sqrt(in))), B = 0,
so the wrapped model starts exactly at the base model and the first step only moves B.

    LoRALinear(base, r, alpha, dropout)   wraps a Linear; ``base`` keeps its Parameters (frozen by apply_lora)
    LoRAConv2d(base, r, alpha, dropout)   the same on a Conv2d through its im2col view (apply_lora wraps Conv2d
                                          targets with it): A [r, in*kh*kw] runs as a conv, B [out, r] as a 1x1 conv
    merge() / unmerge()                   W += scaling B.A (inference: zero extra latency) / W -= scaling B.A;
                                          merging twice or unmerging an unmerged layer raises RuntimeError
    apply_lora(model, target_modules, r, alpha)   replaces matching Linear submodules in place (a name matches
                                          when it equals a target or ends with "." + target, as peft matches) and
                                          sets requires_grad False on every non-adapter parameter
    lora_state_dict / load_lora_state_dict        only the adapter tensors ("<path>.lora_A", "<path>.lora_B")
    trainable_parameters(model)           {"trainable", "total", "fraction", "nf4_frozen"} (NF4 base weights of
                                          QLoRALinear layers count as frozen parameters: they are the model's)
    add_adapter / use_adapters            named adapters on one base, one per batch row (lora_named.py) [Q245]

Every function here that walks a model's adapters (``lora_layers``) finds LoRALinear and QLoRALinear (qlora.py)
alike: state dicts, peft export / import and the parameter report work on QLoRA models unchanged. Merging into an
NF4 base cannot be undone exactly (the merged weight would have to be re-quantized, and W + dW is not on the NF4
grid), so ``QLoRALinear.merge()`` raises and ``merge_lora(model, dequantize=True)`` is the explicit way: each
QLoRALinear becomes a LoRALinear on its dequantized fp32 weight (what peft dequantizes into before it re-quantizes)
and is merged there; ``unmerge_lora`` then restores that fp32 weight.

Per-request adapters (multi-LoRA serving, autograd-capable; the model-level functions are in lora_named.py):
inside ``with use_adapters(model, ["a", "b", None]):``
row n of every adapted layer's input (dim 0: a request; [B, T, in] inputs keep a request's tokens together) gets
adapter ids[n] (None: the base only). Rows are grouped per adapter, each group runs its own (x A^T) B^T, and the
groups are put back in row order by an integer-array gather, so the cost is N r (in + out) MACs over the base GEMM
and gradients reach every adapter its rows used.

Backward runs through tinylearn autograd: grads reach A and B (and x); the frozen base gets none.
peft's names and state_dict format: ``tinylearn.compress.peft_compat``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..autograd.factory import cat
from ..autograd.tensor import Tensor
from ..nn import functional as F
from ..nn import init
from ..nn.layers import Conv2d, Linear
from ..nn.layers_extra import ModuleDict
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


class LoRAAdapter(Module):
    """One named adapter of a LoRA layer: lora_A [r, in] kaiming-uniform(a=sqrt(5)), lora_B [out, r] zeros,
    scaling alpha / r (the same init and names as the layer's default adapter)."""

    def __init__(self, layer: Module, r: int, alpha: float, dtype: Any) -> None:
        super().__init__()
        init_adapter(self, layer, r, alpha, 0.0, dtype)

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha}"


class AdapterLayerMixin:
    """What LoRALinear and QLoRALinear share: named adapters, per-row adapter selection, the LoRA branch.

    The default adapter is the layer's own lora_A / lora_B / scaling (peft's single-adapter layout); further ones
    live in ``self.adapters`` (a ModuleDict of LoRAAdapter, created by the first ``add_adapter``). ``active`` names
    the adapter every row uses; ``row_ids`` (set by ``use_adapters``) overrides it with one adapter per row."""

    DEFAULT = "default"

    def _init_selection(self) -> None:
        self.active = self.DEFAULT
        self.row_ids: list[str | None] | None = None

    def adapter_names(self) -> list[str]:
        extra = self._modules.get("adapters")
        return [self.DEFAULT, *(list(extra) if extra is not None else [])]

    def adapter(self, name: str = "default") -> Module:
        """The module holding adapter ``name``'s lora_A, lora_B and scaling (the layer itself for "default")."""
        if name == self.DEFAULT:
            return self
        extra = self._modules.get("adapters")
        if extra is None or name not in extra:
            raise KeyError(f"adapter: unknown adapter {name!r}; this layer has {self.adapter_names()}")
        return extra[name]

    def add_adapter(self, name: str, r: int, alpha: float) -> LoRAAdapter:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name: expected an identifier-like adapter name, got {name!r}")
        if name in self.adapter_names():
            raise ValueError(f"name: adapter {name!r} already exists on this layer ({self.adapter_names()})")
        _check_rank(r, self.in_features, self.out_features)
        if "adapters" not in self._modules:
            self.adapters = ModuleDict()
        ad = LoRAAdapter(self, r, alpha, self.lora_A.data.dtype)
        self.adapters[name] = ad
        return ad

    def delta_weight(self, adapter: str = "default") -> np.ndarray:
        """scaling * B @ A of ``adapter`` as a numpy array [out, in] (the update merge() adds to W)."""
        ad = self.adapter(adapter)
        dt = ad.lora_A.data.dtype if ad.lora_A.data.dtype.kind == "f" else np.dtype(np.float32)  # bf16: in fp32
        return (ad.scaling * (ad.lora_B.data.astype(dt) @ ad.lora_A.data.astype(dt))).astype(dt)

    def _branch(self, h: Tensor, ad: Module) -> Tensor:
        return (h @ ad.lora_A.T) @ ad.lora_B.T * ad.scaling

    def _lora_delta(self, x: Tensor) -> Tensor | None:
        """The adapter term for input x (dropout applied here); None when no row uses an adapter."""
        h = F.dropout(x, self.dropout_p, self.training) if self.dropout_p > 0 else x
        if self.row_ids is None:
            if self.active is None or self.active not in self.adapter_names():
                return None  # this layer does not carry the selected adapter: base only
            return self._branch(h, self.adapter(self.active))
        ids = self.row_ids
        if len(ids) != x.shape[0]:
            raise ValueError(
                f"use_adapters: {len(ids)} adapter ids for an input of {x.shape[0]} rows (dim 0), shape {x.shape}"
            )
        names = self.adapter_names()
        groups: dict[str, list[int]] = {}
        for i, a in enumerate(ids):
            if a is not None and a in names:
                groups.setdefault(a, []).append(i)
        if not groups:
            return None
        parts, order = [], []
        for a, rows in groups.items():
            idx = np.asarray(rows, dtype=np.int64)
            parts.append(self._branch(h[idx], self.adapter(a)))
            order.append(idx)
        rest = np.setdiff1d(np.arange(x.shape[0]), np.concatenate(order))
        if rest.size:  # base-only rows: a zero adapter term
            parts.append(Tensor(np.zeros((rest.size, *parts[0].shape[1:]), dtype=parts[0].data.dtype)))
            order.append(rest)
        perm = np.concatenate(order)
        inv = np.empty_like(perm)
        inv[perm] = np.arange(perm.size)
        return (cat(parts, 0) if len(parts) > 1 else parts[0])[inv]


class LoRALinear(AdapterLayerMixin, Module):
    """``base(x) + dropout(x) A^T B^T * alpha / r`` with A [r, in] kaiming-uniform(a=sqrt(5)), B [out, r] zeros."""

    def __init__(self, base: Linear, r: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(base, Linear):
            raise TypeError(f"base: expected a tinylearn.nn.Linear, got {type(base).__name__}")
        _check_rank(r, base.in_features, base.out_features)  # before anything is registered
        self.base_layer = base
        init_adapter(self, base, r, alpha, dropout, base.weight.data.dtype)
        self.merged = False
        self.merged_adapter: str | None = None
        self.disabled = False  # True: forward is the base path only (GatedLoRA's fallback)
        self._init_selection()

    def forward(self, x: Tensor) -> Tensor:
        y = self.base_layer(x)
        if self.merged or self.disabled:
            if self.disabled and self.merged:
                raise RuntimeError("forward: a merged LoRALinear cannot be disabled (unmerge it first)")
            if self.merged and (self.row_ids is not None or self.active != self.merged_adapter):
                raise RuntimeError(
                    f"forward: this LoRALinear has adapter {self.merged_adapter!r} merged; unmerge it before "
                    f"selecting other adapters (active {self.active!r}, per-row ids {self.row_ids is not None})"
                )
            return y
        d = self._lora_delta(x)
        return y if d is None else y + d

    def merge(self, adapter: str = "default") -> None:
        if self.merged:
            raise RuntimeError(
                f"merge: this LoRALinear is already merged (adapter {self.merged_adapter!r}; call unmerge() first)"
            )
        w = self.base_layer.weight
        w.data = w.data + self.delta_weight(adapter).astype(w.data.dtype).reshape(w.shape)
        self.merged, self.merged_adapter, self.active = True, adapter, adapter

    def unmerge(self) -> None:
        if not self.merged:
            raise RuntimeError("unmerge: this LoRALinear is not merged")
        w = self.base_layer.weight
        w.data = w.data - self.delta_weight(self.merged_adapter or self.DEFAULT).astype(w.data.dtype).reshape(w.shape)
        self.merged, self.merged_adapter = False, None

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, r={self.r}, alpha={self.alpha}, "
            f"dropout={self.dropout_p}, merged={self.merged}"
        )


class LoRAConv2d(LoRALinear):
    """LoRA on a ``Conv2d`` through its im2col view (groups=1, zero padding).

    A convolution multiplies im2col columns [in * kh * kw, L] by W viewed as a matrix [out, in * kh * kw], so its
    update is the same low-rank B [out, r] @ A [r, in * kh * kw] as a Linear's: lora_A / lora_B keep that 2-D shape
    (rank checked against min(in * kh * kw, out)), merge() adds scaling * B @ A reshaped to [out, in, kh, kw]. The
    forward never builds that product: A runs as an r-channel convolution with W's kernel size, stride, padding and
    dilation, B as a 1x1 convolution -- peft's LoRA Conv2d layout (lora_A Conv2d(in, r, k), lora_B Conv2d(r, out,
    1)), whose [r, in, kh, kw] / [out, r, 1, 1] weights are these arrays reshaped (peft_compat converts)."""

    def __init__(self, base: Conv2d, r: int, alpha: float, dropout: float = 0.0) -> None:
        Module.__init__(self)
        if not isinstance(base, Conv2d):
            raise TypeError(f"base: expected a tinylearn.nn.Conv2d, got {type(base).__name__}")
        if base.groups != 1 or base.padding_mode != "zeros":
            raise ValueError(
                f"base: LoRAConv2d needs groups=1 and padding_mode='zeros', got groups={base.groups}, "
                f"padding_mode={base.padding_mode!r}"
            )
        view = _Im2colView(base.in_channels * int(np.prod(base.kernel_size)), base.out_channels)
        _check_rank(r, view.in_features, view.out_features, " (the im2col view [out, in*kh*kw])")
        self.base_layer = base
        init_adapter(self, view, r, alpha, dropout, base.weight.data.dtype)
        self.merged = False
        self.merged_adapter: str | None = None
        self.disabled = False
        self._init_selection()

    def peft_shapes(self, r: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """peft's lora_A / lora_B weight shapes for rank r: [r, in, kh, kw], [out, r, 1, 1]."""
        b = self.base_layer
        return (r, b.in_channels, *b.kernel_size), (b.out_channels, r, 1, 1)

    def _branch(self, h: Tensor, ad: Module) -> Tensor:
        b = self.base_layer
        a4, b4 = self.peft_shapes(ad.r)
        z = F.conv2d(h, ad.lora_A.reshape(*a4), None, b.stride, b.padding, b.dilation)
        return F.conv2d(z, ad.lora_B.reshape(*b4)) * ad.scaling

    def extra_repr(self) -> str:
        b = self.base_layer
        return (
            f"{b.in_channels}, {b.out_channels}, kernel_size={b.kernel_size}, r={self.r}, alpha={self.alpha}, "
            f"dropout={self.dropout_p}, merged={self.merged}"
        )


class _Im2colView:
    """in_features / out_features of a Conv2d's weight as the im2col matrix (what init_adapter reads)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        self.in_features, self.out_features = in_features, out_features


def lora_layers(model: Module) -> list[tuple[str, Module]]:
    """(dotted name, layer) for every adapter layer in ``model``: LoRALinear and QLoRALinear (both are
    AdapterLayerMixin; qlora.py imports this module, so the test is on the shared base)."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, AdapterLayerMixin)]


def _is_nf4(layer: Module) -> bool:
    """A QLoRALinear (its base is NF4 codes), told without importing qlora.py (which imports this module)."""
    return isinstance(layer, AdapterLayerMixin) and hasattr(layer, "weight_nf4")


def _require_layers(model: Any, what: str) -> list[tuple[str, Module]]:
    if not isinstance(model, Module):
        raise TypeError(f"model: expected a tinylearn.nn.Module, got {type(model).__name__}")
    layers = lora_layers(model)
    if not layers:
        raise ValueError(
            f"model: {type(model).__name__} has no LoRALinear / QLoRALinear layers for {what} "
            "(call apply_lora or apply_qlora first)"
        )
    return layers


def _linear_names(model: Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, Linear)]


def _conv_names(model: Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, Conv2d)]


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
    """Wrap every Linear (in a LoRALinear) and Conv2d (in a LoRAConv2d, groups=1) whose dotted name equals or ends
    with ``"." + target``; freeze the rest."""
    targets = check_targets(model, target_modules, alpha, dropout)
    inside_lora = {n + ".base_layer" for n, _ in lora_layers(model)}
    hits = [(n, m) for n, m in model.named_modules() if isinstance(m, Linear | Conv2d) and n and n not in inside_lora]
    hits = [(n, m) for n, m in hits if _matches(n, targets)]
    if not hits:
        raise ValueError(
            f"target_modules: {targets} match no Linear or Conv2d module; Linear modules in the model: "
            f"{_linear_names(model)}, Conv2d modules: {_conv_names(model)}"
        )
    for n, m in hits:  # validate every rank (and conv) before modifying anything
        if isinstance(m, Conv2d):
            if m.groups != 1 or m.padding_mode != "zeros":
                raise ValueError(f"target_modules: Conv2d {n!r} has groups={m.groups} / padding_mode="
                                 f"{m.padding_mode!r}; LoRA needs groups=1 and zero padding")  # fmt: skip
            k = m.in_channels * int(np.prod(m.kernel_size))
            _check_rank(r, k, m.out_channels, f" for {n!r} (im2col view {m.out_channels}x{k})")
        else:
            _check_rank(r, m.in_features, m.out_features, f" for {n!r} ({m.out_features}x{m.in_features})")
    for p in model.parameters():
        p.requires_grad = False
    for n, m in hits:
        parent_name, _, child = n.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, (LoRAConv2d if isinstance(m, Conv2d) else LoRALinear)(m, r, alpha, dropout))
    for _, layer in lora_layers(model):
        layer.lora_A.requires_grad = True
        layer.lora_B.requires_grad = True
    return model


def trainable_parameters(model: Module) -> dict[str, Any]:
    """{"trainable": #elements with requires_grad, "total": #elements, "fraction": trainable / total,
    "nf4_frozen": #elements held as NF4 codes}. A QLoRALinear's base weight is no Parameter (packed codes and
    scales), but it is part of the model: its elements count in "total" as frozen ones (peft counts a 4-bit
    weight's elements the same way)."""
    total = trainable = 0
    for p in model.parameters():
        total += p.data.size
        trainable += p.data.size if p.requires_grad else 0
    nf4 = sum(m.weight_nf4.numel for _, m in lora_layers(model) if _is_nf4(m))
    total += nf4
    return {"trainable": trainable, "total": total, "fraction": trainable / total if total else 0.0,
            "nf4_frozen": nf4}  # fmt: skip


def _adapter_layers(model: Module, adapter: str, what: str) -> list[tuple[str, Module]]:
    """The adapter layers of ``model`` that carry ``adapter`` (ValueError: none at all, KeyError: none has it)."""
    layers = _require_layers(model, what)
    have = [(n, m) for n, m in layers if adapter in m.adapter_names()]
    if not have:
        names = sorted({a for _, m in layers for a in m.adapter_names()})
        raise KeyError(f"adapter: no layer has adapter {adapter!r}; adapters in the model: {names}")
    return have


def lora_state_dict(model: Module, adapter: str = "default") -> OrderedDict[str, Tensor]:
    """Only the tensors of one adapter: "<path>.lora_A" [r, in] and "<path>.lora_B" [out, r] (detached, shared
    storage), for LoRALinear and QLoRALinear layers alike. A named adapter (``add_adapter``) is exported under the
    same keys, so it loads into a single-adapter model. ValueError for a model without adapter layers."""
    out: OrderedDict[str, Tensor] = OrderedDict()
    for n, layer in _adapter_layers(model, adapter, "lora_state_dict"):
        pre = n + "." if n else ""
        ad = layer.adapter(adapter)
        out[pre + "lora_A"] = ad.lora_A.detach()
        out[pre + "lora_B"] = ad.lora_B.detach()
    return out


def load_lora_state_dict(model: Module, sd: Mapping[str, Any], adapter: str = "default") -> Module:
    """Copy adapter tensors into ``model``'s adapter ``adapter``; keys and shapes must match exactly (merged layers
    refused)."""
    own = lora_state_dict(model, adapter)
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


def merge_lora(model: Module, adapter: str = "default", dequantize: bool = False) -> Module:
    """Merge ``adapter`` into every adapter layer's base weight (W += scaling B A).

    QLoRALinear layers have an NF4 base, which cannot take the update without re-quantizing (lossy, and unmerge
    could not restore the codes): RuntimeError unless ``dequantize=True``, which replaces each QLoRALinear in place
    by a LoRALinear on its dequantized fp32 weight (sharing the adapter Parameters) and merges there. Every layer is
    checked before any is changed."""
    layers = _adapter_layers(model, adapter, "merge_lora")
    q = [n for n, m in layers if _is_nf4(m)]
    if q and not dequantize:
        raise RuntimeError(
            f"merge_lora: layers {q} have an NF4 base weight; merging would re-quantize W + scaling B A (lossy, "
            "not undoable). Pass dequantize=True to merge into their dequantized fp32 weights instead"
        )
    for n, m in layers:
        if m.merged:
            raise RuntimeError(f"merge_lora: layer {n!r} is already merged (call unmerge_lora first)")
    for n, m in layers:
        if _is_nf4(m):
            m = m.to_lora_linear()
            parent_name, _, child = n.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, m)
        m.merge(adapter)
    return model


def unmerge_lora(model: Module) -> Module:
    """Undo merge_lora on every merged layer (RuntimeError when none is merged)."""
    layers = [(n, m) for n, m in _require_layers(model, "unmerge_lora") if m.merged]
    if not layers:
        raise RuntimeError("unmerge_lora: no adapter layer of the model is merged")
    for _, layer in layers:
        layer.unmerge()
    return model
