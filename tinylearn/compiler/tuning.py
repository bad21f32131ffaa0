"""The search space ``compiler.schedule`` (topic 17): the schedule knobs of topic 12's loop nests for one generated
C++ kernel, bias + GELU over rows (``y = gelu(x + b)``, erf form, b broadcast along the rows).

The algorithm is fixed (a ``FusedKernel`` built here in ``kernel_ir``, the same IR ``tl.compile``'s fusion
produces); a configuration is a *schedule* of its lowered loop nest (``loops.lower``: two loops, ``i0`` over rows
and ``i1`` over columns, kept apart by the broadcast bias), applied in this order:

    tile      split i1 into i1_o (step tile) and i1 (1 = no split)
    order     "rows": rows outermost (row-major traversal); "cols": the column loop (or the column tile i1_o)
              moved outside i0 (``reorder``): with a tile, a column strip of every row before the next strip
    parallel  ``#pragma omp parallel for`` on the outermost loop
    vectorize ``#pragma omp simd`` on the innermost loop
    unroll    ``#pragma GCC unroll`` on the innermost loop (1 = none); not together with vectorize (``loops``
              refuses both on one loop)

``build(cfg)`` returns ``fn(x, b) -> y``: the first call for an input shape lowers, schedules, emits and compiles
the kernel (``codegen_cpp.build`` through ``cc.load``'s disk and process caches), later calls run the library.
The reference is ``kernel_ir.evaluate`` (numpy). ``schedule_nest(nest, cfg)`` applies a configuration to a nest
(what ``variants`` and ``clustering`` read their static statistics from); the default is ``default_schedule``'s
choice (vectorise the innermost loop, parallelise the rows above ``PARALLEL_MIN_WORK``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import tunable
from .kernel_ir import Buffer, FusedKernel, Instr, evaluate
from .loops import PARALLEL_MIN_WORK, Loop, LoopNest, default_schedule, lower

OP = "compiler.schedule"
TILES = (1, 16, 64, 256, 1024)
UNROLLS = (1, 2, 4, 8)


def bias_gelu_kernel(rows: int, cols: int, dtype: str = "float32") -> FusedKernel:
    """y = 0.5 h (1 + erf(h / sqrt 2)), h = x + b: x [rows, cols], b [cols] (stride 0 over rows)."""
    for name, v in (("rows", rows), ("cols", cols)):
        if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
    rows, cols = int(rows), int(cols)
    shape = (rows, cols)
    body: list[Instr] = []

    def new(op: str, args: tuple[int, ...] = (), attr: Any = None) -> int:
        body.append(Instr(len(body), op, args, attr))
        return len(body) - 1

    h = new("add", (new("load", (), 0), new("load", (), 1)))
    inner = new("mul", (h, new("const", (), 1 / math.sqrt(2))))
    half = new("mul", (h, new("const", (), 0.5)))
    y = new("mul", (half, new("add", (new("const", (), 1.0), new("erf", (inner,))))))
    body.append(Instr(-1, "store", (y,), 0))
    ins = [Buffer("x", shape, dtype, (cols, 1)), Buffer("b", (cols,), dtype, (0, 1))]
    outs = [Buffer("y", shape, dtype, (cols, 1))]
    return FusedKernel(f"bias_gelu_{rows}x{cols}", shape, 0, ins, outs, body, dtype)


def _innermost_vars(nest: LoopNest) -> list[str]:
    return sorted({lp.var for lp in nest.loops() if not any(isinstance(n, Loop) for n in lp.body)})


def apply_schedule(nest: LoopNest, cfg: Mapping[str, Any]) -> LoopNest:
    """Apply a schedule configuration to any lowered nest, in the module docstring's order: ``tile`` splits every
    innermost loop, ``order="cols"`` (optional key) swaps the two loops of a perfect two-loop nest, ``parallel``
    threads the single outermost loop, ``vectorize`` / ``unroll`` mark every innermost loop. An illegal step (a
    reduction carried by the parallel loop, a nest that is not perfect) raises ValueError from ``loops``."""
    inner = _innermost_vars(nest)
    tile = int(cfg.get("tile", 1))
    if tile > 1:
        for var in inner:
            nest.tile(var, tile)
    top = [n for n in nest.body if isinstance(n, Loop)]
    if cfg.get("order", "rows") == "cols":
        if len(top) != 1 or len(top[0].body) != 1 or not isinstance(top[0].body[0], Loop):
            raise ValueError(f"order: 'cols' needs a perfect two-loop nest, kernel {nest.kernel.name!r} has none")
        nest.reorder(top[0].body[0].var, top[0].var)
        top = [n for n in nest.body if isinstance(n, Loop)]
    if cfg.get("parallel"):
        if len(top) != 1:
            raise ValueError(f"parallel: kernel {nest.kernel.name!r} has {len(top)} outermost loops, not one")
        nest.parallelize(top[0].var)
    for var in _innermost_vars(nest):  # after the reorder: the loop that is innermost now
        if cfg.get("vectorize"):
            nest.vectorize(var)
        if int(cfg.get("unroll", 1)) > 1:
            nest.unroll(var, int(cfg["unroll"]))
    return nest


def schedule_nest(nest: LoopNest, cfg: Mapping[str, Any]) -> LoopNest:
    """Apply configuration ``cfg`` to the lowered two-loop nest of ``bias_gelu_kernel`` (module docstring order)."""
    vars_ = {lp.var for lp in nest.loops()}
    if vars_ != {"i0", "i1"}:
        raise ValueError(f"nest: expected the two loops i0, i1 of a row-broadcast point-wise kernel, got {vars_}")
    return apply_schedule(nest, cfg)


def scheduled(shape: tunable.Shape, cfg: Mapping[str, Any]) -> LoopNest:
    """The kernel of ``shape`` lowered and scheduled by ``cfg`` (no compilation)."""
    return schedule_nest(lower(bias_gelu_kernel(int(shape["R"]), int(shape["C"]))), cfg)


def valid(cfg: Mapping[str, Any], shape: tunable.Shape) -> bool:
    if cfg["vectorize"] and cfg["unroll"] > 1:
        return False
    return cfg["tile"] == 1 or cfg["tile"] < int(shape["C"])  # a tile covering the row is the untiled loop


def default(shape: tunable.Shape) -> tunable.Config:
    work = int(shape["R"]) * int(shape["C"]) * len(bias_gelu_kernel(1, 1).body)
    return {
        "tile": 1,
        "order": "rows",
        "parallel": int(work >= PARALLEL_MIN_WORK and shape["R"] > 1),
        "vectorize": 1,
        "unroll": 1,
    }


def build(cfg: Mapping[str, Any]) -> Any:
    from . import codegen_cpp

    cfg = dict(cfg)
    compiled: dict[tuple[int, int], Any] = {}

    def fn(x: np.ndarray, b: np.ndarray) -> np.ndarray:
        key = (int(x.shape[0]), int(x.shape[1]))
        ck = compiled.get(key)
        if ck is None:
            kernel = bias_gelu_kernel(*key)
            ck = compiled[key] = codegen_cpp.build(kernel, lambda nest: schedule_nest(nest, cfg))
        return ck(x, b)[0]

    return fn


def shape_of(x: np.ndarray, b: np.ndarray) -> tunable.Shape:
    return {"R": int(x.shape[0]), "C": int(x.shape[1])}


def make_args(shape: tunable.Shape, rng: Any) -> tuple[tuple, dict]:
    r, c = int(shape["R"]), int(shape["C"])
    return (rng.standard_normal((r, c)).astype(np.float32), rng.standard_normal(c).astype(np.float32)), {}


def reference(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    return evaluate(bias_gelu_kernel(int(x.shape[0]), int(x.shape[1])), [x, b])[0]


SPACE = tunable.declare(
    tunable.Space(
        op=OP,
        params=(
            tunable.Param("tile", TILES),
            tunable.Param("order", ("rows", "cols")),
            tunable.Param("parallel", (0, 1)),
            tunable.Param("vectorize", (0, 1)),
            tunable.Param("unroll", UNROLLS),
        ),
        build=build,
        shape_of=shape_of,
        make_args=make_args,
        default=default,
        valid=valid,
        backend="cpp",
        reference=reference,
        description="loop schedule (tile, order, parallel, vectorize, unroll) of a generated bias+GELU C++ kernel",
    )
)


# ------------------------------------------------------------------------------- every fused kernel of tl.compile
# ``tl.compile``'s C++ code generator (kernel_cache) asks ``tuned_schedule(kernel)`` for each fused kernel. Every
# kernel *pattern* (kernel_cache.pattern_hash: the structure with sizes as symbols) gets its own space
# ``compiler.schedule.<hash>`` the first time tuning is on and the pattern is seen: the generic knobs of
# ``apply_schedule`` (tile, parallel, vectorize, unroll; no loop order), a shape {"d0": extent, ...} of the domain,
# inputs drawn uniformly from [0.5, 2) (inside the domain of log, sqrt, division), and ``kernel_ir.evaluate`` as
# the reference. The default configuration *is* ``default_schedule`` (built by it), so an untuned call and a
# default record run the same code. Kernels with a non-float input, or a domain size no input carries, are left
# to ``default_schedule`` (no space).
KERNEL_TILES = (1, 16, 64, 256)
KERNEL_UNROLLS = (1, 4)


class _Pattern:
    """The kernels of one pattern seen so far (by domain shape) and where each domain size sits in the inputs."""

    def __init__(self, op: str, binding: list[tuple[int, int]]) -> None:
        self.op, self.binding = op, binding
        self.kernels: dict[tuple[int, ...], FusedKernel] = {}
        self.space: tunable.Space | None = None
        self._valid: dict[tuple, bool] = {}
        self._built: dict[tuple, Any] = {}

    @staticmethod
    def shape_dict(dims: tuple[int, ...]) -> tunable.Shape:
        return {f"d{i}": int(n) for i, n in enumerate(dims)}

    def dims_of(self, shape: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(int(shape[f"d{i}"]) for i in range(len(self.binding)))

    def kernel(self, dims: tuple[int, ...]) -> FusedKernel:
        k = self.kernels.get(dims)
        if k is None:
            raise ValueError(f"shape: no kernel of {self.op} was compiled at {dims}; seen: {sorted(self.kernels)}")
        return k

    def shape_of(self, *arrays: np.ndarray) -> tunable.Shape:
        return self.shape_dict(tuple(int(np.shape(arrays[j])[a]) for j, a in self.binding))

    def make_args(self, shape: tunable.Shape, rng: Any) -> tuple[tuple, dict]:
        k = self.kernel(self.dims_of(shape))
        return tuple(rng.uniform(0.5, 2.0, b.shape).astype(b.dtype) for b in k.inputs), {}

    def default(self, shape: tunable.Shape) -> tunable.Config:
        nest = default_schedule(lower(self.kernel(self.dims_of(shape))))
        loops = nest.loops()
        return {
            "tile": 1,
            "parallel": int(any(lp.parallel for lp in loops)),
            "vectorize": int(any(lp.simd for lp in loops)),
            "unroll": 1,
        }

    def valid(self, cfg: Mapping[str, Any], shape: tunable.Shape) -> bool:
        dims = self.dims_of(shape)
        key = (tuple(sorted(cfg.items())), dims)
        if key not in self._valid:
            self._valid[key] = self._check(cfg, self.kernel(dims))
        return self._valid[key]

    @staticmethod
    def _check(cfg: Mapping[str, Any], kernel: FusedKernel) -> bool:
        if cfg["vectorize"] and cfg["unroll"] > 1:
            return False
        nest = lower(kernel)
        extents = {d.var: d.extent for d in nest.plan.dims}
        if cfg["tile"] > 1 and any(extents.get(v, 0) <= cfg["tile"] for v in _innermost_vars(nest)):
            return False  # a tile covering a loop is that loop untiled
        try:
            apply_schedule(nest, cfg)
        except ValueError:
            return False
        return True

    def build(self, cfg: Mapping[str, Any]) -> Any:
        from . import codegen_cpp

        cfg = dict(cfg)

        def fn(*arrays: np.ndarray) -> Any:
            dims = self.dims_of(self.shape_of(*arrays))
            key = (tuple(sorted(cfg.items())), dims)
            ck = self._built.get(key)
            if ck is None:
                kernel = self.kernel(dims)
                sched = None if cfg == self.default(self.shape_dict(dims)) else (lambda n: apply_schedule(n, cfg))
                ck = self._built[key] = codegen_cpp.build(kernel, sched)
            outs = ck(*arrays)
            return outs[0] if len(outs) == 1 else tuple(outs)

        return fn

    def reference(self, *arrays: np.ndarray) -> Any:
        outs = evaluate(self.kernel(self.dims_of(self.shape_of(*arrays))), list(arrays))
        return outs[0] if len(outs) == 1 else tuple(outs)


_PATTERNS: dict[str, _Pattern | None] = {}


def _binding(kernel: FusedKernel) -> list[tuple[int, int]] | None:
    if any(not np.issubdtype(np.dtype(b.dtype), np.floating) for b in kernel.inputs) or not kernel.inputs:
        return None
    out = []
    for n in kernel.shape:
        hit = next(((j, a) for j, b in enumerate(kernel.inputs) for a, m in enumerate(b.shape) if m == n), None)
        if hit is None:
            return None
        out.append(hit)
    return out


def kernel_space(kernel: FusedKernel, pattern: str) -> tunable.Space | None:
    """The schedule space of ``kernel``'s pattern (``pattern``: its ``kernel_cache.pattern_hash``; declared on first
    sight, see above), or None when the kernel cannot be tuned this way; ``kernel`` is registered as the pattern's
    kernel for its domain shape."""
    op = f"{OP}.{pattern}"
    if op not in _PATTERNS:
        binding = _binding(kernel)
        pat = _PATTERNS[op] = None if binding is None else _Pattern(op, binding)
        if pat is not None:
            pat.space = tunable.declare(
                tunable.Space(
                    op=op,
                    params=(
                        tunable.Param("tile", KERNEL_TILES),
                        tunable.Param("parallel", (0, 1)),
                        tunable.Param("vectorize", (0, 1)),
                        tunable.Param("unroll", KERNEL_UNROLLS),
                    ),
                    build=pat.build,
                    shape_of=pat.shape_of,
                    make_args=pat.make_args,
                    default=pat.default,
                    valid=pat.valid,
                    backend="cpp",
                    reference=pat.reference,
                    description=f"loop schedule of tl.compile's fused kernel pattern {op.rsplit('.', 1)[1]} "
                    f"({', '.join(sorted({i.op for i in kernel.body}))})",
                )
            )
    pat = _PATTERNS[op]
    if pat is None:
        return None
    pat.kernels[tuple(int(n) for n in kernel.shape)] = kernel
    return pat.space


def kernel_shape(kernel: FusedKernel) -> tunable.Shape:
    """The shape dict of ``kernel`` in its pattern's space: {"d0": extent, ...} of the domain."""
    return _Pattern.shape_dict(tuple(int(n) for n in kernel.shape))


def tuned_schedule(kernel: FusedKernel, pattern: str) -> Any:
    """A schedule function for ``codegen_cpp.build`` from the tuned record of ``kernel``'s pattern and shape class,
    or None (tuning off, no record, the record is the default, or the kernel has no space): the default schedule."""
    if not tunable.has_config_provider():
        return None
    space = kernel_space(kernel, pattern)
    if space is None:
        return None
    shape = kernel_shape(kernel)
    cfg = tunable.tuned_config(space, shape)
    if cfg is None or cfg == space.default(shape):
        return None
    return lambda nest: apply_schedule(nest, cfg)
