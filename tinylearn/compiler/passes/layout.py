"""Layout selection for a compiled program: where a transpose (``Permute``) is folded, materialised or left a view.

Eager numpy runs ``x.T`` / ``permute`` as a view; the compiled program (``runtime.Program``) runs it as an extern
step and then every fused kernel that reads it makes its own contiguous copy (``KernelStep.run`` hands kernels
C-contiguous arrays): k readers, k copies (a strided read + a write + a read each). The rule, per Permute node:

    fused-kernel readers   fold: the kernel loads the permute's *input* with permuted strides (the kernel IR takes
                           any strides over its domain; ``loops.plan`` keeps the dims apart): no copy at all
    extern readers (MatMul, ...)
        >= 2               materialise contiguous once (``ContiguousStep``), shared by all of them: each would
                           otherwise read the view strided or copy it internally (np.matmul of an n-d view does)
        1                  leave the view: the one reader pays at most the one copy materialising would cost
    graph output           leave the view (eager returns a view too)

A Permute left with no reader after folding is dropped from the program. Values are unchanged (the same
arithmetic on the same elements). Not done: choosing layouts of kernel *outputs* (they are always written
contiguous), or tiling a kernel whose transposed load has a large inner stride (``loops.tile`` can, by hand).

    report = layout.analyse(program)          # decisions only, printable
    report = layout.apply(program, build)     # rewrite: ``build(kernel)`` -> callable for a rewritten kernel
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..graph import Node
from ..kernel_ir import Buffer, FusedKernel
from ..runtime import ExternStep, KernelStep, PreparedCall, Program


@dataclass
class ContiguousStep:
    """An extern op whose result is made C-contiguous once (a materialised transpose shared by its readers)."""

    node: Node
    call: PreparedCall = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.call = PreparedCall(self.node)

    def run(self, env: dict[Node, Any]) -> None:
        env[self.node] = np.ascontiguousarray(self.call(env)[0])


@dataclass
class Decision:
    node: Node  # the Permute
    action: str  # "fold" | "fold+materialise" | "fold+view" | "materialise" | "view"
    kernels: list[str] = field(default_factory=list)  # kernels that read it (folded)
    externs: list[str] = field(default_factory=list)  # extern / getitem readers
    output: bool = False
    reason: str = ""

    def __str__(self) -> str:
        perm = tuple(self.node.args[1]) if len(self.node.args) > 1 else ()
        src = self.node.args[0].name if isinstance(self.node.args[0], Node) else "?"
        return f"%{self.node.name} = permute(%{src}, {perm}): {self.action} ({self.reason})"


@dataclass
class LayoutReport:
    decisions: list[Decision]
    rewritten: list[str] = field(default_factory=list)  # "kernel: input strides a -> b"
    removed: list[str] = field(default_factory=list)  # Permute steps dropped

    def __str__(self) -> str:
        if not self.decisions:
            return "layout: no permute in the program"
        lines = [f"layout: {len(self.decisions)} permute(s)"] + [f"  {d}" for d in self.decisions]
        lines += [f"  rewrote {r}" for r in self.rewritten] + [f"  dropped %{r} (no reader left)" for r in self.removed]
        return "\n".join(lines)


def _readers(program: Program) -> dict[Node, list[Any]]:
    out: dict[Node, list[Any]] = {}
    for s in program.steps:
        ins = s.inputs if isinstance(s, KernelStep) else s.node.inputs()
        for n in dict.fromkeys(ins):
            out.setdefault(n, []).append(s)
    return out


def _is_permute(step: Any) -> bool:
    return (
        isinstance(step, ExternStep)
        and step.node.op == "Permute"
        and len(step.node.args) > 1
        and isinstance(step.node.args[0], Node)
        and step.node.args[0].dtype == step.node.dtype
    )


def analyse(program: Program) -> LayoutReport:
    """The decision for every Permute step of ``program`` (the module docstring's rule); changes nothing."""
    readers = _readers(program)
    outputs = set(program.graph.outputs)
    decisions = []
    for step in program.steps:
        if not _is_permute(step):
            continue
        p = step.node
        rs = readers.get(p, [])
        kernels = [s.kernel.name for s in rs if isinstance(s, KernelStep) and s.kernel.dtype == np.dtype(p.dtype).name]
        externs = [
            s.node.name
            for s in rs
            if not (isinstance(s, KernelStep) and s.kernel.dtype == np.dtype(p.dtype).name) and hasattr(s, "node")
        ]
        externs += [s.kernel.name for s in rs if isinstance(s, KernelStep) and s.kernel.name not in kernels]
        out = p in outputs
        if len(externs) >= 2:
            ext, why_e = "materialise", f"{len(externs)} extern readers share one contiguous copy"
        elif externs or out:
            ext, why_e = "view", "one extern reader" if externs else "a graph output"
        else:
            ext, why_e = "", ""
        if kernels:
            action = "fold" + (f"+{ext}" if ext else "")
            reason = f"{len(kernels)} fused kernel(s) load %{p.args[0].name} with permuted strides"
            reason += f"; {why_e}" if why_e else "; no other reader: the step is dropped"
        else:
            action, reason = ext or "view", why_e or "no reader"
        decisions.append(Decision(p, action, kernels, externs, out, reason))
    return LayoutReport(decisions)


def folded_strides(buf: Buffer, n_domain: int, src_shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, ...]:
    """``buf``'s strides over the kernel domain when it is read from the permute's contiguous input instead."""
    m = len(buf.shape)
    cs = [math.prod(src_shape[d + 1 :]) for d in range(len(src_shape))]
    out = []
    for d, s in enumerate(buf.strides):
        i = d - (n_domain - m)
        out.append(0 if s == 0 or i < 0 else cs[perm[i] % m])
    return tuple(out)


def apply(program: Program, build: Callable[[FusedKernel], Callable[..., list]]) -> LayoutReport:
    """Rewrite ``program`` by ``analyse``'s decisions: kernels load permute inputs with folded strides (rebuilt by
    ``build``), shared extern reads are materialised once, Permute steps without readers are dropped."""
    report = analyse(program)
    by_node = {d.node: d for d in report.decisions}
    for i, s in enumerate(program.steps):
        if not isinstance(s, KernelStep):
            continue
        hit = [j for j, n in enumerate(s.inputs) if n in by_node and s.kernel.name in by_node[n].kernels]
        if not hit:
            continue
        k = s.kernel
        inputs, nodes = list(k.inputs), list(s.inputs)
        for j in hit:
            p = nodes[j]
            src, perm = p.args[0], tuple(int(x) for x in p.args[1])
            new = folded_strides(inputs[j], len(k.shape), tuple(src.shape), perm)
            report.rewritten.append(f"{k.name}: input {j} %{p.name} strides {inputs[j].strides} -> %{src.name} {new}")
            inputs[j] = Buffer(src.name, tuple(src.shape), inputs[j].dtype, new)
            nodes[j] = src
        k2 = replace(k, inputs=inputs, meta={**k.meta, "layout": "folded permute"})
        program.steps[i] = KernelStep(k2, nodes, s.outputs, build(k2), s.backend)
    readers = _readers(program)
    outputs = set(program.graph.outputs)
    steps = []
    for s in program.steps:
        d = by_node.get(s.node) if isinstance(s, ExternStep) else None
        if d is not None and not readers.get(s.node) and s.node not in outputs:
            report.removed.append(s.node.name)
            continue
        if d is not None and d.action.endswith("materialise"):
            s = ContiguousStep(s.node)
        steps.append(s)
    program.steps[:] = steps
    return report


__all__ = ["ContiguousStep", "Decision", "LayoutReport", "analyse", "apply", "folded_strides"]
