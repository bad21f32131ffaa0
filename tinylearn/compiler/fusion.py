"""Fusion: group point-wise chains and row reductions into ``FusedKernel``s, and explain the decisions.

Why: an element-wise op reads and writes its whole tensor; a chain of k of them moves ~2k tensors through memory
where one fused loop moves the chain's inputs and outputs only. Inductor, XLA and TVM all start here.

Grouping (one pass over the graph in order, ``plan``): a fusible node (``lowering.fusible``) joins the group of one
of its producers when their iteration domains agree, else it starts a group:

    point-wise node, output shape == domain                   -> element-level register
    point-wise node, output shape == row shape (reduced dims 1), reading only row-level registers -> row-level
    reduction over the trailing k dims of the domain (or of a point-wise group's domain, which then gains k)
    a join that would make a cycle (the node also reads a value that waits for the group) is refused; dependencies
    are tracked per group (a group runs as one unit, so it waits for what ANY of its members reads)
    ``horizontal=True`` (the backward graphs): a node no producer group takes may join the latest group over the
    same domain (sibling fusion), under the same cycle check

So softmax, LayerNorm, ``x.mean(-1, keepdim=True)`` and their point-wise producers and consumers share one kernel.
An ``Expand`` feeding a kernel is not materialised: the kernel loads the expand's input with stride 0 along the
broadcast dims. MatMul / Linear / conv are never fused (extern calls); their bias / activation / residual
consumers form a kernel that reads the GEMM's output: epilogue fusion.

Stores: a node is written to memory when the graph returns it or a node outside its group reads it. A point-wise
producer in a pure point-wise group whose outside readers are all fused kernels can instead be *recomputed* in each
reader (its store and loads disappear). The cost rule, in bytes moved (``flop_cost`` bytes per op and element):

    store cost     = nbytes * (1 + readers)                   (one write, one read per reading kernel)
    recompute cost = readers * (bytes of the cone's inputs + ops * elements * flop_cost)

``mode="default"`` recomputes when it is cheaper; ``"max-fusion"`` always does (Inductor's aggressive mode).
``FusionPlan.explain()`` prints the groups, their stores and the bytes saved.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .graph import Graph, Node
from .kernel_ir import FusedKernel
from .lowering import KernelBuilder, fusible, lower
from .runtime import ExternStep, GetItemStep, KernelStep

MODES = ("default", "max-fusion")


@dataclass(eq=False)
class Group:
    gid: int
    shape: tuple[int, ...]
    k: int
    nodes: list[Node] = field(default_factory=list)
    level: dict[Node, str] = field(default_factory=dict)

    @property
    def row_shape(self) -> tuple[int, ...]:
        n = len(self.shape)
        return tuple(1 if i >= n - self.k else s for i, s in enumerate(self.shape))

    @property
    def pointwise(self) -> bool:
        return self.k == 0


def _level(g: Group, n: Node, kind: str, k: int) -> tuple[str, int] | None:
    """(level, new k of the group) if ``n`` can join ``g``; None otherwise."""
    if np.dtype(n.dtype) != np.dtype(g.nodes[0].dtype):
        return None  # one kernel computes in one dtype
    ins = [a for a in n.inputs() if a in g.level]
    for a in ins:
        if g.level[a] == "row" and tuple(a.shape) != g.row_shape:
            return None
    if kind == "pw":
        if tuple(n.shape) == g.shape:
            return "elem", g.k
        if g.k and tuple(n.shape) == g.row_shape and all(g.level[a] == "row" for a in ins):
            return "row", g.k
        return None
    x = n.args[0]
    if x in g.level and g.level[x] != "elem":
        return None
    if any(a in g.level for a in n.args[1:3] if isinstance(a, Node)):
        return None  # LayerNorm's weight / bias have their own shape: loaded, not computed here
    if tuple(x.shape) != g.shape or (g.k and g.k != k):
        return None
    return ("row" if n.op in ("Sum", "Mean") else "elem"), k


@dataclass
class FusionPlan:
    graph: Graph
    mode: str
    groups: list[Group]
    group_of: dict[Node, Group]
    recompute: dict[Node, set[int]]  # producer -> ids of the groups that recompute it
    notes: list[str] = field(default_factory=list)
    kernels: list[tuple[FusedKernel, list[Node], list[Node]]] = field(default_factory=list)
    kernel_groups: list[Group] = field(default_factory=list)  # the group of each kernel (some groups need none)

    def needs_store(self, n: Node, users: dict[Node, list[Node]]) -> bool:
        g = self.group_of[n]
        if n in self.graph.outputs:
            return True
        for u in users.get(n, []):
            ug = self.group_of.get(u)
            if ug is g:
                continue
            if ug is None or ug.gid not in self.recompute.get(n, set()):
                return True
        return False

    def bytes_saved(self) -> int:
        return sum(k.meta["bytes_saved"] for k, _, _ in self.kernels)

    def explain(self) -> str:
        lines = [f"fusion ({self.mode}): {len(self.kernels)} kernel(s), {self.bytes_saved()} bytes of traffic saved"]
        for k, ins, outs in self.kernels:
            lines.append(
                f"  {k.name}: domain {list(k.shape)} reduce {k.reduce_dims} <- {', '.join(k.meta['nodes'])}"
                f"  (loads {[n.name for n in ins]}, stores {[n.name for n in outs]}, saves {k.meta['bytes_saved']} B)"
            )
            if k.meta["recomputed"]:
                lines.append(f"    recomputes {k.meta['recomputed']}")
        lines += ["  " + n for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()


def _cone(p: Node, g: Group) -> list[Node]:
    """The nodes of pure point-wise group ``g`` that ``p`` is computed from (p included), in graph order."""
    seen: list[Node] = []
    stack = [p]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.append(n)
        stack.extend(a for a in n.inputs() if a in g.level)
    return seen


def plan(
    graph: Graph,
    mode: str = "default",
    flop_cost: float = 1.0,
    exclude: set[Node] | frozenset[Node] = frozenset(),
    horizontal: bool = False,
) -> FusionPlan:
    """Group the fusible nodes of ``graph`` and decide stores / recomputation; ``build_kernels`` lowers the plan.
    ``exclude``: nodes that stay extern calls even if fusible (the joint graph runs them with a ctx for backward).
    ``horizontal``: a node no producer group takes may join the latest group over the same domain (sibling
    fusion; the backward graphs use it: a VJP's first node often reads only saved values and the output grad)."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    groups: list[Group] = []
    group_of: dict[Node, Group] = {}
    # dependencies at group level (a group runs as one unit, so it waits for what ANY of its nodes reads):
    # direct[n] = groups an extern / leaf node n reads (through other externs); gdeps[gid] = groups group gid reads
    direct: dict[Node, set[int]] = {}
    gdeps: dict[int, set[int]] = {}

    def reads(a: Node) -> set[int]:
        return {group_of[a].gid} if a in group_of else direct.get(a, set())

    def reach(start: set[int]) -> set[int]:
        seen, stack = set(), list(start)
        while stack:
            i = stack.pop()
            if i not in seen:
                seen.add(i)
                stack.extend(gdeps[i])
        return seen

    for n in graph.nodes:
        f = fusible(n) if n not in exclude else None
        chosen = None
        if f is not None:
            cands = []
            for a in n.inputs():
                g = group_of.get(a)
                if g is not None and g not in cands:
                    cands.append(g)
            for g in reversed(cands):
                lv = _level(g, n, *f)
                outside = [a for a in n.inputs() if group_of.get(a) is not g]
                if lv is None or any(g.gid in reach(reads(a)) for a in outside):
                    continue  # joining would make g wait for a value that waits for g: a cycle
                chosen, (level, g.k) = g, lv
                break
            if chosen is None and horizontal:
                dom = tuple((n.args[0] if f[0] == "red" else n).shape)
                for g in reversed(groups):
                    if g in cands or g.shape != dom:
                        continue
                    lv = _level(g, n, *f)
                    if lv is None or any(g.gid in reach(reads(a)) for a in n.inputs()):
                        continue
                    chosen, (level, g.k) = g, lv
                    break
            if chosen is None:
                x = n.args[0] if f[0] == "red" else n
                chosen = Group(len(groups), tuple(x.shape), f[1])
                groups.append(chosen)
                gdeps[chosen.gid] = set()
                level = "row" if n.op in ("Sum", "Mean") else "elem"
            chosen.nodes.append(n)
            chosen.level[n] = level
            group_of[n] = chosen
            for a in n.inputs():
                if group_of.get(a) is not chosen:
                    gdeps[chosen.gid] |= reads(a)
        else:
            d: set[int] = set()
            for a in n.inputs():
                d |= reads(a)
            direct[n] = d
    fp = FusionPlan(graph, mode, groups, group_of, {})
    _decide_recompute(fp, flop_cost)
    return fp


def recompute_cheaper(
    producer_nbytes: int, n_readers: int, cone_ops: int, leaf_nbytes: int, numel: int, flop_cost: float = 1.0
) -> bool:
    """The cost rule for a point-wise producer read by ``n_readers`` other kernels: store it (one write, one read per
    reader: ``producer_nbytes * (1 + n_readers)`` bytes) or recompute it in each reader (reread its ``leaf_nbytes``
    of inputs and redo its ``cone_ops`` ops on ``numel`` elements, an op weighted as ``flop_cost`` bytes). True when
    recomputing is strictly cheaper."""
    store = producer_nbytes * (1 + n_readers)
    redo = n_readers * (leaf_nbytes + cone_ops * numel * flop_cost)
    return redo < store


def _decide_recompute(fp: FusionPlan, flop_cost: float) -> None:
    users = fp.graph.users()
    for g in fp.groups:
        if not g.pointwise:
            continue
        for p in g.nodes:
            readers = {fp.group_of.get(u) for u in users.get(p, []) if fp.group_of.get(u) is not g}
            if not readers or None in readers or p in fp.graph.outputs:
                continue
            if any(r.shape != g.shape or r.level.get(u) == "row" for r in readers for u in users[p] if u in r.level):
                continue
            cone = _cone(p, g)
            leaves = {a for c in cone for a in c.inputs() if a not in g.level}
            numel = int(np.prod(p.shape))
            store = p.nbytes * (1 + len(readers))
            redo = len(readers) * (sum(a.nbytes for a in leaves) + len(cone) * numel * flop_cost)
            cheaper = recompute_cheaper(
                p.nbytes, len(readers), len(cone), sum(a.nbytes for a in leaves), numel, flop_cost
            )
            if fp.mode == "max-fusion" or cheaper:
                fp.recompute[p] = {r.gid for r in readers}
                fp.notes.append(
                    f"recompute %{p.name} ({len(cone)} op(s)) in {len(readers)} reader kernel(s): "
                    f"{redo:.0f} B-equivalent vs {store} B to store and reload"
                )
            else:
                fp.notes.append(f"store %{p.name}: recomputing costs {redo:.0f} B-equivalent vs {store} B stored")


def build_kernels(fp: FusionPlan) -> list[tuple[FusedKernel, list[Node], list[Node]]]:
    """Lower every group to a FusedKernel; returns (kernel, input nodes, output nodes) per group."""
    users = fp.graph.users()
    out, fp.kernel_groups = [], []
    for g in fp.groups:
        if not any(fp.needs_store(n, users) for n in g.nodes):
            fp.notes.append(f"no kernel for {[n.name for n in g.nodes]}: every reader recomputes them")
            continue
        dt = np.dtype(g.nodes[0].dtype).name
        b = KernelBuilder(f"fused_{g.gid}_" + "_".join(n.op.lower() for n in g.nodes[:4]), g.shape, g.k, dt)
        regs: dict[Node, int] = {}
        recomputed: list[str] = []

        def val(
            a: Any,
            inline: Group | None = None,
            g: Group = g,
            b: KernelBuilder = b,
            regs: dict = regs,
            rec: list = recomputed,
        ) -> int:
            if not isinstance(a, Node):
                return b.const(float(a))
            if a in regs:
                return regs[a]
            if a in g.level:
                regs[a] = lower(b, a, val)
            elif inline is not None and a in inline.level:  # a node of a recomputed producer's cone
                regs[a] = lower(b, a, lambda x, inline=inline: val(x, inline))
            elif g.gid in fp.recompute.get(a, set()):
                rec.append(a.name)
                src = fp.group_of[a]
                regs[a] = lower(b, a, lambda x, src=src: val(x, src))
            else:  # a value from memory; an expand is read as a broadcast (stride-0) load of its input
                src = a
                while src.op == "Expand" and isinstance(src.args[0], Node) and src.args[0].dtype == src.dtype:
                    src = src.args[0]
                regs[a] = b.load(src)
            return regs[a]

        saved = 0
        for n in g.nodes:
            r = val(n)
            if fp.needs_store(n, users):
                b.store(r, n, g.level[n] == "row")
            else:
                saved += n.nbytes * (1 + len(users.get(n, [])))
        meta = {"nodes": [n.name for n in g.nodes], "recomputed": recomputed, "bytes_saved": int(saved)}
        meta["ops"] = [n.op for n in g.nodes]
        k = b.build(meta)
        out.append((k, b.input_nodes, b.output_nodes))
        fp.kernel_groups.append(g)
    fp.kernels = out
    return out


def schedule(fp: FusionPlan) -> list[Any]:
    """Graph nodes and kernels in a dependency-respecting order: ``Node`` (an extern call / getitem) or an index into
    ``fp.kernels``. Units are taken in the order of their first node in the graph, when ready (Kahn's algorithm)."""
    graph = fp.graph
    pos = {n: i for i, n in enumerate(graph.nodes)}
    unit_of: dict[Node, Any] = {}
    units: list[Any] = []
    first: dict[int, int] = {}
    for ki in range(len(fp.kernels)):
        for n in fp.kernel_groups[ki].nodes:
            unit_of[n] = ("k", ki)
        first[len(units)] = min(pos[n] for n in fp.kernel_groups[ki].nodes)
        units.append(("k", ki))
    for n in graph.nodes:
        if n.kind in ("call", "getitem") and n not in unit_of and n not in fp.group_of:
            unit_of[n] = ("n", n)
            first[len(units)] = pos[n]
            units.append(("n", n))
    index = {u if u[0] == "k" else ("n", id(u[1])): i for i, u in enumerate(units)}

    def uid(u: Any) -> int:
        return index[u if u[0] == "k" else ("n", id(u[1]))]

    reads: dict[int, set[int]] = {i: set() for i in range(len(units))}
    for i, u in enumerate(units):
        nodes = fp.kernels[u[1]][1] if u[0] == "k" else u[1].inputs()
        for a in nodes:
            if a in unit_of and uid(unit_of[a]) != i:
                reads[i].add(uid(unit_of[a]))
    indeg = {i: len(r) for i, r in reads.items()}
    readers: dict[int, list[int]] = {i: [] for i in reads}
    for i, r in reads.items():
        for j in r:
            readers[j].append(i)
    heap = [(first[i], i) for i, c in indeg.items() if c == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, i = heapq.heappop(heap)
        order.append(units[i][1])
        for j in readers[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, (first[j], j))
    if len(order) != len(units):
        raise RuntimeError("fusion: the kernel schedule has a cycle (a fusion decision was wrong)")
    return order


def program_steps(
    fp: FusionPlan,
    backend_fn: Callable[[FusedKernel, str], tuple[Callable[..., list], str, str | None]],
    backend: str,
    extern_step: Callable[[Node], Any] = ExternStep,
) -> tuple[list[Any], list[str], list[str]]:
    """The plan as runtime steps in schedule order: (steps, backend used per kernel, backend fallback reasons).

    ``backend_fn(kernel, backend)`` -> (callable, backend used, fallback reason or None) builds each kernel (api's
    cached builder); ``extern_step(node)`` makes the step of an unfused call (the joint forward keeps some ctxs)."""
    kernels = build_kernels(fp)
    fns, used, reasons = [], [], []
    for k, _, _ in kernels:
        fn, b, why = backend_fn(k, backend)
        fns.append(fn)
        used.append(b)
        if why:
            reasons.append(why)
    steps: list[Any] = []
    for u in schedule(fp):
        if isinstance(u, int):
            k, ins, outs = kernels[u]
            steps.append(KernelStep(k, ins, outs, fns[u], used[u]))
        elif u.kind == "getitem":
            steps.append(GetItemStep(u))
        else:
            steps.append(extern_step(u))
    return steps, used, reasons
