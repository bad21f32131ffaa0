"""An MLIR-style pattern rewriter: a ``Pattern`` matches a root node (``match(graph, node, users) -> captures | None``)
and ``rewrite(graph, node, captures) -> new node`` replaces it; ``apply_patterns`` visits every node once per
round until nothing matches (a greedy driver, like MLIR's ``applyPatternsAndFoldGreedily``).

The default set fuses a GEMM with its epilogue into one call, the pattern cuBLASLt / oneDNN call "post-ops":

    relu|gelu( add( linear(x, w[, b]) | matmul(x, w), bias ) )   -> linear_act(x, w, bias, act)
    relu|gelu( linear(x, w, b) )                                 -> linear_act(x, w, b, act)
    relu( conv(x, w, b) )                                        -> conv_act(x, w, b)

Intermediate values must have no other reader (else they would be computed twice). ``LinearAct`` is a Function:
forward runs the GEMM, adds the bias in place and applies the activation in place (one call, no temporaries), and
backward differentiates the chain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...autograd import gemm_route
from ...autograd import ops_elementwise as _ew
from ...autograd.function import Function, unbroadcast
from ..graph import Graph, Node
from .report import PassReport

ACTS = ("ReLU", "GELU")


@dataclass
class Pattern:
    name: str
    match: Callable[[Graph, Node, dict[Node, list[Node]]], dict[str, Any] | None]
    rewrite: Callable[[Graph, Node, dict[str, Any]], Node]


class LinearAct(Function):
    """y = act(x @ w^T + b) (``transpose_w=True``, nn.Linear's weight) or act(x @ w + b) (a matmul's)."""

    @staticmethod
    def forward(ctx, x, w, b=None, act="ReLU", approximate="none", transpose_w=True, act_cls=None):
        wt = w.T if transpose_w else w
        x2 = x.reshape(-1, x.shape[-1])
        z = gemm_route.cpp_mm(x2, wt) if gemm_route.use_cpp(x2, wt) else x @ wt
        z = z if z.shape == x.shape[:-1] + (wt.shape[1],) else z.reshape(x.shape[:-1] + (wt.shape[1],))
        if b is not None:
            z = z + b
        # the activation op the traced graph had (nn.functional's GELU runs the C++ kernel; autograd's the numpy one)
        ctx.act_ctx = act_cls() if act_cls is not None else _ew.ReLU() if act == "ReLU" else _ew.GELU()
        kw = {} if act == "ReLU" else {"approximate": approximate}
        y = type(ctx.act_ctx).forward(ctx.act_ctx, z, **kw)
        ctx.save_for_backward(x, w)
        ctx.has_b, ctx.transpose_w, ctx.bshape = b is not None, transpose_w, None if b is None else b.shape
        return y

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gz = type(ctx.act_ctx).backward(ctx.act_ctx, g)
        gx, gw = gemm_route.linear_grads(gz, x, w, True, True, ctx.transpose_w)
        gb = unbroadcast(gz, ctx.bshape) if ctx.has_b else None
        return gx, gw, gb


def _single_user(n: Node, users: dict[Node, list[Node]]) -> bool:
    return len(users.get(n, [])) == 1


def _match_linear_act(graph: Graph, node: Node, users: dict[Node, list[Node]]) -> dict[str, Any] | None:
    if node.op not in ACTS or not isinstance(node.args[0], Node):
        return None
    src = node.args[0]
    bias = None
    if src.op == "Add" and _single_user(src, users):
        a, b = src.args
        lin, bias = (a, b) if isinstance(a, Node) and a.op in ("Linear", "MatMul") else (b, a)
        if not (isinstance(lin, Node) and lin.op in ("Linear", "MatMul")) or not isinstance(bias, Node):
            return None
        if len(bias.shape) != 1 or bias.shape[0] != lin.shape[-1] or bias.dtype != lin.dtype:
            return None
        if lin.op == "Linear" and len(lin.args) > 2 and lin.args[2] is not None:
            return None  # two biases: leave it
        src_add = src
    else:
        lin, src_add = src, None
        if lin.op != "Linear":
            return None
        bias = lin.args[2] if len(lin.args) > 2 else None
    if lin.op not in ("Linear", "MatMul") or not _single_user(lin, users):
        return None
    x, w = lin.args[0], lin.args[1]
    if not (isinstance(x, Node) and isinstance(w, Node)) or len(w.shape) != 2 or len(x.shape) < 2:
        return None
    if node.dtype != x.dtype or np.dtype(node.dtype).kind != "f":
        return None
    return {"x": x, "w": w, "b": bias, "lin": lin, "add": src_add}


def _rewrite_linear_act(graph: Graph, node: Node, c: dict[str, Any]) -> Node:
    kw = {"act": node.op, "transpose_w": c["lin"].op == "Linear", "act_cls": node.target}
    if node.op == "GELU":
        kw["approximate"] = node.kwargs.get("approximate", "none")
    new = Node(graph.fresh_name("linear_act"), "call", "linear_act", LinearAct, (c["x"], c["w"], c["b"]), kw)
    new.shape, new.dtype = node.shape, node.dtype
    new.meta["fused"] = [n.name for n in (c["lin"], c["add"], node) if n is not None]
    return new


LINEAR_ACT = Pattern("linear_act", _match_linear_act, _rewrite_linear_act)


class ConvAct(Function):
    """y = relu(conv(x, w, b, ...)): the convolution op's own forward (``conv``: its Function class, ``conv_kw``:
    its keyword arguments), then ReLU in place on its output; backward masks the gradient and calls the
    convolution's own backward."""

    @staticmethod
    def forward(ctx, x, w, b=None, conv=None, conv_kw=None):
        ctx.sub = conv()
        ctx.sub.needs_input_grad = ctx.needs_input_grad
        y = conv.forward(ctx.sub, x, w, b, **(conv_kw or {}))
        ctx.conv = conv
        np.maximum(y, 0, out=y)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return ctx.conv.backward(ctx.sub, np.where(y > 0, g, 0).astype(g.dtype, copy=False))


def _match_conv_act(graph: Graph, node: Node, users: dict[Node, list[Node]]) -> dict[str, Any] | None:
    if node.op != "ReLU" or not isinstance(node.args[0], Node):
        return None
    conv = node.args[0]
    if conv.op != "ConvNdFunction" or not _single_user(conv, users) or len(conv.args) > 3:
        return None
    if np.dtype(node.dtype) != np.dtype(conv.dtype) or np.dtype(node.dtype).kind != "f":
        return None
    return {"conv": conv}


def _rewrite_conv_act(graph: Graph, node: Node, c: dict[str, Any]) -> Node:
    conv = c["conv"]
    x, w, b = (*conv.args, None)[:3]
    kw = {"conv": conv.target, "conv_kw": dict(conv.kwargs)}
    new = Node(graph.fresh_name("conv_act"), "call", "conv_act", ConvAct, (x, w, b), kw)
    new.shape, new.dtype = node.shape, node.dtype
    new.meta["fused"] = [conv.name, node.name]
    return new


CONV_ACT = Pattern("conv_act", _match_conv_act, _rewrite_conv_act)
DEFAULT_PATTERNS = (LINEAR_ACT, CONV_ACT)


def apply_patterns(
    graph: Graph, patterns: tuple[Pattern, ...] = DEFAULT_PATTERNS, max_rounds: int = 10_000
) -> PassReport:
    rep = PassReport("patterns")
    for _ in range(max_rounds):
        hit = False
        users = graph.users()
        for n in list(graph.nodes):
            if n.kind != "call":
                continue
            for p in patterns:
                c = p.match(graph, n, users)
                if c is None:
                    continue
                new = p.rewrite(graph, n, c)
                graph.nodes[graph.nodes.index(n)] = new
                graph.replace_all_uses(n, new)
                rep.changes.append(f"{p.name}: %{n.name} and its producers {new.meta.get('fused', [])} -> %{new.name}")
                hit = True
                break
            if hit:
                break
        if not hit:
            break
    return rep


def run(graph: Graph) -> PassReport:
    return apply_patterns(graph)


__all__ = ["Pattern", "LinearAct", "ConvAct", "CONV_ACT", "LINEAR_ACT", "DEFAULT_PATTERNS", "apply_patterns", "run"]
