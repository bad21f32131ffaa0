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
from .loops import PARALLEL_MIN_WORK, LoopNest, lower

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


def _innermost(nest: LoopNest) -> str:
    loop = nest.body[0]
    while loop.body and hasattr(loop.body[0], "var"):
        loop = loop.body[0]
    return loop.var


def schedule_nest(nest: LoopNest, cfg: Mapping[str, Any]) -> LoopNest:
    """Apply configuration ``cfg`` to the lowered two-loop nest of ``bias_gelu_kernel`` (module docstring order)."""
    vars_ = {lp.var for lp in nest.loops()}
    if vars_ != {"i0", "i1"}:
        raise ValueError(f"nest: expected the two loops i0, i1 of a row-broadcast point-wise kernel, got {vars_}")
    tile = int(cfg["tile"])
    if tile > 1:
        nest.tile("i1", tile)
    if cfg["order"] == "cols":
        nest.reorder("i1_o" if tile > 1 else "i1", "i0")
    if cfg["parallel"]:
        nest.parallelize(nest.body[0].var)
    inner = _innermost(nest)
    if cfg["vectorize"]:
        nest.vectorize(inner)
    if int(cfg["unroll"]) > 1:
        nest.unroll(inner, int(cfg["unroll"]))
    return nest


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
