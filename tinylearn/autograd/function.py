"""Differentiable operations: the ``Function`` base class every op (built-in or custom) is written with.

An op is a pair of maps on numpy arrays that sit side by side:

    forward:   y = f(x_1, ..., x_k)
    backward:  (dL/dx_1, ..., dL/dx_k) = VJP(dL/dy)   — the vector-Jacobian product, never the Jacobian itself

Custom-op API (torch-like; other tinylearn packages use it to add differentiable ops)::

    from tinylearn.autograd import Function

    class Square(Function):
        @staticmethod
        def forward(ctx, x, scale=1.0):            # Tensor args arrive unwrapped as np.ndarray
            ctx.save_for_backward(x)
            ctx.scale = scale                      # plain attributes on ctx are fine too
            return scale * x * x                   # an np.ndarray (or a tuple of arrays)

        @staticmethod
        def backward(ctx, grad_out):               # one np.ndarray per forward output
            (x,) = ctx.saved_tensors
            return 2 * ctx.scale * x * grad_out, None   # one entry per *positional* forward arg

    y = Square.apply(t, 3.0)                       # -> Tensor (a tuple of Tensors for tuple outputs)

Rules:
- positional args that are Tensors reach ``forward`` as their ``.data`` arrays; any other positional or keyword
  arg passes through unchanged. ``backward`` returns a tuple with one entry per positional arg (a bare array is
  accepted when there is exactly one); entries for non-Tensor args, or inputs that do not require grad, must be
  ``None`` (or anything: they are ignored). ``ctx.needs_input_grad[i]`` tells whether input i needs one, so
  backward can skip work.
- each returned gradient must have exactly the shape of its input (reduce broadcast dims yourself, e.g. with
  ``tinylearn.autograd.function.unbroadcast``); the engine checks and raises RuntimeError naming the op.
- backward must not modify ``grad_out`` in place (it may be shared); it may return it unchanged.
- ``ctx.save_for_backward(*arrays)`` / ``ctx.saved_tensors``: saved values are freed after backward unless
  ``backward(retain_graph=True)``; running backward through a freed node raises RuntimeError like torch.
- ``ctx.mark_non_differentiable(*idx)`` (output indices) makes those outputs plain tensors (e.g. argmax indices).

The engine (``Tensor.backward``) visits the nodes in reverse topological order, so every node's output
gradient is complete (summed over all of its consumers) before its own backward runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_autocast_hook: Any = None  # tinylearn.amp.autocast installs (cls, args, kwargs) -> outputs | NotImplemented
# tinylearn.compiler.trace installs a recorder while it traces: (cls, args, kwargs) -> outputs (it runs the op itself
# and records it as a graph node); the recorder also has ``escape(tensor, what)``, which Tensor's conversions to
# Python values (bool, item, numpy, ...) call so data-dependent control flow becomes a graph break
_trace_hook: Any = None
# tinylearn.profiler installs a recorder while a ``tl.profile()`` block runs: ``forward(cls, ctx, arrays, kwargs)``
# runs and times an op's forward, ``backward(node, grad_outputs)`` (called by the engine) its backward
_profile_hook: Any = None


class _GradMode:
    """Global switch read by ``Function.apply`` (``tl.no_grad()`` flips it). Anomaly mode lives here too."""

    enabled: bool = True
    anomaly: bool = False


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the dimensions numpy broadcasting added or stretched, so it gets ``shape`` back.

    Broadcasting copies x along the new/size-1 axes, so the VJP sums the gradient along exactly those axes.
    """
    if grad.shape == shape:
        return grad
    nd = grad.ndim - len(shape)
    if nd:
        grad = grad.sum(axis=tuple(range(nd)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad.reshape(shape)


class Function:
    """Base class of differentiable ops. An instance is the ``ctx`` of one call and the graph node it creates."""

    __slots__ = (
        "inputs",
        "saved_tensors",
        "needs_input_grad",
        "n_out",
        "non_diff",
        "freed",
        "out_hooks",
        "out_meta",
        "__dict__",
    )

    # tl.memory.estimate's model of the backward: True when it allocates a temporary the size of a buffer the op
    # saved for itself (im2col's dcol); an op whose backward makes only its input gradients sets False
    backward_temporary: bool = True

    def __init__(self) -> None:
        self.saved_tensors: tuple[Any, ...] = ()
        self.non_diff: tuple[int, ...] = ()
        self.out_hooks: dict[int, list] | None = None
        self.freed = False

    # -- the API ops implement ------------------------------------------------------------------------------
    @staticmethod
    def forward(ctx: Function, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - abstract
        raise RuntimeError("Function.forward must be overridden by the op")

    @staticmethod
    def backward(ctx: Function, *grad_outputs: np.ndarray) -> Any:  # pragma: no cover - abstract
        raise RuntimeError("Function.backward must be overridden by the op")

    def save_for_backward(self, *values: Any) -> None:
        self.saved_tensors = values

    def mark_non_differentiable(self, *output_indices: int) -> None:
        self.non_diff = output_indices

    @property
    def name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return f"<{type(self).__name__}Backward>"

    # -- graph construction ---------------------------------------------------------------------------------
    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        if _trace_hook is not None:  # tracing (tinylearn.compiler): the recorder runs the op and records it
            return _trace_hook(cls, args, kwargs)
        if _autocast_hook is not None:  # the one autocast entry point: casts inputs/outputs of listed ops
            out = _autocast_hook(cls, args, kwargs)
            if out is not NotImplemented:
                return out
        ctx = cls()
        arrays = []
        needs = []
        any_grad = False
        for a in args:
            if isinstance(a, Tensor):
                arrays.append(a.data)
                rg = a.requires_grad
                needs.append(rg)
                any_grad = any_grad or rg
            else:
                arrays.append(a)
                needs.append(False)
        track = any_grad and _GradMode.enabled
        ctx.needs_input_grad = tuple(needs) if track else (False,) * len(args)
        if _profile_hook is None:
            out = cls.forward(ctx, *arrays, **kwargs)
        else:  # tl.profile(): the recorder runs the forward and times it
            out = _profile_hook.forward(cls, ctx, arrays, kwargs)
        if _GradMode.anomaly:
            _check_finite(cls.__name__, out, "forward")
        if type(out) is tuple:
            ctx.n_out = len(out)
            ctx.out_meta = [(o.shape, o.dtype) for o in out]
            if track:
                ctx.inputs = args
                _record_versions(ctx, args)
                res = tuple(
                    Tensor._make(o, i not in ctx.non_diff, ctx if i not in ctx.non_diff else None, i)
                    for i, o in enumerate(out)
                )
            else:
                res = tuple(Tensor._make(o, False, None, 0) for o in out)
            return res
        ctx.n_out = 1
        if track:
            ctx.inputs = args
            _record_versions(ctx, args)
            return Tensor._make(out, True, ctx, 0)
        return Tensor._make(out, False, None, 0)


def _record_versions(ctx: Function, args: tuple) -> None:
    """Version counters like torch: remember the version of every input whose array was saved for backward; the
    engine raises if an in-place op bumped it before backward (the saved value would be stale)."""
    saved = getattr(ctx, "saved_tensors", None)
    if not saved:
        return
    ids = {id(s) for s in saved if isinstance(s, np.ndarray)}
    vs = [(a, a._version) for a in args if isinstance(a, Tensor) and id(a.data) in ids]
    if vs:
        ctx.saved_versions = vs


def _check_finite(op: str, out: Any, where: str) -> None:
    outs = out if isinstance(out, tuple) else (out,)
    for o in outs:
        if isinstance(o, np.ndarray) and o.dtype.kind == "f" and not np.isfinite(o).all():
            bad = "NaN" if np.isnan(o).any() else "Inf"
            raise RuntimeError(f"anomaly: op {op!r} produced {bad} in its {where} (output shape {o.shape})")


from .tensor import Tensor  # noqa: E402  (circular: Tensor's operators are built from Functions)
