"""The analysis every backend shares before it writes loops: ``plan(kernel) -> KernelPlan``.

* dims are *coalesced*: adjacent domain dims merge when every buffer is contiguous across them (stride of the outer
  = stride of the inner x its extent), and size-1 dims disappear, so the common cases become one flat loop
  (point-wise) or rows x cols (a row reduction); a transposed input keeps two loops. Row dims are named ``i0, i1,
  ...``, reduced dims ``j0, j1, ...``;
* every buffer's strides over the merged dims;
* each register's level: constant (hoisted), per row (reductions and what depends only on them) or per element;
* which stores write a per-row value and which a per-element one.

``loops.lower`` builds the loop nest from this plan; ``codegen_triton`` and ``codegen_cuda`` read it directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .kernel_ir import REDUCE, FusedKernel, Instr


@dataclass
class Dim:
    var: str  # the loop/index variable: i0, i1 (rows) or j0, j1 (reduced)
    extent: int
    reduce: bool


@dataclass
class KernelPlan:
    """The analysis shared by the backends: coalesced dims, strides over them, register levels, what runs where."""

    kernel: FusedKernel
    dims: list[Dim]
    in_strides: list[tuple[int, ...]]  # per input, one stride per coalesced dim
    out_strides: list[tuple[int, ...]]  # per output (outputs are written contiguous in their own shape)
    level: dict[int, str]  # register -> "const" | "row" | "elem"
    row_stores: list[Instr]  # stores into keepdims outputs (one value per row)
    elem_stores: list[Instr]  # stores into domain-shaped outputs

    @property
    def row_dims(self) -> list[Dim]:
        return [d for d in self.dims if not d.reduce]

    @property
    def red_dims(self) -> list[Dim]:
        return [d for d in self.dims if d.reduce]

    def cone(self, regs: list[int], levels: tuple[str, ...] = ("elem",)) -> list[Instr]:
        """The instructions (body order) defining ``regs`` and their transitive arguments, restricted to ``levels``."""
        defs = {i.out: i for i in self.kernel.body if i.op != "store"}
        need: set[int] = set()
        stack = list(regs)
        while stack:
            r = stack.pop()
            if r in need or self.level[r] not in levels:
                continue
            need.add(r)
            if defs[r].op not in REDUCE:
                stack.extend(defs[r].args)
        return [i for i in self.kernel.body if i.op != "store" and i.out in need]


def _contiguous(shape: tuple[int, ...]) -> list[int]:
    strides, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = acc if shape[d] > 1 else 0
        acc *= shape[d]
    return strides


def plan(kernel: FusedKernel) -> KernelPlan:
    """Validate ``kernel`` for code generation and analyse it (ValueError naming the offending buffer or op)."""
    kernel.validate()
    shape, n, k = kernel.shape, len(kernel.shape), kernel.reduce_dims
    if any(s < 0 for s in shape):
        raise ValueError(f"kernel {kernel.name!r}: negative extent in shape {shape}")
    if k == 0 and any(i.op in REDUCE for i in kernel.body):
        raise ValueError(f"kernel {kernel.name!r}: a {REDUCE} instruction but reduce_dims is 0")
    for j, b in enumerate(kernel.inputs):
        if any(s < 0 for s in b.strides):
            raise ValueError(f"inputs[{j}] ({b.name!r}): negative strides {b.strides} are not supported")
        span = sum((e - 1) * s for e, s in zip(shape, b.strides)) if math.prod(shape) else 0
        if span >= max(math.prod(b.shape), 1) and math.prod(shape):
            raise ValueError(
                f"inputs[{j}] ({b.name!r}): strides {b.strides} over domain {shape} read past its {b.shape}"
            )
    level: dict[int, str] = {}
    for ins in kernel.body:
        if ins.op == "store":
            continue
        arg_levels = {level[a] for a in ins.args}
        if ins.op in REDUCE:
            level[ins.out] = "row"
        elif ins.op == "load" or "elem" in arg_levels:
            level[ins.out] = "elem"
        else:
            level[ins.out] = "row" if "row" in arg_levels else "const"
    row_stores, elem_stores, out_strides_full = [], [], []
    for ins in kernel.body:
        if ins.op != "store":
            continue
        b = kernel.outputs[ins.attr]
        keep = shape[: n - k] + (1,) * k
        if b.shape not in (shape, keep):
            raise ValueError(f"outputs[{ins.attr}] ({b.name!r}): shape {b.shape}, expected {shape} or {keep}")
        if b.shape == shape:
            elem_stores.append(ins)
        elif level[ins.args[0]] == "elem":
            raise ValueError(f"outputs[{ins.attr}] ({b.name!r}): an element-level register stored into shape {b.shape}")
        else:
            row_stores.append(ins)
    for b in kernel.outputs:
        out_strides_full.append(_contiguous(b.shape) if len(b.shape) == n else [0] * n)
    # coalesce: drop size-1 dims, merge neighbours that every buffer traverses contiguously
    bufs = [list(b.strides) for b in kernel.inputs] + out_strides_full
    groups: list[tuple[bool, list[int]]] = []  # (reduce, [extent, strides...]) per coalesced dim
    for red in (False, True):
        lo, hi = (0, n - k) if not red else (n - k, n)
        if lo == hi:
            continue
        cur: list[list[int]] = []
        for d in range(lo, hi):
            if shape[d] == 1:
                continue
            col = [shape[d]] + [s[d] for s in bufs]
            if cur and all(prev == s * col[0] for prev, s in zip(cur[-1][1:], col[1:])):
                cur[-1] = [cur[-1][0] * col[0]] + col[1:]
            else:
                cur.append(col)
        if not cur:
            cur = [[1] + [0] * len(bufs)]
        groups += [(red, c) for c in cur]
    dims, counts = [], {False: 0, True: 0}
    for red, c in groups:
        dims.append(Dim(f"{'j' if red else 'i'}{counts[red]}", c[0], red))
        counts[red] += 1
    strides = [tuple(c[1 + b] for _, c in groups) for b in range(len(bufs))]
    ni = len(kernel.inputs)
    return KernelPlan(kernel, dims, strides[:ni], strides[ni:], level, row_stores, elem_stores)
