"""``Module``: the container of parameters, buffers and submodules, with torch's internals.

Attribute assignment registers by type: a ``Parameter`` goes to ``_parameters``, a ``Module`` to ``_modules``,
a Tensor assigned to a name already in ``_buffers`` updates that buffer; anything else is a plain attribute.
``state_dict()`` maps dotted names (``"0.weight"``, ``"bn.running_mean"``) to tensors; ``load_state_dict``
copies values back in place (strict: missing or unexpected keys raise RuntimeError, shapes ValueError).

Hooks (like torch): ``register_forward_pre_hook(hook(module, args) -> None | new args)`` runs before ``forward``,
``register_forward_hook(hook(module, args, output) -> None | new output)`` after; each returns a handle with
``.remove()``. Pruning re-parametrises a weight with a pre-hook exactly as torch.nn.utils.prune does:
``weight`` leaves ``_parameters``, ``weight_orig`` (Parameter) and ``weight_mask`` (buffer) are registered, and the
pre-hook sets ``module.weight = weight_orig * weight_mask`` as a plain attribute before every forward.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from .._inputs import to_numpy
from ..autograd.tensor import Tensor
from .parameter import Parameter

_handle_ids = itertools.count()


class RemovableHandle:
    def __init__(self, hooks: dict) -> None:
        self.id = next(_handle_ids)
        self._hooks = hooks

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class Module:
    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{type(self).__name__}: forward() is not defined")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._forward_pre_hooks:
            for hook in list(self._forward_pre_hooks.values()):
                r = hook(self, args)
                if r is not None:
                    args = r if isinstance(r, tuple) else (r,)
        out = self.forward(*args, **kwargs)
        if self._forward_hooks:
            for hook in list(self._forward_hooks.values()):
                r = hook(self, args, out)
                if r is not None:
                    out = r
        return out

    # -- registration -----------------------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        if "_parameters" not in d:
            raise RuntimeError(f"{type(self).__name__}: call super().__init__() before assigning attribute {name!r}")
        if isinstance(value, Parameter):
            self._remove_from(name, keep="_parameters")
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._remove_from(name, keep="_modules")
            self._modules[name] = value
        elif name in self._parameters:
            if value is not None:
                raise TypeError(
                    f"{name}: cannot assign {type(value).__name__} to parameter {name!r} (Parameter or None)"
                )
            self._parameters[name] = None
        elif name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"{name}: cannot assign {type(value).__name__} to buffer {name!r} (Tensor or None)")
            self._buffers[name] = value
        elif name in self._modules:
            if value is not None:
                raise TypeError(f"{name}: cannot assign {type(value).__name__} to submodule {name!r} (Module or None)")
            self._modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def _remove_from(self, name: str, keep: str) -> None:
        for dname in ("_parameters", "_buffers", "_modules"):
            if dname != keep:
                self.__dict__[dname].pop(name, None)
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for dname in ("_parameters", "_buffers", "_modules"):
            sub = d.get(dname)
            if sub is not None and name in sub:
                return sub[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for dname in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__[dname]:
                del self.__dict__[dname][name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"name: parameter name must be a non-empty string without '.', got {name!r}")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"param: expected Parameter or None for {name!r}, got {type(param).__name__}")
        if name in self.__dict__ and name not in self._parameters:
            raise ValueError(f"name: attribute {name!r} already exists")
        self._remove_from(name, keep="_parameters")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | np.ndarray | None, persistent: bool = True) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"name: buffer name must be a non-empty string without '.', got {name!r}")
        if name in self.__dict__ and name not in self._buffers:
            raise ValueError(f"name: attribute {name!r} already exists")
        if isinstance(tensor, np.ndarray):
            tensor = Tensor(tensor)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"tensor: buffer {name!r} must be a Tensor, ndarray or None, got {type(tensor).__name__}")
        self._remove_from(name, keep="_buffers")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"module: {name!r} must be a Module or None, got {type(module).__name__}")
        self._remove_from(name, keep="_modules")
        self._modules[name] = module

    register_module = add_module

    def register_forward_pre_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        h = RemovableHandle(self._forward_pre_hooks)
        self._forward_pre_hooks[h.id] = hook
        return h

    def register_forward_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        h = RemovableHandle(self._forward_hooks)
        self._forward_hooks[h.id] = hook
        return h

    # -- traversal --------------------------------------------------------------------------------------------
    def named_modules(self, memo: set | None = None, prefix: str = "") -> Iterator[tuple[str, Module]]:
        if memo is None:
            memo = set()
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is None:
                continue
            yield from m.named_modules(memo, f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        seen = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def _named_members(self, dname: str, prefix: str, recurse: bool) -> Iterator[tuple[str, Any]]:
        seen = set()
        mods = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for mprefix, m in mods:
            for k, v in m.__dict__[dname].items():
                if v is None or id(v) in seen:
                    continue
                seen.add(id(v))
                yield (f"{mprefix}.{k}" if mprefix else k), v

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        yield from self._named_members("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        yield from self._named_members("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target: str) -> Module:
        mod: Module = self
        for part in target.split(".") if target else []:
            if part not in mod._modules:
                raise AttributeError(f"target: {type(mod).__name__} has no submodule {part!r} (in {target!r})")
            mod = mod._modules[part]
        return mod

    def apply(self, fn: Callable[[Module], None]) -> Module:
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # -- state --------------------------------------------------------------------------------------------------
    def state_dict(self, prefix: str = "") -> OrderedDict[str, Tensor]:
        """Dotted name -> detached Tensor (sharing storage with the module) for parameters and persistent buffers."""
        out: OrderedDict[str, Tensor] = OrderedDict()
        self._save_to(out, prefix)
        return out

    def _save_to(self, out: OrderedDict, prefix: str) -> None:
        for k, p in self._parameters.items():
            if p is not None:
                out[prefix + k] = p.detach()
        for k, b in self._buffers.items():
            if b is not None and k not in self._non_persistent:
                out[prefix + k] = b.detach()
        for k, m in self._modules.items():
            if m is not None:
                m._save_to(out, prefix + k + ".")

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> tuple[list[str], list[str]]:
        """Copy values in place; returns (missing_keys, unexpected_keys). strict=True raises RuntimeError on either."""
        own: dict[str, Tensor] = {}
        for mprefix, m in self.named_modules():
            pre = mprefix + "." if mprefix else ""
            for k, p in m._parameters.items():
                if p is not None:
                    own[pre + k] = p
            for k, b in m._buffers.items():
                if b is not None and k not in m._non_persistent:
                    own[pre + k] = b
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise RuntimeError(
                f"load_state_dict: missing keys {missing}, unexpected keys {unexpected} in state_dict "
                f"for {type(self).__name__}"
            )
        for k, t in own.items():
            if k not in state_dict:
                continue
            arr = to_numpy(state_dict[k], f"state_dict[{k!r}]")  # a torch (CPU) state_dict loads directly
            if arr.shape != t.data.shape:
                raise ValueError(f"state_dict[{k!r}]: shape {arr.shape} does not match the module's {t.data.shape}")
            if t.data.flags.writeable:
                np.copyto(t.data, arr, casting="unsafe")
            else:
                t.data = np.array(arr, dtype=t.data.dtype)
        return missing, unexpected

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.data = np.zeros_like(p.data)

    def num_parameters(self) -> int:
        return sum(p.data.size for p in self.parameters())

    # -- printing ------------------------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = []
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"({name}): {sub}")
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))
