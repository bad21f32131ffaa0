"""Execution of a compiled program: extern calls and fused kernels, in the graph's order.

A ``Program`` is a list of steps over an environment ``env`` (node -> numpy array):

    ExternStep(node)    ``node.target.forward(ctx, *arrays, **kwargs)`` with a fresh ``ctx`` -- the op's own numpy /
                        C++ code, exactly what eager runs (Inductor calls these fallbacks "extern kernels")
    KernelStep(...)     one ``FusedKernel``: its inputs read from env, its outputs written to env (reshaped to the
                        nodes' shapes, e.g. a Sum without keepdim), run by the backend's callable

Placeholders come from the call's arguments, params from ``param.data`` at call time, constants from the graph.
``run_graph_with_ctx`` runs the unfused graph and keeps every node's ctx: the compiled autograd Function replays
the recorded ops' own ``backward`` from them (autograd.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .graph import Graph, Node
from .kernel_ir import FusedKernel


def node_arrays(node: Node, env: dict[Node, Any]) -> tuple[tuple, dict]:
    args = tuple(env[a] if isinstance(a, Node) else a for a in node.args)
    kwargs = {k: env[v] if isinstance(v, Node) else v for k, v in node.kwargs.items()}
    return args, kwargs


def call_node(node: Node, env: dict[Node, Any], needs: tuple[bool, ...] | None = None) -> tuple[Any, Any]:
    """Run one call node's Function forward on arrays; returns (output, ctx)."""
    args, kwargs = node_arrays(node, env)
    ctx = node.target()
    ctx.needs_input_grad = needs if needs is not None else (False,) * len(args)
    out = node.target.forward(ctx, *args, **kwargs)
    if isinstance(out, tuple):
        ctx.n_out = len(out)
        out = tuple(np.asarray(o) for o in out)
    else:
        ctx.n_out = 1
        out = np.asarray(out)
    return out, ctx


def leaf_value(node: Node, inputs: list[Any]) -> Any:
    if node.kind == "placeholder":
        return inputs[node.target]
    if node.kind == "param":
        return node.value.data
    return node.value


class PreparedCall:
    """``call_node`` for one node with its argument lists laid out once: per call only the env lookups, the ctx and
    the forward remain (a compiled TinyGPT forward runs ~90 extern ops a call, so the generic version's per-call
    isinstance scans and dict building were a visible share of its Python overhead). Built when the program is
    assembled, after the passes: a later change to the node's args is not seen."""

    __slots__ = ("cls", "fwd", "args", "slots", "kwargs", "kw_slots", "needs")

    def __init__(self, node: Node, needs: tuple[bool, ...] | None = None) -> None:
        self.cls = node.target
        self.fwd = node.target.forward
        self.args = list(node.args)
        self.slots = tuple((i, a) for i, a in enumerate(node.args) if isinstance(a, Node))
        self.kwargs = dict(node.kwargs)
        self.kw_slots = tuple((k, v) for k, v in node.kwargs.items() if isinstance(v, Node))
        self.needs = needs if needs is not None else (False,) * len(node.args)

    def __call__(self, env: dict[Any, Any]) -> tuple[Any, Any]:
        args = self.args.copy()
        for i, a in self.slots:
            args[i] = env[a]
        kwargs = self.kwargs
        if self.kw_slots:
            kwargs = dict(kwargs)
            for k, v in self.kw_slots:
                kwargs[k] = env[v]
        ctx = self.cls()
        ctx.needs_input_grad = self.needs
        out = self.fwd(ctx, *args, **kwargs)
        if isinstance(out, tuple):
            ctx.n_out = len(out)
            return tuple(np.asarray(o) for o in out), ctx
        ctx.n_out = 1
        return (out if type(out) is np.ndarray else np.asarray(out)), ctx


@dataclass
class ExternStep:
    node: Node
    call: PreparedCall = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.call = PreparedCall(self.node)

    def run(self, env: dict[Node, Any]) -> None:
        env[self.node] = self.call(env)[0]


@dataclass
class KernelStep:
    kernel: FusedKernel
    inputs: list[Node]
    outputs: list[Node]
    fn: Any  # callable(*arrays) -> list of arrays (kernel_ir.evaluate or a compiled backend)
    backend: str = "numpy"

    def run(self, env: dict[Node, Any], out: list[np.ndarray | None] | None = None) -> None:
        """``out``: per output, an arena slot (shaped like the kernel's output) to write into, or None (allocate).

        Column-major inputs: Linear's forward returns the [N, out] view of a C-contiguous [out, N] product (autograd/
        linalg.py), and a copy to C order cost more than the kernel itself (measured in the compiled MLP block's
        training step: ~1.2 ms per [512, 1024] GELU kernel vs 0.1 ms). A point-wise kernel whose buffers all cover
        the whole domain in C order reads and writes every element at the same flat index, so when every input is
        the same 2-D column-major array shape it runs on the transposes' memory as is, and its outputs are the
        column-major views of what it wrote (the layout Linear's backward then keeps)."""
        dt = np.dtype(self.kernel.dtype)
        values = [env[n] for n in self.inputs]
        if self._column_major(values):
            arrays = [np.ascontiguousarray(v.T, dtype=dt).reshape(b.shape) for v, b in zip(values, self.kernel.inputs)]
            outs = self._call(arrays, dt, out)
            for node, o in zip(self.outputs, outs):
                env[node] = np.asarray(o).reshape(node.shape[::-1]).T
            return
        arrays = [np.ascontiguousarray(v, dtype=dt) for v in values]
        outs = self._call(arrays, dt, out)
        for node, o in zip(self.outputs, outs):
            env[node] = np.asarray(o).reshape(node.shape)

    def _column_major(self, values: list[Any]) -> bool:
        flat = self.__dict__.get("_flat")
        if flat is None:
            k = self.kernel
            c_strides = tuple(int(np.prod(k.shape[i + 1 :])) for i in range(len(k.shape)))
            flat = self.__dict__["_flat"] = bool(
                k.reduce_dims == 0
                and all(b.strides == c_strides for b in (*k.inputs, *k.outputs))
                and len({n.shape for n in (*self.inputs, *self.outputs)}) == 1
                and len(self.inputs[0].shape) == 2
            )
        return flat and all(
            isinstance(v, np.ndarray) and v.ndim == 2 and v.flags.f_contiguous and not v.flags.c_contiguous
            for v in values
        )

    def _call(self, arrays: list[np.ndarray], dt: np.dtype, out: list[np.ndarray | None] | None) -> list[Any]:
        if out is not None and any(o is not None for o in out):
            if hasattr(self.fn, "kernel"):  # a CompiledKernel: writes into the slots (fresh arrays for the rest)
                full = [np.empty(b.shape, dt) if o is None else o for o, b in zip(out, self.kernel.outputs)]
                return self.fn(*arrays, out=full)
            # another backend: compute, then copy into the planned slots
            return [o if slot is None else _copy_into(slot, o) for o, slot in zip(self.fn(*arrays), out)]
        return self.fn(*arrays)


def _copy_into(slot: np.ndarray, value: np.ndarray) -> np.ndarray:
    np.copyto(slot, np.asarray(value).reshape(slot.shape))
    return slot


@dataclass
class Program:
    """The steps in order; ``memory`` (``passes.memory_plan.MemoryPlan``, optional): kernel outputs written into one
    arena per program, reused across calls (a call that finds it in use by another thread gets a fresh one);
    ``layout``: the layout pass's report."""

    graph: Graph
    steps: list[Any] = field(default_factory=list)
    memory: Any = None
    layout: Any = None  # passes.layout.LayoutReport: what the layout pass decided (None: not run)

    def run(self, inputs: list[Any]) -> list[np.ndarray]:
        leaves = self.__dict__.get("_leaves")
        if leaves is None:  # the graph is final once the program runs: its leaves are listed once
            leaves = self.__dict__["_leaves"] = [
                n for n in self.graph.nodes if n.kind in ("placeholder", "param", "constant")
            ]
        env: dict[Node, Any] = {n: leaf_value(n, inputs) for n in leaves}
        if self.memory is None:
            for s in self.steps:
                s.run(env)
            return [env[o] for o in self.graph.outputs]
        handle = self.memory.acquire()
        slots = handle[1]
        try:
            for i, s in enumerate(self.steps):
                if isinstance(s, KernelStep) and i in slots:
                    s.run(env, slots[i])
                else:
                    s.run(env)
            return [env[o] for o in self.graph.outputs]  # never in the arena (the planner leaves them out)
        finally:
            self.memory.release(handle)


def extern_program(graph: Graph) -> Program:
    """Every call node as an extern step (the numpy reference of a graph)."""
    steps: list[Any] = []
    for n in graph.nodes:
        if n.kind == "call":
            steps.append(ExternStep(n))
        elif n.kind == "getitem":
            steps.append(GetItemStep(n))
    return Program(graph, steps)


@dataclass
class GetItemStep:
    node: Node

    def run(self, env: dict[Node, Any]) -> None:
        env[self.node] = env[self.node.args[0]][self.node.target]


def run_graph(graph: Graph, inputs: list[Any]) -> list[np.ndarray]:
    return extern_program(graph).run(inputs)
