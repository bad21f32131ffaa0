"""Autograd through a compiled graph: the joint program (AOT style, joint.py) and the replay fallback.

``grad_call`` is what a compiled call that needs gradients runs: ``CompiledJointFn``, one node of the eager
autograd graph whose forward runs the joint program's fused forward (keeping the saved values and ctxs) and whose
backward runs its fused backward program (derivative table + fusion, joint.py). Where the joint builder refuses a
graph (``joint.Unsupported``, e.g. a multi-output op such as ``max(dim)``), the call replays the graph with
``CompiledGraphFn`` below; the reason is cached on the compiled graph and printed by ``explain_joint(compiled)``.

The replay fallback (AOT-Autograd's idea in its simplest correct form): the compiled call becomes ONE node of the
eager autograd graph, ``CompiledGraphFn.apply(*inputs, *params)``. Its forward runs the graph node by node with
each recorded op's own ``forward`` and a fresh ctx per node (the ctx is what the op saves for its backward); its
backward walks the nodes in reverse and calls each op's own ``backward`` with that ctx, summing the gradients of
values read more than once (the engine's algorithm, replayed on the graph).
So the gradients are eager's by construction (same VJPs, same order of accumulation per value).

Only nodes that depend on an input requiring grad keep a ctx and take part in backward (``needs_input_grad`` is
set per node, so e.g. Linear skips dW for a frozen weight). Fusion is not used on this path. Inference calls (no
input requires grad, or ``no_grad``) take api's fused inference program.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd.function import Function
from ..autograd.tensor import Tensor
from .graph import Graph, Node
from .joint import BackendFn, JointProgram, Unsupported, build_joint
from .runtime import call_node, leaf_value


class CompiledGraphFn(Function):
    @staticmethod
    def forward(ctx, *arrays, graph: Graph, n_inputs: int) -> tuple:
        inputs, params = list(arrays[:n_inputs]), list(arrays[n_inputs:])
        needs = ctx.needs_input_grad
        rg: set[Node] = set()
        env: dict[Node, Any] = {}
        for j, p in enumerate(graph.params()):
            env[p] = params[j]
            if needs[n_inputs + j]:
                rg.add(p)
        ctxs: dict[Node, Function] = {}
        for n in graph.nodes:
            if n.kind == "placeholder":
                env[n] = inputs[n.target]
                if needs[n.target]:
                    rg.add(n)
            elif n.kind == "constant":
                env[n] = leaf_value(n, inputs)
            elif n.kind == "getitem":
                env[n] = env[n.args[0]][n.target]
                if n.args[0] in rg:
                    rg.add(n)
            elif n.kind == "call":
                flags = tuple(isinstance(a, Node) and a in rg for a in n.args)
                env[n], c = call_node(n, env, flags)
                if any(flags):
                    rg.add(n)
                    ctxs[n] = c
        ctx.graph, ctx.ctxs, ctx.rg, ctx.n_inputs = graph, ctxs, rg, n_inputs
        return tuple(env[o] for o in graph.outputs)

    @staticmethod
    def backward(ctx, *gouts):
        graph, rg = ctx.graph, ctx.rg
        grads: dict[Node, Any] = {}

        def add(node: Node, g: Any, i: int | None = None) -> None:
            if i is None:
                grads[node] = g if node not in grads else grads[node] + g
                return
            slot = grads.setdefault(node, [None] * node.n_out)
            slot[i] = g if slot[i] is None else slot[i] + g

        for o, g in zip(graph.outputs, gouts):
            if o in rg and g is not None:
                add(o, g)
        for n in reversed(graph.nodes):
            if n not in rg or n not in grads:
                continue
            g = grads.pop(n) if n.kind in ("call", "getitem") else grads[n]
            if n.kind == "getitem":
                add(n.args[0], g, n.target)
            elif n.kind == "call":
                if n.n_out > 1:
                    g = [gi if gi is not None else np.zeros(sh, dt) for gi, (sh, dt) in zip(g, n.meta["out_meta"])]
                    res = n.target.backward(ctx.ctxs[n], *g)
                else:
                    res = n.target.backward(ctx.ctxs[n], g)
                if not isinstance(res, tuple):
                    res = (res,)
                for a, gi in zip(n.args, res):
                    if isinstance(a, Node) and a in rg and gi is not None:
                        add(a, np.asarray(gi))
        ph = {n.target: n for n in graph.placeholders()}
        out = [grads.get(ph[i]) if i in ph else None for i in range(ctx.n_inputs)]
        out += [grads.get(p) for p in graph.params()]
        ctx.ctxs = None
        return tuple(out)


class CompiledJointFn(Function):
    """The joint program as one autograd node: fused forward (saves values and ctxs), fused backward."""

    @staticmethod
    def forward(ctx, *arrays, joint: JointProgram, n_inputs: int) -> tuple:
        outs, saved, ctxs = joint.run_forward(list(arrays[:n_inputs]))
        ctx.joint, ctx.saved, ctx.ctxs = joint, saved, ctxs
        ctx.out_shapes = [(o.shape, o.dtype) for o in outs]
        return tuple(outs)

    @staticmethod
    def backward(ctx, *gouts):
        g = [np.zeros(s, d) if gi is None else np.asarray(gi, dtype=d) for gi, (s, d) in zip(gouts, ctx.out_shapes)]
        return tuple(ctx.joint.run_backward(g, ctx.saved, ctx.ctxs))


def joint_for(cg: Any, needs: tuple[bool, ...], n_inputs: int, backend_fn: BackendFn, backend: str, mode: str):
    """The cached JointProgram of compiled graph ``cg`` for this requires-grad pattern, or the Unsupported reason."""
    cache = cg.__dict__.setdefault("joint", {})
    if needs not in cache:
        try:
            cache[needs] = build_joint(cg.train_graph, needs, n_inputs, backend_fn, backend, mode)[0]
        except Unsupported as e:
            cache[needs] = f"joint graph refused, backward replays eager's ops: {e}"
        except Exception as e:  # a builder bug must not cost a training step: replay, and say why
            cache[needs] = f"joint graph failed ({type(e).__name__}: {e}), backward replays eager's ops"
    return cache[needs]


def grad_call(
    cg: Any, args: tuple, params: list[Tensor], backend_fn: BackendFn, backend: str, mode: str
) -> tuple[Tensor, ...]:
    """A compiled call that needs gradients: the joint program, or the replay when the joint builder refused."""
    needs = tuple(isinstance(a, Tensor) and a.requires_grad for a in args) + tuple(p.requires_grad for p in params)
    jp = joint_for(cg, needs, len(args), backend_fn, backend, mode)
    if isinstance(jp, str):
        return CompiledGraphFn.apply(*args, *params, graph=cg.train_graph, n_inputs=len(args))
    return CompiledJointFn.apply(*args, *params, joint=jp, n_inputs=len(args))


def explain_joint(compiled: Any) -> str:
    """The joint programs (forward / backward graphs and fusion plans) of every graph of a compiled function, or
    the reason a graph's backward replays eager's ops."""
    parts = []
    for i, cg in enumerate(compiled.graphs()):
        for needs, jp in cg.__dict__.get("joint", {}).items():
            parts.append(f"== graph {i}, requires grad {list(needs)} ==")
            parts.append(jp if isinstance(jp, str) else jp.explain())
    return "\n".join(parts) if parts else "(no call with gradients compiled yet)"
