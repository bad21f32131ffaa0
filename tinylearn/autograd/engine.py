"""The reverse-mode engine behind ``Tensor.backward``: topological order, gradient summing, hooks, leaves.

Invariant: for a scalar loss L and every tensor x in its graph,

    x.grad = dL/dx = sum over consumers c of VJP_c(dL/d out_c)

computed by visiting graph nodes (``Function`` instances, ``tensor._ctx``) in reverse topological order, so a
node's backward runs only after *all* gradient contributions to its outputs have been summed (the reused-node
pitfall). Leaf tensors (created by the user, ``requires_grad=True``) accumulate into ``.grad`` across backward
calls, like torch; intermediate gradients are dropped unless ``retain_grad()`` was called.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from . import function as _function
from .function import Function, _check_finite, _GradMode


class HookHandle:
    """Returned by ``Tensor.register_hook``; ``remove()`` unregisters the hook."""

    def __init__(self, lst: list, fn: Any) -> None:
        self._lst, self._fn = lst, fn

    def remove(self) -> None:
        if self._fn in self._lst:
            self._lst.remove(self._fn)


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


def _sole_view(g: np.ndarray) -> bool:
    """True when ``g`` is a view (e.g. a reshape of a backward's fresh result) of an array that owns its data and
    that nothing but ``g`` references (CPython's reference count 3: the base pointer of ``g``, the local ``b`` and
    getrefcount's argument; any other view, saved tensor or user array holds one more), so handing ``g`` to ``.grad``
    shares nothing."""
    b = g.base
    return type(b) is np.ndarray and b.flags.owndata and sys.getrefcount(b) == 3


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
        if not fresh and ((g.base is not None and not _sole_view(g)) or not g.flags.writeable or id(g) in handed):
            g = g.copy()
        handed.add(id(g))
        t.grad = Tensor._make(g, False, None, 0)
    else:
        # never in place: the existing .grad array may still be referenced by the graph or the user
        t.grad.data = np.asarray(t.grad.data + g)


def run_backward(root: Tensor, g: np.ndarray, retain_graph: bool) -> None:
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
            for t, ver in getattr(node, "saved_versions", ()):
                if t._version != ver:
                    raise RuntimeError(
                        "one of the variables needed for gradient computation has been modified by an inplace "
                        f"operation: [{type(node).__name__} input of shape {t.shape}] is at version {t._version}; "
                        f"expected version {ver} instead"
                    )
            if _function._profile_hook is None:
                gins = type(node).backward(node, *gouts)
            else:  # tl.profile(): the recorder runs the backward and times it
                gins = _function._profile_hook.backward(node, gouts)
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


from .tensor import Tensor  # noqa: E402  (circular: the engine builds Tensors, Tensor.backward calls the engine)
