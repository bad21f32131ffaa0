"""``Tensor``: an np.ndarray plus the autograd bookkeeping, and the reverse-mode engine (``Tensor.backward``).

Invariant of the engine: for a scalar loss L and every tensor x in its graph,

    x.grad = dL/dx = sum over consumers c of VJP_c(dL/d out_c)

computed by visiting graph nodes (``Function`` instances, ``tensor._ctx``) in reverse topological order, so a
node's backward runs only after *all* gradient contributions to its outputs have been summed (the reused-node
pitfall). Leaf tensors (created by the user, ``requires_grad=True``) accumulate into ``.grad`` across backward
calls, like torch; intermediate gradients are dropped unless ``retain_grad()`` was called.

Storage hook (for the memory-pool topic): ``set_storage_hook(fn)`` makes every Tensor built from a freshly
computed array (op outputs, factories, ``Tensor(data)``) call ``fn(array) -> array`` first; ``fn`` may return an
arena-backed copy with the same shape/dtype/values. ``set_storage_hook(None)`` (the default) removes it; unset,
it costs one ``is None`` test per tensor. ``get_storage_hook()`` returns the current hook.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .function import Function, _check_finite, _GradMode

_storage_hook: Callable[[np.ndarray], np.ndarray] | None = None


def set_storage_hook(fn: Callable[[np.ndarray], np.ndarray] | None) -> Callable[[np.ndarray], np.ndarray] | None:
    """Install ``fn(array) -> array`` (or None to remove); returns the previous hook so callers can restore it."""
    global _storage_hook
    if fn is not None and not callable(fn):
        raise TypeError(f"fn: storage hook must be callable or None, got {type(fn).__name__}")
    prev, _storage_hook = _storage_hook, fn
    return prev


def get_storage_hook() -> Callable[[np.ndarray], np.ndarray] | None:
    return _storage_hook


_DTYPES = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "int64": np.int64,
    "int32": np.int32,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
}


def _as_array(data: Any, dtype: Any) -> np.ndarray:
    if isinstance(data, Tensor):
        data = data.data
    if dtype is not None:
        dt = np.dtype(_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype)
        return np.array(data, dtype=dt, copy=None)
    if isinstance(data, np.ndarray):
        return data
    if isinstance(data, np.generic):
        return np.asarray(data)
    if type(data).__module__.startswith("torch"):  # torch tensors (even requires_grad ones) keep their dtype
        return data.detach().cpu().numpy()
    arr = np.asarray(data)
    if arr.dtype == np.float64:  # python floats / lists of floats -> float32 (torch's default dtype)
        arr = arr.astype(np.float32)
    return arr


class Tensor:
    """A numpy array with autograd. ``Tensor(data, requires_grad=False, dtype=None)``.

    dtype: python floats/lists become float32 (torch's default); numpy arrays keep their dtype (float64 is what
    gradcheck uses). Only floating tensors can require grad (TypeError otherwise, as in torch).
    """

    __slots__ = ("data", "grad", "_rg", "_ctx", "_idx", "_hooks", "__weakref__", "__dict__")
    __array_priority__ = 1000
    __array_ufunc__ = None  # ndarray <op> Tensor defers to Tensor's reflected operator; np.exp(Tensor) is a TypeError

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """np.asarray(t) gives the data (no graph: use the Tensor methods for differentiable math)."""
        if dtype is not None and np.dtype(dtype) != self.data.dtype:
            return self.data.astype(dtype)
        return self.data.copy() if copy else self.data

    def __init__(self, data: Any, requires_grad: bool = False, dtype: Any = None) -> None:
        arr = _as_array(data, dtype)
        if _storage_hook is not None:
            arr = _storage_hook(arr)
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
        if _storage_hook is not None:
            arr = _storage_hook(arr)
        t = Tensor.__new__(Tensor)
        t.data = arr
        t.grad = None
        t._hooks = None
        t._idx = idx
        if requires_grad and arr.dtype.kind == "f":
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
        if value and self.data.dtype.kind not in "fc":
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
        return self.data.shape if dim is None else self.data.shape[dim]

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
        return self.data

    def item(self) -> Any:
        if self.data.size != 1:
            raise ValueError(f"item: only one-element tensors can be converted to a scalar, got shape {self.shape}")
        return self.data.item()

    def tolist(self) -> Any:
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

        return Cast.apply(self, np.dtype(_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype))

    def float(self) -> Tensor:
        return self.astype(np.float32)

    def double(self) -> Tensor:
        return self.astype(np.float64)

    def long(self) -> Tensor:
        return self.astype(np.int64)

    def __repr__(self) -> str:
        extra = ""
        if self._ctx is not None:
            extra = f", grad_fn=<{self._ctx.name}Backward>"
        elif self._rg:
            extra = ", requires_grad=True"
        body = np.array2string(self.data, precision=4, separator=", ", prefix="Tensor(")
        return f"Tensor({body}, dtype={self.data.dtype}{extra})"

    def __bool__(self) -> bool:
        if self.data.size != 1:
            raise RuntimeError(f"Boolean value of Tensor with more than one value is ambiguous (shape {self.shape})")
        return bool(self.data)

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.data.dtype.kind not in "iu" or self.data.size != 1:
            raise TypeError(f"only integer tensors of a single element can be converted to an index, got {self}")
        return int(self.data)

    __hash__ = object.__hash__

    # -- hooks ------------------------------------------------------------------------------------------------
    def register_hook(self, hook: Callable[[Tensor], Any]) -> _HookHandle:
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
        return _HookHandle(lst, hook)

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
                raise ValueError(f"grad: shape {g.shape} does not match the tensor's shape {self.shape}")
        _run_backward(self, g, retain_graph)

    # -- operators (implemented in ops_*.py as Functions) ---------------------------------------------------
    def __add__(self, other: Any) -> Tensor:
        return _ew.Add.apply(self, _lift(other))

    __radd__ = __add__

    def __sub__(self, other: Any) -> Tensor:
        return _ew.Sub.apply(self, _lift(other))

    def __rsub__(self, other: Any) -> Tensor:
        return _ew.Sub.apply(_lift(other), self)

    def __mul__(self, other: Any) -> Tensor:
        return _ew.Mul.apply(self, _lift(other))

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Tensor:
        return _ew.Div.apply(self, _lift(other))

    def __rtruediv__(self, other: Any) -> Tensor:
        return _ew.Div.apply(_lift(other), self)

    def __pow__(self, other: Any) -> Tensor:
        return _ew.Pow.apply(self, _lift(other))

    def __rpow__(self, other: Any) -> Tensor:
        return _ew.Pow.apply(_lift(other), self)

    def __matmul__(self, other: Any) -> Tensor:
        return _la.MatMul.apply(self, other if isinstance(other, Tensor) else Tensor(other))

    def __rmatmul__(self, other: Any) -> Tensor:
        return _la.MatMul.apply(Tensor(other), self)

    def __neg__(self) -> Tensor:
        return _ew.Neg.apply(self)

    # in-place arithmetic: updates .data (no graph), e.g. ``with tl.no_grad(): p -= lr * p.grad``.
    # Like torch it is refused on a tensor that requires grad while grad mode is on. (No version counters: do not
    # modify in place a tensor whose value an unfinished graph still needs.)
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
        except ValueError:
            raise ValueError(
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
        return self

    def copy_(self, src: Any) -> Tensor:
        if self._rg and _GradMode.enabled:
            raise RuntimeError("copy_: a tensor that requires grad is being used in an in-place operation")
        arr = src.data if isinstance(src, Tensor) else np.asarray(src)
        if not self.data.flags.writeable:
            self.data = self.data.copy()
        try:
            np.copyto(self.data, np.broadcast_to(arr, self.shape), casting="same_kind")
        except ValueError:
            raise ValueError(f"copy_: source of shape {arr.shape} cannot be copied into shape {self.shape}") from None
        return self

    def __getitem__(self, idx: Any) -> Tensor:
        return _sh.GetItem.apply(self, _unwrap_index(idx))

    def __setitem__(self, idx: Any, value: Any) -> None:
        if self._rg and _GradMode.enabled:
            raise RuntimeError("__setitem__: in-place assignment into a tensor that requires grad is not supported")
        self.data[_unwrap_index(idx)] = value.data if isinstance(value, Tensor) else value

    # comparisons: plain (non-differentiable) bool tensors
    def __lt__(self, o: Any) -> Tensor:
        return Tensor._make(self.data < _val(o), False, None, 0)

    def __le__(self, o: Any) -> Tensor:
        return Tensor._make(self.data <= _val(o), False, None, 0)

    def __gt__(self, o: Any) -> Tensor:
        return Tensor._make(self.data > _val(o), False, None, 0)

    def __ge__(self, o: Any) -> Tensor:
        return Tensor._make(self.data >= _val(o), False, None, 0)

    def __eq__(self, o: Any) -> Tensor:  # type: ignore[override]
        return Tensor._make(self.data == _val(o), False, None, 0)

    def __ne__(self, o: Any) -> Tensor:  # type: ignore[override]
        return Tensor._make(self.data != _val(o), False, None, 0)

    # elementwise
    def neg(self) -> Tensor:
        return _ew.Neg.apply(self)

    def exp(self) -> Tensor:
        return _ew.Exp.apply(self)

    def log(self) -> Tensor:
        return _ew.Log.apply(self)

    def sqrt(self) -> Tensor:
        return _ew.Sqrt.apply(self)

    def tanh(self) -> Tensor:
        return _ew.Tanh.apply(self)

    def sigmoid(self) -> Tensor:
        return _ew.Sigmoid.apply(self)

    def relu(self) -> Tensor:
        return _ew.ReLU.apply(self)

    def gelu(self, approximate: str = "none") -> Tensor:
        return _ew.GELU.apply(self, approximate=approximate)

    def abs(self) -> Tensor:
        return _ew.Abs.apply(self)

    def clip(self, min: float | None = None, max: float | None = None) -> Tensor:  # noqa: A002
        return _ew.Clip.apply(self, min=min, max=max)

    clamp = clip

    def maximum(self, other: Any) -> Tensor:
        return _ew.Maximum.apply(self, _lift(other))

    def minimum(self, other: Any) -> Tensor:
        return _ew.Minimum.apply(self, _lift(other))

    def pow(self, other: Any) -> Tensor:
        return self.__pow__(other)

    def matmul(self, other: Any) -> Tensor:
        return self.__matmul__(other)

    def softmax(self, dim: int = -1) -> Tensor:
        return _rd.Softmax.apply(self, dim=dim)

    def log_softmax(self, dim: int = -1) -> Tensor:
        return _rd.LogSoftmax.apply(self, dim=dim)

    # reductions
    def sum(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        return _rd.Sum.apply(self, dim=dim, keepdim=keepdim)

    def mean(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        return _rd.Mean.apply(self, dim=dim, keepdim=keepdim)

    def max(self, dim: int | None = None, keepdim: bool = False) -> Tensor:
        return _rd.Max.apply(self, dim=dim, keepdim=keepdim, sign=1.0)

    def min(self, dim: int | None = None, keepdim: bool = False) -> Tensor:
        return _rd.Max.apply(self, dim=dim, keepdim=keepdim, sign=-1.0)

    def var(
        self, dim: int | Sequence[int] | None = None, keepdim: bool = False, correction: int = 1, unbiased: Any = None
    ) -> Tensor:
        if unbiased is not None:
            correction = 1 if unbiased else 0
        return _rd.Var.apply(self, dim=dim, keepdim=keepdim, correction=correction)

    def std(self, dim: int | Sequence[int] | None = None, keepdim: bool = False, correction: int = 1) -> Tensor:
        return self.var(dim, keepdim, correction).sqrt()

    def argmax(self, dim: int | None = None, keepdim: bool = False) -> Tensor:
        out = np.argmax(self.data, axis=dim, keepdims=keepdim) if dim is not None else np.argmax(self.data)
        return Tensor._make(np.asarray(out, dtype=np.int64), False, None, 0)

    def argmin(self, dim: int | None = None, keepdim: bool = False) -> Tensor:
        out = np.argmin(self.data, axis=dim, keepdims=keepdim) if dim is not None else np.argmin(self.data)
        return Tensor._make(np.asarray(out, dtype=np.int64), False, None, 0)

    # shape
    def reshape(self, *shape: Any) -> Tensor:
        return _sh.Reshape.apply(self, _shape_arg(shape))

    def view(self, *shape: Any) -> Tensor:
        return _sh.Reshape.apply(self, _shape_arg(shape))

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        nd = self.data.ndim
        perm = list(range(nd))
        d0, d1 = _norm_dim(dim0, nd, "dim0"), _norm_dim(dim1, nd, "dim1")
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return _sh.Permute.apply(self, tuple(perm))

    def permute(self, *dims: Any) -> Tensor:
        dims = _shape_arg(dims)
        nd = self.data.ndim
        if sorted(_norm_dim(d, nd, "dims") for d in dims) != list(range(nd)):
            raise ValueError(f"dims: {dims} is not a permutation of the {nd} dims of shape {self.shape}")
        return _sh.Permute.apply(self, tuple(_norm_dim(d, nd, "dims") for d in dims))

    @property
    def T(self) -> Tensor:  # noqa: N802
        return _sh.Permute.apply(self, tuple(range(self.data.ndim - 1, -1, -1)))

    @property
    def mT(self) -> Tensor:  # noqa: N802
        return self.transpose(-2, -1)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        nd = self.data.ndim
        if nd == 0:
            return self.reshape(1)
        s, e = _norm_dim(start_dim, nd, "start_dim"), _norm_dim(end_dim, nd, "end_dim")
        if s > e:
            raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {self.shape}")
        shp = self.shape
        return self.reshape(shp[:s] + (int(np.prod(shp[s : e + 1])),) + shp[e + 1 :])

    def unsqueeze(self, dim: int) -> Tensor:
        d = _norm_dim(dim, self.data.ndim + 1, "dim")
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def squeeze(self, dim: int | None = None) -> Tensor:
        shp = self.shape
        if dim is None:
            return self.reshape(tuple(s for s in shp if s != 1))
        d = _norm_dim(dim, self.data.ndim, "dim")
        if shp[d] != 1:
            return self
        return self.reshape(shp[:d] + shp[d + 1 :])

    def expand(self, *sizes: Any) -> Tensor:
        sizes = _shape_arg(sizes)
        shp = self.shape
        if len(sizes) < len(shp):
            raise ValueError(f"expand: sizes {sizes} have fewer dims than the tensor's shape {shp}")
        lead = len(sizes) - len(shp)
        target = tuple(shp[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(sizes))
        return _sh.Expand.apply(self, target)

    def expand_as(self, other: Tensor) -> Tensor:
        return self.expand(*other.shape)

    def repeat(self, *reps: Any) -> Tensor:
        reps = _shape_arg(reps)
        return _sh.Repeat.apply(self, reps)


class _HookHandle:
    def __init__(self, lst: list, fn: Any) -> None:
        self._lst, self._fn = lst, fn

    def remove(self) -> None:
        if self._fn in self._lst:
            self._lst.remove(self._fn)


def _lift(x: Any) -> Any:
    """Scalars stay Python scalars (keeps the tensor's dtype); arrays become constant Tensors."""
    t = type(x)
    if t is Tensor or t is float or t is int or isinstance(x, Tensor):
        return x
    if isinstance(x, np.generic | bool):
        return x.item() if isinstance(x, np.generic) else x
    return Tensor(x)


def _val(x: Any) -> Any:
    return x.data if isinstance(x, Tensor) else x


def _unwrap_index(idx: Any) -> Any:
    if isinstance(idx, Tensor):
        return idx.data
    if isinstance(idx, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in idx)
    if isinstance(idx, list):
        return np.asarray(idx)
    return idx


def _shape_arg(shape: tuple) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], tuple | list):
        shape = tuple(shape[0])
    return tuple(int(s) for s in shape)


def _norm_dim(d: int, nd: int, name: str) -> int:
    if not -max(nd, 1) <= d < max(nd, 1):
        raise ValueError(f"{name}: dimension {d} out of range for a tensor with {nd} dims")
    return d % max(nd, 1)


# ---------------------------------------------------------------------------------------------------------------
# reverse-mode engine
# ---------------------------------------------------------------------------------------------------------------
def topo_sort(root: Any, parents: Callable[[Any], Iterable[Any]]) -> list[Any]:
    """Nodes reachable from ``root`` through ``parents(node)``, each listed after all of its parents (root last).

    Iterative post-order DFS, so a 100k-deep chain does not hit Python's recursion limit.
    """
    order: list[Any] = []
    seen = {id(root)}
    stack = [(root, iter(parents(root)))]
    while stack:
        node, it = stack[-1]
        for p in it:
            if id(p) not in seen:
                seen.add(id(p))
                stack.append((p, iter(parents(p))))
                break
        else:
            stack.pop()
            order.append(node)
    return order


def _node_parents(node: Function) -> list[Function]:
    return [t._ctx for t in node.inputs if isinstance(t, Tensor) and t._ctx is not None]


def _topo_order(root: Function) -> list[Function]:
    return topo_sort(root, _node_parents)


def _call_hooks(hooks: list, g: np.ndarray) -> np.ndarray:
    for h in list(hooks):
        r = h(Tensor._make(g, False, None, 0))
        if r is not None:
            g = r.data if isinstance(r, Tensor) else np.asarray(r)
    return g


def _accumulate_leaf(t: Tensor, g: np.ndarray, handed: set, fresh: bool = False) -> None:
    """Add this pass's total gradient ``g`` of leaf ``t`` into ``t.grad`` (hooks first, like torch)."""
    if t._hooks:
        g = _call_hooks(t._hooks, g)
        fresh = False
    if g.dtype != t.data.dtype:
        g = g.astype(t.data.dtype)
        fresh = True
    if t.grad is None:
        # the engine's array may be shared (a view, another leaf's grad, a pending slot): copy only then
        if not fresh and (g.base is not None or not g.flags.writeable or id(g) in handed):
            g = g.copy()
        handed.add(id(g))
        t.grad = Tensor._make(g, False, None, 0)
    else:
        # never in place: the existing .grad array may still be referenced by the graph or the user
        t.grad.data = np.asarray(t.grad.data + g)


def _run_backward(root: Tensor, g: np.ndarray, retain_graph: bool) -> None:
    handed: set[int] = set()
    ctx0 = root._ctx
    if ctx0 is None:
        _accumulate_leaf(root, g, handed)
        return
    order = _topo_order(ctx0)
    # per node: list of output grads; per leaf: [tensor, summed grad]. ``owned`` holds ids of arrays the engine
    # created by summing (safe to add into in place); everything else may be shared and is never mutated.
    grads: dict[int, list] = {id(ctx0): [None] * ctx0.n_out}
    leaves: dict[int, list] = {}
    owned: set[int] = set()
    grads[id(ctx0)][root._idx] = g
    anomaly = _GradMode.anomaly
    prev_mode = _GradMode.enabled
    _GradMode.enabled = False  # backward formulas run on arrays; never record them
    try:
        for node in reversed(order):
            gouts = grads.pop(id(node), None)
            if gouts is None:
                continue
            for x in gouts:
                owned.discard(id(x))
            if node.saved_tensors is None:
                raise RuntimeError(
                    f"backward: trying to backward through the graph a second time (op {node.name!r}); its saved "
                    "values were freed. Specify retain_graph=True on the first backward call."
                )
            if node.out_hooks:
                for i, hs in node.out_hooks.items():
                    if gouts[i] is not None:
                        gouts[i] = _call_hooks(hs, gouts[i])
            if node.n_out > 1:
                if all(x is None for x in gouts):
                    continue
                # outputs that received no gradient contribute zeros (torch materializes them too)
                gouts = [gz if gz is not None else np.zeros(sh, dt) for gz, (sh, dt) in zip(gouts, node.out_meta)]
            gins = type(node).backward(node, *gouts)
            if type(gins) is not tuple:
                gins = (gins,)
            if anomaly:
                _check_finite(node.name, tuple(x for x in gins if isinstance(x, np.ndarray)), "backward")
            for inp, gi in zip(node.inputs, gins):
                if gi is None or not isinstance(inp, Tensor) or not inp._rg:
                    continue
                if type(gi) is not np.ndarray:
                    gi = np.asarray(gi, dtype=inp.data.dtype)
                if gi.shape != inp.data.shape:
                    raise RuntimeError(
                        f"backward: op {node.name!r} returned a gradient of shape {gi.shape} for an input of shape "
                        f"{inp.data.shape}"
                    )
                c = inp._ctx
                if c is None:
                    slot = leaves.get(id(inp))
                    if slot is None:
                        slot = leaves[id(inp)] = [inp, None]
                    idx = 1
                else:
                    slot = grads.get(id(c))
                    if slot is None:
                        slot = grads[id(c)] = [None] * c.n_out
                    idx = inp._idx
                cur = slot[idx]
                if cur is None:
                    slot[idx] = gi
                elif id(cur) in owned:
                    cur += gi
                else:
                    new = np.add(cur, gi, dtype=np.result_type(cur, gi))
                    if type(new) is not np.ndarray:  # 0-d arithmetic returns a numpy scalar
                        new = np.asarray(new)
                    owned.add(id(new))
                    slot[idx] = new
            if not retain_graph and node.saved_tensors:
                node.saved_tensors = None
        for t, gl in leaves.values():
            _accumulate_leaf(t, gl, handed, id(gl) in owned)
    finally:
        _GradMode.enabled = prev_mode


from . import linalg as _la  # noqa: E402
from . import ops_elementwise as _ew  # noqa: E402
from . import ops_reduce as _rd  # noqa: E402
from . import ops_shape as _sh  # noqa: E402
