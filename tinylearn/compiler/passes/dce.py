"""Dead-code elimination: keep the nodes the outputs depend on, the inputs (placeholders, params) and ops with side
effects (batch norm in training mode updates its running statistics); drop the rest."""

from __future__ import annotations

from ..graph import Graph, Node
from .report import PassReport


def has_side_effects(node: Node) -> bool:
    return node.op == "BatchNormFn" and bool(node.kwargs.get("training"))


def run(graph: Graph) -> PassReport:
    rep = PassReport("dce")
    live: set[Node] = set()
    stack = [*graph.outputs, *(n for n in graph.nodes if has_side_effects(n))]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(n.inputs())
    keep = []
    for n in graph.nodes:
        if n in live or n.kind in ("placeholder", "param"):
            keep.append(n)
        else:
            rep.changes.append(f"removed %{n.name} ({n.op})")
    graph.nodes = keep
    return rep
