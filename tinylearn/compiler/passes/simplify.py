"""Algebraic simplification: rewrite a node into a cheaper equal one, and never change a value's shape or dtype.

    x * 1, 1 * x, x + 0, 0 + x, x - 0, x / 1, x ** 1   -> x        (only when x already has the result's shape and
                                                                      dtype: broadcasting or promotion is not a no-op)
    permute(permute(x, p), q)                          -> permute(x, p∘q), or x when p∘q is the identity
    reshape(reshape(x, s), t)                          -> reshape(x, t)
    reshape(x, x.shape), expand(x, x.shape)            -> x
    permute(x, identity)                               -> x

Not applied: x * 0 -> 0 (wrong for NaN / inf), x - x -> 0 (same reason).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import Graph, Node
from .report import PassReport

_IDENTITY_RIGHT = {"Mul": 1, "Add": 0, "Sub": 0, "Div": 1, "Pow": 1}
_IDENTITY_LEFT = {"Mul": 1, "Add": 0}


def _is_scalar(a: Any, value: float) -> bool:
    if isinstance(a, bool) or not isinstance(a, int | float):
        if isinstance(a, Node) and a.kind == "constant":
            arr = np.asarray(a.value)
            return arr.size == 1 and arr.ndim == 0 and arr.dtype.kind == "f" and float(arr) == value
        return False
    return a == value


def _same(x: Any, node: Node) -> bool:
    return isinstance(x, Node) and tuple(x.shape) == tuple(node.shape) and np.dtype(x.dtype) == np.dtype(node.dtype)


def _identity_of(node: Node) -> Node | None:
    """The node ``node`` equals, if it is an identity op; None otherwise."""
    op, a = node.op, node.args
    if op in _IDENTITY_RIGHT and len(a) == 2 and _is_scalar(a[1], _IDENTITY_RIGHT[op]) and _same(a[0], node):
        return a[0]
    if op in _IDENTITY_LEFT and len(a) == 2 and _is_scalar(a[0], _IDENTITY_LEFT[op]) and _same(a[1], node):
        return a[1]
    if op in ("Reshape", "Expand") and _same(a[0], node):
        return a[0]
    if op == "Permute" and tuple(a[1]) == tuple(range(len(a[1]))):
        return a[0]
    return None


def run(graph: Graph) -> PassReport:
    rep = PassReport("simplify")
    for n in graph.nodes:
        if n.kind != "call":
            continue
        if n.op == "Permute" and isinstance(n.args[0], Node) and n.args[0].op == "Permute":
            inner = n.args[0]
            p, q = inner.args[1], n.args[1]
            composed = tuple(p[i] for i in q)
            n.args = (inner.args[0], composed)
            rep.changes.append(f"%{n.name}: permute of permute %{inner.name} -> permute{composed} of %{n.args[0].name}")
        if n.op == "Reshape" and isinstance(n.args[0], Node) and n.args[0].op == "Reshape":
            inner = n.args[0]
            n.args = (inner.args[0], *n.args[1:])
            rep.changes.append(f"%{n.name}: reshape of reshape %{inner.name} -> reshape of %{n.args[0].name}")
        same = _identity_of(n)
        if same is not None:
            graph.replace_all_uses(n, same)
            rep.changes.append(f"%{n.name} ({n.op}) is the identity -> %{same.name}")
    return rep
