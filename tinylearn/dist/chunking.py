"""Chunking a large all-reduce under changing bandwidth (a model, deterministic; notebook 06 §7b).

Gradients appear at a constant rate during backward; each chunk's all-reduce may start once the link is free and
its last byte exists, pays the latency ``alpha`` and then moves its bytes at the bandwidth of the moment.

    chunked_all_reduce(n, backward_s, alpha, bw_at, chunk_of) -> (time the last chunk is done, chunk sizes)
    adaptive_chunk(alpha, overhead=0.1) -> chunk_of: size each chunk to last ~alpha * (1 - f) / f at the
        exponentially averaged throughput of the finished chunks (f = latency share, 0.1 -> ~9 alpha per chunk)

``bw_at(t) -> (bytes per second, time the bandwidth changes next)`` describes the link (piecewise constant).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

BandwidthAt = Callable[[float], tuple[float, float]]
ChunkOf = Callable[[float | None], float]


def transfer_end(t: float, nbytes: float, bw_at: BandwidthAt) -> float:
    """When ``nbytes`` started at time ``t`` have crossed a link with piecewise-constant bandwidth ``bw_at``."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    while nbytes > 0:
        bw, until = bw_at(t)
        if not bw > 0 or not until > t:
            raise ValueError(f"bw_at({t}) returned bandwidth {bw} and change time {until}: need bw > 0 and until > t")
        if (until - t) * bw >= nbytes:
            return t + nbytes / bw
        nbytes -= (until - t) * bw
        t = until
    return t


def chunked_all_reduce(
    n: int, backward_s: float, alpha: float, bw_at: BandwidthAt, chunk_of: ChunkOf
) -> tuple[float, list[int]]:
    """Time (from the start of backward) when all ``n`` gradient bytes are reduced, and the chunk sizes used.

    ``chunk_of(estimate)`` gives the next chunk's size from the running throughput estimate (None before the first
    chunk finished); the estimate is the mean of the previous estimate and the last chunk's measured throughput."""
    if n <= 0 or backward_s <= 0 or alpha < 0:
        raise ValueError(f"need n > 0, backward_s > 0, alpha >= 0; got n={n}, backward_s={backward_s}, alpha={alpha}")
    rate, t, sent, est, sizes = n / backward_s, 0.0, 0, None, []
    while sent < n:
        c = int(min(chunk_of(est), n - sent))
        if c <= 0:
            raise ValueError(f"chunk_of({est}) gave a chunk of {c} bytes: chunks must be >= 1 byte")
        start = max(t, (sent + c) / rate)  # the link is free and the chunk's last byte exists
        end = transfer_end(start + alpha, c, bw_at)
        seen = c / (end - start - alpha)  # measured throughput of this chunk
        est = seen if est is None else 0.5 * est + 0.5 * seen
        t, sent = end, sent + c
        sizes.append(c)
    return max(t, backward_s), sizes


def adaptive_chunk(
    alpha: float, overhead: float = 0.1, first: int = 1 << 20, lo: int = 256 << 10, hi: int = 64 << 20
) -> ChunkOf:
    """chunk_of that keeps the latency share near ``overhead``: c = alpha * b_hat * (1 - f) / f, clipped to [lo, hi]
    (``first`` bytes before any throughput is known)."""
    if not 0 < overhead < 1:
        raise ValueError(f"overhead must be in (0, 1), got {overhead}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")

    def chunk_of(est: float | None) -> float:
        return first if est is None else int(np.clip(alpha * est * (1 - overhead) / overhead, lo, hi))

    return chunk_of
