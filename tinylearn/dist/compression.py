"""Gradient compression with error feedback, reduced correctly: every rank's payload is all-gathered and
decompressed with *its own* indices/scale before summing.

Error feedback (Seide et al. 2014, Karimireddy et al. 2019): v = g + e;  send C(v);  e <- v - D(C(v)).
Whatever compression drops this step is added back the next, so the sum of applied updates tracks the sum of
true gradients and SGD still converges.

* ``TopK(ratio)``: keep the k = ceil(ratio * n) entries of largest |v|; payload (int32 indices, values).
  Sparse payloads of different ranks have different indices, so they cannot be summed element-wise by an
  all-reduce: they are all-gathered and scattered into a dense sum.
* ``Int8(stochastic=True)``: QSGD-style q = round(v / s) with s = max|v| / 127 (stochastic rounding is unbiased:
  E[q s] = v); payload (int8 codes, fp32 scale). Codes of different ranks have different scales, so summing
  codes (what a naive int8 all-reduce does) is wrong; each rank's codes are dequantised with its own scale.

Bytes a rank sends for a ring all-gather of payload P: (p-1) * |P|; a dense fp32 ring all-reduce: 2(p-1)/p * 4n.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .collectives import all_gather


class TopK:
    """Top-k sparsification: payload = (indices int32, values)."""

    name = "topk"

    def __init__(self, ratio: float = 0.01) -> None:
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio: expected 0 < ratio <= 1, got {ratio}")
        self.ratio = ratio

    def k(self, n: int) -> int:
        return min(n, max(1, math.ceil(self.ratio * n))) if n else 0

    def compress(self, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flat = v.reshape(-1)
        idx = torch.topk(flat.abs(), self.k(flat.numel()), sorted=False).indices
        return idx.to(torch.int32), flat[idx].clone()

    def decompress(self, payload: tuple[torch.Tensor, ...], numel: int, dtype: torch.dtype) -> torch.Tensor:
        idx, vals = payload
        out = torch.zeros(numel, dtype=dtype)
        out.index_add_(0, idx.long(), vals.to(dtype))
        return out

    def payload_bytes(self, numel: int, itemsize: int = 4) -> int:
        return self.k(numel) * (4 + itemsize)


class Int8:
    """QSGD-style 8-bit quantisation with one fp32 scale per tensor; payload = (int8 codes, scale[1])."""

    name = "int8"

    def __init__(self, stochastic: bool = True, seed: int = 0) -> None:
        self.stochastic = stochastic
        self.gen = torch.Generator().manual_seed(seed)

    def compress(self, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flat = v.reshape(-1).float()
        amax = float(flat.abs().max()) if flat.numel() else 0.0
        scale = amax / 127.0 if amax > 0 else 1.0
        x = flat / scale
        if self.stochastic:
            x = torch.floor(x + torch.rand(x.shape, generator=self.gen))
        else:
            x = torch.round(x)
        q = x.clamp_(-127, 127).to(torch.int8)
        return q, torch.tensor([scale], dtype=torch.float32)

    def decompress(self, payload: tuple[torch.Tensor, ...], numel: int, dtype: torch.dtype) -> torch.Tensor:
        q, scale = payload
        return (q.float() * scale).to(dtype)

    def payload_bytes(self, numel: int, itemsize: int = 4) -> int:
        return numel + 4


def error_feedback_step(
    compressor: Any, grad: torch.Tensor, residual: torch.Tensor
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]:
    """v = grad + residual; payload = C(v); new residual = v - D(payload). Returns (payload, D(payload), residual)."""
    v = grad.reshape(-1) + residual.reshape(-1)
    payload = compressor.compress(v)
    local = compressor.decompress(payload, v.numel(), v.dtype)
    return payload, local, (v - local).view(residual.shape)


def topk_error_feedback(
    grad: torch.Tensor, residual: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One top-k error-feedback step on flat tensors: (indices of the k largest |grad + residual|, their values,
    new residual with those entries zeroed)."""
    v = grad.reshape(-1) + residual.reshape(-1)
    idx = torch.topk(v.abs(), k, sorted=False).indices
    vals = v[idx].clone()
    new = v.clone()
    new[idx] = 0
    return idx, vals, new


def compressed_all_reduce(
    tensor: torch.Tensor, compressor: Any, residual: torch.Tensor | None = None, op: str = "sum", group: Any = None
) -> int:
    """Sum (or average, op="avg") of the compressed tensors of all ranks, in place; returns bytes this rank sent.

    With ``residual`` (same shape, updated in place) error feedback is applied. Each payload piece is all-gathered
    (ring) and every rank decompresses every payload with its own metadata, summing in rank order, so all ranks
    get bitwise-identical results.
    """
    if op not in ("sum", "avg"):
        raise ValueError(f"op: compressed all-reduce supports 'sum' or 'avg', got {op!r}")
    if not tensor.dtype.is_floating_point:
        raise TypeError(f"tensor: expected a floating-point tensor, got {tensor.dtype}")
    p = dist.get_world_size(group) if dist.is_initialized() else 1
    n = tensor.numel()
    if residual is None:
        payload = compressor.compress(tensor.reshape(-1))
    else:
        payload, _, new_res = error_feedback_step(compressor, tensor, residual)
        residual.copy_(new_res)
    total = torch.zeros(n, dtype=tensor.dtype)
    sent = 0
    if p == 1:
        total += compressor.decompress(payload, n, tensor.dtype)
    else:
        gathered = []
        for piece in payload:
            out = torch.empty(p * piece.numel(), dtype=piece.dtype)
            all_gather(out, piece.contiguous(), group=group)
            gathered.append(out.view(p, *piece.shape))
            sent += (p - 1) * piece.numel() * piece.element_size()
        for r in range(p):
            total += compressor.decompress(tuple(g[r] for g in gathered), n, tensor.dtype)
    if op == "avg":
        total /= p
    tensor.copy_(total.view(tensor.shape))
    return sent


def dense_ring_bytes(numel: int, world_size: int, itemsize: int = 4) -> float:
    """Bytes one rank sends in a ring all-reduce of ``numel`` elements: 2(p-1)/p * n * itemsize."""
    return 2 * (world_size - 1) / world_size * numel * itemsize if world_size > 1 else 0.0


class TwoBit:
    """2-bit (ternary) quantisation: codes in {-1, 0, +1} times one fp32 scale s = max|v| (round to the nearest
    level, half to even: |v| > s/2 -> +-s), packed 4 codes per byte; payload = (uint8 packed codes, scale[1])."""

    name = "2bit"

    def compress(self, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flat = v.reshape(-1).float()
        n = flat.numel()
        amax = float(flat.abs().max()) if n else 0.0
        scale = amax if amax > 0 else 1.0
        codes = torch.round(flat / scale).clamp_(-1, 1).to(torch.int64) + 1  # {0, 1, 2}
        pad = (-n) % 4
        c = torch.cat([codes, torch.ones(pad, dtype=torch.int64)]).view(-1, 4)
        packed = (c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)).to(torch.uint8)
        return packed, torch.tensor([scale], dtype=torch.float32)

    def decompress(self, payload: tuple[torch.Tensor, ...], numel: int, dtype: torch.dtype) -> torch.Tensor:
        packed, scale = payload
        p = packed.to(torch.int64)
        c = torch.stack([p & 3, (p >> 2) & 3, (p >> 4) & 3, (p >> 6) & 3], dim=1).reshape(-1)[:numel]
        return ((c - 1).float() * scale).to(dtype)

    def payload_bytes(self, numel: int, itemsize: int = 4) -> int:
        return -(-numel // 4) + 4


class ClippedLowBit:
    """2- or 3-bit quantisation with an adaptive clipping threshold instead of the max: scale s = k * rms(v) (it
    follows the current scale of v), L = 2^(bits-1) - 1 levels per side, code q = clamp(round(v / s * L), -L, L),
    value q * s / L. Entries beyond s are clipped to +-s; with error feedback the clipped excess stays in the residual
    and is sent over the following steps (at most s per step), so outliers no longer set a huge scale that rounds
    every other entry to 0. Codes are bit-packed (``bits`` bits each); payload = (uint8 packed codes, scale[1])."""

    def __init__(self, bits: int = 2, k: float = 1.0) -> None:
        if bits not in (2, 3):
            raise ValueError(f"bits: expected 2 or 3, got {bits!r}")
        if not (math.isfinite(k) and k > 0):
            raise ValueError(f"k: expected a finite value > 0, got {k}")
        self.bits, self.k, self.levels = bits, k, 2 ** (bits - 1) - 1
        self.name = f"clip{bits}bit"

    def compress(self, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flat = v.reshape(-1).float()
        rms = float(flat.pow(2).mean().sqrt()) if flat.numel() else 0.0
        scale = self.k * rms if rms > 0 else 1.0
        u = (torch.round(flat / scale * self.levels).clamp_(-self.levels, self.levels) + self.levels).to(torch.uint8)
        planes = (u.numpy()[:, None] >> np.arange(self.bits, dtype=np.uint8)) & 1
        return torch.from_numpy(np.packbits(planes.reshape(-1))), torch.tensor([scale], dtype=torch.float32)

    def decompress(self, payload: tuple[torch.Tensor, ...], numel: int, dtype: torch.dtype) -> torch.Tensor:
        packed, scale = payload
        planes = np.unpackbits(packed.numpy())[: numel * self.bits].reshape(numel, self.bits).astype(np.int64)
        q = (planes << np.arange(self.bits)).sum(axis=1) - self.levels
        return (torch.from_numpy(q).float() * (scale / self.levels)).to(dtype)

    def payload_bytes(self, numel: int, itemsize: int = 4) -> int:
        return -(-numel * self.bits // 8) + 4
