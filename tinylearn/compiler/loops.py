"""Lowering a ``FusedKernel`` to a loop nest, and the schedule transforms on it (the algorithm / schedule split).

Halide and TVM separate *what* a kernel computes (the algorithm: here the SSA body of a ``FusedKernel``) from *how*
its loops run (the schedule: tiling, loop order, vectorisation, threads). ``lower`` produces the plain algorithmic
nest; the transforms rewrite the loops, never the arithmetic, so every schedule computes the same values:

    nest = lower(kernel)                # loops over the domain, no annotations
    nest.tile("i0", 256).parallelize("i0_o").vectorize("i0")
    print(nest)                         # the nest with its annotations (what codegen_cpp turns into C++)

The shape of the nest (``KernelPlan`` holds the analysis every backend shares):

* dims are *coalesced* first: adjacent domain dims merge when every buffer is contiguous across them (stride of
  the outer = stride of the inner x its extent), and size-1 dims disappear. The common cases become one flat loop
  (point-wise) or rows x cols (a row reduction); a transposed input keeps two loops. Row dims are named ``i0, i1,
  ...``, reduced dims ``j0, j1, ...``.
* point-wise kernel: one nest over the domain computing what the stores need.
* reduction kernel: a nest over the row dims; per row, one loop over the reduced dims *per reduction*, each
  recomputing the element-level registers its operand needs (Inductor's choice: recompute cheap point-wise work
  rather than keep a row in memory), then the row-level registers (mean, rstd, ...) and stores, and a final loop
  for the element-level stores. Registers that depend only on constants are hoisted into a prologue.
* row buffers (the rule, ``keep_rule``): an element-level register that a later per-row loop needs again is *kept*
  (written to a row-local buffer ``rb<r>`` by the loop that first computes it, read back by the later loops)
  instead of recomputed when (a) its computation contains a costly op (``COSTLY``: exp, log, erf, tanh, sigmoid,
  pow, div, sqrt, rsqrt) and (b) the kept rows fit in ``ROW_BUFFER_MAX_BYTES`` (128 KiB: half of a small L2, so
  the buffer is re-read from L1/L2, never from DRAM). Softmax's ``exp(x - max)`` is then computed once per
  element (loops: max; exp + keep + sum; reload / sum -> store) where recomputing cost two exps per element; cheap
  registers (LayerNorm's ``x - mean``) are recomputed from the input, which costs the same load as a reload.
  A row longer than the budget falls back to recomputation (a buffer spilled to L3/DRAM costs a write and a read
  per element, more than the exp it saves). An online max+sum pass was not chosen: its per-element rescale
  ``sum * exp(m_old - m_new)`` costs a second exp per element unless vectorised per lane, which the IR can not
  express for arbitrary reductions.

Transforms name loops by their variable; the per-row loops over the same reduced dim share a name, so
``vectorize("j0")`` annotates all of them. ``tile(v, f)`` splits ``v`` into ``v_o`` (step f) and ``v``;
``reorder(a, b, ...)`` permutes a perfect nest; ``vectorize`` (innermost loops: ``#pragma omp simd``),
``parallelize`` (``#pragma omp parallel for``; refused on a loop that carries a reduction), ``unroll(v, f)``.
``default_schedule`` applies a simple rule: vectorise the innermost loops, parallelise the outermost loop when the
domain size x body length reaches ``PARALLEL_MIN_WORK``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from .kernel_ir import REDUCE, FusedKernel, Instr
from .kernel_plan import Dim, KernelPlan, _contiguous, plan  # noqa: F401  (re-exported: loops.plan)

PARALLEL_MIN_WORK = 1 << 17  # domain elements x body instructions below which threads cost more than they save
SIMD_MIN_EXTENT = 4
ROW_BUFFER_MAX_BYTES = 128 << 10  # kept registers of one row (per thread) above which they are recomputed instead
COSTLY = frozenset({"exp", "log", "erf", "tanh", "sigmoid", "pow", "div", "sqrt", "rsqrt"})


# ------------------------------------------------------------------------------------------------ loop nest nodes
@dataclass
class Compute:
    instr: Instr  # r<out> = op(args); a load reads its input at the current index


@dataclass
class Reduce:
    instr: Instr
    phase: str  # "init" (acc = identity), "update" (acc = acc op r<arg>), "finish" (r<out> = acc)


@dataclass
class Store:
    instr: Instr  # output <attr> at the current index = r<args[0]>


@dataclass
class Keep:
    reg: int  # row buffer rb<reg>[row index] = r<reg> (the loop that first computes a kept register)


@dataclass
class Reload:
    reg: int  # r<reg> = rb<reg>[row index] (a later per-row loop; no recomputation)


@dataclass
class RowBuffers:
    regs: list[int]  # per row (per thread): one buffer of ``elems`` elements for each kept register
    elems: int


@dataclass
class Loop:
    var: str
    dim: str  # the dim variable this loop advances (== var unless it is the outer loop of a tile)
    start: str
    stop: str
    step: int = 1
    body: list = field(default_factory=list)
    parallel: bool = False
    simd: bool = False
    unroll: int = 0

    def reductions(self) -> list[Instr]:
        """The reductions this loop's own body updates (for an ``omp simd reduction(...)`` clause)."""
        return [n.instr for n in self.body if isinstance(n, Reduce) and n.phase == "update"]

    def bound_vars(self) -> set[str]:
        return set(re.findall(r"[A-Za-z_]\w*", f"{self.start} {self.stop}"))


def _walk(nodes: list):
    for node in nodes:
        yield node, nodes
        if isinstance(node, Loop):
            yield from _walk(node.body)


@dataclass
class LoopNest:
    plan: KernelPlan
    prologue: list  # const-level computes, before every loop
    body: list

    @property
    def kernel(self) -> FusedKernel:
        return self.plan.kernel

    def loops(self, var: str | None = None) -> list[Loop]:
        found = [n for n, _ in _walk(self.body) if isinstance(n, Loop) and (var is None or n.var == var)]
        if var is not None and not found:
            names = sorted({n.var for n in self.loops()})
            raise ValueError(f"loop {var!r}: no such loop in kernel {self.kernel.name!r} (loops: {names})")
        return found

    # ---------------------------------------------------------------------------------------- transforms
    def tile(self, var: str, factor: int) -> LoopNest:
        """Split loop ``var`` into ``var_o`` (step ``factor``) around ``var`` (at most ``factor`` iterations)."""
        if not isinstance(factor, int) or factor < 1:
            raise ValueError(f"factor: expected a positive int, got {factor!r}")
        for loop in self.loops(var):
            if loop.step != 1 or loop.start != "0":
                raise ValueError(f"loop {var!r}: already tiled (tile its outer loop {var}_o instead)")
            inner = Loop(var, loop.dim, f"{var}_o", f"min({loop.stop}, {var}_o + {factor})", 1, loop.body)
            inner.simd, inner.unroll = loop.simd, loop.unroll
            loop.var, loop.step, loop.body, loop.simd, loop.unroll = f"{var}_o", factor, [inner], False, 0
        return self

    def reorder(self, *order: str) -> LoopNest:
        """Permute a perfect nest (each loop's body is just the next loop) so its loops run in ``order``; applied
        wherever the nest occurs (e.g. every per-row loop over the reduced dims)."""
        done = 0
        for outer in [lp for lp in self.loops() if lp.var in order]:
            chain, node = [], outer
            while isinstance(node, Loop) and node.var in order and len(chain) < len(order):
                chain.append(node)
                node = node.body[0] if len(node.body) == 1 else None
            if len(chain) < len(order):
                continue  # not the outermost loop of the chain (or not perfect: checked below)
            by_var = {lp.var: lp for lp in chain}
            placed: set[str] = set()
            for v in order:
                early = by_var[v].bound_vars() & (set(order) - placed - {v})
                if early:
                    raise ValueError(
                        f"reorder{order}: loop {v!r} bounds use {sorted(early)}, which would run inside it"
                    )
                placed.add(v)
            fields = [(lp.var, lp.dim, lp.start, lp.stop, lp.step, lp.parallel, lp.simd, lp.unroll) for lp in chain]
            innermost_body = chain[-1].body
            new = {f[0]: f for f in fields}
            for lp, v in zip(chain, order):
                lp.var, lp.dim, lp.start, lp.stop, lp.step, lp.parallel, lp.simd, lp.unroll = new[v]
            chain[-1].body = innermost_body
            done += 1
        if done:
            return self
        raise ValueError(f"reorder{order}: these loops do not form a perfect nest in kernel {self.kernel.name!r}")

    def vectorize(self, var: str) -> LoopNest:
        """``#pragma omp simd`` (with a reduction clause for the accumulators it updates) on innermost loop(s)."""
        for loop in self.loops(var):
            if any(isinstance(n, Loop) for n in loop.body):
                raise ValueError(f"loop {var!r}: only an innermost loop can be vectorised")
            if loop.unroll:
                raise ValueError(f"loop {var!r}: is unrolled; vectorise or unroll it, not both")
            loop.simd = True
        return self

    def parallelize(self, var: str) -> LoopNest:
        """``#pragma omp parallel for`` on loop ``var`` (refused on a loop that carries a reduction)."""
        for loop in self.loops(var):
            inits = {id(n.instr) for n, _ in _walk(loop.body) if isinstance(n, Reduce) and n.phase == "init"}
            carried = [n.instr.out for n, _ in _walk(loop.body) if isinstance(n, Reduce) and id(n.instr) not in inits]
            if carried:
                raise ValueError(f"loop {var!r}: carries reduction(s) of r{carried[0]}; threads would race on it")
            if any(lp.parallel and any(n is loop for n, _ in _walk(lp.body)) for lp in self.loops()):
                raise ValueError(f"loop {var!r}: inside a parallel loop already")
            loop.parallel = True
        return self

    def unroll(self, var: str, factor: int) -> LoopNest:
        """``#pragma GCC unroll factor`` on loop(s) ``var``."""
        if not isinstance(factor, int) or factor < 1:
            raise ValueError(f"factor: expected a positive int, got {factor!r}")
        for loop in self.loops(var):
            if loop.simd:
                raise ValueError(f"loop {var!r}: is vectorised; vectorise or unroll it, not both")
            loop.unroll = factor
        return self

    # ---------------------------------------------------------------------------------------- printing
    def row_index(self) -> str:
        """The flat index of the current element within its row (row-major over the reduced dims)."""
        terms, acc = [], 1
        for d in reversed(self.plan.red_dims):
            terms.append(d.var if acc == 1 else f"{d.var}*{acc}")
            acc *= d.extent
        return " + ".join(reversed(terms)) or "0"

    def kept(self) -> list[int]:
        """The registers kept in row buffers (see the module docstring's rule)."""
        return [r for n, _ in _walk(self.body) if isinstance(n, RowBuffers) for r in n.regs]

    def index(self, strides: tuple[int, ...]) -> str:
        terms = [d.var if s == 1 else f"{d.var}*{s}" for d, s in zip(self.plan.dims, strides) if s]
        return " + ".join(terms) or "0"

    def __str__(self) -> str:
        k, p = self.kernel, self.plan
        dims = ", ".join(f"n_{d.var}={d.extent}{' (reduced)' if d.reduce else ''}" for d in p.dims)
        lines = [f"kernel {k.name!r} {k.dtype}: domain {k.shape} -> loops over {dims}"]

        def stmt(node) -> str:
            if isinstance(node, Keep):
                return f"rb{node.reg}[{self.row_index()}] = r{node.reg}"
            if isinstance(node, Reload):
                return f"r{node.reg} = rb{node.reg}[{self.row_index()}]"
            if isinstance(node, RowBuffers):
                return "row buffers " + ", ".join(f"rb{r}[{node.elems}]" for r in node.regs)
            ins = node.instr
            if isinstance(node, Store):
                b = k.outputs[ins.attr]
                return f"{b.name}[{self.index(p.out_strides[ins.attr])}] = r{ins.args[0]}"
            if isinstance(node, Reduce):
                acc, v = f"acc{ins.out}", f"r{ins.args[0]}"
                return {
                    "init": f"{acc} = {'0' if ins.op == 'sum' else '-inf'}",
                    "update": f"{acc} = {acc} + {v}" if ins.op == "sum" else f"{acc} = max({acc}, {v})",
                    "finish": f"r{ins.out} = acc{ins.out}",
                }[node.phase]
            if ins.op == "load":
                return f"r{ins.out} = {k.inputs[ins.attr].name}[{self.index(p.in_strides[ins.attr])}]"
            if ins.op == "const":
                return f"r{ins.out} = {ins.attr!r}"
            return f"r{ins.out} = {ins.op}({', '.join(f'r{a}' for a in ins.args)})"

        def emit(nodes: list, depth: int) -> None:
            for node in nodes:
                pad = "  " * depth
                if isinstance(node, Loop):
                    notes = [
                        "parallel" if node.parallel else "",
                        "simd" if node.simd else "",
                        f"unroll {node.unroll}" if node.unroll else "",
                    ]
                    red = [f"r{i.out}" for i in node.reductions()]
                    notes.append(f"reduces {', '.join(red)}" if red else "")
                    note = "  # " + ", ".join(x for x in notes if x) if any(notes) else ""
                    step = f" step {node.step}" if node.step != 1 else ""
                    lines.append(f"{pad}for {node.var} in [{node.start}, {node.stop}){step}:{note}")
                    emit(node.body, depth + 1)
                else:
                    lines.append(pad + stmt(node))

        emit(self.prologue, 0)
        emit(self.body, 0)
        return "\n".join(lines)


def _nest(dims: list[Dim], body: list) -> list:
    """Loops over ``dims`` (outermost first) around ``body``; no dims: the body itself."""
    for d in reversed(dims):
        body = [Loop(d.var, d.var, "0", f"n_{d.var}", 1, body)]
    return body


def _costly(p: KernelPlan) -> dict[int, bool]:
    """Element-level register -> whether its computation (within this kernel) contains a ``COSTLY`` op."""
    out: dict[int, bool] = {}
    for ins in p.kernel.body:
        if ins.op != "store" and p.level[ins.out] == "elem":
            out[ins.out] = ins.op in COSTLY or any(out.get(a, False) for a in ins.args)
    return out


def _pass_cone(p: KernelPlan, targets: list[int], earlier: set[int], keep: bool) -> tuple[list[Instr], set[int]]:
    """The element-level instructions one per-row loop computes for ``targets``, and the registers it reloads:
    those an earlier loop computed whose computation is costly (when ``keep``)."""
    defs = {i.out: i for i in p.kernel.body if i.op != "store"}
    costly = _costly(p)
    need: set[int] = set()
    reload: set[int] = set()
    stack = list(targets)
    while stack:
        r = stack.pop()
        if r in need or r in reload or p.level[r] != "elem":
            continue
        if keep and r in earlier and costly[r]:
            reload.add(r)
            continue
        need.add(r)
        stack.extend(defs[r].args)
    return [i for i in p.kernel.body if i.op != "store" and i.out in need], reload


def keep_rule(kernel: FusedKernel, max_bytes: int | None = None) -> tuple[list[int], str]:
    """(registers to keep in row buffers, the reason): the module docstring's rule, printable."""
    p = plan(kernel)
    limit = ROW_BUFFER_MAX_BYTES if max_bytes is None else max_bytes
    if kernel.reduce_dims == 0:
        return [], "point-wise kernel: one loop, nothing to keep"
    passes = [[i.args[0]] for i in kernel.body if i.op in REDUCE]
    if p.elem_stores:
        passes.append([s.args[0] for s in p.elem_stores])
    earlier: set[int] = set()
    kept: set[int] = set()
    for targets in passes:
        instrs, reload = _pass_cone(p, targets, earlier, True)
        kept |= reload
        earlier |= {i.out for i in instrs}
    if not kept:
        return [], "no costly element-level register is needed by two per-row loops: recompute"
    nbytes = len(kept) * kernel.cols * np.dtype(kernel.dtype).itemsize
    regs = sorted(kept)
    if nbytes > limit:
        return [], f"keeping {[f'r{r}' for r in regs]} needs {nbytes} B per row > {limit} B: recompute"
    return regs, f"keep {[f'r{r}' for r in regs]} in row buffers ({nbytes} B per row <= {limit} B)"


def lower(kernel: FusedKernel, row_buffer_bytes: int | None = None) -> LoopNest:
    """The unscheduled loop nest of ``kernel`` (see the module docstring for its shape and the row-buffer rule;
    ``row_buffer_bytes`` overrides ``ROW_BUFFER_MAX_BYTES``, 0 = always recompute)."""
    p = plan(kernel)
    body_instrs = [i for i in kernel.body if i.op != "store"]
    prologue = [Compute(i) for i in body_instrs if p.level[i.out] == "const"]
    if kernel.reduce_dims == 0:
        regs = [s.args[0] for s in p.elem_stores]
        inner = [Compute(i) for i in p.cone(regs)] + [Store(s) for s in p.elem_stores]
        return LoopNest(p, prologue, _nest(p.dims, inner))
    kept, _ = keep_rule(kernel, row_buffer_bytes)
    keep = bool(kept)
    earlier: set[int] = set()

    def loop_body(targets: list[int]) -> list:
        instrs, reload = _pass_cone(p, targets, earlier, keep)
        nodes: list = [Reload(r) for r in sorted(reload)] + [Compute(i) for i in instrs]
        nodes += [Keep(i.out) for i in instrs if i.out in kept and i.out not in earlier]
        earlier.update(i.out for i in instrs)
        return nodes

    row: list = [RowBuffers(kept, kernel.cols)] if kept else []
    for ins in kernel.body:
        if ins.op in REDUCE:
            update = loop_body([ins.args[0]]) + [Reduce(ins, "update")]
            row += [Reduce(ins, "init"), *_nest(p.red_dims, update), Reduce(ins, "finish")]
        elif ins.op == "store":
            if ins in p.row_stores:
                row.append(Store(ins))
        elif p.level[ins.out] == "row":
            row.append(Compute(ins))
    if p.elem_stores:
        regs = [s.args[0] for s in p.elem_stores]
        row += _nest(p.red_dims, loop_body(regs) + [Store(s) for s in p.elem_stores])
    return LoopNest(p, prologue, _nest(p.row_dims, row))


def default_schedule(nest: LoopNest) -> LoopNest:
    """Vectorise the innermost loops (extent >= SIMD_MIN_EXTENT); parallelise the outermost loop when the domain
    size x body length reaches PARALLEL_MIN_WORK and it has more than one iteration."""
    dims = {d.var: d for d in nest.plan.dims}
    for var in sorted({lp.var for lp in nest.loops() if not any(isinstance(n, Loop) for n in lp.body)}):
        if var in dims and dims[var].extent >= SIMD_MIN_EXTENT:
            nest.vectorize(var)
    work = math.prod(nest.kernel.shape) * len(nest.kernel.body)
    top = [n for n in nest.body if isinstance(n, Loop)]
    if len(top) == 1 and work >= PARALLEL_MIN_WORK and dims[top[0].dim].extent > 1:
        try:
            nest.parallelize(top[0].var)
        except ValueError:  # a full reduction: its only loop carries the accumulator
            pass
    return nest
