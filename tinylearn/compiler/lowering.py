"""Lowering graph ops to the fused-kernel IR's primitives (``kernel_ir``): one function per op family.

Each rule emits three-address instructions through a ``KernelBuilder`` and returns the result register. The math
follows the eager op's own formula, in the same order where it matters for rounding:

    GELU (exact)     y = x * (0.5 * (1 + erf(x / sqrt 2)))
    GELU (tanh)      y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    Softmax          m = max_r(x); e = exp(x - m); y = e / sum_r(e)                       (row: the last dim)
    LogSoftmax       m = max_r(x); s = x - m; y = s - log(sum_r(exp(s)))
    LayerNorm        mu = sum_r(x)/n; d = x - mu; var = sum_r(d*d)/n; y = d * rsqrt(var + eps) * w + b
    Sum / Mean       sum_r(x) [/ n]                                                       (trailing dims)
    Clip             min(max(x, lo), hi);   Where(c, a, b)   where(c, a, b);   Pow(x, 2)   square(x)
    Erf, CmpF        erf(x); gt/ge/lt/le/eq(a, b) as 0/1: ops of the backward graphs (derivatives.py)

``fusible(node)`` says whether a node can be lowered: ("pw", 0) for a point-wise op, ("red", k) for an op that
reduces over its last k dims, None otherwise (and the node stays an extern call).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .graph import Node
from .kernel_ir import Buffer, FusedKernel, Instr

UNARY = {"Neg": "neg", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Tanh": "tanh", "Sigmoid": "sigmoid"}
UNARY.update({"ReLU": "relu", "Abs": "abs", "Erf": "erf"})
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Maximum": "max", "Minimum": "min", "Pow": "pow"}
POINTWISE = {*UNARY, *BINARY, "GELU", "Where", "Clip", "CmpF"}  # Erf, CmpF: backward graphs (derivatives.py)
ROWWISE = {"Softmax", "LogSoftmax", "LayerNormFn", "Sum", "Mean"}
FLOATS = ("float32", "float64")


def _axes(dim: Any, nd: int) -> tuple[int, ...] | None:
    if dim is None:
        return tuple(range(nd))
    dims = (dim,) if isinstance(dim, int | np.integer) else tuple(dim)
    try:
        return tuple(sorted(int(d) % nd for d in dims))
    except (TypeError, ZeroDivisionError):
        return None


def fusible(node: Node) -> tuple[str, int] | None:
    """("pw", 0), ("red", k) or None: see the module docstring."""
    if node.kind != "call" or node.n_out != 1 or np.dtype(node.dtype).name not in FLOATS:
        return None
    if int(np.prod(node.shape, dtype=np.int64)) == 0:
        return None
    dt = np.dtype(node.dtype)
    for i, a in enumerate(node.args):
        if isinstance(a, Node):
            if np.dtype(a.dtype) != dt and not (node.op == "Where" and i == 0):
                return None
        elif a is not None and not isinstance(a, int | float | np.integer | np.floating):
            return None
    if node.op in POINTWISE:
        if not node.shape:
            return None  # a 0-d value: nothing to fuse, and the runtime hands kernels 0-d arrays as 1-d
        if node.op == "GELU" and node.kwargs.get("approximate", "none") not in ("none", "tanh"):
            return None
        return ("pw", 0) if any(isinstance(a, Node) for a in node.args) else None
    if node.op not in ROWWISE or not node.args or not isinstance(node.args[0], Node):
        return None
    nd = len(node.args[0].shape)
    if nd == 0:
        return None
    if node.op in ("Softmax", "LogSoftmax"):
        d = node.kwargs.get("dim", -1)
        return ("red", 1) if isinstance(d, int) and d % nd == nd - 1 else None
    if node.op == "LayerNormFn":
        k = len(node.kwargs.get("normalized_shape", ()))
        ok = all(a is None or (isinstance(a, Node) and np.dtype(a.dtype) == dt) for a in node.args[1:3])
        return ("red", k) if 0 < k <= nd and ok else None
    axes = _axes(node.kwargs.get("dim"), nd)
    if axes is None or axes != tuple(range(nd - len(axes), nd)):
        return None
    return ("red", len(axes))


class KernelBuilder:
    """Collects the instructions, inputs and outputs of one kernel."""

    def __init__(self, name: str, shape: tuple[int, ...], reduce_dims: int, dtype: str) -> None:
        self.name, self.shape, self.k, self.dtype = name, tuple(shape), reduce_dims, dtype
        self.body: list[Instr] = []
        self.inputs: list[Buffer] = []
        self.outputs: list[Buffer] = []
        self.input_nodes: list[Node] = []
        self.output_nodes: list[Node] = []
        self._loads: dict[Node, int] = {}
        self._consts: dict[float, int] = {}

    def emit(self, op: str, *args: int, attr: Any = None) -> int:
        r = len(self.body)
        self.body.append(Instr(r, op, tuple(args), attr))
        return r

    def const(self, v: float) -> int:
        v = float(v)
        if v not in self._consts:
            self._consts[v] = self.emit("const", attr=v)
        return self._consts[v]

    def strides(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Element strides of a C-contiguous array of ``shape`` over the domain dims (0 where broadcast)."""
        n = len(self.shape)
        if len(shape) > n:
            raise ValueError(f"shape {shape} has more dims than the kernel domain {self.shape}")
        full = (1,) * (n - len(shape)) + tuple(shape)
        out, step = [0] * n, 1
        for d in range(n - 1, -1, -1):
            out[d] = 0 if full[d] == 1 else step
            step *= full[d]
        return tuple(out)

    def load(self, node: Node) -> int:
        if node not in self._loads:
            i = len(self.inputs)
            shape = tuple(node.shape) or (1,) * min(len(self.shape), 1)  # 0-d arrives 1-d (np.ascontiguousarray)
            self.inputs.append(Buffer(node.name, shape, self.dtype, self.strides(shape)))
            self.input_nodes.append(node)
            self._loads[node] = self.emit("load", attr=i)
        return self._loads[node]

    def store(self, reg: int, node: Node, row: bool) -> None:
        shape = self.row_shape if row else self.shape
        i = len(self.outputs)
        self.outputs.append(Buffer(node.name, shape, self.dtype, self.strides(shape)))
        self.output_nodes.append(node)
        self.emit("store", reg, attr=i)
        self.body[-1] = Instr(-1, "store", (reg,), i)

    @property
    def row_shape(self) -> tuple[int, ...]:
        n = len(self.shape)
        return tuple(1 if i >= n - self.k else s for i, s in enumerate(self.shape))

    def build(self, meta: dict[str, Any]) -> FusedKernel:
        k = FusedKernel(self.name, self.shape, self.k, self.inputs, self.outputs, self.body, self.dtype, meta)
        k.validate()
        return k


def lower(b: KernelBuilder, node: Node, val: Callable[[Any], int]) -> int:
    """Emit ``node``'s computation; ``val(arg)`` gives the register of an argument (a node or a Python number)."""
    op, a, kw = node.op, node.args, node.kwargs
    if op in UNARY:
        return b.emit(UNARY[op], val(a[0]))
    if op == "Pow" and not isinstance(a[1], Node) and float(a[1]) == 2.0:
        return b.emit("square", val(a[0]))
    if op in BINARY:
        return b.emit(BINARY[op], val(a[0]), val(a[1]))
    if op == "CmpF":  # a float 0/1 mask (derivatives.py)
        return b.emit(kw.get("op", "gt"), val(a[0]), val(a[1]))
    if op == "Where":
        return b.emit("where", val(a[0]), val(a[1]), val(a[2]))
    if op == "Clip":
        r = val(a[0])
        lo, hi = kw.get("min", a[1] if len(a) > 1 else None), kw.get("max", a[2] if len(a) > 2 else None)
        if lo is not None:
            r = b.emit("max", r, b.const(lo))
        if hi is not None:
            r = b.emit("min", r, b.const(hi))
        return r
    if op == "GELU":
        x = val(a[0])
        if kw.get("approximate", "none") == "none":
            cdf = b.emit(
                "mul",
                b.const(0.5),
                b.emit("add", b.const(1.0), b.emit("erf", b.emit("mul", x, b.const(math.sqrt(0.5))))),
            )
            return b.emit("mul", x, cdf)
        x3 = b.emit("pow", x, b.const(3.0))
        inner = b.emit("mul", b.const(math.sqrt(2.0 / math.pi)), b.emit("add", x, b.emit("mul", b.const(0.044715), x3)))
        half_x = b.emit("mul", b.const(0.5), x)
        return b.emit("mul", half_x, b.emit("add", b.const(1.0), b.emit("tanh", inner)))
    x = val(a[0])
    n = float(math.prod(b.shape[len(b.shape) - b.k :]))
    if op in ("Softmax", "LogSoftmax"):
        sh = b.emit("sub", x, b.emit("max_reduce", x))
        if op == "Softmax":
            e = b.emit("exp", sh)
            return b.emit("div", e, b.emit("sum", e))
        return b.emit("sub", sh, b.emit("log", b.emit("sum", b.emit("exp", sh))))
    if op == "Sum":
        return b.emit("sum", x)
    if op == "Mean":
        return b.emit("div", b.emit("sum", x), b.const(n))
    if op == "LayerNormFn":
        mean = b.emit("div", b.emit("sum", x), b.const(n))
        d = b.emit("sub", x, mean)
        var = b.emit("div", b.emit("sum", b.emit("mul", d, d)), b.const(n))
        rstd = b.emit("recip", b.emit("sqrt", b.emit("add", var, b.const(kw.get("eps", 1e-5)))))
        y = b.emit("mul", d, rstd)
        if len(a) > 1 and a[1] is not None:
            y = b.emit("mul", y, val(a[1]))
        if len(a) > 2 and a[2] is not None:
            y = b.emit("add", y, val(a[2]))
        return y
    raise ValueError(f"node %{node.name}: op {op} has no lowering")
