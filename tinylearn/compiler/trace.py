"""Tracing: run the function once on real Tensors and record every ``Function.apply`` as a graph node.

This is the simplest capture a define-by-run framework allows (torch.jit.trace's, not Dynamo's bytecode analysis):
``Function.apply`` consults ``tinylearn.autograd.function._trace_hook``; while ``trace`` runs, the hook is a
``Tracer`` that executes the op for real (so the Python code around it sees true values and shapes) and appends a
node whose inputs are the nodes that produced its Tensor arguments:

    Tensor argument of fn              -> placeholder          (guarded: shape and dtype)
    parameter / leaf requiring grad    -> param                (its ``.data`` is read at every call)
    any other Tensor or array          -> constant             (baked in, like torch.fx's get_attr of a buffer)

What a trace cannot see becomes a ``GraphBreak``. ``trace``/``run_traced`` raise it; ``capture`` (what
``tl.compile`` uses) instead records the break, stops recording and lets the function run on to its end eagerly, so
the user's function runs exactly once on that call (side effects such as a counter or BatchNorm's running
statistics happen once) and its result is the eager result. The break splits nothing: a later call of that shape
class runs the whole function eagerly (resuming Python in the middle of a function needs Dynamo's bytecode rewriting,
which a ``Function.apply`` hook cannot do). Breaks:

- a Python value read from a graph value (``bool(t)``, ``t.item()``, ``t.numpy()``, ``np.asarray(t)``): the
  control flow after it depends on the data (Tensor's conversions call ``Tracer.escape``);
- an in-place update of a graph value (``x += 1``, ``x.copy_(...)``): the graph would miss it (version counters);
- an op whose result the graph cannot replay (dropout's random mask, checkpoint, autocast casts);
- values read through ``t.data`` directly: invisible to the hook, so ``check_reproducible`` traces a second time on
  permuted inputs and refuses a graph whose structure or constants changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..autograd import function as _function
from ..autograd.function import Function
from ..autograd.methods import TensorMethods
from ..autograd.tensor import Tensor
from ..nn.module import Module
from ..nn.parameter import Parameter
from .graph import Graph, Node, literal_key

# ops a graph cannot replay: their result depends on state the node does not hold
UNREPLAYABLE = {
    "DropoutFn": "dropout draws a fresh random mask every call (compile the module in eval mode)",
    "_Checkpoint": "checkpoint runs a Python function inside the op",
    "AutocastCast": "autocast casts are not supported by tl.compile",
    "AutocastRound": "autocast casts are not supported by tl.compile",
}


class Compare(Function):
    """``a < b`` (etc.) as a graph node while tracing: eager comparisons make plain bool Tensors outside
    ``Function.apply``, so ``trace`` routes the six comparison operators here (results identical, no gradient)."""

    OPS = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal}
    OPS["ne"] = np.not_equal

    @staticmethod
    def forward(ctx, a, b, op="lt"):
        ctx.mark_non_differentiable(0)
        return np.asarray(Compare.OPS[op](a, b))

    @staticmethod
    def backward(ctx, g):
        return None, None


def _compare_method(op: str) -> Callable[[Any, Any], Any]:
    def method(self: Tensor, other: Any) -> Any:
        if not isinstance(other, Tensor | int | float | bool | np.ndarray | np.generic):
            return NotImplemented
        return Compare.apply(self, other, op=op)

    return method


class GraphBreak(Exception):
    """Tracing stopped: ``reason`` says why, ``op`` names the op or Tensor method involved."""

    def __init__(self, reason: str, op: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.op = reason, op


class Tracer:
    """The recorder ``Function.apply`` calls while tracing (see the module docstring)."""

    def __init__(self, graph: Graph, params: dict[int, tuple[str, Tensor]] | None = None) -> None:
        self.graph = graph
        self.params = params or {}
        self.values: dict[int, Node] = {}
        self.keep: list[Tensor] = []  # the traced tensors stay alive, so ids are not reused while tracing
        self.versions: list[tuple[Tensor, int, Node]] = []
        self.continue_on_break = False  # capture(): record the first break, stop recording, let the function run
        self.broken: GraphBreak | None = None
        self.saved_methods: dict[str, Any] = {}  # the comparison operators trace replaced (restored on a break)

    def stop(self, brk: GraphBreak) -> None:
        """A graph break: raise it, or (``continue_on_break``) record it and stop recording for good."""
        if not self.continue_on_break:
            raise brk
        self.broken = brk
        _function._trace_hook = None
        for name, m in self.saved_methods.items():
            setattr(TensorMethods, name, m)

    def bind(self, t: Tensor, node: Node) -> None:
        self.values[id(t)] = node
        self.keep.append(t)
        self.versions.append((t, t._version, node))

    def value_of(self, t: Tensor) -> Node:
        node = self.values.get(id(t))
        if node is not None:
            return node
        g = self.graph
        if id(t) in self.params or isinstance(t, Parameter) or (t.requires_grad and t.is_leaf):
            name = self.params[id(t)][0] if id(t) in self.params else f"param{len(g.params())}"
            node = Node(g.fresh_name("p_" + name.replace(".", "_")), "param", "param", name, value=t)
        else:
            node = Node(g.fresh_name("const"), "constant", "constant", value=t.data)
        node.shape, node.dtype = tuple(t.shape), t.dtype
        g.add(node)
        self.bind(t, node)
        return node

    def constant(self, arr: np.ndarray) -> Node:
        node = Node(self.graph.fresh_name("const"), "constant", "constant", value=arr, shape=arr.shape, dtype=arr.dtype)
        return self.graph.add(node)

    # -- the hook protocol ------------------------------------------------------------------------------------
    def __call__(self, cls: type, args: tuple, kwargs: dict) -> Any:
        op = cls.__name__
        brk = None
        if op in UNREPLAYABLE:
            brk = GraphBreak(f"op {op}: {UNREPLAYABLE[op]}", op)
        for k, v in kwargs.items():
            if brk is None and isinstance(v, Tensor) and id(v) in self.values:
                brk = GraphBreak(f"op {op}: keyword argument {k!r} is a graph value (only positional ones are)", op)
        if brk is not None:
            self.stop(brk)
            return cls.apply(*args, **kwargs)  # recording stopped: the op runs eagerly, like the rest of fn
        node_args = tuple(
            self.value_of(a) if isinstance(a, Tensor) else self.constant(a) if isinstance(a, np.ndarray) else a
            for a in args
        )
        _function._trace_hook = None  # run the op itself (nested applies are part of it, not graph nodes)
        try:
            out = cls.apply(*args, **kwargs)
        finally:
            _function._trace_hook = self
        g = self.graph
        node = Node(g.fresh_name(op), "call", op, cls, node_args, dict(kwargs))
        g.add(node)
        if isinstance(out, tuple):
            node.n_out = len(out)
            node.shape, node.dtype = (), None
            node.meta["out_meta"] = [(tuple(o.shape), o.dtype) for o in out]
            for i, o in enumerate(out):
                gi = g.add(Node(g.fresh_name(f"{op}_{i}"), "getitem", "getitem", i, (node,)))
                gi.shape, gi.dtype = tuple(o.shape), o.dtype
                self.bind(o, gi)
        else:
            node.shape, node.dtype = tuple(out.shape), out.dtype
            self.bind(out, node)
        return out

    def escape(self, t: Tensor, what: str) -> None:
        node = self.values.get(id(t))
        if node is not None and node.kind != "constant":
            src = f"the output of {node.op}" if node.kind in ("call", "getitem") else f"the {node.kind}"
            self.stop(
                GraphBreak(f"data-dependent control flow: Tensor.{what}() on %{node.name} ({src}) while tracing", what)
            )


def module_params(module: Module) -> dict[int, tuple[str, Tensor]]:
    return {id(p): (name, p) for name, p in module.named_parameters()}


@dataclass
class Capture:
    """What ``capture`` returns: the graph (None after a break), fn's eager result, and the break if any."""

    graph: Graph | None
    out: Any
    broken: GraphBreak | None = None


def run_traced(
    fn: Callable[..., Any], args: tuple, params: dict[int, tuple[str, Tensor]] | None = None
) -> tuple[Graph, Any]:
    """Trace ``fn(*args)``; returns (graph, fn's real result). Raises GraphBreak (hook uninstalled either way)."""
    cap = _trace(fn, args, params, continue_on_break=False)
    assert cap.graph is not None  # a break raised
    return cap.graph, cap.out


def capture(fn: Callable[..., Any], args: tuple, params: dict[int, tuple[str, Tensor]] | None = None) -> Capture:
    """Trace ``fn(*args)`` running it exactly once: on a graph break the rest of fn runs eagerly (not recorded) and
    the Capture holds the break (``graph`` None) and fn's result. A break found before fn starts (autocast, a numpy
    argument) runs fn eagerly once; one found after it returns (an in-place update, an unsupported output) keeps
    that run's result. Exceptions raised by fn itself propagate."""
    return _trace(fn, args, params, continue_on_break=True)


def _trace(
    fn: Callable[..., Any], args: tuple, params: dict[int, tuple[str, Tensor]] | None, continue_on_break: bool
) -> Capture:
    def before(brk: GraphBreak) -> Capture:
        if not continue_on_break:
            raise brk
        return Capture(None, fn(*args), brk)

    if _function._autocast_hook is not None:
        return before(GraphBreak("autocast is active: tl.compile traces fp32/fp64 graphs only", "autocast"))
    if _function._trace_hook is not None:
        raise GraphBreak("nested tracing: a compiled function called while another one is being traced", "trace")
    if isinstance(fn, Module) and params is None:
        params = module_params(fn)
    graph = Graph()
    tracer = Tracer(graph, params)
    tracer.continue_on_break = continue_on_break
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            ph = graph.add(Node(graph.fresh_name(f"x{i}"), "placeholder", "placeholder", i))
            ph.shape, ph.dtype = tuple(a.shape), a.dtype
            tracer.bind(a, ph)
        elif isinstance(a, np.ndarray):
            brk = GraphBreak(f"argument {i} is a numpy array: pass a Tensor (arrays would be baked in)", "argument")
            return before(brk)
    for _name, p in (params or {}).values():  # parameters in a stable order, even those the trace does not read
        tracer.value_of(p)
    saved = {f"__{op}__": TensorMethods.__dict__[f"__{op}__"] for op in Compare.OPS}
    tracer.saved_methods = saved
    _function._trace_hook = tracer
    try:
        for name in saved:  # comparisons become graph nodes while tracing (restored below)
            setattr(TensorMethods, name, _compare_method(name.strip("_")))
        out = fn(*args)
    finally:
        _function._trace_hook = None
        for name, m in saved.items():
            setattr(TensorMethods, name, m)
    if tracer.broken is not None:
        return Capture(None, out, tracer.broken)
    brk = None
    if isinstance(out, Tensor):
        graph.outputs, graph.out_struct = [tracer.value_of(out)], "single"
    elif isinstance(out, tuple | list) and all(isinstance(o, Tensor) for o in out):
        graph.outputs, graph.out_struct = [tracer.value_of(o) for o in out], type(out).__name__
    else:
        brk = GraphBreak(f"unsupported output: {type(out).__name__} (return a Tensor or a tuple/list of Tensors)")
    for t, v, node in tracer.versions:
        if brk is None and t._version != v and node.kind != "constant":
            brk = GraphBreak(f"in-place mutation of %{node.name} ({node.kind}) during tracing", "in-place")
    if brk is not None:
        if not continue_on_break:
            raise brk
        return Capture(None, out, brk)
    return Capture(graph, out)


def trace(fn: Callable[..., Any], *example_inputs: Any) -> Graph:
    """The graph of ``fn(*example_inputs)`` (a module's parameters become ``param`` nodes). Raises GraphBreak."""
    if not callable(fn):
        raise TypeError(f"fn: expected a callable or an nn.Module, got {type(fn).__name__}")
    return run_traced(fn, example_inputs)[0]


def _fingerprint(graph: Graph) -> list[tuple]:
    idx = {n: i for i, n in enumerate(graph.nodes)}
    rows = []
    for n in graph.nodes:
        args = tuple(("%", idx[a]) if isinstance(a, Node) else literal_key(a) for a in n.args)
        kw = tuple((k, ("%", idx[v]) if isinstance(v, Node) else literal_key(v)) for k, v in sorted(n.kwargs.items()))
        rows.append((n.kind, n.op, n.shape, str(n.dtype), args, kw))
    return rows


def check_reproducible(fn: Callable[..., Any], args: tuple, graph: Graph, params: Any = None) -> None:
    """Trace again with every Tensor argument's elements permuted and raise GraphBreak if the graph differs.

    A value read through ``t.data`` (a mask ``x.data > 0``, token ids turned into a numpy index) is recorded as a
    constant: the second trace then records a different constant (or different ops), and the graph is refused.
    Arrays the ops update in place (batch norm's running statistics) are restored afterwards."""
    rng = np.random.default_rng(0)
    args2 = tuple(
        Tensor._make(rng.permutation(a.data.reshape(-1)).reshape(a.shape), a.requires_grad, None, 0)
        if isinstance(a, Tensor) and a.data.size > 1
        else a
        for a in args
    )
    mutable = [v for n in graph.calls() for v in n.kwargs.values() if isinstance(v, np.ndarray)]
    saved = [m.copy() for m in mutable]
    try:
        g2, _ = run_traced(fn, args2, params)
    finally:
        for m, s in zip(mutable, saved):
            np.copyto(m, s)
    f1, f2 = _fingerprint(graph), _fingerprint(g2)
    if len(f1) != len(f2):
        raise GraphBreak(f"the traced ops depend on the input values ({len(f1)} vs {len(f2)} nodes on a second trace)")
    for n1, n2, a, b in zip(graph.nodes, g2.nodes, f1, f2):
        differs = a != b
        if not differs and n1.kind == "constant":
            differs = not np.array_equal(np.asarray(n1.value), np.asarray(n2.value), equal_nan=True)
        if differs:
            readers = [u.op for u in graph.users().get(n1, [])]
            what = f"constant read by {', '.join(readers)}" if n1.kind == "constant" and readers else n1.op
            raise GraphBreak(
                f"node %{n1.name} ({what}) changed on a second trace with other input values: a value read "
                "outside tinylearn ops (t.data, a random draw) would be baked in",
                readers[0] if n1.kind == "constant" and readers else n1.op,
            )
