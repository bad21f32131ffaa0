"""Chunk sizes per link level on a multi-hop path (NVLink -> PCIe -> Ethernet -> ...): notebook 06, Q192.

A deterministic store-and-forward model. A transfer of n bytes crosses hops h = 0..H-1, each with its own
latency alpha_h, time per byte beta_h and chunk size c_h. Hop h sends its chunk j (bytes up to b_j) once all
those bytes have arrived from hop h-1 and its previous chunk is done:

    end_j = max(ready_j, end_{j-1}) + alpha_h + (b_j - b_{j-1}) beta_h,   ready_j = when hop h-1 delivered b_j bytes

``fan_in`` models a Gather (or the cross-machine leg of an All-to-All) whose streams merge: hop h carries the
streams of ``fan_in`` identical children, so its bytes are fan_in times those arriving on each input.

    pipeline_time(nbytes, hops, chunks) -> seconds for the last byte to leave the last hop
    adaptive_chunks(nbytes, hops, overhead=0.1) -> per-hop chunk sizes from the alphas and betas:
        bottleneck hop b (largest beta per source byte): c_b = sqrt(n_b alpha_b / (beta'_up + beta'_down)),
            the balance of its per-chunk latencies (n_b / c_b) alpha_b against the pipeline fill and drain
            c_b beta' (beta' = slowest neighbour side, per bottleneck byte);
        every other hop: the smallest chunk with alpha_h <= overhead x its transfer time, rounded so that it
            divides c_b evenly (no partial chunks at the level boundary), never above c_b.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._inputs import is_int
from .cost_model import check_nonneg


@dataclass(frozen=True)
class Hop:
    """One link level: latency per message, seconds per byte, and how many identical streams merge into it."""

    name: str
    alpha_s: float
    beta_s_per_byte: float
    fan_in: int = 1

    def __post_init__(self) -> None:
        check_nonneg("alpha_s", self.alpha_s)
        if check_nonneg("beta_s_per_byte", self.beta_s_per_byte) == 0:
            raise ValueError(f"beta_s_per_byte: expected > 0, got {self.beta_s_per_byte}")
        if not is_int(self.fan_in) or self.fan_in < 1:
            raise ValueError(f"fan_in: expected an int >= 1, got {self.fan_in!r}")
        object.__setattr__(self, "fan_in", int(self.fan_in))  # np.int64(2) -> 2 (frozen dataclass)


def _check(nbytes: int, hops: Sequence[Hop]) -> None:
    if not is_int(nbytes) or nbytes < 1:
        raise ValueError(f"nbytes: expected an int >= 1, got {nbytes!r}")
    if len(hops) == 0 or not all(isinstance(h, Hop) for h in hops):
        raise ValueError(f"hops: expected a non-empty sequence of Hop, got {hops!r}")


def pipeline_time(nbytes: int, hops: Sequence[Hop], chunks: Sequence[int] | int) -> float:
    """Seconds until ``nbytes`` per source have crossed every hop with these chunk sizes (one int = all hops)."""
    _check(nbytes, hops)
    cs = [chunks] * len(hops) if is_int(chunks) else list(chunks)
    if len(cs) != len(hops):
        raise ValueError(f"chunks: expected {len(hops)} sizes (one per hop), got {len(cs)}")
    for c in cs:
        if not is_int(c) or c < 1:
            raise ValueError(f"chunks: expected ints >= 1, got {c!r}")
    n = int(nbytes)
    cum_prev = np.array([n], dtype=np.int64)  # the source holds everything at t = 0
    end_prev = np.array([0.0])
    for h, c in zip(hops, cs):
        n, cum_prev = n * h.fan_in, cum_prev * h.fan_in  # fan_in identical input streams, in parallel
        c = min(int(c), n)
        bnd = np.minimum(np.arange(1, -(-n // c) + 1, dtype=np.int64) * c, n)
        ready = end_prev[np.searchsorted(cum_prev, bnd, side="left")]
        dur = h.alpha_s + np.diff(bnd, prepend=0) * h.beta_s_per_byte
        s = np.cumsum(dur)  # end_j = s_j + max_{i<=j} (ready_i - s_{i-1})
        end_prev, cum_prev = s + np.maximum.accumulate(ready - (s - dur)), bnd
    return float(end_prev[-1])


def adaptive_chunks(nbytes: int, hops: Sequence[Hop], overhead: float = 0.1) -> list[int]:
    """Per-hop chunk sizes from each level's alpha and beta (see the module docstring)."""
    _check(nbytes, hops)
    if not (is_int(overhead) or isinstance(overhead, float)) or not 0 < overhead < 1:
        raise ValueError(f"overhead: expected a number in (0, 1), got {overhead!r}")
    fan = np.cumprod([h.fan_in for h in hops]).astype(float)  # bytes on hop h per source byte
    per_src = [h.beta_s_per_byte * f for h, f in zip(hops, fan)]
    b = int(np.argmax(per_src))
    n_b = int(nbytes) * int(fan[b])
    up = max((per_src[i] / fan[b] for i in range(b)), default=0.0)
    down = max((per_src[i] / fan[b] for i in range(b + 1, len(hops))), default=0.0)  # s per bottleneck byte
    c_b = n_b if len(hops) == 1 else min(n_b, max(1, int(math.sqrt(n_b * hops[b].alpha_s / (up + down)))))
    out = []
    for i, h in enumerate(hops):
        cap = max(1, c_b * int(fan[i]) // int(fan[b]))  # the bottleneck chunk, in this hop's bytes
        want = h.alpha_s * (1 - overhead) / (overhead * h.beta_s_per_byte)
        out.append(c_b if i == b else (-(-cap // max(1, math.floor(cap / want))) if want < cap else cap))
    return out
