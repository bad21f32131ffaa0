"""Graph passes: each module holds one, ``run(graph) -> PassReport`` rewriting the graph in place.

    shape_infer   re-derive every node's shape/dtype from op rules and compare with what the trace recorded
    dce           dead-code elimination: drop call/constant nodes no output depends on
    cse           common-subexpression elimination: one node per (op, inputs, kwargs)
    fold          constant folding: a call whose inputs are all constants is evaluated once, at compile time
    simplify      algebraic identities: x*1, x+0, x-0, x/1, x**1, permute of permute, reshape of reshape, no-op
                  reshape/expand
    patterns      an MLIR-style pattern rewriter (match a node, rewrite it); e.g. linear + bias + relu/gelu ->
                  one ``linear_act`` call
    horizontal    Linear ops reading one input -> one GEMM on their stacked weights (attention's q/k/v), by a
                  cost rule (the input's rows)

``run_pipeline`` applies them in the order a compiler would (inference; ``patterns`` too). A report prints what its
pass changed (``str(report)``) and nothing else.
"""

from __future__ import annotations

from ..graph import Graph
from . import cse, dce, fold, horizontal, patterns, shape_infer, simplify
from .report import PassReport

DEFAULT = ("shape_infer", "simplify", "fold", "cse", "dce")
PASSES = {
    "shape_infer": shape_infer,
    "dce": dce,
    "cse": cse,
    "fold": fold,
    "simplify": simplify,
    "patterns": patterns,
    "horizontal": horizontal,
}


def run_pipeline(graph: Graph, names: tuple[str, ...] = DEFAULT) -> list[PassReport]:
    """Run the named passes in order on ``graph`` (in place); ``patterns`` runs the default pattern set."""
    reports = []
    for name in names:
        if name not in PASSES:
            raise ValueError(f"names: unknown pass {name!r}, expected one of {sorted(PASSES)}")
        rep = PASSES[name].run(graph)
        if name in ("simplify", "fold", "cse", "patterns"):  # drop what the rewrite left dead, in its report
            rep.changes += [f"(dce) {c}" for c in dce.run(graph).changes]
        reports.append(rep)
    return reports


__all__ = ["PassReport", "run_pipeline", "DEFAULT", "PASSES", "cse", "dce", "fold", "patterns", "shape_infer"]
__all__ += ["simplify"]
