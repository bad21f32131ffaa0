"""Hand-built FusedKernels shared by the code-generator tests (test_loops, test_codegen_*): each case is a kernel,
inputs for it and, where one exists, the torch function it should match."""

from __future__ import annotations

import math

import numpy as np

from tinylearn.compiler.kernel_ir import Buffer, FusedKernel, Instr


def contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


class Body:
    """A tiny builder: ``b.load(0)``, ``b.op("add", r1, r2)``, ``b.const(0.5)``, ``b.store(r, 0)``."""

    def __init__(self) -> None:
        self.instrs: list[Instr] = []

    def _new(self, op: str, args: tuple[int, ...] = (), attr=None) -> int:
        r = len(self.instrs)
        self.instrs.append(Instr(r, op, args, attr))
        return r

    def load(self, j: int) -> int:
        return self._new("load", (), j)

    def const(self, v: float) -> int:
        return self._new("const", (), v)

    def op(self, name: str, *args: int) -> int:
        return self._new(name, tuple(args))

    def store(self, r: int, j: int) -> None:
        self.instrs.append(Instr(-1, "store", (r,), j))


def gelu_residual(rows: int, cols: int, dtype: str = "float32") -> FusedKernel:
    """y = gelu(x + bias) + res (erf form), bias broadcast along rows."""
    shape = (rows, cols)
    ins = [
        Buffer("x", shape, dtype, contiguous(shape)),
        Buffer("bias", (cols,), dtype, (0, 1)),
        Buffer("res", shape, dtype, contiguous(shape)),
    ]
    b = Body()
    h = b.op("add", b.load(0), b.load(1))
    inner = b.op("mul", h, b.const(1 / math.sqrt(2)))
    g = b.op("mul", b.op("mul", h, b.const(0.5)), b.op("add", b.const(1.0), b.op("erf", inner)))
    b.store(b.op("add", g, b.load(2)), 0)
    return FusedKernel("gelu_residual", shape, 0, ins, [Buffer("y", shape, dtype, contiguous(shape))], b.instrs, dtype)


def softmax(rows: int, cols: int, dtype: str = "float32") -> FusedKernel:
    shape = (rows, cols)
    b = Body()
    x = b.load(0)
    e = b.op("exp", b.op("sub", x, b.op("max_reduce", x)))
    b.store(b.op("div", e, b.op("sum", e)), 0)
    buf = [Buffer("x", shape, dtype, contiguous(shape))]
    return FusedKernel("softmax", shape, 1, buf, [Buffer("y", shape, dtype, contiguous(shape))], b.instrs, dtype)


def layer_norm(rows: int, cols: int, dtype: str = "float32", eps: float = 1e-5) -> FusedKernel:
    """y = (x - mean) * rstd * w + b; also stores mean and rstd per row (shape (rows, 1))."""
    shape = (rows, cols)
    ins = [
        Buffer("x", shape, dtype, contiguous(shape)),
        Buffer("w", (cols,), dtype, (0, 1)),
        Buffer("b", (cols,), dtype, (0, 1)),
    ]
    outs = [
        Buffer("y", shape, dtype, contiguous(shape)),
        Buffer("mean", (rows, 1), dtype, (1, 0)),
        Buffer("rstd", (rows, 1), dtype, (1, 0)),
    ]
    b = Body()
    x = b.load(0)
    inv_n = b.const(1.0 / cols)
    mean = b.op("mul", b.op("sum", x), inv_n)
    xc = b.op("sub", x, mean)
    var = b.op("mul", b.op("sum", b.op("square", xc)), inv_n)
    rstd = b.op("rsqrt", b.op("add", var, b.const(eps)))
    y = b.op("add", b.op("mul", b.op("mul", xc, rstd), b.load(1)), b.load(2))
    b.store(y, 0)
    b.store(mean, 1)
    b.store(rstd, 2)
    return FusedKernel("layer_norm", shape, 1, ins, outs, b.instrs, dtype)


def group_norm(n: int, groups: int, cg: int, hw: int, dtype: str = "float32", eps: float = 1e-5) -> FusedKernel:
    """GroupNorm after the reshape (N, C, HW) -> (N, G, C/G, HW): reduce the 2 trailing dims; the per-channel
    weight (G, C/G) has strides (0, C/G, 1, 0), so the reduced dims do not coalesce (two loops)."""
    shape = (n, groups, cg, hw)
    ins = [Buffer("x", shape, dtype, contiguous(shape)), Buffer("w", (groups, cg), dtype, (0, cg, 1, 0))]
    outs = [Buffer("y", shape, dtype, contiguous(shape)), Buffer("mean", (n, groups, 1, 1), dtype, (groups, 1, 0, 0))]
    b = Body()
    x = b.load(0)
    inv_n = b.const(1.0 / (cg * hw))
    mean = b.op("mul", b.op("sum", x), inv_n)
    xc = b.op("sub", x, mean)
    var = b.op("mul", b.op("sum", b.op("mul", xc, xc)), inv_n)
    y = b.op("mul", b.op("mul", xc, b.op("rsqrt", b.op("add", var, b.const(eps)))), b.load(1))
    b.store(y, 0)
    b.store(mean, 1)
    return FusedKernel("group_norm", shape, 2, ins, outs, b.instrs, dtype)


def transposed_add(rows: int, cols: int, dtype: str = "float32") -> FusedKernel:
    """y = 2 * at.T + c where ``at`` is stored (cols, rows): strides (1, rows) over the (rows, cols) domain."""
    shape = (rows, cols)
    ins = [Buffer("at", (cols, rows), dtype, (1, rows)), Buffer("c", shape, dtype, contiguous(shape))]
    b = Body()
    b.store(b.op("add", b.op("mul", b.load(0), b.const(2.0)), b.load(1)), 0)
    return FusedKernel("transposed_add", shape, 0, ins, [Buffer("y", shape, dtype, contiguous(shape))], b.instrs, dtype)


def row_max(rows: int, cols: int, dtype: str = "float32") -> FusedKernel:
    """m = max over the row of max(x, 0) and min(x, 1) summed; tests max/min/relu NaN propagation too."""
    shape = (rows, cols)
    b = Body()
    x = b.load(0)
    m = b.op("max_reduce", x)
    b.store(m, 0)
    b.store(b.op("add", b.op("relu", x), b.op("min", x, b.const(1.0))), 1)
    outs = [Buffer("m", (rows, 1), dtype, (1, 0)), Buffer("z", shape, dtype, contiguous(shape))]
    return FusedKernel("row_max", shape, 1, [Buffer("x", shape, dtype, contiguous(shape))], outs, b.instrs, dtype)


def all_ops(size: int, dtype: str = "float32") -> FusedKernel:
    """Every UNARY and BINARY op and ``where`` on two inputs, each stored: one output per op."""
    from tinylearn.compiler.kernel_ir import BINARY, UNARY

    shape = (size,)
    ins = [Buffer("a", shape, dtype, (1,)), Buffer("p", shape, dtype, (1,))]
    b = Body()
    a, p = b.load(0), b.load(1)
    results = [b.op(u, p if u in ("log", "sqrt", "rsqrt") else a) for u in UNARY]
    results += [b.op(op, a, p) for op in BINARY]
    results.append(b.op("where", b.op("gt", a, b.const(0.0)), a, p))
    for j, r in enumerate(results):
        b.store(r, j)
    outs = [Buffer(f"o{j}", shape, dtype, (1,)) for j in range(len(results))]
    return FusedKernel("all_ops", shape, 0, ins, outs, b.instrs, dtype)


def inputs_for(kernel: FusedKernel, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(b.shape).astype(kernel.dtype) for b in kernel.inputs]
