"""Memory planning for a compiled program: fused-kernel outputs live in one arena, at offsets planned from lifetimes.

    mp = memory_plan.plan_memory(program)     # analysis + offsets (tinylearn.memory.planner, strategy "best")
    program.memory = mp                       # the runtime writes kernel outputs into the arena (``attach`` does both)
    print(mp.report())                        # arena vs sum of buffers vs the planner's lower bound, in-place choices

What is planned: every output of a ``KernelStep`` (the C++ kernels take output pointers: ``CompiledKernel(...,
out=...)``). Extern ops allocate their own results (numpy), graph inputs/params/constants belong to the caller.

Lifetimes, in step indices (closed intervals, as the planner wants): first = the step that writes the buffer, last
= the last step that reads it. Extern ops and getitem may return *views* of their inputs (reshape, transpose,
expand), so a buffer's lifetime extends to the last use of every value that may alias it (its alias closure through
extern/getitem steps; ``FRESH_OPS``, e.g. MatMul, always allocate their result and break the chain). A buffer
whose alias closure contains a graph output is left out of the arena (allocated per call): graph outputs must
never alias the arena, which the next call overwrites.

In-place (``inplace=True``): a point-wise kernel (no reduced dims) writes an output over an input buffer when
  * the input is a planned buffer whose (alias-extended) lifetime ends at this step (no later reader, no live view),
  * it reads that input at the output's own index (same shape and strides, so element i is read before it is
    written and no other element is read from it), in the kernel dtype (no conversion copy), same byte size,
  * the input is used once by the kernel, and the output is itself planned (not a graph output).
The pair then shares one planner entry spanning both lifetimes. (The C++ kernel declares its pointers
``__restrict``; in place it gets the same pointer for that input and output. That is safe for this loop shape: each
iteration loads every input once, computes, then stores at the same index, so no load of element i can follow the
store to element i -- the store's value depends on it -- and other iterations touch other elements.) Inputs of the
graph, outputs of the graph, values read later and broadcast/transposed reads are never overwritten.

The arena is allocated once per program (shapes are static per compiled graph) and reused across calls; a call
that finds it in use (another thread) gets a fresh one. ``alignment`` = 64 bytes (a cache line, an AVX-512 vector).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...memory import planner
from ..graph import Node
from ..runtime import ExternStep, KernelStep, Program

ALIGNMENT = 64
FRESH_OPS = frozenset({"MatMul", "Linear", "Cat", "Stack", "Clone"})  # extern ops whose result is never a view


@dataclass
class Slot:
    """One planned buffer: the node, the step that writes it (and its output index), its bytes and placement."""

    node: Node
    step: int
    index: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    first: int
    last: int
    group: int = -1  # planner entry (several slots share one when written in place)
    offset: int = -1
    inplace_of: Node | None = None  # the input buffer this output overwrites


@dataclass
class MemoryPlan:
    """The plan of one program: ``report()`` prints it; ``acquire``/``release`` hand the runtime its arena."""

    program: Program = field(repr=False)
    slots: list[Slot]
    lifetimes: list[tuple[int, int, int]]  # per planner entry: (bytes, first, last)
    offsets: list[int]
    arena_bytes: int
    lower_bound: int
    excluded: list[tuple[str, str]] = field(default_factory=list)  # (node name, reason)
    alignment: int = ALIGNMENT
    _free: list[tuple[np.ndarray, dict]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def buffer_bytes(self) -> int:
        """Bytes the planned buffers would take allocated separately (what runs without planning)."""
        return sum(s.nbytes for s in self.slots)

    def inplace(self) -> list[tuple[str, str, int]]:
        """(output, overwritten input, step) for each in-place decision."""
        return [(s.node.name, s.inplace_of.name, s.step) for s in self.slots if s.inplace_of is not None]

    def report(self) -> str:
        lines = [
            f"memory plan: {len(self.slots)} kernel buffer(s) in {len(self.lifetimes)} slot(s); arena "
            f"{self.arena_bytes} B vs {self.buffer_bytes} B allocated separately vs lower bound {self.lower_bound} B"
            f" (alignment {self.alignment})"
        ]
        for s in self.slots:
            note = f", in place over %{s.inplace_of.name}" if s.inplace_of is not None else ""
            lines.append(f"  %{s.node.name}: {s.nbytes} B live steps [{s.first}, {s.last}] at offset {s.offset}{note}")
        lines += [f"  not planned %{n}: {why}" for n, why in self.excluded]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()

    # -- runtime ----------------------------------------------------------------------------------------------
    def _new(self) -> tuple[np.ndarray, dict]:
        raw = np.empty(self.arena_bytes + self.alignment, np.uint8)
        start = (-raw.ctypes.data) % self.alignment
        arena = raw[start : start + self.arena_bytes]
        views: dict[int, list[Any]] = {}
        for s in self.slots:
            n_out = len(self.program.steps[s.step].outputs)
            v = arena[s.offset : s.offset + s.nbytes].view(s.dtype).reshape(s.shape)
            views.setdefault(s.step, [None] * n_out)[s.index] = v
        return arena, views

    def acquire(self) -> tuple[np.ndarray, dict]:
        """(arena, {step index: [slot view or None per kernel output]}): the cached arena, or a new one if busy."""
        with self._lock:
            if self._free:
                return self._free.pop()
        return self._new()

    def release(self, handle: tuple[np.ndarray, dict]) -> None:
        """Give back what ``acquire`` returned: kept for the next call (one arena is cached)."""
        with self._lock:
            if not self._free:
                self._free.append(handle)


def _step_inputs(step: Any) -> list[Node]:
    if isinstance(step, KernelStep):
        return list(step.inputs)
    return [a for a in step.node.inputs()]


def _step_outputs(step: Any) -> list[Node]:
    return list(step.outputs) if isinstance(step, KernelStep) else [step.node]


def lifetimes(program: Program) -> tuple[dict[Node, tuple[int, int]], dict[Node, set[Node]]]:
    """({kernel output node: (first step, last step)}, {node: kernel outputs it may alias}); the last step
    includes the uses of every extern/getitem result that may be a view of the buffer."""
    aliases: dict[Node, set[Node]] = {}  # value -> the kernel buffers it may be (a view of)
    first: dict[Node, int] = {}
    last: dict[Node, int] = {}
    for i, step in enumerate(program.steps):
        for n in _step_inputs(step):
            for b in aliases.get(n, ()):
                last[b] = i
        if isinstance(step, KernelStep):
            for n in step.outputs:
                aliases[n] = {n}
                first[n] = last[n] = i
        elif isinstance(step, ExternStep) and step.node.op in FRESH_OPS:
            aliases[step.node] = set()
        else:  # an extern op, getitem or any other step: its result may be a view of any input
            aliases[step.node] = set().union(*[aliases.get(n, set()) for n in _step_inputs(step)])
    return {n: (first[n], last[n]) for n in first}, aliases


def _inplace_ok(step: KernelStep, j: int, src: Slot, out_k: int) -> bool:
    k = step.kernel
    if k.reduce_dims != 0 or step.inputs.count(step.inputs[j]) != 1:
        return False
    bi, bo = k.inputs[j], k.outputs[out_k]
    return (
        bi.shape == bo.shape
        and tuple(bi.strides) == tuple(bo.strides)
        and src.dtype == k.dtype
        and np.dtype(step.inputs[j].dtype) == np.dtype(k.dtype)
        and src.nbytes == int(np.prod(bo.shape, dtype=np.int64)) * np.dtype(k.dtype).itemsize
    )


def plan_memory(
    program: Program, alignment: int = ALIGNMENT, inplace: bool = True, strategy: str = "best"
) -> MemoryPlan:
    """Lifetimes, in-place decisions and arena offsets for ``program``'s kernel outputs (module docstring)."""
    spans, aliases = lifetimes(program)
    outputs = set(program.graph.outputs)
    in_outputs: set[Node] = set()
    for o in outputs:
        in_outputs |= aliases.get(o, set())
    slots: list[Slot] = []
    by_node: dict[Node, Slot] = {}
    excluded: list[tuple[str, str]] = []
    for i, step in enumerate(program.steps):
        if not isinstance(step, KernelStep):
            continue
        for j, (n, b) in enumerate(zip(step.outputs, step.kernel.outputs)):
            if n in in_outputs:
                why = "a graph output" if n in outputs else "a graph output may be a view of it"
                excluded.append((n.name, why))
                continue
            nbytes = int(np.prod(b.shape, dtype=np.int64)) * np.dtype(step.kernel.dtype).itemsize
            if nbytes == 0:
                excluded.append((n.name, "empty"))
                continue
            s = Slot(n, i, j, nbytes, tuple(b.shape), step.kernel.dtype, *spans[n])
            slots.append(s)
            by_node[n] = s
    # in-place: union the output's slot with a dying input's
    group = {id(s): g for g, s in enumerate(slots)}
    parent = list(range(len(slots)))

    def find(g: int) -> int:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    if inplace:
        used: set[Node] = set()
        for i, step in enumerate(program.steps):
            if not isinstance(step, KernelStep):
                continue
            for k_out, o in enumerate(step.outputs):
                dst = by_node.get(o)
                if dst is None:
                    continue
                for j, n in enumerate(step.inputs):
                    src = by_node.get(n)
                    if src is None or n in used or src.last != i or not _inplace_ok(step, j, src, k_out):
                        continue
                    used.add(n)
                    dst.inplace_of = n
                    parent[find(group[id(dst)])] = find(group[id(src)])
                    break
    roots: dict[int, int] = {}
    lts: list[tuple[int, int, int]] = []
    for s in slots:
        r = find(group[id(s)])
        if r not in roots:
            roots[r] = len(lts)
            lts.append((s.nbytes, s.first, s.last))
        e = roots[r]
        size, f, la = lts[e]
        lts[e] = (max(size, s.nbytes), min(f, s.first), max(la, s.last))
        s.group = e
    offsets, peak = planner.plan(lts, strategy=strategy, alignment=alignment) if lts else ([], 0)
    for s in slots:
        s.offset = offsets[s.group]
    arena = max((o + planner.align_up(sz, alignment) for o, (sz, _, _) in zip(offsets, lts)), default=0)
    lb = planner.lower_bound(lts, alignment) if lts else 0
    return MemoryPlan(program, slots, lts, list(offsets), max(arena, peak), lb, excluded, alignment)


def attach(program: Program, inplace: bool = True) -> Program:
    """Plan ``program``'s memory and make its runs use the arena; returns the program (for ``api.build``).
    ``TINYLEARN_MEMORY_PLAN=0`` turns planning off (every kernel output allocated per call, as before)."""
    if os.environ.get("TINYLEARN_MEMORY_PLAN", "1") == "0":
        return program
    program.memory = plan_memory(program, inplace=inplace)
    if not program.memory.slots:
        program.memory = None  # nothing to plan: the plain run
    return program
