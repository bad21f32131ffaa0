"""``Tensor``: an np.ndarray plus the autograd bookkeeping (torch's ``torch.Tensor``, on numpy).

This file holds the state and what touches it directly: construction (dtype rules in dtypes.py, the storage hook
in storage.py), properties, conversions, gradient hooks, ``backward`` (the engine is engine.py) and the in-place
updates. The differentiable methods (operators, elementwise, reductions, shape ops) come from the
``TensorMethods`` mixin in methods.py.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from . import function as _function
from . import storage as _storage
from .dtypes import as_array, as_dtype, is_floating
from .errors import ShapeError
from .function import Function, _GradMode
from .methods import TensorMethods, _unwrap_index
from .storage import get_storage_hook, set_storage_hook  # noqa: F401  (re-exported: memory.pooled uses them here)


class Tensor(TensorMethods):
    """A numpy array with autograd. ``Tensor(data, requires_grad=False, dtype=None)``.

    dtype: python floats/lists become float32 (torch's default); numpy arrays keep their dtype (float64 is what
    gradcheck uses). Only floating tensors can require grad (TypeError otherwise, as in torch).
    """

    _version = 0  # bumped by every in-place op; backward checks it for tensors saved for backward (like torch)

    __slots__ = ("data", "grad", "_rg", "_ctx", "_idx", "_hooks", "__weakref__", "__dict__")
    __array_priority__ = 1000
    __array_ufunc__ = None  # ndarray <op> Tensor defers to Tensor's reflected operator; np.exp(Tensor) is a TypeError

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """np.asarray(t) gives the data (no graph: use the Tensor methods for differentiable math)."""
        if _function._trace_hook is not None:
            _function._trace_hook.escape(self, "__array__")
        if dtype is not None and np.dtype(dtype) != self.data.dtype:
            return self.data.astype(dtype)
        return self.data.copy() if copy else self.data

    def __init__(self, data: Any, requires_grad: bool = False, dtype: Any = None) -> None:
        try:
            arr = as_array(data.data if isinstance(data, Tensor) else data, dtype)
        except ValueError as e:  # ragged nested lists: numpy's "inhomogeneous shape"
            raise ValueError(f"data: cannot make a tensor of {type(data).__name__} {data!r:.80}: {e}") from e
        if arr.dtype.kind in "OUSMm":  # None, strings, objects, dates: not numeric data
            raise TypeError(
                f"data: expected numeric data (array, number, nested list), got {type(data).__name__} "
                f"with numpy dtype {arr.dtype}"
            )
        if _storage.hook is not None:
            arr = _storage.hook(arr)
        self.data = arr
        self.grad: Tensor | None = None
        self._ctx: Function | None = None
        self._idx = 0
        self._hooks: list | None = None
        self._rg = False
        if requires_grad:
            self.requires_grad = True

    @staticmethod
    def _make(arr: Any, requires_grad: bool, ctx: Function | None, idx: int) -> Tensor:
        """Fast internal constructor for op outputs (no dtype conversion, no checks)."""
        if type(arr) is not np.ndarray:
            arr = np.asarray(arr)
        hook = _storage.hook
        if hook is not None:
            arr = hook(arr)
        t = Tensor.__new__(Tensor)
        t.data = arr
        t.grad = None
        t._hooks = None
        t._idx = idx
        if requires_grad and is_floating(arr.dtype):
            t._rg, t._ctx = True, ctx
        else:
            t._rg, t._ctx = False, None
        return t

    # -- basic properties -----------------------------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._rg

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if value and not (is_floating(self.data.dtype) or self.data.dtype.kind == "c"):
            raise TypeError(
                f"requires_grad: only floating point tensors can require gradients, got dtype {self.data.dtype}"
            )
        if not value and self._ctx is not None:
            raise RuntimeError("requires_grad: you can only change requires_grad flags of leaf tensors (use detach())")
        self._rg = bool(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    @property
    def grad_fn(self) -> Function | None:
        return self._ctx

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    def dim(self) -> int:
        return self.data.ndim

    def size(self, dim: int | None = None) -> Any:
        if dim is None:
            return self.data.shape
        from .errors import DimError
        from .ops_reduce import norm_dim

        if self.data.ndim == 0:  # torch: a 0-d tensor has no dims to ask about
            raise DimError(f"dim: dimension {dim} specified but the tensor has no dimensions")
        return self.data.shape[norm_dim(dim, self.data.ndim)]

    def numel(self) -> int:
        return self.data.size

    def __len__(self) -> int:
        if self.data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.data.shape[0]

    def __iter__(self) -> Any:
        for i in range(len(self)):
            yield self[i]

    def numpy(self) -> np.ndarray:
        if _function._trace_hook is not None:  # tracing: a value leaves the graph (tinylearn.compiler)
            _function._trace_hook.escape(self, "numpy")
        return self.data

    def item(self) -> Any:
        if _function._trace_hook is not None:
            _function._trace_hook.escape(self, "item")
        if self.data.size != 1:
            raise ValueError(f"item: only one-element tensors can be converted to a scalar, got shape {self.shape}")
        return self.data.item()

    def tolist(self) -> Any:
        if _function._trace_hook is not None:
            _function._trace_hook.escape(self, "tolist")
        return self.data.tolist()

    def detach(self) -> Tensor:
        return Tensor._make(self.data, False, None, 0)

    def clone(self) -> Tensor:
        from .ops_shape import Clone

        return Clone.apply(self)

    def contiguous(self) -> Tensor:
        return self

    def astype(self, dtype: Any) -> Tensor:
        from .ops_shape import Cast

        return Cast.apply(self, as_dtype(dtype))

    def float(self) -> Tensor:
        return self.astype(np.float32)

    def double(self) -> Tensor:
        return self.astype(np.float64)

    def long(self) -> Tensor:
        return self.astype(np.int64)

    def half(self) -> Tensor:
        return self.astype(np.float16)

    def bfloat16(self) -> Tensor:
        return self.astype("bfloat16")

    def to(self, dtype: Any) -> Tensor:
        """Differentiable cast, e.g. ``t.to("bfloat16")`` (no devices here: dtype only); self if unchanged."""
        dt = as_dtype(dtype)
        return self if dt == self.data.dtype else self.astype(dt)

    def __repr__(self) -> str:
        extra = ""
        if self._ctx is not None:
            extra = f", grad_fn=<{self._ctx.name}Backward>"
        elif self._rg:
            extra = ", requires_grad=True"
        body = np.array2string(self.data, precision=4, separator=", ", prefix="Tensor(")
        return f"Tensor({body}, dtype={self.data.dtype}{extra})"

    def __bool__(self) -> bool:
        if _function._trace_hook is not None:  # tracing: data-dependent control flow is a graph break
            _function._trace_hook.escape(self, "__bool__")
        if self.data.size != 1:
            raise RuntimeError(f"Boolean value of Tensor with more than one value is ambiguous (shape {self.shape})")
        return bool(self.data)

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if _function._trace_hook is not None:
            _function._trace_hook.escape(self, "__index__")
        if self.data.dtype.kind not in "iu" or self.data.size != 1:
            raise TypeError(f"only integer tensors of a single element can be converted to an index, got {self}")
        return int(self.data)

    __hash__ = object.__hash__

    # -- hooks ------------------------------------------------------------------------------------------------
    def register_hook(self, hook: Callable[[Tensor], Any]) -> _engine.HookHandle:
        """``hook(grad) -> Tensor|None`` runs when this tensor's gradient is computed; a return value replaces it."""
        if not self._rg:
            raise RuntimeError("register_hook: cannot register a hook on a tensor that doesn't require gradient")
        if self._ctx is None:
            if self._hooks is None:
                self._hooks = []
            lst = self._hooks
        else:
            if self._ctx.out_hooks is None:
                self._ctx.out_hooks = {}
            lst = self._ctx.out_hooks.setdefault(self._idx, [])
        lst.append(hook)
        return _engine.HookHandle(lst, hook)

    def retain_grad(self) -> None:
        """Keep this non-leaf tensor's gradient in ``.grad`` after backward."""
        if self._ctx is None:
            return
        ref = weakref.ref(self)

        def _keep(g: Tensor) -> None:
            t = ref()
            if t is not None:
                t.grad = Tensor._make(g.data.copy(), False, None, 0) if t.grad is None else t.grad + g.data
            return None

        self.register_hook(_keep)

    # -- the engine -------------------------------------------------------------------------------------------
    def backward(self, grad: Any = None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) * grad into every leaf's ``.grad`` (grad defaults to 1 for scalars)."""
        if not self._rg:
            raise RuntimeError("backward: element 0 of tensors does not require grad and does not have a grad_fn")
        if grad is None:
            if self.data.size != 1:
                raise RuntimeError(
                    f"backward: grad can be implicitly created only for scalar outputs, got shape {self.shape}"
                )
            g = np.ones_like(self.data)
        else:
            g = np.array(grad.data if isinstance(grad, Tensor) else grad, dtype=self.data.dtype)
            if g.shape != self.shape:
                raise ShapeError(f"grad: shape {g.shape} does not match the tensor's shape {self.shape}")
        _engine.run_backward(self, g, retain_graph)

    # in-place arithmetic: updates .data (no graph), e.g. ``with tl.no_grad(): p -= lr * p.grad``.
    # Like torch it is refused on a tensor that requires grad while grad mode is on. Every in-place op bumps
    # ``_version``; backward raises if a tensor saved for backward changed since (torch's version counters).
    def _inplace(self, other: Any, ufunc: np.ufunc, name: str) -> Tensor:
        if self._rg and _GradMode.enabled:
            raise RuntimeError(
                f"{name}: a tensor that requires grad is being used in an in-place operation (wrap it in tl.no_grad())"
            )
        o = other.data if isinstance(other, Tensor) else other
        if not self.data.flags.writeable:
            self.data = self.data.copy()
        try:
            ufunc(self.data, o, out=self.data, casting="same_kind")
            self._version += 1
        except ValueError:
            raise ShapeError(
                f"{name}: operand of shape {np.shape(o)} cannot update a tensor of shape {self.shape}"
            ) from None
        return self

    def __iadd__(self, other: Any) -> Tensor:
        return self._inplace(other, np.add, "__iadd__")

    def __isub__(self, other: Any) -> Tensor:
        return self._inplace(other, np.subtract, "__isub__")

    def __imul__(self, other: Any) -> Tensor:
        return self._inplace(other, np.multiply, "__imul__")

    def __itruediv__(self, other: Any) -> Tensor:
        return self._inplace(other, np.true_divide, "__itruediv__")

    def zero_(self) -> Tensor:
        return self.fill_(0)

    def fill_(self, value: float) -> Tensor:
        if self._rg and _GradMode.enabled:
            raise RuntimeError("fill_: a tensor that requires grad is being used in an in-place operation")
        if not self.data.flags.writeable:
            self.data = self.data.copy()
        self.data[...] = value
        self._version += 1
        return self

    def copy_(self, src: Any) -> Tensor:
        if self._rg and _GradMode.enabled:
            raise RuntimeError("copy_: a tensor that requires grad is being used in an in-place operation")
        arr = src.data if isinstance(src, Tensor) else np.asarray(src)
        if not self.data.flags.writeable:
            self.data = self.data.copy()
        try:
            np.copyto(self.data, np.broadcast_to(arr, self.shape), casting="same_kind")
            self._version += 1
        except ValueError:
            raise ShapeError(f"copy_: source of shape {arr.shape} cannot be copied into shape {self.shape}") from None
        return self

    def __setitem__(self, idx: Any, value: Any) -> None:
        if self._rg and _GradMode.enabled:
            raise RuntimeError("__setitem__: in-place assignment into a tensor that requires grad is not supported")
        self.data[_unwrap_index(idx)] = value.data if isinstance(value, Tensor) else value
        self._version += 1


from . import engine as _engine  # noqa: E402  (circular: the engine builds Tensors)
