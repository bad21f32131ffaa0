"""Named adapters on one frozen base (multi-LoRA serving, autograd-capable) [Q245]: the model-level functions over the
adapter layers of lora.py / qlora.py.

    add_adapter(model, name, r, alpha)    a further named adapter on every LoRA / QLoRA layer (the first one is
                                          "default", at lora_A / lora_B as peft keeps it)
    adapter_names(model)                  every adapter name in the model, "default" first
    use_adapters(model, ids)              a context: one adapter for the whole batch, or one per batch row
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from ..nn.module import Module
from .lora import _check_alpha, _check_rank, _matches, _require_layers, check_targets, lora_layers


def add_adapter(
    model: Module, name: str, r: int = 8, alpha: float = 8.0, target_modules: Iterable[str] | None = None
) -> Module:
    """Add adapter ``name`` (A kaiming-uniform, B = 0, trainable) to every LoRA / QLoRA layer of ``model`` (or to
    those whose dotted name matches ``target_modules``). The base stays shared and frozen; select adapters with
    ``use_adapters``. Every layer is validated before any is changed."""
    layers = _require_layers(model, "add_adapter")
    if target_modules is not None:
        targets = check_targets(model, target_modules, alpha, 0.0)
        layers = [(n, m) for n, m in layers if _matches(n, targets)]
        if not layers:
            raise ValueError(
                f"target_modules: {targets} match no adapter layer; adapter layers: "
                f"{[n for n, _ in lora_layers(model)]}"
            )
    _check_alpha(alpha)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: expected an identifier-like adapter name, got {name!r}")
    for n, m in layers:
        if name in m.adapter_names():
            raise ValueError(f"name: adapter {name!r} already exists on layer {n!r}")
        _check_rank(r, m.in_features, m.out_features, f" for {n!r} ({m.out_features}x{m.in_features})")
    for _, m in layers:
        ad = m.add_adapter(name, r, alpha)
        ad.lora_A.requires_grad = True
        ad.lora_B.requires_grad = True
    return model


def adapter_names(model: Module) -> list[str]:
    """Every adapter name on any adapter layer of ``model``, "default" first."""
    names: dict[str, None] = {}
    for _, m in _require_layers(model, "adapter_names"):
        names.update(dict.fromkeys(m.adapter_names()))
    return list(names)


@contextmanager
def use_adapters(model: Module, ids: str | Sequence[str | None] | None) -> Iterator[Module]:
    """Select adapters for the forwards inside the block: a name (every row), None (base only) or one name / None
    per batch row (dim 0 of each adapter layer's input; a [B, T, in] input keeps a request's tokens together).
    Layers that lack a selected adapter run their base for those rows. Restores the previous selection on exit.
    Gradients flow as usual (the rows of adapter a reach a's lora_A / lora_B only)."""
    layers = _require_layers(model, "use_adapters")
    known = adapter_names(model)
    per_row = not (ids is None or isinstance(ids, str))
    sel = list(ids) if per_row else [ids]
    for i, a in enumerate(sel):
        if a is not None and a not in known:
            raise KeyError(f"ids[{i}]: unknown adapter {a!r}; adapters in the model: {known}")
    saved = [(m.active, m.row_ids) for _, m in layers]
    for _, m in layers:
        m.active, m.row_ids = (None, sel) if per_row else (sel[0], None)
    try:
        yield model
    finally:
        for (_, m), (a, r) in zip(layers, saved, strict=True):
            m.active, m.row_ids = a, r
