"""Tuning ``tl.compile``'s generated kernels: one schedule search per fused-kernel pattern and shape class.

``tl.compile`` fuses a traced graph into kernels and generates C++ for each with ``default_schedule`` (vectorise the
innermost loops, thread the outermost one above a work threshold). ``tune_compiled(compiled)`` takes a compiled
function that has run once, finds its distinct C++ kernels (by pattern hash and shape class, so the 12 identical
LayerNorm kernels of a transformer stack are searched once), and searches each kernel's schedule space
(``compiler.tuning.kernel_space``: tile x parallel x vectorize x unroll, every candidate checked against the IR's
numpy evaluation before it is timed) with the usual searchers, storing the records. A later ``tl.compile`` run with
tuning on (``TINYLEARN_TUNE=cached`` or ``with tuned("cached", db=...)``) generates each kernel with the stored
winner; the kernel cache keys compiled code by its source, so tuned and default versions never mix.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..compiler.api import CompiledFunction
from ..compiler.kernel_cache import pattern_hash
from ..compiler.tuning import kernel_shape, kernel_space
from .records import RecordDB
from .tuner import TuneResult, tune


def compiled_kernels(compiled: CompiledFunction) -> list[Any]:
    """The distinct fused kernels of ``compiled`` (one per pattern and shape class), named as the code generator
    names them (``k<pattern hash>``); a compiled function that was never called has none."""
    if not isinstance(compiled, CompiledFunction):
        raise TypeError(f"compiled: expected what tl.compile returns, got {type(compiled).__name__}")
    from .. import tunable

    seen: dict[tuple[str, str], Any] = {}
    for cg in compiled.graphs():
        for k in cg.kernels():
            ph = pattern_hash(k)
            named = dataclasses.replace(k, name=f"k{ph}")
            seen.setdefault((ph, tunable.class_of(kernel_shape(named))), named)
    return list(seen.values())


def tune_compiled(
    compiled: CompiledFunction,
    *,
    searcher: str = "grid",
    budget: int = 16,
    db: RecordDB | None = None,
    repeat: int = 7,
    seed: int = 0,
) -> list[TuneResult]:
    """Search the loop schedule of every distinct C++ kernel of ``compiled`` (see the module docstring); returns
    one ``TuneResult`` per tuned kernel (kernels with a non-float input have no space and are skipped)."""
    if not isinstance(compiled, CompiledFunction):
        raise TypeError(f"compiled: expected what tl.compile returns, got {type(compiled).__name__}")
    if compiled.backend != "cpp":
        raise ValueError(f"compiled: schedules are tuned for the cpp backend, this function uses {compiled.backend!r}")
    kernels = compiled_kernels(compiled)
    if not kernels:
        raise ValueError("compiled: no kernel compiled yet; call the compiled function once first")
    out = []
    for k in kernels:
        space = kernel_space(k, pattern_hash(k))
        if space is None:
            continue
        out.append(tune(space.op, kernel_shape(k), searcher=searcher, budget=budget, db=db, repeat=repeat, seed=seed))
    return out
