"""Common-subexpression elimination: two call nodes with the same op, the same input nodes and equal literal
arguments compute the same value (ops are pure functions of their arguments), so the later one is replaced by the
first. Keyed by ``(op class, args, kwargs)`` with arrays hashed by content; ops with side effects are left alone."""

from __future__ import annotations

from ..graph import Graph, Node, literal_key
from .dce import has_side_effects
from .report import PassReport


def run(graph: Graph) -> PassReport:
    rep = PassReport("cse")
    seen: dict[tuple, Node] = {}
    remove: set[Node] = set()
    for n in graph.nodes:
        if n.kind not in ("call", "getitem") or has_side_effects(n):
            continue
        key = (n.kind, id(n.target) if n.kind == "call" else n.target, literal_key(n.args), literal_key(n.kwargs))
        first = seen.get(key)
        if first is None:
            seen[key] = n
            continue
        graph.replace_all_uses(n, first)
        remove.add(n)
        rep.changes.append(f"%{n.name} ({n.op}) -> %{first.name}")
    graph.nodes = [n for n in graph.nodes if n not in remove]
    return rep
