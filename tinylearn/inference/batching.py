"""Length-bucketed batch formation inside a synchronisation window (padding waste vs FIFO batching).

A padded batch of n sequences costs n * max(len) token slots; the slots beyond each sequence's own length are
padding. Requests are collected for one sync window (every ``window`` seconds the collected requests are
dispatched); inside a window, ``"fifo"`` cuts them into batches of ``max_batch`` in arrival order, ``"bucket"``
first groups them by length bucket (``ceil(len / bucket_width)``) -- equivalently reorders them by length -- and cuts
each bucket into batches, so sequences of similar length share a batch and padding shrinks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .._inputs import is_int, is_real


def form_batches(
    arrivals: Sequence[float],
    lengths: Sequence[int],
    max_batch: int,
    window: float,
    policy: str = "bucket",
    bucket_width: int = 16,
) -> list[list[int]]:
    """Indices of the requests in each batch, in dispatch order (window by window).

    ``arrivals`` (s, >= 0) and ``lengths`` (tokens, >= 1) describe the requests; a request arriving in
    [k * window, (k + 1) * window) is dispatched at the end of window k."""
    if policy not in ("fifo", "bucket"):
        raise ValueError(f"policy: expected 'fifo' or 'bucket', got {policy!r}")
    if not is_int(max_batch) or max_batch < 1:
        raise ValueError(f"max_batch: must be an int >= 1, got {max_batch!r}")
    real = is_real(window)
    if not (real and math.isfinite(window) and window > 0):
        raise ValueError(f"window: must be a finite number > 0, got {window!r}")
    if not is_int(bucket_width) or bucket_width < 1:
        raise ValueError(f"bucket_width: must be an int >= 1, got {bucket_width!r}")
    max_batch, window, bucket_width = int(max_batch), float(window), int(bucket_width)
    if len(arrivals) != len(lengths):
        raise ValueError(f"lengths: expected {len(arrivals)} entries (one per arrival), got {len(lengths)}")
    for i, (a, n) in enumerate(zip(arrivals, lengths, strict=True)):
        if not (math.isfinite(a) and a >= 0):
            raise ValueError(f"arrivals[{i}]: must be finite and >= 0, got {a!r}")
        if int(n) != n or n < 1:
            raise ValueError(f"lengths[{i}]: must be an int >= 1, got {n!r}")
    windows: dict[int, list[int]] = {}
    for i in sorted(range(len(arrivals)), key=lambda i: (arrivals[i], i)):
        windows.setdefault(int(arrivals[i] // window), []).append(i)
    batches: list[list[int]] = []
    for w in sorted(windows):
        ids = windows[w]
        if policy == "fifo":
            groups = [ids]
        else:
            by_bucket: dict[int, list[int]] = {}
            for i in ids:
                by_bucket.setdefault(-(-int(lengths[i]) // bucket_width), []).append(i)
            groups = [sorted(by_bucket[b], key=lambda i: (lengths[i], arrivals[i], i)) for b in sorted(by_bucket)]
        for g in groups:
            batches.extend(g[j : j + max_batch] for j in range(0, len(g), max_batch))
    return batches


def padding_stats(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Token slots of padded ``batches`` (each: n * max length), real tokens, padding and its fraction."""
    if not batches or any(len(b) == 0 for b in batches):
        raise ValueError(f"batches: need a non-empty list of non-empty batches, got {batches!r}")
    seen = [i for b in batches for i in b]
    if len(set(seen)) != len(seen) or not all(0 <= i < len(lengths) for i in seen):
        raise ValueError("batches: every index must name a distinct request of lengths")
    slots = sum(len(b) * max(int(lengths[i]) for i in b) for b in batches)
    real = sum(int(lengths[i]) for i in seen)
    return dict(batches=len(batches), slots=slots, real_tokens=real, padding=slots - real, waste=(slots - real) / slots)
