"""``tl.compile``: trace -> passes -> fusion -> kernels, behind guards and a cache (torch.compile's shape, small).

    compiled = tl.compile(fn_or_module, backend="cpp", mode="default")
    y = compiled(x)                  # first call: traces (the traced run's result is returned), then compiles
    y = compiled(x2)                 # same shapes/dtypes: a cache hit, the compiled program runs
    compiled.stats                   # {'calls', 'hits', 'misses', 'recompiles', 'graph_breaks', 'eager_calls', ...}

Guards: the cache key is the *shape class* of the call: every Tensor argument's shape (dims marked with
``mark_dynamic`` erased) and dtype, whether it requires grad, the non-Tensor arguments (by value), grad mode and a
module's ``training`` flag. A key never seen before is a miss; a miss after the first compile is a recompile (the
guard failed). Within a shape class, each concrete size of a dynamic dim gets its own graph and kernels
(``stats['size_specializations']``), made without tracing when the first traced graph can be re-specialised
(``stats['reuses']``, from the third size on: the second is traced to confirm that the graph does not depend on
the size; shapes.py says when; ``explain()`` says why not: then ``stats['traces']`` grows).
``dynamic=`` (shapes.py): "reuse" (default), "retrace", "pow2" / "learned" (pad dynamic dims up to shared
buckets where the graph is row-independent: ``stats['padded_calls']``, ``'pad_elements'`` of
``'real_elements'``), or a ``ShapePolicy``;
``prefetch()`` builds the predicted next size (``stats['prediction_hits']`` of ``'predictions'``).

Fused kernels come from the process-wide pattern-hash cache (kernel_cache.py): equal structure compiles once,
across layers and compiled functions; ``kernel_summary()`` prints fused kernels vs distinct patterns.

Graph breaks (trace.py): the call that meets one runs the function exactly once, recording stops at the break and
the rest runs eagerly (its result is returned); that shape class then runs eagerly, with a ``UserWarning`` naming
the op and reason. (Compiling the part before the break, as Dynamo does, needs resuming Python mid-function from
bytecode: not done.) ``validate=True`` traces a second time on the first call (permuted inputs, BatchNorm's
statistics restored): pass ``validate=False`` when even that second run of fn is unwanted.

Per compiled graph: the unfused graph (after shape inference, simplification, constant folding, CSE, DCE) serves
calls that need gradients (autograd.py); a copy rewritten by the pattern pass and fused serves the others. Fused
kernels run on ``backend``: "numpy" (``kernel_ir.evaluate``), "cpp" (``codegen_cpp.build``) or "triton"
(``codegen_triton.build``); a backend that cannot build a kernel falls back to numpy with a warning.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..autograd import function as _function
from ..autograd.function import _GradMode
from ..autograd.tensor import Tensor
from ..nn.module import Module
from . import fusion, passes, shapes
from .autograd import explain_joint, grad_call
from .graph import Graph
from .kernel_cache import CACHE, concrete_key, pattern_hash
from .kernel_ir import FusedKernel
from .listing import kernel_listing
from .passes import layout
from .passes.memory_plan import attach as _plan_memory
from .runtime import ExternStep, KernelStep, Program
from .trace import GraphBreak, capture, check_reproducible, module_params

BACKENDS = ("cpp", "numpy", "triton")
MODES = fusion.MODES


def mark_dynamic(tensor: Tensor, dim: int) -> Tensor:
    """Mark ``dim`` of ``tensor`` dynamic: the compile cache's shape class ignores its size. Returns the tensor."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"tensor: expected a tinylearn Tensor, got {type(tensor).__name__}")
    if isinstance(dim, bool | np.bool_) or not isinstance(dim, int | np.integer):
        raise ValueError(f"dim: expected an int in [-{tensor.ndim}, {tensor.ndim}), got {dim!r}")
    dim = int(dim)  # numpy integers too
    if not -tensor.ndim <= dim < tensor.ndim:  # a 0-d tensor has no dim to mark
        raise ValueError(f"dim: expected an int in [-{tensor.ndim}, {tensor.ndim}), got {dim!r}")
    dyn = set(getattr(tensor, "_tl_dynamic", ()))
    dyn.add(dim % tensor.ndim)
    tensor._tl_dynamic = frozenset(dyn)
    return tensor


KERNEL_CACHE = CACHE.stats  # {'requests', 'hits', 'builds', 'fallbacks'} of the pattern-hash kernel cache


def kernel_key(kernel: FusedKernel) -> tuple:
    """The structure of a kernel (everything but its name and provenance; registers renumbered) and its sizes:
    equal keys compute the same thing (kernel_cache.concrete_key; the cpp backend also shares across sizes)."""
    return concrete_key(kernel)


def _backend_fn(kernel: FusedKernel, backend: str) -> tuple[Callable[..., list], str, str | None]:
    """(callable, backend used, reason for a fallback or None); equal kernels are built once (kernel_cache)."""
    return CACHE.get(kernel, backend)


@dataclass
class CompiledGraph:
    """One traced graph and what was built from it."""

    graph: Graph  # as traced
    train_graph: Graph  # after the generic passes (autograd path)
    infer_graph: Graph  # after patterns too (the fused program's graph)
    plan: fusion.FusionPlan
    program: Program
    reports: list[passes.PassReport]
    backends: list[str] = field(default_factory=list)
    signature: str = ""  # the traced graph's structural hash (graph.Graph.signature)

    def kernels(self) -> list[FusedKernel]:
        return [k for k, _, _ in self.plan.kernels]


def build(graph: Graph, backend: str, mode: str) -> tuple[CompiledGraph, list[str]]:
    """Passes, fusion and kernel building for one traced graph; returns it and the backend fallback reasons."""
    train = graph.copy()
    reports = passes.run_pipeline(train)
    infer = train.copy()
    reports.append(passes.patterns.run(infer))
    reports.append(passes.horizontal.run(infer))
    passes.dce.run(infer)
    plan = fusion.plan(infer, mode)
    steps, used, reasons = fusion.program_steps(plan, _backend_fn, backend)
    program = Program(infer, steps)
    # layout selection: permutes read by fused kernels fold into their load strides; one read by several extern
    # ops is made contiguous once (passes/layout.py); TINYLEARN_LAYOUT=0 turns it off (as TINYLEARN_MEMORY_PLAN=0)
    if os.environ.get("TINYLEARN_LAYOUT", "1") != "0":
        program.layout = layout.apply(program, lambda k: _backend_fn(k, backend)[0])
    cg = CompiledGraph(graph, train, infer, plan, _plan_memory(program), reports, used, graph.signature())
    return cg, reasons


def _tensor_positions(args: tuple) -> list[int]:
    return [i for i, a in enumerate(args) if isinstance(a, Tensor)]


@dataclass
class _Entry:
    broken: GraphBreak | None = None
    by_size: dict[tuple, CompiledGraph] = field(default_factory=dict)
    dyn: dict[int, frozenset[int]] = field(default_factory=dict)  # argument index -> its dynamic dims
    template: CompiledGraph | None = None  # the first traced graph: re-specialised for new sizes when possible
    blocker: str | None = None  # why the template cannot be re-specialised (shapes.reuse_blocker)
    confirmed: bool = False  # a second size traced to the same graph up to shapes: later sizes re-specialise
    pad: shapes.PadPlan | str | None = None  # buckets: the padding plan, or why padding is refused
    notes: list[str] = field(default_factory=list)


STATS = (
    *("calls", "hits", "misses", "recompiles", "graph_breaks", "eager_calls", "size_specializations"),
    *("traces", "reuses", "padded_calls", "pad_elements", "real_elements"),
    *("predictions", "prediction_hits", "prefetched"),
)


class CompiledFunction:
    """What ``compile`` returns: call it like the function; ``stats``, ``entries``, ``explain()``, ``prefetch()``."""

    def __init__(
        self, fn: Callable[..., Any], backend: str, mode: str, validate: bool, policy: shapes.ShapePolicy | None = None
    ) -> None:
        self.fn, self.backend, self.mode, self.validate = fn, backend, mode, validate
        self.policy = policy or shapes.ShapePolicy()
        self.module = fn if isinstance(fn, Module) else None
        self.cache: dict[tuple, _Entry] = {}
        self.stats = dict.fromkeys(STATS, 0)
        self._warned_backend = False
        self._predicted: dict[tuple[int, int], int] = {}
        self._last: tuple[tuple, list[int], list[tuple[int, ...]]] | None = None  # last call: key, Tensor args, shapes

    # -- guards -----------------------------------------------------------------------------------------------
    def _keys(self, args: tuple) -> tuple[tuple, tuple]:
        static, sizes = [], []
        for a in args:
            if isinstance(a, Tensor):
                dyn = getattr(a, "_tl_dynamic", frozenset())
                static.append(("T", tuple(None if i in dyn else s for i, s in enumerate(a.shape)), str(a.dtype)))
                static.append(a.requires_grad)
                sizes.append(tuple(a.shape))
            else:
                try:
                    hash(a)
                    static.append(("V", type(a).__name__, a))
                except TypeError:
                    static.append(("id", id(a)))
        static.append(_GradMode.enabled)
        if self.module is not None:
            static.append(self.module.training)
            static.append(tuple(p.requires_grad for p in self.module.parameters()))
        return tuple(static), tuple(sizes)

    @staticmethod
    def _dyn(args: tuple) -> dict[int, frozenset[int]]:
        return {
            i: frozenset(a._tl_dynamic)
            for i, a in enumerate(args)
            if isinstance(a, Tensor) and getattr(a, "_tl_dynamic", None)
        }

    def _observe(self, args: tuple, dyn: dict[int, frozenset[int]]) -> None:
        """Record the dynamic sizes (policy history), score the last prediction, predict the next sizes."""
        for i, dims in dyn.items():
            for d in dims:
                dim, n = (i, d), args[i].shape[d]
                if dim in self._predicted:
                    self.stats["predictions"] += 1
                    self.stats["prediction_hits"] += int(self._predicted[dim] == self.policy.bucket(dim, n))
                self.policy.observe(dim, n)
                p = self.policy.predict(dim)
                if p is not None:
                    self._predicted[dim] = p

    def __call__(self, *args: Any) -> Any:
        if _function._trace_hook is not None:  # called inside another trace: inline (its ops join that graph)
            return self.fn(*args)
        self.stats["calls"] += 1
        key, sizes = self._keys(args)
        dyn = self._dyn(args)
        self._observe(args, dyn)
        self._last = (key, _tensor_positions(args), list(sizes))
        entry = self.cache.get(key)
        if entry is None:
            self.stats["misses"] += 1
            if self.cache:
                self.stats["recompiles"] += 1
            entry = self.cache[key] = _Entry(dyn=dyn)
            return self._compile(entry, args, sizes)
        if entry.broken is not None:
            return self._eager(entry.broken, args)
        cg = entry.by_size.get(sizes)
        if cg is not None:
            self.stats["hits"] += 1
            return self._run(cg, args)
        if self.policy.buckets and not self._needs_grad(args, entry):
            out = self._padded(entry, args)
            if out is not None:
                return out
        self.stats["size_specializations"] += 1
        cg = self._specialize(entry, _tensor_positions(args), sizes)
        if cg is None:
            return self._compile(entry, args, sizes)
        return self._run(cg, args)

    def _eager(self, brk: GraphBreak, args: tuple) -> Any:
        self.stats["eager_calls"] += 1
        warnings.warn(f"tl.compile: graph break ({brk.reason}); this call runs eagerly", UserWarning, stacklevel=3)
        return self.fn(*args)

    def _build(self, graph: Graph) -> CompiledGraph:
        cg, reasons = build(graph, self.backend, self.mode)
        if reasons and not self._warned_backend:
            self._warned_backend = True
            warnings.warn(
                f"tl.compile: backend {self.backend!r} unavailable ({reasons[0]}); fused kernels run on numpy",
                UserWarning,
                stacklevel=4,
            )
        return cg

    def _compile(self, entry: _Entry, args: tuple, sizes: tuple) -> Any:
        """Trace this call (the function runs exactly once: a break lets it finish eagerly) and build its graph."""
        params = module_params(self.module) if self.module is not None else None
        self.stats["traces"] += 1
        cap = capture(self.fn, args, params)
        brk = cap.broken
        if brk is None and self.validate:
            try:
                check_reproducible(self.fn, args, cap.graph, params)
            except GraphBreak as e:
                brk = e
        if brk is not None:
            self.stats["graph_breaks"] += 1
            self.stats["eager_calls"] += 1
            entry.broken = brk
            warnings.warn(
                f"tl.compile: graph break ({brk.reason}); the rest of this call ran eagerly, and so will later calls "
                "of this shape class",
                UserWarning,
                stacklevel=3,
            )
            return cap.out
        assert cap.graph is not None
        cg = self._build(cap.graph)
        entry.by_size[sizes] = cg
        if entry.template is None and entry.dyn:
            entry.template = cg
            entry.blocker = shapes.reuse_blocker(cap.graph)
            if entry.blocker is not None:
                entry.notes.append(f"new sizes re-trace: {entry.blocker}")
            if self.policy.buckets:
                entry.pad = entry.blocker or shapes.pad_analysis(cap.graph, entry.dyn)
                if isinstance(entry.pad, str):
                    entry.notes.append(f"no padding to buckets: {entry.pad}")
        elif entry.template is not None and not entry.confirmed and entry.blocker is None:
            diff = shapes.same_up_to_sizes(entry.template.graph, cap.graph)
            if diff is None:
                entry.confirmed = True
            else:
                entry.blocker = (
                    f"the trace at sizes {list(sizes)} differs from the first at {diff}: it depends on the size"
                )
                entry.notes.append(f"new sizes re-trace: {entry.blocker}")
        return cap.out  # the traced run is an eager run: its result (with its autograd graph) is this call's answer

    # -- dynamic sizes ----------------------------------------------------------------------------------------
    def _needs_grad(self, args: tuple, entry: _Entry) -> bool:
        if not _GradMode.enabled:
            return False
        params = entry.template.graph.params() if entry.template is not None else []
        return any(a.requires_grad for a in args if isinstance(a, Tensor)) or any(p.value.requires_grad for p in params)

    def _specialize(self, entry: _Entry, positions: list[int], sizes: tuple) -> CompiledGraph | None:
        """The template graph re-specialised to ``sizes`` (no trace), or None when it must be traced."""
        if self.policy.mode == "retrace" or entry.template is None:
            return None
        if entry.blocker is not None or not entry.confirmed:
            return None  # not confirmed yet: this size traces (and confirms or refuses reuse)
        shp = dict(zip(positions, sizes))
        try:
            graph = shapes.respecialize(entry.template.graph, shp)
        except ValueError as e:
            entry.notes.append(f"sizes {list(sizes)} re-trace: {e}")
            return None
        cg = entry.by_size[sizes] = self._build(graph)
        self.stats["reuses"] += 1
        return cg

    def _padded(self, entry: _Entry, args: tuple) -> Any:
        """Pad the dynamic dims up to their buckets, run the bucket's graph, slice; None when padding is refused."""
        if not isinstance(entry.pad, shapes.PadPlan) or not entry.confirmed:
            return None
        arrays, orig = list(args), {}
        for i, dims in entry.dyn.items():
            a = args[i]
            widths = [(0, 0)] * a.ndim
            for d in dims:
                orig[(i, d)] = a.shape[d]
                widths[d] = (0, self.policy.bucket((i, d), a.shape[d]) - a.shape[d])
            arrays[i] = Tensor._make(np.pad(a.data, widths), False, None, 0) if any(w for _, w in widths) else a
        psizes = tuple(tuple(a.shape) for a in arrays if isinstance(a, Tensor))
        cg = entry.by_size.get(psizes)
        if cg is None:
            self.stats["size_specializations"] += 1
            cg = self._specialize(entry, _tensor_positions(args), psizes)
            if cg is None:
                return None
        else:
            self.stats["hits"] += 1
        self.stats["padded_calls"] += 1
        real = sum(int(np.prod(a.shape)) for a in args if isinstance(a, Tensor))
        self.stats["real_elements"] += real
        self.stats["pad_elements"] += sum(int(np.prod(a.shape)) for a in arrays if isinstance(a, Tensor)) - real
        with np.errstate(all="ignore"):  # padded rows may overflow or divide by zero: they are sliced off
            out = self._run(cg, tuple(arrays))
        outs = [out] if cg.graph.out_struct == "single" else list(out)
        sliced = []
        for o, axes in zip(outs, entry.pad.out_axes):
            idx = tuple(slice(0, orig[axes[d]]) if d in axes else slice(None) for d in range(o.ndim))
            sliced.append(Tensor._make(np.ascontiguousarray(o.data[idx]), False, None, 0) if axes else o)
        if cg.graph.out_struct == "single":
            return sliced[0]
        return list(sliced) if cg.graph.out_struct == "list" else tuple(sliced)

    def prefetch(self) -> int:
        """Build the graph (and kernels) for the predicted next sizes of the last call's shape class, before the
        call that needs them (synchronously). Returns how many graphs were built (0: predicted sizes are built, no
        prediction, or the graph cannot be re-specialised)."""
        if self._last is None:
            return 0
        key, positions, sizes = self._last
        entry = self.cache.get(key)
        if entry is None or entry.broken is not None or entry.template is None:
            return 0
        new = list(sizes)
        pos = {i: k for k, i in enumerate(positions)}
        for (i, d), n in self._predicted.items():
            if i in entry.dyn and d in entry.dyn[i]:
                s = list(new[pos[i]])
                s[d] = n
                new[pos[i]] = tuple(s)
        target = tuple(new)
        if target in entry.by_size:
            return 0
        cg = self._specialize(entry, positions, target)
        if cg is None:
            return 0
        self.stats["prefetched"] += 1
        return 1

    def _run(self, cg: CompiledGraph, args: tuple) -> Any:
        g = cg.train_graph
        tensors = [a for a in args if isinstance(a, Tensor)]
        params = [p.value for p in g.params()]
        if _GradMode.enabled and any(t.requires_grad for t in (*tensors, *params)):
            outs = grad_call(cg, args, params, _backend_fn, self.backend, self.mode)  # joint program (or replay)
        else:
            arrays = [a.data if isinstance(a, Tensor) else a for a in args]
            outs = tuple(Tensor._make(o, False, None, 0) for o in cg.program.run(arrays))
        if g.out_struct == "single":
            return outs[0]
        return list(outs) if g.out_struct == "list" else tuple(outs)

    # -- introspection ----------------------------------------------------------------------------------------
    def graphs(self) -> list[CompiledGraph]:
        return [cg for e in self.cache.values() for cg in e.by_size.values()]

    def explain(self) -> str:
        parts = []
        for cg in self.graphs():
            parts += [str(r) for r in cg.reports] + [cg.plan.explain()]
        for e in self.cache.values():
            if e.broken is not None:
                parts.append(f"graph break: {e.broken.reason}")
            parts += e.notes
        if self.policy.history:
            parts.append(f"dynamic sizes ({self.policy.mode}):\n" + self.policy.report())
        if self.graphs():
            parts.append(self.kernel_summary())
        joint = explain_joint(self)
        if not joint.startswith("(no call"):
            parts.append(joint)
        return "\n".join(parts)

    def kernel_summary(self) -> str:
        """Fused kernels in every compiled graph vs distinct kernel patterns (what the kernel cache compiles)."""
        ks = [k for cg in self.graphs() for k in cg.kernels()]
        sizes = {kernel_key(k) for k in ks}
        return (
            f"kernels: {len(ks)} fused kernels, {len({pattern_hash(k) for k in ks})} distinct patterns, "
            f"{len(sizes)} distinct (pattern, sizes)"
        )


def compile(  # noqa: A001  (torch.compile's name)
    fn: Callable[..., Any] | Module,
    *,
    backend: str = "cpp",
    mode: str = "default",
    validate: bool = True,
    dynamic: str | shapes.ShapePolicy = "reuse",
) -> CompiledFunction:
    """Compile ``fn`` (a function of Tensors, or an ``nn.Module`` whose parameters become graph inputs).

    backend: where fused kernels run ("cpp", "numpy", "triton"); mode: "default" or "max-fusion" (recompute
    producers into every consumer kernel); validate: trace twice to refuse graphs that depend on values read
    outside tinylearn ops (see trace.check_reproducible); dynamic: how new sizes of ``mark_dynamic`` dims are
    served: "reuse" (re-specialise the traced graph when safe), "retrace", "pow2" / "learned" (pad to shared
    buckets where exact) or a ``shapes.ShapePolicy`` (see shapes.py)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if not callable(fn):
        raise TypeError(f"fn: expected a callable or an nn.Module, got {type(fn).__name__}")
    return CompiledFunction(fn, backend, mode, validate, shapes.as_policy(dynamic))


def show_code(compiled: CompiledFunction, file: Any = None) -> str:
    """Print (and return) the source of every kernel: generated C++/Triton where built, else the IR listing."""
    if not isinstance(compiled, CompiledFunction):
        raise TypeError(f"compiled: expected what tl.compile returns, got {type(compiled).__name__}")
    parts = []
    for cg in compiled.graphs():
        for step in cg.program.steps:
            if isinstance(step, KernelStep):
                src = getattr(step.fn, "source", None)
                parts.append(f"// {step.backend}: {step.kernel.name}\n" + (src or kernel_listing(step.kernel)))
            elif isinstance(step, ExternStep):
                parts.append(f"# extern {step.node.op}: %{step.node.name}")
    text = "\n".join(parts) if parts else "(nothing compiled yet: call the compiled function first)"
    print(text, file=file)
    return text
