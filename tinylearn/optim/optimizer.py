"""Optimizer base: parameter groups (dicts with their own hyper-parameters, e.g. ``lr``), per-parameter state.

Updates happen in place on ``p.data`` under no graph recording. Two backends compute the same update:
"numpy" (several in-place array passes) and "cpp" (one fused pass per parameter, tinylearn._C.autograd; used
for C-contiguous float32/float64 parameters). ``backend="auto"`` (default) picks cpp when the extension is built.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import numpy as np

from ..autograd.tensor import Tensor


@functools.cache
def _cpp_module() -> ModuleType | None:
    try:
        from .. import _C
    except ImportError:
        return None
    return getattr(_C, "autograd", None)


_BACKENDS = ("auto", "numpy", "cpp")


class Optimizer:
    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], backend: str = "auto") -> None:
        if backend not in _BACKENDS:
            raise ValueError(f"backend: expected one of {_BACKENDS}, got {backend!r}")
        if backend == "cpp" and _cpp_module() is None:
            raise RuntimeError("backend 'cpp': tinylearn._C.autograd is not built; run tools/build.sh")
        self._fused = _cpp_module() if backend in ("auto", "cpp") else None
        self.backend = "cpp" if self._fused is not None else "numpy"
        self.defaults = dict(defaults)
        self.state: dict[Tensor, dict[str, Any]] = {}
        self._scratch: dict[tuple, np.ndarray] = {}
        self.param_groups: list[dict[str, Any]] = []
        params = list(params)
        if not params:
            raise ValueError("params: optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group: dict[str, Any]) -> None:
        ps = group["params"]
        ps = [ps] if isinstance(ps, Tensor) else list(ps)
        for i, p in enumerate(ps):
            if not isinstance(p, Tensor):
                raise TypeError(f"params: element {i} is {type(p).__name__}, expected a Tensor/Parameter")
            if not p.requires_grad:
                raise ValueError(f"params: element {i} (shape {p.shape}) does not require grad")
        g = {**self.defaults, **group, "params": ps}
        if g.get("lr", 0.0) < 0:
            raise ValueError(f"lr: learning rate must be >= 0, got {g['lr']}")
        self.param_groups.append(g)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.param_groups:
            for p in g["params"]:
                if set_to_none or p.grad is None:
                    p.grad = None
                else:
                    p.grad.data = np.zeros_like(p.data)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state.get(p)
                if st is None:
                    st = self.state[p] = {}
                g = p.grad.data
                if g.shape != p.data.shape:
                    raise ValueError(f"grad: shape {g.shape} does not match parameter shape {p.data.shape}")
                if not p.data.flags.writeable:
                    p.data = p.data.copy()
                self._update(p.data, g, st, group)
        return loss

    def fused_ok(self, *arrays: np.ndarray) -> bool:
        """True when the C++ kernel can update these arrays in place (same float dtype, C-contiguous, writable)."""
        if self._fused is None:
            return False
        dt = arrays[0].dtype
        if dt != np.float32 and dt != np.float64:
            return False
        return all(a.dtype == dt and a.flags.c_contiguous and a.flags.writeable for a in arrays)

    def scratch(self, like: np.ndarray, slot: int = 0) -> np.ndarray:
        """A reusable temporary with ``like``'s shape/dtype (saves one allocation + page faults per update)."""
        key = (like.shape, like.dtype.str, slot)
        buf = self._scratch.get(key)
        if buf is None:
            buf = self._scratch[key] = np.empty_like(like)
        return buf

    def _update(self, w: np.ndarray, g: np.ndarray, state: dict[str, Any], group: dict[str, Any]) -> None:
        raise RuntimeError(f"{type(self).__name__} must implement _update")

    def state_dict(self) -> dict[str, Any]:
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        return {
            "state": {
                index[id(p)]: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
                for p, s in self.state.items()
            },
            "param_groups": [
                {**{k: v for k, v in g.items() if k != "params"}, "params": [index[id(p)] for p in g["params"]]}
                for g in self.param_groups
            ],
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        flat = [p for g in self.param_groups for p in g["params"]]
        if len(sd["param_groups"]) != len(self.param_groups):
            raise ValueError(
                f"state_dict: {len(sd['param_groups'])} param groups, optimizer has {len(self.param_groups)}"
            )
        for g, sg in zip(self.param_groups, sd["param_groups"]):
            g.update({k: v for k, v in sg.items() if k != "params"})
        self.state = {
            flat[int(i)]: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
            for i, s in sd["state"].items()
        }
