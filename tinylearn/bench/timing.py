"""measure(fn): wall-clock timing with warm-up; the statistic reported everywhere is the median.

Each repeat times one call with time.perf_counter(); calls faster than ``min_call_s`` are batched
(``inner`` calls per sample) so that timer resolution does not dominate. Optional peak memory: traced
Python allocations (tracemalloc, numpy included) of one extra call.
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field

from .._inputs import as_int


@dataclass
class Timing:
    """Seconds per call: median/min/max over ``times`` (each a per-call average over ``inner`` calls)."""

    median: float
    min: float
    max: float
    times: list[float] = field(default_factory=list)
    inner: int = 1
    peak_bytes: int | None = None

    @property
    def median_ms(self) -> float:
        return self.median * 1e3


def measure(
    fn: Callable[[], object],
    warmup: int = 2,
    repeat: int = 10,
    min_call_s: float = 2e-4,
    memory: bool = False,
    warmup_s: float = 0.02,
) -> Timing:
    """Time ``fn()`` (no arguments): ``warmup`` untimed calls (more, until ``warmup_s`` seconds have passed), then
    ``repeat`` timed samples.

    The time-based warm-up puts a fast kernel in its steady state before it is timed: the first calls of a ~100 us
    kernel can pay first-touch page faults of fresh output buffers (glibc serves large blocks with mmap until its
    dynamic mmap threshold has risen) and wake sleeping OpenMP workers. Two calls were not enough: on a 2-core AVX2
    EPYC (Zen 2), 1M-element int8 quantize / dequantize at 2 threads timed 1.10-1.34x torch with two warm-up calls
    per row, and 0.65-0.79x after 20 ms of warm-up (torch's rows, timed after ours, had run on a warmed heap).

    ``memory=True`` also records the peak traced allocation of one more call (tracemalloc; sees numpy and
    Python allocations, not torch's C++ allocator).
    """
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    warmup, repeat = as_int(warmup, "warmup", min=0), as_int(repeat, "repeat", min=1)
    start = time.perf_counter()
    done = 0
    while done < warmup or (done > 0 and time.perf_counter() - start < warmup_s):
        fn()
        done += 1
    t0 = time.perf_counter()
    fn()
    once = time.perf_counter() - t0
    inner = 1 if once >= min_call_s else min(1000, max(1, int(min_call_s / max(once, 1e-9))))
    gc_was = gc.isenabled()
    gc.disable()
    try:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - t0) / inner)
    finally:
        if gc_was:
            gc.enable()
    peak = None
    if memory:
        tracemalloc.start()
        try:
            fn()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    return Timing(statistics.median(times), min(times), max(times), times, inner, peak)
