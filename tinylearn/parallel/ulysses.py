"""DeepSpeed-Ulysses sequence parallelism: trade the sequence split for a head split around local attention.

Each rank holds q, k, v [b, h, N/P, d] for its contiguous part of the sequence (rank r: positions
[r·N/P, (r+1)·N/P)). One all-to-all turns the sequence shards into head shards [b, h/P, N, d] (rank r gets heads
[r·h/P, (r+1)·h/P) for the whole sequence), every rank runs ordinary full attention on its heads, and the inverse
all-to-all brings the output back to sequence shards. The backward of an all-to-all is the inverse all-to-all
(``_SeqToHeads`` / ``_HeadsToSeq`` are each other's adjoints), and local attention is torch SDPA with its own
autograd. q, k and v travel in one stacked message.

Bytes per rank: an all-to-all keeps 1/P of its input and sends (P-1)/P of it, so one forward sends
(P-1)/P·(3 + 1)·b·h·(N/P)·d elements (q, k, v out, output back) and the backward the same (dO out; dq, dk, dv
back) — ``ulysses_bytes``. Unlike ring attention the volume per rank falls with P (the all-to-all moves 1/P of
the sequence per link) but the parallelism is capped at the head count: heads not divisible by P raise
ValueError naming heads and world size.

The all-to-all: gloo does implement ``dist.all_to_all_single`` on CPU (torch 2.13, checked in
tests/longctx/test_ulysses.py); the default ``impl="p2p"`` nevertheless posts P-1 isend/irecv pairs through the
tl.dist group wrapper, because those name the peer when it dies or hangs and are counted byte for byte.
``impl="gloo"`` uses ``all_to_all_single``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._inputs import as_int
from ..dist.counters import Counters
from ..dist.group import _Group, check_same_across_ranks

__all__ = ["IMPLS", "reset_ulysses_counts", "ulysses_attention", "ulysses_bytes", "ulysses_counts"]

COUNTS = Counters("bytes_sent", "fwd_bytes", "bwd_bytes", "all_to_all")
_TAG = 7700
IMPLS = ("p2p", "gloo")


def reset_ulysses_counts() -> None:
    """Zero the per-process counters of ``ulysses_counts``."""
    COUNTS.reset()


def ulysses_counts() -> dict[str, int]:
    """Bytes this process sent in Ulysses all-to-alls (total, forward, backward) and the number of all-to-alls."""
    return COUNTS.snapshot()


def ulysses_bytes(
    batch: int, heads: int, seq_local: int, head_dim: int, world_size: int, element_size: int = 4
) -> dict[str, int]:
    """Bytes each rank sends in one Ulysses forward and backward: 4 tensors × (P-1)/P of b·h·n·d each way."""
    batch, heads, seq_local, head_dim = (
        as_int(v, n, min=1)
        for v, n in ((batch, "batch"), (heads, "heads"), (seq_local, "seq_local"), (head_dim, "head_dim"))
    )
    world_size, element_size = as_int(world_size, "world_size", min=1), as_int(element_size, "element_size", min=1)
    local = batch * heads * seq_local * head_dim * element_size
    sent = 4 * local * (world_size - 1) // world_size
    return {"fwd_bytes": sent, "bwd_bytes": sent}


def _all_to_all(chunks: list[torch.Tensor], g: _Group, phase: str, impl: str = "p2p") -> list[torch.Tensor]:
    """``chunks[j]`` goes to group rank j; returns the list whose entry i came from rank i (own chunk kept)."""
    p, me = g.size, g.me
    COUNTS["all_to_all"] += 1
    sent = sum(c.numel() * c.element_size() for j, c in enumerate(chunks) if j != me)
    COUNTS["bytes_sent"] += sent
    COUNTS[phase] += sent
    chunks = [c.contiguous() for c in chunks]
    if impl == "gloo":
        flat_in = torch.cat([c.reshape(-1) for c in chunks])
        flat_out = torch.empty_like(flat_in)  # equal chunk sizes on every rank
        dist.all_to_all_single(flat_out, flat_in, group=g.group)
        m = chunks[0].numel()
        return [flat_out[i * m : (i + 1) * m].view(chunks[0].shape) for i in range(p)]
    out: list[torch.Tensor] = [torch.empty_like(chunks[0]) for _ in range(p)]
    out[me] = chunks[me]
    works = []
    for s in range(1, p):  # shift s: receive from me-s, send to me+s (every pair posted once per direction)
        src, dst = (me - s) % p, (me + s) % p
        works.append(g.irecv(out[src], src, _TAG + s))
        works.append(g.isend(chunks[dst], dst, _TAG + s))
    for w in works:
        w.wait()
    return out


def _seq_to_heads(x: torch.Tensor, g: _Group, phase: str, impl: str) -> torch.Tensor:
    """[..., h, n, d] sequence shard -> [..., h/P, P·n, d] head shard (x may carry leading stack dims)."""
    hd = x.dim() - 3
    parts = list(x.chunk(g.size, dim=hd))
    got = _all_to_all(parts, g, phase, impl)
    return torch.cat(got, dim=hd + 1)


def _heads_to_seq(x: torch.Tensor, g: _Group, phase: str, impl: str) -> torch.Tensor:
    """[..., h/P, N, d] head shard -> [..., h, N/P, d] sequence shard (the inverse of ``_seq_to_heads``)."""
    hd = x.dim() - 3
    parts = list(x.chunk(g.size, dim=hd + 1))
    got = _all_to_all(parts, g, phase, impl)
    return torch.cat(got, dim=hd)


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: _Group, impl: str) -> torch.Tensor:  # type: ignore[override]
        ctx.g, ctx.impl = g, impl
        return _seq_to_heads(x, g, "fwd_bytes", impl)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return _heads_to_seq(grad, ctx.g, "bwd_bytes", ctx.impl), None, None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: _Group, impl: str) -> torch.Tensor:  # type: ignore[override]
        ctx.g, ctx.impl = g, impl
        return _heads_to_seq(x, g, "fwd_bytes", impl)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return _seq_to_heads(grad, ctx.g, "bwd_bytes", ctx.impl), None, None


_DT = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Any = None,
    causal: bool = False,
    *,
    impl: str = "p2p",
) -> torch.Tensor:
    """Attention over the full sequence from contiguous sequence shards [b, h, N/P, d]; returns this rank's
    output shard. All-to-all to head shards, local SDPA, all-to-all back; differentiable."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected [batch, heads, seq_local, head_dim], got shape {tuple(t.shape)}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v: shapes must match, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v: dtypes must match, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {causal!r}")
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    g = _Group(group)
    b, h, n, d = q.shape
    if h % g.size:
        raise ValueError(
            f"heads: {h} attention heads are not divisible by world size {g.size} (Ulysses splits heads over ranks)"
        )
    dt = _DT.index(q.dtype) if q.dtype in _DT else 99
    check_same_across_ranks(
        f"ulysses_attention input (q shape {tuple(q.shape)} here)",
        [("batch", b), ("heads", h), ("seq_local", n), ("head_dim", d), ("dtype", dt), ("causal", int(causal))],
        group,
        count_first=False,
    )
    qkv = _SeqToHeads.apply(torch.stack([q, k, v]), g, impl)  # [3, b, h/P, N, d]
    o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=causal)
    return _HeadsToSeq.apply(o, g, impl)
