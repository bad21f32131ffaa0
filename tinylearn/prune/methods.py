"""Pruning methods on tinylearn.nn modules, mirroring torch.nn.utils.prune.

Reparameterisation (the invariant every method keeps): pruning ``module.<name>`` moves the Parameter to
``<name>_orig``, registers a buffer ``<name>_mask`` (1 keep / 0 pruned, same dtype and shape) and a forward
pre-hook that recomputes the plain attribute

    module.<name> = <name>_orig * <name>_mask            (an autograd op)

before every forward. So d loss / d <name>_orig = mask * d loss / d <name>: pruned weights get zero gradient and
stay zero through fine-tuning (an optimizer without weight decay never changes their ``_orig`` value; with decay
it only shrinks them, and they are still masked). ``remove`` bakes ``orig * mask`` into a plain Parameter again.

A method implements one thing, ``compute_mask(t, default_mask) -> mask`` on numpy arrays (``t`` holds the
importance scores, by default the current weight). Pruning the same parameter again wraps the methods in a
``PruningContainer``: the new method only sees the still-unpruned entries (unstructured), channels (structured)
or groups (N:M), so masks compose multiplicatively and ``amount`` is relative to what is left.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import numpy as np

from .._inputs import to_numpy
from ..autograd.tensor import Tensor
from . import masks as M


def _find_hook(module: Any, name: str) -> tuple[Any, BasePruningMethod] | None:
    hooks = getattr(module, "_forward_pre_hooks", None)
    if hooks is None:
        raise TypeError(f"module: expected a tinylearn.nn.Module, got {type(module).__name__}")
    found = [(k, h) for k, h in hooks.items() if isinstance(h, BasePruningMethod) and h._tensor_name == name]
    if len(found) > 1:
        raise RuntimeError(f"name: {len(found)} pruning hooks on {name!r}; expected at most one")
    return found[0] if found else None


class BasePruningMethod(ABC):
    """Subclasses set ``PRUNING_TYPE`` ("unstructured", "structured" (with ``self.dim``), "global", "n:m")."""

    PRUNING_TYPE: str = "unstructured"
    _tensor_name: str | None = None

    @abstractmethod
    def compute_mask(self, t: np.ndarray, default_mask: np.ndarray) -> np.ndarray:
        """New mask (numpy, same shape as ``t``) from importance scores ``t`` and the current ``default_mask``."""

    def __call__(self, module: Any, inputs: Any) -> None:  # the forward pre-hook
        setattr(module, self._tensor_name, self.apply_mask(module))

    def apply_mask(self, module: Any) -> Tensor:
        if self._tensor_name is None:
            raise RuntimeError(f"{type(self).__name__}: not attached to a parameter (call .apply first)")
        orig = getattr(module, self._tensor_name + "_orig")
        mask = getattr(module, self._tensor_name + "_mask")
        return orig * mask

    @classmethod
    def apply(
        cls, module: Any, name: str, *args: Any, importance_scores: Any = None, **kwargs: Any
    ) -> BasePruningMethod:
        """Prune ``module.<name>`` in place with ``cls(*args, **kwargs)`` (composing with earlier pruning)."""
        if not isinstance(name, str):
            raise TypeError(f"name: expected a str, got {type(name).__name__}")
        old = _find_hook(module, name)
        if old is None and not isinstance(module._parameters.get(name), Tensor):
            known = [k for k, v in module._parameters.items() if v is not None]
            raise ValueError(f"name: {type(module).__name__} has no parameter {name!r} to prune (parameters: {known})")
        method = cls(*args, **kwargs)
        method._tensor_name = name
        hooks = module._forward_pre_hooks
        saved: tuple[BasePruningMethod, ...] = ()
        if old is not None:
            key, old_method = old
            saved = old_method._pruning_methods if isinstance(old_method, PruningContainer) else ()
            del hooks[key]
            if isinstance(old_method, PruningContainer):
                old_method.add_pruning_method(method)
                method = old_method
            else:
                container = PruningContainer(old_method)
                container.add_pruning_method(method)
                method = container
        orig = getattr(module, name)
        scores = orig if importance_scores is None else importance_scores
        scores_np = to_numpy(scores, "importance_scores")
        if scores_np.shape != orig.shape:
            raise ValueError(f"importance_scores: shape {scores_np.shape} differs from {name!r}'s {orig.shape}")
        fresh = not isinstance(method, PruningContainer)
        if fresh:
            module.register_parameter(name + "_orig", orig)
            del module._parameters[name]
            default_mask = np.ones(orig.shape, dtype=orig.data.dtype)
        else:
            default_mask = getattr(module, name + "_mask").data.copy()
        try:
            mask = method.compute_mask(scores_np, default_mask=default_mask)
            module.register_buffer(name + "_mask", Tensor(np.asarray(mask, dtype=orig.data.dtype)))
            setattr(module, name, method.apply_mask(module))
            module.register_forward_pre_hook(method)
        except Exception:
            if fresh:  # restore the parameter as it was
                orig_p = getattr(module, name + "_orig")
                if name in module.__dict__:
                    delattr(module, name)
                del module._parameters[name + "_orig"]
                module._buffers.pop(name + "_mask", None)
                module.register_parameter(name, orig_p)
            else:  # put the previous method (container) back as it was
                if isinstance(old[1], PruningContainer):
                    old[1]._pruning_methods = saved
                module.register_forward_pre_hook(old[1])
            raise
        return method

    def prune(self, t: Any, default_mask: Any = None, importance_scores: Any = None) -> np.ndarray:
        """``t * mask`` without touching a module (numpy)."""
        t = to_numpy(t, "t")
        scores = t if importance_scores is None else to_numpy(importance_scores, "importance_scores")
        dm = np.ones_like(t) if default_mask is None else to_numpy(default_mask, "default_mask")
        return t * self.compute_mask(scores, default_mask=dm)

    def remove(self, module: Any) -> None:
        """Make pruning permanent: ``<name>`` becomes a Parameter holding orig * mask; orig and mask are deleted."""
        name = self._tensor_name
        if name is None:
            raise RuntimeError(f"{type(self).__name__}: not attached to a parameter")
        weight = self.apply_mask(module)
        if name in module.__dict__:
            delattr(module, name)
        orig = module._parameters[name + "_orig"]
        orig.data = np.ascontiguousarray(weight.data)
        del module._parameters[name + "_orig"]
        del module._buffers[name + "_mask"]
        setattr(module, name, orig)


class PruningContainer(BasePruningMethod):
    """The sequence of methods applied to one parameter; ``compute_mask`` runs the newest on the unpruned part."""

    def __init__(self, *methods: BasePruningMethod) -> None:
        self._pruning_methods: tuple[BasePruningMethod, ...] = ()
        if len(methods) == 1 and not isinstance(methods[0], BasePruningMethod):
            methods = tuple(methods[0])
        for m in methods:
            self.add_pruning_method(m)

    def add_pruning_method(self, method: BasePruningMethod) -> None:
        if not isinstance(method, BasePruningMethod):
            raise TypeError(f"method: expected a BasePruningMethod, got {type(method).__name__}")
        if self._tensor_name is None:
            self._tensor_name = method._tensor_name
        elif method._tensor_name != self._tensor_name:
            raise ValueError(f"method: prunes {method._tensor_name!r}, this container prunes {self._tensor_name!r}")
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self) -> Any:
        return iter(self._pruning_methods)

    def __getitem__(self, i: int) -> BasePruningMethod:
        return self._pruning_methods[i]

    def compute_mask(self, t: np.ndarray, default_mask: np.ndarray) -> np.ndarray:
        method = self._pruning_methods[-1]
        t = np.asarray(t)
        mask = np.array(default_mask, dtype=t.dtype if np.issubdtype(t.dtype, np.floating) else np.float32)
        kind = method.PRUNING_TYPE
        if kind == "unstructured":
            slc: Any = mask == 1
        elif kind == "structured":
            dim = M.check_dim(t, method.dim)
            keep = mask.sum(axis=tuple(d for d in range(t.ndim) if d != dim)) != 0
            idx: list[Any] = [slice(None)] * t.ndim
            idx[dim] = keep
            slc = tuple(idx)
        elif kind in ("global", "n:m"):
            slc = tuple(slice(None) for _ in range(t.ndim))
        else:
            raise ValueError(f"PRUNING_TYPE: unknown pruning type {kind!r}")
        partial = method.compute_mask(t[slc], default_mask=mask[slc])
        mask[slc] = partial
        return mask


class Identity(BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: np.ndarray, default_mask: np.ndarray) -> np.ndarray:
        return np.array(default_mask, copy=True)


class RandomUnstructured(BasePruningMethod):
    """Prune ``amount`` entries chosen uniformly at random (``seed`` or a numpy Generator for reproducibility)."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: Any, seed: int | np.random.Generator | None = None) -> None:
        M.validate_amount_type(amount)
        self.amount = amount
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    def compute_mask(self, t: np.ndarray, default_mask: np.ndarray) -> np.ndarray:
        return M.random_unstructured_mask(t, self.amount, default_mask, rng=self.rng)


class L1Unstructured(BasePruningMethod):
    """Prune the ``amount`` entries with the smallest |t| (ties: lower flat index first)."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: Any) -> None:
        M.validate_amount_type(amount)
        self.amount = amount

    def compute_mask(self, t: np.ndarray, default_mask: np.ndarray) -> np.ndarray:
        return M.l1_unstructured_mask(t, self.amount, default_mask)


class LnStructured(BasePruningMethod):
    """Prune the ``amount`` slices along ``dim`` with the smallest L``n`` norm (dim=0: output channels/filters)."""

    PRUNING_TYPE = "structured"

    def __init__(self, amount: Any, n: Any, dim: int = -1) -> None:
        M.validate_amount_type(amount)
        self.amount, self.n, self.dim = amount, n, dim

    def compute_mask(self, t: np.ndarray, default_mask: np.ndarray) -> np.ndarray:
        return M.ln_structured_mask(t, self.amount, self.n, self.dim, default_mask)


class RandomStructured(BasePruningMethod):
    PRUNING_TYPE = "structured"

    def __init__(self, amount: Any, dim: int = -1, seed: int | np.random.Generator | None = None) -> None:
        M.validate_amount_type(amount)
        self.amount, self.dim = amount, dim
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    def compute_mask(self, t: np.ndarray, default_mask: np.ndarray) -> np.ndarray:
        return M.random_structured_mask(t, self.amount, self.dim, default_mask, rng=self.rng)


class NMSparsity(BasePruningMethod):
    """Keep the ``n`` largest |t| in every ``m`` consecutive entries along ``dim`` (default 1, the reduction dim of
    Linear (out, in) and Conv (out, in, kh, kw) weights; 0 for 1-D tensors). Composed with an earlier mask,
    already-pruned entries are pruned first, so each group ends with at most n nonzeros."""

    PRUNING_TYPE = "n:m"

    def __init__(self, n: int = 2, m: int = 4, dim: int | None = None) -> None:
        M.check_n_m((m,), n, m, 0)
        self.n, self.m, self.dim = n, m, dim

    def compute_mask(self, t: np.ndarray, default_mask: np.ndarray) -> np.ndarray:
        t = np.asarray(t)
        dim = self.dim if self.dim is not None else (1 if t.ndim >= 2 else 0)
        scores = np.where(np.asarray(default_mask) != 0, np.abs(t).astype(np.float64), -1.0)
        return M.n_m_mask(t, self.n, self.m, dim, scores=scores) * default_mask


class CustomFromMask(BasePruningMethod):
    PRUNING_TYPE = "global"

    def __init__(self, mask: Any) -> None:
        self.mask = to_numpy(mask, "mask")

    def compute_mask(self, t: np.ndarray, default_mask: np.ndarray) -> np.ndarray:
        if self.mask.shape != np.shape(default_mask):
            raise ValueError(f"mask: shape {self.mask.shape} differs from the parameter's {np.shape(default_mask)}")
        return np.asarray(default_mask) * (self.mask != 0).astype(np.asarray(default_mask).dtype)


def pruning_hooks(module: Any) -> Iterable[BasePruningMethod]:
    """The pruning methods attached to ``module`` (not its children)."""
    return [h for h in module._forward_pre_hooks.values() if isinstance(h, BasePruningMethod)]
