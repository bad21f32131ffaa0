"""Adapter weights between tinylearn's LoRA names and peft's (the format ``PeftModel.state_dict()`` holds).

    tinylearn                       peft (adapter "default", model wrapped by get_peft_model)
    <path>.lora_A  [r, in]    <->   base_model.model.<path>.lora_A.default.weight  [r, in]
    <path>.lora_B  [out, r]   <->   base_model.model.<path>.lora_B.default.weight  [out, r]
    <path>.base_layer.weight  <->   base_model.model.<path>.base_layer.weight  (base weights: ``with_base=True``)

Layouts are identical (peft's lora_A / lora_B are nn.Linear(in, r) / nn.Linear(r, out) without bias, whose
weights are [r, in] / [out, r]), so the conversion only renames and copies. ``save_pretrained`` files drop the
adapter name ("...lora_A.weight"); ``from_peft_state_dict`` accepts both spellings. Values come back as numpy
arrays (to_peft) or are read from anything numpy can convert, torch tensors included (from_peft). peft is never
imported here; ``tests/compress/test_peft_parity.py`` checks forward, gradients and merging against it.

LoRAConv2d layers keep A / B as the im2col matrices [r, in*kh*kw] / [out, r]; peft's Conv2d adapters hold them as
[r, in, kh, kw] / [out, r, 1, 1]: the conversion reshapes (same element order).

QLoRA models (QLoRALinear layers) export and import their adapters the same way (peft keeps a 4-bit layer's
adapter under the same names). Their base weight is NF4 codes: ``with_base=True`` refuses them (peft's file would
hold a bitsandbytes Params4bit with its quant_state, a format not written here). ``adapter``: which tinylearn adapter
(``add_adapter``) to export / import; ``adapter_name``: the name peft's keys carry.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..nn.module import Module
from .lora import _adapter_layers, lora_layers, lora_state_dict

PREFIX = "base_model.model."


def _to_numpy(v: Any, name: str) -> np.ndarray:
    if hasattr(v, "detach") and hasattr(v, "cpu"):  # torch tensor
        v = v.detach().cpu().numpy()
    elif hasattr(v, "numpy"):
        v = v.numpy()
    try:
        return np.asarray(v)
    except Exception as e:  # pragma: no cover - defensive
        raise TypeError(f"sd[{name!r}]: cannot convert {type(v).__name__} to an array") from e


def to_peft_state_dict(
    model: Module, adapter_name: str = "default", with_base: bool = False, adapter: str = "default"
) -> dict[str, np.ndarray]:
    """peft-named copies of ``model``'s adapter ``adapter`` (and its base Linear weights when ``with_base``)."""
    from .qlora import QLoRALinear

    if not isinstance(adapter_name, str) or not adapter_name:
        raise ValueError(f"adapter_name: expected a non-empty string, got {adapter_name!r}")
    layers = _adapter_layers(model, adapter, "to_peft_state_dict")
    if with_base:
        q = [n for n, m in layers if isinstance(m, QLoRALinear)]
        if q:
            raise ValueError(
                f"with_base: layers {q} hold NF4 base weights (QLoRALinear), which this exporter does not write in "
                "peft's bitsandbytes format; export the adapter alone (with_base=False)"
            )
    out: dict[str, np.ndarray] = OrderedDict()
    for n, layer in layers:
        p = PREFIX + n
        ad = layer.adapter(adapter)
        a, b = ad.lora_A.data.copy(), ad.lora_B.data.copy()
        if hasattr(layer, "peft_shapes"):  # LoRAConv2d: peft's Conv2d weights [r, in, kh, kw] / [out, r, 1, 1]
            sa, sb = layer.peft_shapes(ad.r)
            a, b = a.reshape(sa), b.reshape(sb)
        out[f"{p}.lora_A.{adapter_name}.weight"] = a
        out[f"{p}.lora_B.{adapter_name}.weight"] = b
        if with_base:
            if layer.merged:
                raise RuntimeError(f"to_peft_state_dict: layer {n!r} is merged; unmerge it to export base weights")
            out[f"{p}.base_layer.weight"] = layer.base_layer.weight.data.copy()
            if layer.base_layer.bias is not None:
                out[f"{p}.base_layer.bias"] = layer.base_layer.bias.data.copy()
    return out


def from_peft_state_dict(
    model: Module, sd: Mapping[str, Any], adapter_name: str = "default", adapter: str = "default"
) -> Module:
    """Load peft-named adapter weights (peft adapter ``adapter_name``) into ``model``'s adapter ``adapter`` of its
    LoRA / QLoRA layers (missing or unknown lora keys: KeyError)."""
    want = lora_state_dict(model, adapter)
    got: dict[str, np.ndarray] = {}
    for k, v in sd.items():
        if ".lora_A." not in k and ".lora_B." not in k:
            continue  # base weights and other entries are not adapter tensors
        name = k[len(PREFIX) :] if k.startswith(PREFIX) else k
        for ab in ("lora_A", "lora_B"):
            for suffix in (f".{ab}.{adapter_name}.weight", f".{ab}.weight"):
                if name.endswith(suffix):
                    got[name[: -len(suffix)] + "." + ab] = _to_numpy(v, k)
    missing, unexpected = [k for k in want if k not in got], [k for k in got if k not in want]
    if missing or unexpected:
        raise KeyError(f"sd: adapter {adapter_name!r}: missing {missing}, unexpected {unexpected}")
    by_name = dict(lora_layers(model))
    for k, arr in got.items():
        path, _, ab = k.rpartition(".")
        layer = by_name[path]
        if layer.merged:
            raise RuntimeError(f"from_peft_state_dict: layer {path!r} is merged; unmerge it first")
        ad = layer.adapter(adapter)
        p = getattr(ad, ab)
        if hasattr(layer, "peft_shapes") and arr.shape == layer.peft_shapes(ad.r)[ab == "lora_B"]:
            arr = arr.reshape(p.shape)  # peft's conv layout -> the im2col view
        if arr.shape != p.shape:
            raise ValueError(f"sd[{k!r}]: shape {arr.shape} does not match the adapter's {p.shape}")
        np.copyto(p.data, arr, casting="unsafe")
    return model


def to_peft_model(torch_model: Any, model: Module, alpha: float | None = None) -> Any:
    """Wrap ``torch_model`` (same architecture, same base weights) with peft and load ``model``'s adapter into it.

    Imports peft lazily (optional dependency). All LoRA layers of ``model`` must share r and alpha.
    """
    try:
        import peft
        import torch
    except ImportError as e:  # pragma: no cover - peft is an optional extra
        raise ImportError("to_peft_model needs peft and torch installed") from e
    layers = lora_layers(model)
    if not layers:
        raise ValueError(f"model: {type(model).__name__} has no LoRALinear layers")
    rs, alphas = {m.r for _, m in layers}, {m.alpha for _, m in layers}
    if len(rs) != 1 or len(alphas) != 1:
        raise ValueError(f"model: LoRA layers must share r and alpha for one LoraConfig, got r {rs}, alpha {alphas}")
    cfg = peft.LoraConfig(
        r=rs.pop(),
        lora_alpha=alpha if alpha is not None else alphas.pop(),
        lora_dropout=0.0,
        target_modules=[n for n, _ in layers],
    )
    pm = peft.get_peft_model(torch_model, cfg)
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in to_peft_state_dict(model).items()}
    pm.load_state_dict(sd, strict=False)
    return pm
