"""Functional pruning API (thin wrappers over the methods, named like torch.nn.utils.prune).

    tl.prune.l1_unstructured(module, "weight", amount=0.9)     # 90% of the weight's entries -> 0
    tl.prune.ln_structured(conv, "weight", 0.5, n=2, dim=0)    # half of the output filters, by L2 norm
    tl.prune.global_unstructured([(l1, "weight"), (l2, "weight")], amount=0.8)   # one threshold for all
    tl.prune.n_m_sparsity(linear, "weight", n=2, m=4)          # 2:4 along the input dim
    tl.prune.remove(module, "weight")                           # bake the mask in, drop weight_orig/weight_mask

Each returns the module (like torch). ``sparsity(x)`` is the fraction of zeros of an array / Tensor, or of all
parameters of a module (pruned weights counted through their effective value orig * mask).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .._inputs import to_numpy
from ..autograd.tensor import Tensor
from . import masks as M
from .methods import (
    BasePruningMethod,
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    NMSparsity,
    PruningContainer,
    RandomStructured,
    RandomUnstructured,
    _find_hook,
    pruning_hooks,
)


def identity(module: Any, name: str) -> Any:
    Identity.apply(module, name)
    return module


def random_unstructured(module: Any, name: str, amount: Any, seed: int | None = None) -> Any:
    RandomUnstructured.apply(module, name, amount, seed=seed)
    return module


def l1_unstructured(module: Any, name: str, amount: Any, importance_scores: Any = None) -> Any:
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(module: Any, name: str, amount: Any, dim: int, seed: int | None = None) -> Any:
    RandomStructured.apply(module, name, amount, dim, seed=seed)
    return module


def ln_structured(module: Any, name: str, amount: Any, n: Any, dim: int, importance_scores: Any = None) -> Any:
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def n_m_sparsity(
    module: Any, name: str, n: int = 2, m: int = 4, dim: int | None = None, importance_scores: Any = None
) -> Any:
    """Keep n of every m consecutive entries along ``dim`` (default: dim 1, the reduction dim of the weight)."""
    NMSparsity.apply(module, name, n, m, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module: Any, name: str, mask: Any) -> Any:
    CustomFromMask.apply(module, name, mask=mask)
    return module


def global_unstructured(
    parameters: Iterable[tuple[Any, str]],
    *args: Any,
    amount: Any = None,
    pruning_method: type[BasePruningMethod] | None = None,
    importance_scores: dict[tuple[Any, str], Any] | None = None,
    **kwargs: Any,
) -> None:
    """Prune ``amount`` of all listed (module, name) entries together with one global ranking.

    Scores (default |weight|) of every parameter are concatenated, ``pruning_method`` (default L1Unstructured)
    computes one mask on the still-unpruned entries and each slice is applied with ``custom_from_mask``.
    Call forms: ``global_unstructured(params, 0.8)``, ``global_unstructured(params, amount=0.8)`` and torch's
    ``global_unstructured(params, L1Unstructured, amount=0.8)`` / ``(params, pruning_method=..., amount=...)``.
    """
    for a in args:
        if isinstance(a, type) and issubclass(a, BasePruningMethod):
            if pruning_method is not None:
                raise TypeError("pruning_method: given twice")
            pruning_method = a
        elif isinstance(a, dict) and importance_scores is None:
            importance_scores = a
        elif amount is None:
            amount = a
        else:
            raise TypeError(f"global_unstructured: unexpected positional argument {a!r}")
    pruning_method = L1Unstructured if pruning_method is None else pruning_method
    if amount is not None:
        kwargs["amount"] = amount
    if isinstance(parameters, dict) or not isinstance(parameters, Iterable):
        raise TypeError(f"parameters: expected an iterable of (module, name) pairs, got {type(parameters).__name__}")
    parameters = list(parameters)
    if not parameters:
        raise ValueError("parameters: empty list of (module, name) pairs")
    importance_scores = importance_scores if importance_scores is not None else {}
    if not isinstance(importance_scores, dict):
        raise TypeError(f"importance_scores: expected a dict keyed by (module, name), got {type(importance_scores)}")
    scores, masks, sizes = [], [], []
    for module, name in parameters:
        if _find_hook(module, name) is None and not isinstance(module._parameters.get(name), Tensor):
            raise ValueError(f"name: {type(module).__name__} has no parameter {name!r} to prune")
        w = getattr(module, name)
        s = to_numpy(importance_scores.get((module, name), w), "importance_scores")
        if s.shape != w.shape:
            raise ValueError(f"importance_scores[{name!r}]: shape {s.shape} differs from the parameter's {w.shape}")
        mask = getattr(module, name + "_mask", None)
        scores.append(s.reshape(-1))
        masks.append(np.ones(w.shape, np.float32).reshape(-1) if mask is None else mask.data.reshape(-1))
        sizes.append(w.data.size)
    method = pruning_method(**kwargs)
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(f"pruning_method: global pruning needs an unstructured method, got {pruning_method.__name__}")
    method._tensor_name = "temp"
    container = PruningContainer(method)
    flat = np.concatenate([s.astype(np.float64) for s in scores])
    final = container.compute_mask(flat, np.concatenate(masks).astype(np.float64))
    start = 0
    for (module, name), size in zip(parameters, sizes):
        w = getattr(module, name)
        custom_from_mask(module, name, final[start : start + size].reshape(w.shape))
        start += size


def remove(module: Any, name: str) -> Any:
    """Make the pruning of ``module.<name>`` permanent; ValueError if it is not pruned (or already removed)."""
    found = _find_hook(module, name)
    if found is None:
        raise ValueError(
            f"name: parameter {name!r} of {type(module).__name__} is not pruned (never pruned or already removed)"
        )
    key, method = found
    method.remove(module)
    del module._forward_pre_hooks[key]
    return module


def restore(module: Any, name: str) -> Any:
    """Undo the pruning of ``module.<name>``: the original (unmasked) Parameter comes back, mask and hook go.

    Not in torch; used by sensitivity scans (prune, measure, restore). ValueError if not pruned.
    """
    found = _find_hook(module, name)
    if found is None:
        raise ValueError(f"name: parameter {name!r} of {type(module).__name__} is not pruned")
    key, _ = found
    del module._forward_pre_hooks[key]
    orig = module._parameters.pop(name + "_orig")
    module._buffers.pop(name + "_mask", None)
    if name in module.__dict__:
        delattr(module, name)
    setattr(module, name, orig)
    return module


def is_pruned(module: Any) -> bool:
    """True if ``module`` or any submodule has a pruning pre-hook."""
    mods = module.modules() if hasattr(module, "modules") else [module]
    return any(pruning_hooks(m) for m in mods)


def sparsity(module_or_array: Any) -> float:
    """Fraction of zeros: of an array / Tensor, or over all effective parameters of a module."""
    x = module_or_array
    if hasattr(x, "_forward_pre_hooks") and hasattr(x, "named_modules"):
        zeros = total = 0
        for m in x.modules():
            pruned = {h._tensor_name for h in pruning_hooks(m)}
            for k, p in m._parameters.items():
                if p is None:
                    continue
                if k.endswith("_orig") and k[:-5] in pruned:
                    arr = p.data * m._buffers[k[:-5] + "_mask"].data
                else:
                    arr = p.data
                zeros += int(np.count_nonzero(arr == 0))
                total += arr.size
        return zeros / total if total else 0.0
    return M.sparsity_of(to_numpy(x, "module_or_array"))
