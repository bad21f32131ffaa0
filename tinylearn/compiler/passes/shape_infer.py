"""Shape and dtype inference: re-derive each call's output from op rules and compare with the traced metadata.

    element-wise (Add, Mul, Exp, GELU, Where, ...)   numpy broadcasting of the tensor inputs; the tensors' dtype
    reductions (Sum, Mean; dim, keepdim)              the input shape without (or with 1 at) the reduced dims
    Softmax, LogSoftmax, LayerNormFn, Clone           the input's shape
    Reshape (-1 resolved), Permute, Expand            the movement's target shape
    MatMul, Linear                                    [..., M, K] @ [..., K, N] -> [..., M, N] (batch dims broadcast)

An op without a rule keeps the traced shape (``stats['unchecked']``). A rule that disagrees with the trace is a
compiler bug and is reported (``stats['mismatch']``); the traced value is kept.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..graph import Graph, Node
from .report import PassReport

UNARY = {"Neg", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "ReLU", "Abs", "GELU", "Clip", "Clone"}
BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Maximum", "Minimum", "Where"}
SAME = {"Softmax", "LogSoftmax", "LayerNormFn"}


def _shape(a: Any) -> tuple[int, ...]:
    return a.shape if isinstance(a, Node) else np.shape(a)


def _tensor_dtype(node: Node) -> Any:
    dts = {np.dtype(a.dtype) for a in node.args if isinstance(a, Node) and np.dtype(a.dtype).kind == "f"}
    return dts.pop() if len(dts) == 1 else None


def infer(node: Node) -> tuple[tuple[int, ...], Any] | None:
    """(shape, dtype) of a call node by rule; None when there is no rule (dtype None: not derived)."""
    op, args, kw = node.op, node.args, node.kwargs
    if node.kind != "call" or not args:
        return None
    if op in BINARY:
        dt = _tensor_dtype(node) if op != "Where" else _tensor_dtype(Node("", "call", "", args=args[1:]))
        return tuple(np.broadcast_shapes(*(_shape(a) for a in args))), dt
    if not isinstance(args[0], Node):
        return None
    if op in UNARY or op in SAME:
        return tuple(args[0].shape), _tensor_dtype(node)
    x = args[0]
    if op in ("Sum", "Mean"):
        dim, keep = kw.get("dim"), kw.get("keepdim", False)
        nd = len(x.shape)
        axes = range(nd) if dim is None else [d % nd for d in ((dim,) if isinstance(dim, int) else dim)]
        shp = (
            tuple(1 if i in axes else s for i, s in enumerate(x.shape))
            if keep
            else tuple(s for i, s in enumerate(x.shape) if i not in axes)
        )
        return shp, x.dtype if np.dtype(x.dtype).kind == "f" else None
    if op == "Reshape":
        shape = list(args[1])
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = math.prod(x.shape) // max(known, 1)
        return tuple(shape), x.dtype
    if op == "Permute":
        return tuple(x.shape[p] for p in args[1]), x.dtype
    if op == "Expand":
        return tuple(args[1]), x.dtype
    if op == "MatMul" and isinstance(args[1], Node):
        a, b = x.shape, args[1].shape
        if len(a) >= 2 and len(b) >= 2:
            batch = np.broadcast_shapes(a[:-2], b[:-2])
            return (*batch, a[-2], b[-1]), _tensor_dtype(node)
        return None
    if op == "Linear" and isinstance(args[1], Node):
        return (*x.shape[:-1], args[1].shape[0]), _tensor_dtype(node)
    return None


def run(graph: Graph) -> PassReport:
    rep = PassReport("shape_infer")
    checked = unchecked = mismatch = 0
    for n in graph.nodes:
        if n.kind != "call":
            continue
        r = infer(n)
        if r is None:
            unchecked += 1
            continue
        shape, dt = r
        checked += 1
        n.meta["inferred"] = (shape, dt)
        if tuple(shape) != tuple(n.shape) or (dt is not None and np.dtype(dt) != np.dtype(n.dtype)):
            mismatch += 1
            rep.changes.append(f"%{n.name} ({n.op}): rule says {list(shape)} {dt}, trace recorded {list(n.shape)}")
    rep.stats = {"checked": checked, "unchecked": unchecked, "mismatch": mismatch}
    return rep
