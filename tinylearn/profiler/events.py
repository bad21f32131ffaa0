"""The profiler's event record: one timed call (an autograd forward/backward, a backend dispatch, a user range).

Times are ``time.perf_counter_ns`` stamps. ``parent`` is the id of the enclosing event on the same thread (a
dispatch inside a Function's forward is its child), ``children_ns`` the summed duration of the direct children, so
self time = duration - children (torch.profiler's "Self CPU"). FLOPs/bytes are filled from ``flops.op_cost`` when
the profile closes (so the cost model does not run inside the timed region).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Shape = tuple[int, ...]


@dataclass
class Event:
    id: int
    name: str
    kind: str  # "forward" | "backward" | "dispatch" | "user"
    start_ns: int
    end_ns: int = 0
    tid: int = 0
    parent: int | None = None
    depth: int = 0
    shapes: tuple[Shape, ...] = ()
    dtypes: tuple[str, ...] = ()
    out_shapes: tuple[Shape, ...] = ()
    out_dtypes: tuple[str, ...] = ()
    backend: str | None = None
    version: str | None = None
    children_ns: int = 0
    flops: int | None = None
    bytes: int | None = None
    mem_base: int | None = None
    mem_peak: int | None = None  # bytes allocated above the op's starting point (tracemalloc), memory=True only
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def self_ns(self) -> int:
        return max(0, self.duration_ns - self.children_ns)

    @property
    def gflops(self) -> float | None:
        """Achieved GFLOP/s over the event's self time (None without a FLOP count or time)."""
        if self.flops is None or self.self_ns <= 0:
            return None
        return self.flops / self.self_ns

    @property
    def intensity(self) -> float | None:
        """Arithmetic intensity, FLOP per byte moved."""
        if self.flops is None or not self.bytes:
            return None
        return self.flops / self.bytes


def arrays_meta(values: Any) -> tuple[tuple[Shape, ...], tuple[Any, ...]]:
    """Shapes and dtypes of the array-like values (anything with ``shape`` and ``dtype``); others are skipped.

    Runs inside the timed region, so it keeps numpy's own objects (a dtype's ``str`` is slow Python code): the
    recorder turns dtypes into strings when the profile closes."""
    shapes, dtypes = [], []
    for v in values:
        if type(v) is np.ndarray:
            shapes.append(v.shape)
            dtypes.append(v.dtype)
            continue
        sh = getattr(v, "shape", None)
        dt = getattr(v, "dtype", None)
        if sh is not None and dt is not None and not isinstance(v, type):
            shapes.append(tuple(int(s) for s in sh))
            dtypes.append(dt)
    return tuple(shapes), tuple(dtypes)
