"""The measurement conditions the kernel benchmark tables share: ``limited_threads`` (BLAS, OpenMP and torch
limited to n threads inside a block) and ``peak_rss_growth_mb`` (the growth of the peak resident set, VmHWM reset
through /proc/self/clear_refs, over one call: it sees numpy's and torch's allocators alike).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from .._threads import limited_threads as _limited_threads


def limited_threads(n: int | None) -> contextlib.AbstractContextManager[None]:
    """Limit BLAS and OpenMP (threadpoolctl: numpy's BLAS, tinylearn._C's OpenMP) and torch to ``n`` threads inside
    the block; ``None`` leaves everything as it is (``tinylearn._threads.limited_threads`` with torch)."""
    return _limited_threads(n, torch=True)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def peak_rss_growth_mb(fn: Callable[[], Any], tries: int = 3) -> float:
    """MB by which one ``fn()`` call raises the peak resident set above the resident set before it (min of
    ``tries``). Resets the peak with ``5 > /proc/self/clear_refs`` (Linux >= 4.0); raises RuntimeError elsewhere.
    Freed memory that the allocator keeps resident is reused without growth: run it in a process with a small,
    fixed mmap threshold (``attention_peak_rss`` does)."""
    import gc

    best = float("inf")
    for _ in range(tries):
        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError as e:
            raise RuntimeError(f"cannot reset the peak RSS (/proc/self/clear_refs: {e})") from e
        base = _status_kb("VmRSS")
        out = fn()
        best = min(best, (_status_kb("VmHWM") - base) / 1024)
        del out
    return max(best, 0.0)
