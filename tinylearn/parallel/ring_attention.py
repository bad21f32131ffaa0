"""Ring attention (context parallelism): exact attention over a sequence sharded across the P ranks of ``group``.

Every rank holds q, k, v of shape [batch, heads, seq_local, head_dim] for its part of the sequence. The K/V blocks
travel around the ring (rank r sends to r+1, receives from r-1): at step t rank r holds the K/V of rank (r - t) mod P.
The transfer for step t+1 is POSTED (isend/irecv) before the block of step t is computed, so communication overlaps
computation. The P partial results merge with the online softmax: per query row a running max m, a running sum l
and an unnormalised output o,

    m' = max(m, m_b),  l' = l·e^(m-m') + l_b·e^(m_b-m'),  o' = o·e^(m-m') + o_b·e^(m_b-m'),

and at the end out = o / l, lse = m + log l (the log-sum-exp, saved for the backward).

Backward (``torch.autograd.Function``, FlashAttention-2 style): a second ring pass. Each block's probabilities are
recomputed from the saved lse (P = exp(S - lse), no N×N matrix is kept), D = rowsum(dO ∘ O), dS = P ∘ (dO Vᵀ - D).
dQ accumulates locally; the dK/dV contributions to a K/V block travel around the ring with it: the accumulator for
rank s starts (zero) on rank s+1, collects one contribution per hop and its (P-1)-th send delivers it home, where the
owner adds its own. Bytes sent per rank (elements × element size, b·h·n·d = one local tensor, n = N/P):

    forward   (P-1) K/V blocks         = 2·(P-1)·b·h·n·d
    backward  (P-1) K/V + (P-1) dK/dV  = 4·(P-1)·b·h·n·d

(``ring_bytes``; the module counter ``ring_counts()`` adds up what was actually posted).

Causal masking and load balance. Positions come from the sharding. Contiguous (``zigzag=False``): rank r holds chunk
r of P chunks, so rank P-1 computes P blocks and rank 0 one. Zig-zag (``zigzag=True``, the default when causal):
the sequence is cut into 2P chunks and rank r holds chunks r and 2P-1-r (``zigzag_shard``), so every rank computes
2P+1 of the (N/2P)² tiles (2P-1 full, 2 diagonal): balanced. A tile whose keys all lie after its queries is
skipped; ``ring_counts()["score_elems"]`` counts the score elements each rank computed.

Memory: query rows are processed ``block_size`` at a time, so the largest score tile is [b, h, block_size, n]
(at most; [b, h, n/2, n/2] for small zig-zag shards) and the peak is O(block_size·N/P + b·h·(N/P)·d); nothing of
size N×N exists on any rank (measured in the tests with a dispatch-mode tensor meter, bench_longctx).

Bad input raises ValueError naming the argument: q/k/v shapes that differ, a non-4-D tensor, an odd seq_local
with zig-zag, ranks whose shapes disagree (one handshake all-reduce per forward). Sequences that do not split
evenly are rejected (``zigzag_shard`` / ``shard_sequence`` raise, naming seq and world size), not padded: padding
would need a key mask the caller can get right more easily by padding and masking itself. A rank that dies
mid-ring makes its neighbours raise RuntimeError naming it (tl.dist group p2p requests); a hung one, after the
process-group timeout.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._inputs import as_int
from ..dist.counters import Counters
from ..dist.group import _Group, check_same_across_ranks

__all__ = [
    "attention_reference",
    "reset_ring_counts",
    "ring_attention",
    "ring_bytes",
    "ring_counts",
    "ring_work",
    "shard_sequence",
    "zigzag_shard",
    "zigzag_unshard",
]

COUNTS = Counters("bytes_sent", "fwd_bytes", "bwd_bytes", "messages", "score_elems")
_TAG_FWD, _TAG_BWD_KV, _TAG_BWD_DKV = 7100, 7300, 7500


def reset_ring_counts() -> None:
    """Zero the per-process counters of ``ring_counts``."""
    COUNTS.reset()


def ring_counts() -> dict[str, int]:
    """Bytes this process posted (total, forward, backward), messages, and attention score elements computed."""
    return COUNTS.snapshot()


def ring_bytes(
    batch: int, heads: int, seq_local: int, head_dim: int, world_size: int, element_size: int = 4
) -> dict[str, int]:
    """Bytes each rank sends in one ring-attention forward and backward (see the module docstring)."""
    batch, heads, seq_local, head_dim = (
        as_int(v, n, min=1)
        for v, n in ((batch, "batch"), (heads, "heads"), (seq_local, "seq_local"), (head_dim, "head_dim"))
    )
    world_size, element_size = as_int(world_size, "world_size", min=1), as_int(element_size, "element_size", min=1)
    block = batch * heads * seq_local * head_dim * element_size
    p = world_size - 1
    return {"fwd_bytes": 2 * p * block, "bwd_bytes": 4 * p * block}


# --------------------------------------------------------------------------------------------------- sharding
def _check_world(rank: Any, world: Any) -> tuple[int, int]:
    for name, v in (("world", world), ("rank", rank)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}: expected an int, got {v!r}")
    if world < 1:
        raise ValueError(f"world: expected >= 1, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank: expected 0 <= rank < world={world}, got {rank}")
    return rank, world


def shard_sequence(x: torch.Tensor, rank: int, world: int, dim: int = -2) -> torch.Tensor:
    """Contiguous sharding: chunk ``rank`` of ``world`` equal chunks along ``dim`` (a copy)."""
    rank, world = _check_world(rank, world)
    n = x.shape[dim]
    if n % world:
        raise ValueError(
            f"seq: length {n} (dim {dim} of shape {tuple(x.shape)}) is not divisible by world size {world}"
        )
    c = n // world
    return x.narrow(dim, rank * c, c).contiguous()


def zigzag_shard(x: torch.Tensor, rank: int, world: int, dim: int = -2) -> torch.Tensor:
    """Zig-zag sharding for causal load balance: cut ``dim`` into 2·world chunks; rank r gets chunks r and
    2·world-1-r, concatenated in that order."""
    rank, world = _check_world(rank, world)
    n = x.shape[dim]
    if n % (2 * world):
        raise ValueError(
            f"seq: length {n} (dim {dim} of shape {tuple(x.shape)}) is not divisible by 2 * world size "
            f"= {2 * world} (zig-zag sharding cuts it into 2·world chunks)"
        )
    c = n // (2 * world)
    return torch.cat([x.narrow(dim, rank * c, c), x.narrow(dim, (2 * world - 1 - rank) * c, c)], dim=dim)


def zigzag_unshard(shards: list[torch.Tensor] | tuple[torch.Tensor, ...], dim: int = -2) -> torch.Tensor:
    """Inverse of ``zigzag_shard``: ``shards[r]`` is rank r's shard; returns the full sequence."""
    if not isinstance(shards, list | tuple) or not shards:
        raise ValueError(f"shards: expected a non-empty list of per-rank tensors, got {type(shards).__name__}")
    world = len(shards)
    n = shards[0].shape[dim]
    for r, s in enumerate(shards):
        if s.shape != shards[0].shape:
            raise ValueError(f"shards[{r}]: shape {tuple(s.shape)} differs from shards[0] {tuple(shards[0].shape)}")
    if n % 2:
        raise ValueError(f"shards: local length {n} along dim {dim} is odd; a zig-zag shard holds two equal chunks")
    c = n // 2
    chunks: list[torch.Tensor | None] = [None] * (2 * world)
    for r, s in enumerate(shards):
        chunks[r] = s.narrow(dim, 0, c)
        chunks[2 * world - 1 - r] = s.narrow(dim, c, c)
    return torch.cat(chunks, dim=dim)  # type: ignore[arg-type]


def _layout(rank: int, world: int, n: int, zigzag: bool) -> list[tuple[int, int, int]]:
    """(global chunk id, offset in the local shard, length) of each chunk a rank holds; all chunks equal length."""
    if zigzag:
        c = n // 2
        return [(rank, 0, c), (2 * world - 1 - rank, c, c)]
    return [(rank, 0, n)]


def _pairs(
    me: int, src: int, world: int, n: int, causal: bool, zigzag: bool, block: int
) -> list[tuple[slice, slice, int | None]]:
    """(query rows, key rows, diagonal offset) of the tiles rank ``me`` computes against the K/V of rank ``src``.

    Query rows are cut into pieces of at most ``block`` rows, so a score tile is at most [b, h, block, n]. The
    offset is None for a fully visible tile; for a piece of a diagonal chunk it is the piece's first row within
    the chunk (keys after the piece's last row are left out: all masked)."""
    out: list[tuple[slice, slice, int | None]] = []
    if not causal:
        for r0 in range(0, n, block):
            out.append((slice(r0, min(n, r0 + block)), slice(0, n), None))
        return out
    for qi, qo, ql in _layout(me, world, n, zigzag):
        for ki, ko, kl in _layout(src, world, n, zigzag):
            if ki > qi:
                continue  # every key after every query: skipped
            for r0 in range(0, ql, block):
                r1 = min(ql, r0 + block)
                if ki < qi:
                    out.append((slice(qo + r0, qo + r1), slice(ko, ko + kl), None))
                else:
                    out.append((slice(qo + r0, qo + r1), slice(ko, ko + r1), r0))
    return out


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, diag: int | None) -> torch.Tensor:
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    if diag is not None:  # query row i of the piece is chunk row diag + i: it sees keys 0..diag + i
        rows, cols = s.shape[-2:]
        s.masked_fill_(torch.ones(rows, cols, dtype=torch.bool).triu_(diag + 1), float("-inf"))
    return s


# --------------------------------------------------------------------------------------------------- the ring
def _send(g: _Group, t: torch.Tensor, peer: int, tag: int, phase: str) -> Any:
    COUNTS["bytes_sent"] += t.numel() * t.element_size()
    COUNTS[phase] += t.numel() * t.element_size()
    COUNTS["messages"] += 1
    return g.isend(t, peer, tag)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: _Group,
        causal: bool,
        zigzag: bool,
        scale: float,
        block: int,
    ) -> torch.Tensor:
        p, me = g.size, g.me
        nxt, prv = (me + 1) % p, (me - 1) % p
        b, h, n, d = q.shape
        m = torch.full((b, h, n), float("-inf"), dtype=q.dtype)
        l_sum = torch.zeros(b, h, n, dtype=q.dtype)
        o = torch.zeros_like(q)
        kv = torch.stack([k, v])  # one message per step
        for t in range(p):
            src = (me - t) % p
            if t < p - 1:  # post the next transfer first: it runs while this block is computed
                incoming = torch.empty_like(kv)
                recv = g.irecv(incoming, prv, _TAG_FWD + t)
                send = _send(g, kv, nxt, _TAG_FWD + t, "fwd_bytes")
            for rows, cols, diag in _pairs(me, src, p, n, causal, zigzag, block):
                s = _scores(q[:, :, rows], kv[0][:, :, cols], scale, diag)
                COUNTS["score_elems"] += s.numel()
                m_b = s.amax(-1)
                e = torch.exp(s - m_b.unsqueeze(-1))
                l_b, o_b = e.sum(-1), torch.matmul(e, kv[1][:, :, cols])
                m_old = m[:, :, rows]
                m_new = torch.maximum(m_old, m_b)
                a_old, a_b = torch.exp(m_old - m_new), torch.exp(m_b - m_new)
                l_sum[:, :, rows] = l_sum[:, :, rows] * a_old + l_b * a_b
                o[:, :, rows] = o[:, :, rows] * a_old.unsqueeze(-1) + o_b * a_b.unsqueeze(-1)
                m[:, :, rows] = m_new
            if t < p - 1:
                recv.wait()
                send.wait()
                kv = incoming
        out = o / l_sum.unsqueeze(-1)
        lse = m + torch.log(l_sum)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.g, ctx.causal, ctx.zigzag, ctx.scale, ctx.block = g, causal, zigzag, scale, block
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        g, causal, zigzag, scale, block = ctx.g, ctx.causal, ctx.zigzag, ctx.scale, ctx.block
        p, me = g.size, g.me
        nxt, prv = (me + 1) % p, (me - 1) % p
        n = q.shape[2]
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)  # D = rowsum(dO ∘ O)
        dq = torch.zeros_like(q)
        own = torch.zeros((2, *k.shape), dtype=k.dtype)  # this rank's contribution to its own dK/dV
        kv = torch.stack([k, v])
        acc: torch.Tensor | None = None  # the travelling dK/dV accumulator of the block held now
        pending: list[Any] = []  # dK/dV sends of the previous step (waited one step later: they overlap compute)
        for t in range(p):
            src = (me - t) % p
            if t < p - 1:
                incoming = torch.empty_like(kv)
                recv = g.irecv(incoming, prv, _TAG_BWD_KV + t)
                send = _send(g, kv, nxt, _TAG_BWD_KV + t, "bwd_bytes")
            if (
                t >= 1
            ):  # the accumulator the previous rank sends after its step t: used at step t+1 (or mine at the end)
                acc_in = torch.empty_like(kv)
                acc_recv = g.irecv(acc_in, prv, _TAG_BWD_DKV + t)
            target = own if t == 0 else (acc if acc is not None else torch.zeros_like(kv))
            for rows, cols, diag in _pairs(me, src, p, n, causal, zigzag, block):
                qb, kb, vb = q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols]
                s = _scores(qb, kb, scale, diag)
                COUNTS["score_elems"] += s.numel()
                pr = torch.exp(s - lse[:, :, rows].unsqueeze(-1))  # masked entries: exp(-inf) = 0
                do = dout[:, :, rows]
                target[1][:, :, cols] += torch.matmul(pr.transpose(-1, -2), do)
                ds = pr * (torch.matmul(do, vb.transpose(-1, -2)) - delta[:, :, rows].unsqueeze(-1))
                dq[:, :, rows] += torch.matmul(ds, kb) * scale
                target[0][:, :, cols] += torch.matmul(ds.transpose(-1, -2), qb) * scale
            for w in pending:
                w.wait()
            pending = []
            if t >= 1:
                pending.append(_send(g, target, nxt, _TAG_BWD_DKV + t, "bwd_bytes"))
            if t < p - 1:
                recv.wait()
                send.wait()
                kv = incoming
            if t >= 1:
                acc_recv.wait()
                acc = acc_in
        for w in pending:
            w.wait()
        dkv = own if acc is None else own + acc  # acc: everyone else's contributions, delivered home
        return dq, dkv[0], dkv[1], None, None, None, None, None


def _check_qkv(q: Any, k: Any, v: Any) -> None:
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
    if q.shape[2] < 1:
        raise ValueError(f"q: seq_local must be >= 1, got shape {tuple(q.shape)}")


_DT = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Any = None,
    causal: bool = False,
    *,
    zigzag: bool | None = None,
    scale: float | None = None,
    block_size: int = 256,
) -> torch.Tensor:
    """softmax(Q Kᵀ·scale [+ causal mask]) V over the whole sequence, each rank passing its shard
    [batch, heads, seq_local, head_dim] and getting its shard of the output; differentiable (ring backward).

    ``zigzag`` says how the sequence was sharded (matters only when ``causal``): True = ``zigzag_shard`` (rank r
    holds chunks r and 2P-1-r of 2P), False = contiguous (``shard_sequence``); None = True when causal.
    ``scale`` defaults to 1/sqrt(head_dim). ``block_size`` caps the query rows of one score tile (memory
    O(block_size · seq_local) per rank, FlashAttention-style). Collective: every rank of ``group`` must call it
    with the same shapes.
    """
    _check_qkv(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {causal!r}")
    if zigzag is not None and not isinstance(zigzag, bool):
        raise TypeError(f"zigzag: expected a bool or None, got {zigzag!r}")
    zz = causal if zigzag is None else zigzag
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: expected an int >= 1, got {block_size!r}")
    g = _Group(group)
    b, h, n, d = q.shape
    if zz and causal and n % 2:
        raise ValueError(
            f"seq: local length {n} is odd but zig-zag sharding holds two equal chunks per rank "
            f"(global length {n * g.size} must be divisible by 2 * world size = {2 * g.size})"
        )
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    dt = _DT.index(q.dtype) if q.dtype in _DT else 99
    check_same_across_ranks(
        f"ring_attention input (q shape {tuple(q.shape)} here)",
        [("batch", b), ("heads", h), ("seq_local", n), ("head_dim", d), ("dtype", dt), ("causal", int(causal))]
        + [("zigzag", int(zz))],
        group,
        count_first=False,
    )
    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
    return _RingAttention.apply(qc, kc, vc, g, causal, bool(zz and causal), float(scale), block_size)


def attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """Single-process explicit-softmax attention on the full sequence (the oracle next to torch SDPA)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def ring_work(rank: int, world: int, seq_local: int, causal: bool, zigzag: bool, block_size: int = 256) -> int:
    """Score elements per (batch, head) rank ``rank`` computes in one forward (the load-balance formula)."""
    rank, world = _check_world(rank, world)
    total = 0
    for t in range(world):
        src = (rank - t) % world
        for rows, cols, _ in _pairs(rank, src, world, seq_local, causal, zigzag and causal, block_size):
            total += (rows.stop - rows.start) * (cols.stop - cols.start)
    return total
