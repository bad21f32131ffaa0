"""The graph IR ``tinylearn.compiler.trace`` records: a flat list of ``Node``s in execution order (torch.fx's form).

Every node defines one value (or, for ops with several outputs, a tuple that ``getitem`` nodes take apart):

    kind          what the value is                                   read at
    placeholder   a Tensor argument of the traced function            every call (the guard checks shape / dtype)
    param         a parameter (module parameter, leaf that requires    every call: ``tensor.data`` then, so an
                  grad): a named input that is not an argument         optimizer step is seen, never baked in
    constant      any other tensor or array the function used          trace time (``value``)
    call          ``target`` (a ``Function`` subclass) applied to ``args`` / ``kwargs``; args hold Nodes where the
                  op got a Tensor and plain Python values where it got one
    getitem       output ``index`` of a multi-output call
    output        not a node: ``graph.outputs`` lists the returned nodes, ``out_struct`` how to pack them

A call node is executed like an extern kernel: ``target.forward(ctx, *arrays, **kwargs)`` on numpy arrays with a
fresh ``ctx`` (Inductor's fallback), or lowered to a fused kernel (fusion.py). ``print(graph)`` prints the table.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

KINDS = ("placeholder", "param", "constant", "call", "getitem")


@dataclass(eq=False)
class Node:
    """One value of the graph. Identity is the node object (``eq=False``): two nodes are never 'equal'."""

    name: str
    kind: str
    op: str  # the Function class name for calls, else the kind
    target: Any = None  # call: the Function class; getitem: the output index; placeholder: the argument index
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    shape: tuple[int, ...] = ()
    dtype: Any = None
    value: Any = None  # constant: the array; param: the Tensor it reads
    n_out: int = 1
    meta: dict[str, Any] = field(default_factory=dict)

    def inputs(self) -> list[Node]:
        """The nodes this node reads, in argument order (kwargs that hold nodes count too)."""
        return [a for a in (*self.args, *self.kwargs.values()) if isinstance(a, Node)]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize if self.dtype else 0

    def __repr__(self) -> str:
        return f"%{self.name}"


def _fmt_arg(a: Any) -> str:
    if isinstance(a, Node):
        return f"%{a.name}"
    if isinstance(a, np.ndarray):
        return f"array{list(a.shape)}"
    if isinstance(a, float):
        return f"{a:.6g}"
    return repr(a)


class Graph:
    """Nodes in execution order, the returned nodes and how to pack them."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.outputs: list[Node] = []
        self.out_struct: str = "single"  # "single" | "tuple" | "list"
        self._names: dict[str, int] = {}

    # -- building ---------------------------------------------------------------------------------------------
    def fresh_name(self, base: str) -> str:
        base = base.lower()
        n = self._names.get(base, 0)
        self._names[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    def add(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "placeholder"]

    def params(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "param"]

    def calls(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "call"]

    def users(self) -> dict[Node, list[Node]]:
        """node -> the nodes that read it (a node reading x twice is listed twice)."""
        out: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs():
                out.setdefault(i, []).append(n)
        return out

    def replace_all_uses(self, old: Node, new: Node) -> int:
        """Make every reader of ``old`` (and the outputs) read ``new``; returns how many uses changed."""
        count = 0
        for n in self.nodes:
            hits = sum(a is old for a in n.args)
            if hits:
                n.args = tuple(new if a is old else a for a in n.args)
                count += hits
            for k, v in n.kwargs.items():
                if v is old:
                    n.kwargs[k] = new
                    count += 1
        for i, o in enumerate(self.outputs):
            if o is old:
                self.outputs[i] = new
                count += 1
        return count

    def copy(self) -> Graph:
        """A structural copy (new Node objects; constants and targets shared)."""
        g = Graph()
        g.out_struct, g._names = self.out_struct, dict(self._names)
        m: dict[Node, Node] = {}
        for n in self.nodes:
            c = Node(n.name, n.kind, n.op, n.target, (), dict(n.kwargs), n.shape, n.dtype, n.value, n.n_out)
            c.meta = dict(n.meta)
            c.args = tuple(m[a] if isinstance(a, Node) else a for a in n.args)
            c.kwargs = {k: m[v] if isinstance(v, Node) else v for k, v in n.kwargs.items()}
            m[n] = c
            g.nodes.append(c)
        g.outputs = [m[o] for o in self.outputs]
        return g

    # -- printing and hashing ---------------------------------------------------------------------------------
    def rows(self) -> list[tuple[str, ...]]:
        rows = []
        for i, n in enumerate(self.nodes):
            ins = [_fmt_arg(a) for a in n.args] + [f"{k}={_fmt_arg(v)}" for k, v in n.kwargs.items()]
            if n.kind == "getitem":
                ins = [f"{_fmt_arg(n.args[0])}[{n.target}]"]
            dt = np.dtype(n.dtype).name if n.dtype is not None else "-"
            rows.append((str(i), n.name, n.kind, n.op, ", ".join(ins), str(list(n.shape)), dt))
        return rows

    def table(self) -> str:
        """torch.fx's ``print_tabular``: one row per node, then the outputs."""
        head = ("#", "name", "kind", "op", "inputs", "shape", "dtype")
        rows = self.rows()
        width = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        width[4] = min(width[4], 60)
        lines = ["  ".join(h.ljust(w) for h, w in zip(head, width))]
        lines.append("  ".join("-" * w for w in width))
        for r in rows:
            cells = [c if len(c) <= w else c[: w - 3] + "..." for c, w in zip(r, width)]
            lines.append("  ".join(c.ljust(w) for c, w in zip(cells, width)).rstrip())
        lines.append(f"output ({self.out_struct}): " + ", ".join(f"%{o.name}" for o in self.outputs))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<Graph: {len(self.nodes)} nodes, {len(self.calls())} calls>"

    def signature(self) -> str:
        """A hash of the structure (ops, wiring, literal args, shapes, dtypes): the compile cache's graph key."""
        h = hashlib.sha256()
        idx = {n: i for i, n in enumerate(self.nodes)}
        for n in self.nodes:
            parts = [n.kind, n.op, str(n.shape), str(n.dtype), str(n.target) if n.kind != "call" else ""]
            for a in (*n.args, *n.kwargs.items()):
                parts.append(_key_of(a, idx))
            if n.kind == "constant":
                arr = np.asarray(n.value)
                parts.append(hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:16])
            h.update("|".join(parts).encode())
        h.update(str([idx[o] for o in self.outputs]).encode())
        return h.hexdigest()[:16]


def _key_of(a: Any, idx: dict[Node, int]) -> str:
    if isinstance(a, Node):
        return f"%{idx[a]}"
    if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str):  # a kwargs item
        return f"{a[0]}={_key_of(a[1], idx)}"
    if isinstance(a, np.ndarray):
        return f"array{a.shape}{a.dtype}:{hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:12]}"
    return repr(a)


def literal_key(a: Any) -> Any:
    """A hashable stand-in for an argument (CSE's key): nodes by identity, arrays by content."""
    if isinstance(a, Node):
        return ("node", id(a))
    if isinstance(a, np.ndarray):
        return ("array", a.shape, str(a.dtype), hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
    if isinstance(a, list | tuple):
        return (type(a).__name__, tuple(literal_key(x) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple(sorted((k, literal_key(v)) for k, v in a.items())))
    try:
        hash(a)
    except TypeError:
        return ("id", id(a))
    return (type(a).__name__, a)
