"""Choosing a gradient codec (none / fp16 / int8 / top-k) from a running bandwidth estimate (notebook 06 §8a).

The time of one gradient exchange with codec c on p ranks is predicted as

    T_c = encode_c + decode_c + max(0, alpha + wire_bytes_c / b_hat - overlap)

(the communication that does not hide under ``overlap`` seconds of backward compute is exposed; encode / decode
run on the critical path), where ``b_hat`` is an exponential average of the throughput of the previous transfers.
Fast links hide even fp32 gradients, and then compression only costs (encode time and accuracy); as bandwidth
drops, fp16, int8 and top-k take turns as the fastest. Codecs whose payloads can be
summed on the way (fp32, fp16) use a ring all-reduce, 2(p-1)/p * payload bytes; int8 codes with a per-rank scale and
top-k indices cannot be summed, so they are all-gathered, (p-1) * payload bytes, and every rank decodes p payloads.
Codecs whose relative error exceeds ``max_error`` are not allowed. The selector moves off the current codec only when
another one is predicted to be faster by more than the ``hysteresis`` fraction, so noise in the bandwidth estimate
does not make it flap.

    costs = default_codecs(topk_ratio=0.01)
    sel = CodecSelector(costs, numel=25_000_000, world_size=2, max_error=1.0)
    name = sel.choose(); ...transfer...; sel.observe(nbytes, seconds)

``codec_rel_error(name, grad)`` measures ||g - D(C(g))|| / ||g|| of a codec on a gradient with the codecs of
``tinylearn.dist.compression``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .compression import Int8, TopK

__all__ = ["CodecCost", "CodecSelector", "codec_rel_error", "default_codecs", "simulate_selection"]


@dataclass(frozen=True)
class CodecCost:
    """Cost model of one codec: wire bytes per gradient element, whether payloads can be summed on the way (ring
    all-reduce) or must be all-gathered, encode / decode seconds per element, relative error ||g - D(C(g))|| / ||g||."""

    name: str
    bytes_per_elem: float
    summable: bool
    encode_s_per_elem: float = 0.0
    decode_s_per_elem: float = 0.0
    rel_error: float = 0.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError(f"name: expected a non-empty codec name, got {self.name!r}")
        for field in ("bytes_per_elem", "encode_s_per_elem", "decode_s_per_elem", "rel_error"):
            v = getattr(self, field)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{field}: expected a finite value >= 0, got {v}")
        if self.bytes_per_elem == 0:
            raise ValueError(f"bytes_per_elem: expected > 0, got {self.bytes_per_elem}")

    def wire_bytes(self, numel: int, world_size: int) -> float:
        """Bytes one rank sends: ring all-reduce 2(p-1)/p * payload if summable, else all-gather (p-1) * payload."""
        payload = self.bytes_per_elem * numel
        if world_size == 1:
            return 0.0
        return 2 * (world_size - 1) / world_size * payload if self.summable else (world_size - 1) * payload

    def predict(
        self, numel: int, world_size: int, bandwidth: float, alpha_s: float = 0.0, overlap_s: float = 0.0
    ) -> float:
        """Predicted exposed seconds: encode + decode (of p payloads when all-gathered) + the part of
        alpha + wire bytes / bandwidth that does not hide under ``overlap_s`` seconds of backward compute."""
        if not bandwidth > 0:
            raise ValueError(f"bandwidth: expected > 0 bytes/s, got {bandwidth}")
        if not overlap_s >= 0:
            raise ValueError(f"overlap_s: expected >= 0, got {overlap_s}")
        decodes = 1 if self.summable else world_size
        comm = alpha_s + self.wire_bytes(numel, world_size) / bandwidth
        return self.encode_s_per_elem * numel + decodes * self.decode_s_per_elem * numel + max(0.0, comm - overlap_s)


def default_codecs(
    topk_ratio: float = 0.01, hbm_bytes_per_s: float = 1e12, errors: dict[str, float] | None = None
) -> list[CodecCost]:
    """A model of the four codecs on an accelerator with memory bandwidth ``hbm_bytes_per_s``: encode / decode are
    memory-bound passes (fp16: read 4 + write 2 bytes per element; int8: amax pass + quantise pass, 4 + 4 + 1;
    top-k: a 4-pass radix select over 4-byte keys, 16 bytes, + gather; decode = read payload + write fp32).
    ``errors`` maps codec name -> relative error (default 0 for "none" and the fp16 / int8 rounding bounds, and
    sqrt(1 - ratio) for top-k, the error when all |g| are equal: measure real ones with ``codec_rel_error``)."""
    if not 0 < topk_ratio <= 1:
        raise ValueError(f"topk_ratio: expected 0 < ratio <= 1, got {topk_ratio}")
    if not hbm_bytes_per_s > 0:
        raise ValueError(f"hbm_bytes_per_s: expected > 0, got {hbm_bytes_per_s}")
    err = {"none": 0.0, "fp16": 2.0**-11, "int8": 1 / 254, "topk": math.sqrt(1 - topk_ratio)}
    if errors is not None:
        unknown = set(errors) - set(err)
        if unknown:
            raise ValueError(f"errors: unknown codec names {sorted(unknown)}; expected some of {sorted(err)}")
        err.update(errors)
    m = 1.0 / hbm_bytes_per_s
    topk_bytes = topk_ratio * 8  # int32 index + fp32 value per kept element
    return [
        CodecCost("none", 4.0, True, 0.0, 0.0, err["none"]),
        CodecCost("fp16", 2.0, True, 6 * m, 6 * m, err["fp16"]),
        CodecCost("int8", 1.0, False, 9 * m, 5 * m, err["int8"]),
        CodecCost("topk", topk_bytes, False, 20 * m, topk_bytes * m + topk_ratio * 4 * m, err["topk"]),
    ]


class CodecSelector:
    """Picks the predicted-fastest allowed codec from an exponentially averaged bandwidth estimate, with hysteresis.

    ``observe(nbytes, seconds)`` feeds one finished transfer (seconds on the wire, alpha excluded);
    ``choose()`` returns the codec name for the next exchange."""

    def __init__(
        self,
        codecs: Sequence[CodecCost],
        numel: int,
        world_size: int,
        alpha_s: float = 0.0,
        overlap_s: float = 0.0,
        max_error: float = math.inf,
        hysteresis: float = 0.2,
        smoothing: float = 0.5,
        initial_bandwidth: float = 1e9,
    ) -> None:
        if not codecs:
            raise ValueError("codecs: expected at least one CodecCost, got an empty sequence")
        names = [c.name for c in codecs]
        if len(set(names)) != len(names):
            raise ValueError(f"codecs: names must be unique, got {names}")
        if numel <= 0:
            raise ValueError(f"numel: expected > 0, got {numel}")
        if world_size < 1:
            raise ValueError(f"world_size: expected >= 1, got {world_size}")
        if not alpha_s >= 0:
            raise ValueError(f"alpha_s: expected >= 0, got {alpha_s}")
        if not overlap_s >= 0:
            raise ValueError(f"overlap_s: expected >= 0, got {overlap_s}")
        if not 0 <= hysteresis < 1:
            raise ValueError(f"hysteresis: expected 0 <= hysteresis < 1, got {hysteresis}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing: expected 0 < smoothing <= 1, got {smoothing}")
        if not initial_bandwidth > 0:
            raise ValueError(f"initial_bandwidth: expected > 0, got {initial_bandwidth}")
        self.allowed = [c for c in codecs if c.rel_error <= max_error]
        if not self.allowed:
            raise ValueError(
                f"max_error: no codec has rel_error <= {max_error} (errors {[c.rel_error for c in codecs]})"
            )
        self.numel, self.world_size, self.alpha_s, self.overlap_s = numel, world_size, alpha_s, overlap_s
        self.hysteresis, self.smoothing = hysteresis, smoothing
        self.bandwidth = float(initial_bandwidth)
        self.current: str | None = None
        self.switches = 0

    def predict(self, bandwidth: float | None = None) -> dict[str, float]:
        """Predicted seconds of every allowed codec at ``bandwidth`` (default: the running estimate)."""
        b = self.bandwidth if bandwidth is None else bandwidth
        return {c.name: c.predict(self.numel, self.world_size, b, self.alpha_s, self.overlap_s) for c in self.allowed}

    def wire_bytes(self, name: str) -> float:
        """Bytes one rank sends with codec ``name``."""
        for c in self.allowed:
            if c.name == name:
                return c.wire_bytes(self.numel, self.world_size)
        raise ValueError(f"name: {name!r} is not an allowed codec ({[c.name for c in self.allowed]})")

    def choose(self) -> str:
        """The codec for the next exchange: stay on the current one unless the fastest is better by > hysteresis."""
        pred = self.predict()
        best = min(pred, key=lambda k: (pred[k], k))
        if self.current is None:
            self.current = best
        elif best != self.current and pred[best] < (1 - self.hysteresis) * pred[self.current]:
            self.current = best
            self.switches += 1
        return self.current

    def observe(self, nbytes: float, seconds: float) -> float:
        """Update the bandwidth estimate with one transfer; returns the new estimate (bytes/s)."""
        if not nbytes > 0:
            raise ValueError(f"nbytes: expected > 0, got {nbytes}")
        if not seconds > 0:
            raise ValueError(f"seconds: expected > 0, got {seconds}")
        self.bandwidth = (1 - self.smoothing) * self.bandwidth + self.smoothing * (nbytes / seconds)
        return self.bandwidth


def simulate_selection(selector: CodecSelector, bandwidth_trace: Sequence[float]) -> dict[str, list]:
    """Run ``selector`` over a trace of true link bandwidths (one per step, bytes/s): each step it chooses a codec,
    the transfer takes wire_bytes / true bandwidth, and it observes that transfer. A model, deterministic.

    Returns lists per step: "codec", "estimate" (the bandwidth estimate the choice was made with), "time" (the
    codec's true step time: encode + alpha + bytes / true bandwidth + decode), "best" (the fastest allowed codec
    at the true bandwidth), "best_time"."""
    if len(bandwidth_trace) == 0:
        raise ValueError("bandwidth_trace: expected at least one step, got an empty trace")
    out: dict[str, list] = {"codec": [], "estimate": [], "time": [], "best": [], "best_time": []}
    for b in bandwidth_trace:
        if not b > 0:
            raise ValueError(f"bandwidth_trace: every bandwidth must be > 0, got {b}")
        out["estimate"].append(selector.bandwidth)
        name = selector.choose()
        true = selector.predict(b)
        best = min(true, key=lambda k: (true[k], k))
        out["codec"].append(name)
        out["time"].append(true[name])
        out["best"].append(best)
        out["best_time"].append(true[best])
        nbytes = selector.wire_bytes(name)
        if nbytes > 0:
            selector.observe(nbytes, nbytes / b)
    return out


def codec_rel_error(name: str, grad: torch.Tensor, topk_ratio: float = 0.01) -> float:
    """Measured ||g - D(C(g))|| / ||g|| of codec ``name`` ("none", "fp16", "int8" round-to-nearest, "topk")."""
    if name not in ("none", "fp16", "int8", "topk"):
        raise ValueError(f"name: expected one of 'none', 'fp16', 'int8', 'topk', got {name!r}")
    g = grad.reshape(-1).float()
    norm = float(g.norm())
    if g.numel() == 0 or norm == 0:
        raise ValueError(f"grad: expected a non-empty, non-zero gradient, got numel={g.numel()}, norm={norm}")
    if name == "none":
        d = g
    elif name == "fp16":
        d = g.half().float()
    else:
        codec = Int8(stochastic=False) if name == "int8" else TopK(topk_ratio)
        d = codec.decompress(codec.compress(g), g.numel(), torch.float32)
    return float((g - d).norm()) / norm
