"""The joint forward + backward graph (AOTAutograd's idea): a whole training step compiles, in both directions.

    1. reverse mode over the forward graph    every node that depends on an input requiring grad (and is a float)
       (``build_joint``)                      gets dL/dn: its readers' contributions summed with Add nodes (values
                                              read several times), then its VJP from the derivative table
                                              (derivatives.py) as new graph nodes
    2. extern VJPs                            an op the table has no rule for (MatMul, Linear, conv, embedding, a
                                              tensor exponent, ...) becomes ONE backward node ``ExternVJP(ctx, g)``
                                              that calls the op's own ``backward``; the forward program runs that
                                              op as an extern step that keeps its ``ctx`` (never fused), handed to
                                              the backward program as an input
    3. partition                              backward nodes that read forward values make those values *saved*:
                                              extra outputs of the forward program, inputs of the backward one
    4. recompute vs save (a min-cut rule)     a saved point-wise value (``lowering.fusible`` says "pw") is instead
                                              recomputed in the backward from the inputs of its point-wise cone
                                              (cut at extern / reduction outputs and graph inputs) when the extra
                                              bytes those inputs add to the saved set are at most its own bytes
                                              and the cone has at most ``MAX_RECOMPUTE`` ops; the recomputation
                                              then fuses into the backward kernels (AOTAutograd's partitioner
                                              recomputes cheap point-wise ops the same way)
    5. fusion + codegen on both programs      ``fusion.plan`` / ``build_kernels`` / ``schedule`` and the backend's
                                              kernel builder, exactly as the inference program

``JointProgram.explain()`` prints both graphs, the saved / recomputed values and both fusion plans. Graphs the
joint builder refuses (multi-output ops, non-float values needing a gradient) raise ``Unsupported`` with a reason;
the compiled call then replays eager's backward node by node (autograd.py), never a wrong gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..autograd.function import Function
from ..autograd.ops_elementwise import Add
from . import fusion
from .derivatives import VJPBuilder, vjp
from .graph import Graph, Node
from .lowering import fusible
from .runtime import ExternStep, PreparedCall, leaf_value

MAX_RECOMPUTE = 12  # ops in a recomputed point-wise cone, at most
LEAVES = ("placeholder", "param", "constant")


class Unsupported(Exception):
    """The joint graph cannot be built for this graph (the reason is the message)."""


class ExternVJP(Function):
    """``fn.backward(saved_ctx, g)``: the VJP of an op without a table rule; returns the gradients of the argument
    positions ``which`` (zeros where the op's backward gives None), as a tuple."""

    @staticmethod
    def forward(ctx, saved_ctx, g, fn=None, which=(), meta=()):
        res = fn.backward(saved_ctx, g)
        if not isinstance(res, tuple):
            res = (res,)
        out = []
        for i, (shape, dt) in zip(which, meta):
            r = res[i] if i < len(res) else None
            out.append(np.zeros(shape, dt) if r is None else np.asarray(r, dtype=dt).reshape(shape))
        return tuple(out)

    @staticmethod
    def backward(ctx, *g):
        raise RuntimeError("ExternVJP: double backward through a compiled graph is not supported")


@dataclass
class CtxStep:
    """An extern forward step that keeps the op's ctx (``env[("ctx", node)]``) for the backward's ExternVJP."""

    node: Node
    needs: tuple[bool, ...]
    call: PreparedCall = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.call = PreparedCall(self.node, self.needs)

    def run(self, env: dict[Any, Any]) -> None:
        env[self.node], env[("ctx", self.node)] = self.call(env)


@dataclass
class Compiled:
    """One program: its graph, fusion plan and steps (KernelStep / ExternStep / GetItemStep / CtxStep)."""

    graph: Graph
    plan: fusion.FusionPlan
    steps: list[Any]
    backends: list[str]

    def run(self, inputs: list[Any]) -> dict[Any, Any]:
        env: dict[Any, Any] = {}
        for n in self.graph.nodes:
            if n.kind in LEAVES:
                env[n] = leaf_value(n, inputs)
        for s in self.steps:
            s.run(env)
        return env

    def n_kernels(self) -> int:
        return len(self.plan.kernels)


BackendFn = Callable[[Any, str], tuple[Callable[..., list], str, str | None]]


def compile_program(
    graph: Graph,
    backend_fn: BackendFn,
    backend: str,
    mode: str,
    ctx_nodes: dict[Node, tuple[bool, ...]],
    horizontal: bool = False,
) -> tuple[Compiled, list[str]]:
    """Fuse ``graph`` and build its kernels (``backend_fn``: api's cached kernel builder); nodes in ``ctx_nodes``
    stay extern steps that keep their ctx. Returns the program and the backend fallback reasons."""
    plan = fusion.plan(graph, mode, exclude=set(ctx_nodes), horizontal=horizontal)
    steps, used, reasons = fusion.program_steps(
        plan, backend_fn, backend, lambda u: CtxStep(u, ctx_nodes[u]) if u in ctx_nodes else ExternStep(u)
    )
    return Compiled(graph, plan, steps, used), reasons


@dataclass
class JointProgram:
    """The compiled forward and backward of one graph for one pattern of inputs requiring grad."""

    forward: Compiled
    backward: Compiled
    n_user_outputs: int
    saved: list[Node]  # forward nodes the backward reads (forward outputs after the user's)
    ctx_nodes: list[Node]  # forward nodes whose ctx the backward's ExternVJP nodes read
    grad_slots: list[int | None]  # per input position, then per param: index into the backward's outputs
    recomputed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def run_forward(self, inputs: list[Any]) -> tuple[list[np.ndarray], list[Any], list[Any]]:
        """(user outputs, saved values, ctxs)."""
        env = self.forward.run(inputs)
        outs = [env[o] for o in self.forward.graph.outputs]
        return outs[: self.n_user_outputs], outs[self.n_user_outputs :], [env[("ctx", n)] for n in self.ctx_nodes]

    def run_backward(self, gouts: list[Any], saved: list[Any], ctxs: list[Any]) -> list[Any]:
        env = self.backward.run([*gouts, *saved, *ctxs])
        outs = [env[o] for o in self.backward.graph.outputs]
        return [None if s is None else outs[s] for s in self.grad_slots]

    def explain(self) -> str:
        fw, bw = self.forward, self.backward
        lines = [
            f"joint graph: forward {len(fw.graph.nodes)} nodes, {fw.n_kernels()} fused kernel(s); "
            f"backward {len(bw.graph.nodes)} nodes, {bw.n_kernels()} fused kernel(s)",
            f"saved for backward ({len(self.saved)}): {', '.join('%' + n.name for n in self.saved) or '-'}",
            f"recomputed in backward ({len(self.recomputed)}): {', '.join(self.recomputed) or '-'}",
            f"extern VJPs (op's own backward, ctx kept): {', '.join('%' + n.name for n in self.ctx_nodes) or '-'}",
            "rule: a saved point-wise value is recomputed from its point-wise cone's inputs when they add at most "
            f"its own bytes to the saved set and the cone has <= {MAX_RECOMPUTE} ops",
            *self.notes,
            "-- forward graph --",
            fw.graph.table(),
            "-- forward " + fw.plan.explain(),
            "-- backward graph --",
            bw.graph.table(),
            "-- backward " + bw.plan.explain(),
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()


def requires_grad_nodes(graph: Graph, needs: tuple[bool, ...], n_inputs: int) -> set[Node]:
    """The float nodes that depend on an input (placeholder or param) requiring grad."""
    rg: set[Node] = set()
    params = {p: j for j, p in enumerate(graph.params())}
    for n in graph.nodes:
        if n.kind == "placeholder":
            hit = bool(needs[n.target])
        elif n.kind == "param":
            hit = bool(needs[n_inputs + params[n]])
        elif n.kind in ("call", "getitem"):
            hit = any(a in rg for a in n.inputs())
        else:
            hit = False
        if not hit:
            continue
        if n.kind == "call" and n.n_out > 1:
            raise Unsupported(f"op {n.op} (%{n.name}) has {n.n_out} outputs: the joint graph takes single-output ops")
        if np.dtype(n.dtype).kind == "f":  # a comparison or an index carries no gradient
            rg.add(n)
    return rg


def build_joint(
    graph: Graph,
    needs: tuple[bool, ...],
    n_inputs: int,
    backend_fn: BackendFn,
    backend: str = "numpy",
    mode: str = "default",
    recompute: bool = True,
) -> tuple[JointProgram, list[str]]:
    """The joint program of ``graph`` (``needs``: per input position then per param, whether it requires grad).
    Raises Unsupported with the reason when the graph is outside what the joint builder handles."""
    fw = graph.copy()
    rg = requires_grad_nodes(fw, needs, n_inputs)
    bwg = Graph()
    b = VJPBuilder(bwg)
    gph: list[Node] = []
    grads: dict[Node, list[Node]] = {}
    for i, o in enumerate(fw.outputs):
        ph = Node(bwg.fresh_name(f"grad_{o.name}"), "placeholder", "placeholder", i, shape=o.shape, dtype=o.dtype)
        bwg.add(ph)
        gph.append(ph)
        if o in rg:
            grads.setdefault(o, []).append(ph)
    ctx_nodes: dict[Node, tuple[bool, ...]] = {}
    ctx_ph: dict[Node, Node] = {}
    total: dict[Node, Node] = {}
    for n in reversed(fw.nodes):
        if n not in rg or n not in grads:
            continue
        parts = grads.pop(n)
        g = parts[0]
        for p in parts[1:]:  # a value read several times: its gradient is the sum of its readers' contributions
            g = b.pw(Add, g, p)
        total[n] = g
        if n.kind != "call":
            continue
        res = vjp(b, n, g)
        if res is None:  # the op's own backward, with the ctx its forward (run by the forward program) saved
            flags = tuple(isinstance(a, Node) and a in rg for a in n.args)
            ctx_nodes[n] = flags
            c = Node(bwg.fresh_name(f"ctx_{n.name}"), "placeholder", "ctx", None)
            ctx_ph[n] = c
            which = tuple(i for i, f in enumerate(flags) if f)
            meta = tuple((tuple(n.args[i].shape), np.dtype(n.args[i].dtype)) for i in which)
            call = Node(bwg.fresh_name(f"vjp_{n.op}"), "call", "ExternVJP", ExternVJP, (c, g), {})
            call.kwargs = {"fn": n.target, "which": which, "meta": meta}
            call.n_out, call.meta["out_meta"] = len(which), list(meta)
            bwg.add(call)
            res = [None] * len(n.args)
            for j, i in enumerate(which):
                gi = Node(bwg.fresh_name(f"vjp_{n.op}_{j}"), "getitem", "getitem", j, (call,))
                gi.shape, gi.dtype = meta[j]
                res[i] = bwg.add(gi)
        for a, ga in zip(n.args, res):
            if isinstance(a, Node) and a in rg and ga is not None:
                if tuple(ga.shape) != tuple(a.shape):
                    raise Unsupported(f"the VJP of {n.op} gave shape {ga.shape} for %{a.name} of shape {a.shape}")
                grads.setdefault(a, []).append(ga)
    # outputs of the backward graph: the gradient of each input / param that requires grad
    slots: list[int | None] = []
    bw_outs: list[Node] = []
    ph_of = {n.target: n for n in fw.placeholders()}
    leaves = [ph_of.get(i) for i in range(n_inputs)] + fw.params()
    for leaf in leaves:
        g = total.get(leaf) if leaf is not None else None
        if g is None:
            slots.append(None)
        else:
            slots.append(len(bw_outs))
            bw_outs.append(g)
    bwg.outputs, bwg.out_struct = bw_outs, "tuple"
    # partition: forward values the backward reads are saved, or recomputed (their point-wise cone is cloned)
    read = _forward_reads(bwg, set(fw.nodes))
    saved, recomputed, notes = _choose(fw, read, set(ctx_nodes), recompute)
    bw = _assemble(bwg, gph, saved, recomputed, ctx_ph, fw)
    fw.outputs = list(fw.outputs) + saved
    fwp, r1 = compile_program(fw, backend_fn, backend, mode, ctx_nodes)
    bwp, r2 = compile_program(bw, backend_fn, backend, mode, {}, horizontal=True)
    jp = JointProgram(fwp, bwp, len(graph.outputs), saved, list(ctx_nodes), slots, [n.name for n in recomputed], notes)
    return jp, r1 + r2


def _forward_reads(bwg: Graph, fwset: set[Node]) -> list[Node]:
    seen: list[Node] = []
    for n in bwg.nodes:
        for a in n.inputs():
            if a in fwset and a not in seen:
                seen.append(a)
    return seen


def _cone(n: Node) -> tuple[list[Node], list[Node]] | None:
    """(point-wise nodes n is computed from, n included, in no order; the cone's inputs), or None if too big."""
    cone: list[Node] = []
    ins: list[Node] = []
    stack = [n]
    while stack:
        c = stack.pop()
        if c in cone or c in ins:
            continue
        if c.kind == "call" and fusible(c) == ("pw", 0):
            cone.append(c)
            stack.extend(c.inputs())
        else:
            ins.append(c)
        if len(cone) > MAX_RECOMPUTE:
            return None
    return cone, ins


def _choose(
    fw: Graph, read: list[Node], ctx_nodes: set[Node], recompute: bool
) -> tuple[list[Node], list[Node], list[str]]:
    """Which forward values are saved and which point-wise ones are recomputed (the rule in the module doc)."""
    pos = {n: i for i, n in enumerate(fw.nodes)}
    saved: list[Node] = []
    redo: list[Node] = []
    notes: list[str] = []
    cand = [n for n in read if recompute and n.kind == "call" and n not in ctx_nodes and fusible(n) == ("pw", 0)]
    for n in read:
        if n not in cand:
            saved.append(n)
    for n in sorted(cand, key=lambda x: -pos[x]):  # latest first: its cone may cover earlier candidates
        if n in redo:
            continue
        c = _cone(n)
        if c is None:
            saved.append(n)
            notes.append(f"save %{n.name}: its point-wise cone has more than {MAX_RECOMPUTE} ops")
            continue
        cone, ins = c
        extra = sum(a.nbytes for a in ins if a not in saved and a.kind not in LEAVES)
        if extra <= n.nbytes:
            redo += [x for x in cone if x not in redo]
            saved += [a for a in ins if a not in saved]
            notes.append(
                f"recompute %{n.name} ({len(cone)} point-wise op(s)) from {[a.name for a in ins]}: "
                f"+{extra} B saved instead of {n.nbytes} B"
            )
        else:
            saved.append(n)
            notes.append(f"save %{n.name}: recomputing needs +{extra} B of inputs saved vs {n.nbytes} B")
    saved = [n for n in saved if n not in redo]
    saved.sort(key=lambda x: pos[x])
    redo.sort(key=lambda x: pos[x])
    return saved, redo, notes


def _assemble(
    bwg: Graph, gph: list[Node], saved: list[Node], redo: list[Node], ctx_ph: dict[Node, Node], fw: Graph
) -> Graph:
    """The backward graph: placeholders (grads of the outputs, saved values, ctxs), recomputed forward nodes,
    then the backward nodes; forward nodes are replaced by their placeholder or clone."""
    bw = Graph()
    bw._names = dict(bwg._names)
    m: dict[Node, Node] = {}
    k = len(gph)
    for n in gph:
        bw.nodes.append(n)
    for j, s in enumerate(saved):
        ph = Node(bw.fresh_name(f"saved_{s.name}"), "placeholder", "placeholder", k + j, shape=s.shape, dtype=s.dtype)
        bw.nodes.append(ph)
        m[s] = ph
    k += len(saved)
    for j, (_, c) in enumerate(ctx_ph.items()):
        c.target = k + j
        bw.nodes.append(c)
    for n in redo:
        c = Node(bw.fresh_name(f"re_{n.name}"), "call", n.op, n.target, (), dict(n.kwargs), n.shape, n.dtype)
        c.args = tuple(m.get(a, a) if isinstance(a, Node) else a for a in n.args)
        c.meta["recomputed"] = True
        m[n] = c
        bw.nodes.append(c)
    for n in bwg.nodes:
        if n.kind == "placeholder":
            continue
        n.args = tuple(m.get(a, a) if isinstance(a, Node) else a for a in n.args)
        n.kwargs = {kk: m.get(v, v) if isinstance(v, Node) else v for kk, v in n.kwargs.items()}
        bw.nodes.append(n)
    bw.outputs = [m.get(o, o) for o in bwg.outputs]
    bw.out_struct = "tuple"
    have = set(bw.nodes)
    missing = [a for n in bw.nodes for a in n.inputs() if a not in have]
    if missing:
        raise Unsupported(f"backward graph reads {missing[0]!r}, which is neither saved nor recomputed")
    return bw
