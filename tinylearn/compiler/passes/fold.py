"""Constant folding: a call node whose inputs are all constants has the same value at every call, so it is
evaluated once now (with the op's own forward) and becomes a constant node. Params are not constants (an optimizer
changes them), so nothing that reads one is folded."""

from __future__ import annotations

from ..graph import Graph, Node
from ..runtime import call_node
from .dce import has_side_effects
from .report import PassReport


def run(graph: Graph) -> PassReport:
    rep = PassReport("fold")
    for i, n in enumerate(graph.nodes):
        if n.kind != "call" or n.n_out != 1 or has_side_effects(n):
            continue
        ins = n.inputs()
        if not ins or any(a.kind != "constant" for a in ins):
            continue
        env = {a: a.value for a in ins}
        out, _ = call_node(n, env)
        c = Node(graph.fresh_name("folded"), "constant", "constant", value=out, shape=out.shape, dtype=out.dtype)
        c.meta["folded_from"] = n.name
        graph.nodes[i] = c
        graph.replace_all_uses(n, c)
        rep.changes.append(f"%{n.name} ({n.op} of constants) -> constant %{c.name} {list(out.shape)}")
    return rep
