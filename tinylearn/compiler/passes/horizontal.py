"""Horizontal GEMM fusion: Linear ops that read the same input become one GEMM against their stacked weights.

    Linear(x, w1, b1), Linear(x, w2, b2), ...   ->   g = linear_group(x, w1, w2, ..., b1, b2, ...); g[0], g[1], ...

Attention's q, k and v projections are the case that matters: three products [rows, d] x [d, out_i] become one
[rows, d] x [d, sum out_i]. The input is read once instead of k times, one call's overhead is paid instead of k, and
the wide product reaches the C++ GEMM's AVX-512 rung (``autograd/gemm_route.py``) where a thin one (a GQA k/v
projection, out = 32) stayed on OpenBLAS. Inductor's pre-grad "group / batch fusion" passes do this to linears that
share an input; MLIR and TVM call it horizontal fusion (the vertical kind, a GEMM with its epilogue, is
``patterns.linear_act``).

Cost rule: the weights are stacked at every call (a parameter may change between calls: an optimizer step,
``load_state_dict``), a copy of the k weight matrices. The pass fuses only when that copy is small next to the
products: the input has at least ``MIN_ROWS`` rows (each weight element then feeds at least that many
multiply-adds; a decode step's single row would double its weight traffic). Weights must be 2-D params of one
dtype and the biases all present or all absent. Outputs are column slices of the product (views, no copy), and the
reshapes / transposes after a projection read them through their strides. The decisions are in the report.
"""

from __future__ import annotations

import numpy as np

from ...autograd import gemm_route
from ...autograd.function import Function
from ..graph import Graph, Node
from .report import PassReport

MIN_ROWS = 16  # rows of the shared input below which the per-call weight stacking is not worth it


class LinearGroup(Function):
    """``(x @ w_0^T + b_0, x @ w_1^T + b_1, ...)`` as one GEMM: forward(x, w_0..w_{n-1}[, b_0..b_{n-1}], n=,
    has_bias=) returns the n outputs (column slices of one product); backward runs one GEMM for dX (the stacked
    gradient against the stacked weights) and one for the stacked dW."""

    @staticmethod
    def forward(ctx, x, *wb, n=2, has_bias=False):
        ws, bs = wb[:n], wb[n:] if has_bias else ()
        w = np.concatenate(ws, axis=0)  # [sum out, in]
        z = gemm_route.mm(x.reshape(-1, x.shape[-1]), w.T)
        if has_bias:
            z += np.concatenate(bs)
        ctx.save_for_backward(x, w)
        ctx.widths, ctx.has_bias = [wi.shape[0] for wi in ws], has_bias
        lead, outs, o = x.shape[:-1], [], 0
        for width in ctx.widths:
            outs.append(z[:, o : o + width].reshape(lead + (width,)))
            o += width
        return tuple(outs)

    @staticmethod
    def backward(ctx, *gs):
        x, w = ctx.saved_tensors
        g = np.concatenate([gi.reshape(-1, gi.shape[-1]) for gi in gs], axis=1)  # [rows, sum out]
        need = ctx.needs_input_grad
        gx, gw = gemm_route.linear_grads(g, x, w, need[0], any(need[1 : 1 + len(ctx.widths)]))
        gws, gbs, o = [], [], 0
        for width in ctx.widths:
            gws.append(None if gw is None else gw[o : o + width])
            gbs.append(g[:, o : o + width].sum(axis=0) if ctx.has_bias else None)
            o += width
        return (gx, *gws, *(gbs if ctx.has_bias else ()))


def _candidates(graph: Graph) -> dict[Node, list[Node]]:
    """shared input -> the Linear calls reading it that could be stacked (2-D param weights, float)."""
    groups: dict[Node, list[Node]] = {}
    for n in graph.nodes:
        if n.kind != "call" or n.op != "Linear" or n.kwargs or not 2 <= len(n.args) <= 3:
            continue
        x, w = n.args[0], n.args[1]
        b = n.args[2] if len(n.args) == 3 else None
        if not isinstance(x, Node) or not isinstance(w, Node) or w.kind != "param" or len(w.shape) != 2:
            continue
        if b is not None and not (isinstance(b, Node) and b.kind == "param" and len(b.shape) == 1):
            continue
        if np.dtype(n.dtype).kind != "f" or w.dtype != x.dtype:
            continue
        groups.setdefault(x, []).append(n)
    return groups


def run(graph: Graph, min_rows: int = MIN_ROWS) -> PassReport:
    """Stack every group of two or more Linear calls on one input that passes the cost rule (in place)."""
    rep = PassReport("horizontal")
    for x, lins in _candidates(graph).items():
        if len(lins) < 2:
            continue
        rows = int(np.prod(x.shape[:-1], dtype=np.int64))
        names = ", ".join(f"%{n.name}" for n in lins)
        if rows < min_rows:
            rep.changes.append(f"kept {names} apart: %{x.name} has {rows} row(s) < {min_rows} (stacking the weights "
                               "each call would cost more than the calls it saves)")  # fmt: skip
            continue
        with_b = [len(n.args) == 3 and n.args[2] is not None for n in lins]
        if any(with_b) != all(with_b) or len({n.args[1].dtype for n in lins}) != 1:
            rep.changes.append(f"kept {names} apart: mixed biases or weight dtypes")
            continue
        args = (x, *(n.args[1] for n in lins), *((n.args[2] for n in lins) if all(with_b) else ()))
        first = min(graph.nodes.index(n) for n in lins)
        for a in args[1:]:  # a later Linear's params may be listed after the first one: leaves move up freely
            if graph.nodes.index(a) > first:
                graph.nodes.remove(a)
                graph.nodes.insert(first, a)
                first += 1
        kw = {"n": len(lins), "has_bias": all(with_b)}
        grp = Node(graph.fresh_name("linear_group"), "call", "linear_group", LinearGroup, args, kw)
        grp.n_out, grp.meta["fused"] = len(lins), [n.name for n in lins]
        grp.meta["out_meta"] = [(tuple(n.shape), n.dtype) for n in lins]
        graph.nodes.insert(first, grp)
        for i, n in enumerate(lins):
            gi = Node(n.name, "getitem", "getitem", i, (grp,), shape=tuple(n.shape), dtype=n.dtype)
            graph.nodes[graph.nodes.index(n)] = gi
            graph.replace_all_uses(n, gi)
        outs = sum(n.args[1].shape[0] for n in lins)
        rep.changes.append(f"{names} -> %{grp.name}: one [{rows}, {x.shape[-1]}] x [{x.shape[-1]}, {outs}] GEMM")
    return rep


__all__ = ["MIN_ROWS", "LinearGroup", "run"]
