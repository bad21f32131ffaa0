"""The all-reduce algorithms behind ``tl.dist.all_reduce`` (ring, binomial tree, recursive doubling / halving,
hierarchical) and the schedule arithmetic the notebook and the simulator share with them (``bounds``,
``ring_schedule``, ``recursive_doubling_partner``, ``default_node_size``, ``hierarchical_layout``).

Each private algorithm reduces a flat contiguous tensor in place over a ``_Group`` (tinylearn.dist.group); the
module docstring of ``tinylearn.dist.collectives`` gives each algorithm's schedule and cost. The five are kept side
by side here (notebook 06 compares them) with the helpers they share: the reducer, the per-thread receive
workspace and the piece splitting of the pipelined ring.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from .group import _Group


def _reducer(op: str) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    if op in ("sum", "avg"):
        return lambda a, b: a.add_(b)
    if op == "max":
        return lambda a, b: torch.maximum(a, b, out=a)
    return lambda a, b: torch.minimum(a, b, out=a)


_WS = threading.local()


def _workspace(dtype: torch.dtype, numel: int, slot: int = 0) -> torch.Tensor:
    """A reusable scratch buffer (per thread, dtype and slot): receiving into fresh ``torch.empty`` memory every
    call costs page faults that, for 64 MB messages, rival the transfer itself."""
    cache = getattr(_WS, "bufs", None)
    if cache is None:
        cache = _WS.bufs = {}
    buf = cache.get((dtype, slot))
    if buf is None or buf.numel() < numel:
        buf = cache[(dtype, slot)] = torch.empty(max(numel, 1), dtype=dtype)
    return buf[:numel]


def _int_arg(name: str, v: Any, minimum: int) -> int:
    """An int argument (numpy/torch integers ok; bool and float are errors) >= ``minimum``, else a clear error."""
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__} {v!r}")
    v = v.__index__()
    if v < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {v}")
    return v


def bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Split range(n) into ``parts`` contiguous pieces whose lengths differ by at most one (first ones longer)."""
    n, parts = _int_arg("n", n, 0), _int_arg("parts", parts, 1)
    q, rem = divmod(n, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + q + (1 if i < rem else 0)
        out.append((lo, hi))
        lo = hi
    return out


def _pieces(lo: int, hi: int, piece: int) -> list[tuple[int, int]]:
    if hi <= lo:
        return [(lo, hi)]
    k = max(1, math.ceil((hi - lo) / piece))
    return [(lo + a, lo + b) for a, b in bounds(hi - lo, k)]


# ----------------------------------------------------------------------------------------------------- ring
def ring_schedule(rank: int, step: int, world_size: int) -> tuple[int, int]:
    """(chunk sent, chunk received) by ``rank`` at ``step`` of ring all-reduce (steps 0..2(p-1)-1).

    Steps 0..p-2 are reduce-scatter (the received chunk is reduced into the local one), steps p-1..2p-3
    all-gather (the received chunk overwrites). After reduce-scatter rank r owns the full sum of chunk (r+1) mod p.
    """
    p = _int_arg("world_size", world_size, 1)
    rank, step = _int_arg("rank", rank, 0), _int_arg("step", step, 0)
    if rank >= p:
        raise ValueError(f"rank: expected 0 <= rank < world_size={p}, got {rank}")
    if not 0 <= step < 2 * (p - 1):
        raise ValueError(f"step: expected 0 <= step < {2 * (p - 1)} for world_size={p}, got {step}")
    if step < p - 1:
        return (rank - step) % p, (rank - step - 1) % p
    s = step - (p - 1)
    return (rank + 1 - s) % p, (rank - s) % p


def _ring(
    g: _Group,
    flat: torch.Tensor,
    members: list[int],
    segs: list[tuple[int, int]],
    mode: str,
    reduce: Callable[[torch.Tensor, torch.Tensor], Any] | None,
    piece_elems: int,
    tag_base: int = 0,
    off: int = 0,
) -> None:
    """Pipelined ring over group-local ``members`` (ring order) on element segments ``segs`` of ``flat``.

    mode "rsag": reduce-scatter then all-gather (all-reduce); "rs": reduce-scatter only; "ag": all-gather only.
    ``off`` shifts ownership: with off=-1 member i owns segment i after "rs" and must own it before "ag".
    The piece received at global step t is exactly the piece sent at step t+1, so it is forwarded as soon as it
    has been reduced; receives are posted two steps ahead.
    """
    k = len(members)
    if k == 1:
        return
    pos = members.index(g.me)
    nxt, prv = members[(pos + 1) % k], members[(pos - 1) % k]
    n_rs = k - 1 if mode in ("rs", "rsag") else 0
    n_ag = k - 1 if mode in ("ag", "rsag") else 0
    nsteps = n_rs + n_ag

    def seg(t: int, sending: bool) -> int:
        if t < n_rs:
            return (pos - t + off) % k if sending else (pos - t - 1 + off) % k
        s = t - n_rs
        return (pos + 1 + off - s) % k if sending else (pos + off - s) % k

    max_pieces = max(len(_pieces(lo, hi, piece_elems)) for lo, hi in segs)
    seg_max = max(hi - lo for lo, hi in segs)
    sends_on_seg: dict[int, list[Any]] = {}
    all_sends: list[Any] = []
    waited: set[int] = set()
    recvs: dict[int, list[tuple[Any, int, int, torch.Tensor | None]]] = {}

    def post_recv(t: int) -> None:
        if t >= nsteps:
            return
        c = seg(t, False)
        lo, hi = segs[c]
        lst = []
        for j, (a, b) in enumerate(_pieces(lo, hi, piece_elems)):
            tag = tag_base + t * max_pieces + j
            if t < n_rs:  # three steps are in flight at most (t, t+1, t+2): three scratch slots
                buf = _workspace(flat.dtype, seg_max, t % 3)[a - lo : b - lo]
                lst.append((g.irecv(buf, prv, tag), a, b, buf))
            else:
                for w in sends_on_seg.pop(c, []):  # never overwrite a segment while our own send of it is in flight
                    w.wait()
                    waited.add(id(w))  # a gloo Work must not be waited twice (the second wait blocks)
                lst.append((g.irecv(flat[a:b], prv, tag), a, b, None))
        recvs[t] = lst

    def send(t: int, j: int, a: int, b: int) -> None:
        w = g.isend(flat[a:b], nxt, tag_base + t * max_pieces + j)
        sends_on_seg.setdefault(seg(t, True), []).append(w)
        all_sends.append(w)

    post_recv(0)
    post_recv(1)
    lo, hi = segs[seg(0, True)]
    for j, (a, b) in enumerate(_pieces(lo, hi, piece_elems)):
        send(0, j, a, b)
    for t in range(nsteps):
        post_recv(t + 2)
        for j, (work, a, b, buf) in enumerate(recvs.pop(t)):
            work.wait()
            if buf is not None:
                reduce(flat[a:b], buf)
            if t + 1 < nsteps:
                send(t + 1, j, a, b)
    for w in all_sends:
        if id(w) not in waited:
            w.wait()


# ------------------------------------------------------------------------------------------------ tree etc.
def _binomial_reduce(g: _Group, flat: torch.Tensor, reduce: Callable, root: int, tag: int) -> None:
    p, vr = g.size, (g.me - root) % g.size
    k = 0
    while (1 << k) < p:
        bit = 1 << k
        if vr & bit:
            g.isend(flat, (vr - bit + root) % p, tag + k).wait()
            return
        if vr + bit < p:
            buf = _workspace(flat.dtype, flat.numel(), 3)
            g.irecv(buf, (vr + bit + root) % p, tag + k).wait()
            reduce(flat, buf)
        k += 1


def _binomial_bcast(g: _Group, flat: torch.Tensor, root: int, tag: int) -> None:
    p, vr = g.size, (g.me - root) % g.size
    levels = max(0, math.ceil(math.log2(p))) if p > 1 else 0
    sends = []
    for k in range(levels - 1, -1, -1):
        bit = 1 << k
        low = vr & ((bit << 1) - 1)
        if low == bit:
            g.irecv(flat, (vr - bit + root) % p, tag + k).wait()
        elif low == 0 and vr + bit < p:
            sends.append(g.isend(flat, (vr + bit + root) % p, tag + k))
    for w in sends:
        w.wait()


def recursive_doubling_partner(rank: int, round_: int, world_size: int) -> int | None:
    """Partner of ``rank`` in round ``round_`` of recursive doubling (power-of-two core after folding).

    Ranks >= 2^floor(log2 p) are folded away (partner None during the core rounds).
    """
    p2 = 1 << (world_size.bit_length() - 1)
    if rank >= p2:
        return None
    return rank ^ (1 << round_)


def _exchange(g: _Group, send_t: torch.Tensor, recv_t: torch.Tensor, peer: int, tag: int) -> None:
    wr = g.irecv(recv_t, peer, tag)
    ws = g.isend(send_t, peer, tag)
    wr.wait()
    ws.wait()


def _recursive(g: _Group, flat: torch.Tensor, reduce: Callable, halving: bool, tag: int) -> None:
    p, me = g.size, g.me
    p2 = 1 << (p.bit_length() - 1)
    extra = p - p2
    if me >= p2:  # folded rank: hand the vector over, wait for the result
        g.isend(flat, me - p2, tag).wait()
        g.irecv(flat, me - p2, tag + 1).wait()
        return
    if me < extra:
        buf = _workspace(flat.dtype, flat.numel(), 3)
        g.irecv(buf, me + p2, tag).wait()
        reduce(flat, buf)
    rounds = p2.bit_length() - 1
    if not halving:
        buf = _workspace(flat.dtype, flat.numel(), 3)
        for k in range(rounds):
            _exchange(g, flat, buf, me ^ (1 << k), tag + 2 + k)
            reduce(flat, buf)
    else:
        lo, hi = 0, flat.numel()
        stack = []
        for k in range(rounds - 1, -1, -1):  # recursive halving reduce-scatter: distance p2/2, ..., 1
            d = 1 << k
            mid = lo + (hi - lo) // 2
            keep, give = ((lo, mid), (mid, hi)) if not me & d else ((mid, hi), (lo, mid))
            buf = _workspace(flat.dtype, keep[1] - keep[0], 3)
            _exchange(g, flat[give[0] : give[1]], buf, me ^ d, tag + 2 + k)
            reduce(flat[keep[0] : keep[1]], buf)
            stack.append((give, d))
            lo, hi = keep
        for give, d in reversed(stack):  # recursive doubling all-gather: distance 1, ..., p2/2
            _exchange(g, flat[lo:hi], flat[give[0] : give[1]], me ^ d, tag + 2 + rounds + d.bit_length())
            lo, hi = min(lo, give[0]), max(hi, give[1])
    if me < extra:
        g.isend(flat, me + p2, tag + 1).wait()


def default_node_size(world_size: int) -> int:
    """Node size used by ``hierarchical`` when none is given: LOCAL_WORLD_SIZE if it splits the group into
    several nodes, else the smallest divisor of p that is >= sqrt(p) (minimises 2(k-1)+2(p/k-1) latency)."""
    env = os.environ.get("TINYLEARN_NODE_SIZE") or os.environ.get("LOCAL_WORLD_SIZE")
    if env and env.isdigit() and 1 <= int(env) < world_size and world_size % int(env) == 0:
        return int(env)
    for k in range(max(1, math.isqrt(world_size - 1) + 1 if world_size > 1 else 1), world_size + 1):
        if world_size % k == 0:
            return k
    return max(1, world_size)


def hierarchical_layout(world_size: int, node_size: int) -> tuple[list[list[int]], int, list[list[list[int]]]]:
    """(nodes, K, owners): consecutive-rank nodes, the number K of shards, and owners[j][c] = ranks of node j
    that own shard c (member i of a node with k_j ranks owns a contiguous block of the K shards)."""
    k = min(node_size, world_size)
    nodes = [list(range(s, min(s + k, world_size))) for s in range(0, world_size, k)]
    owner_of = []
    for nd in nodes:
        own = [0] * k
        for i, (a, b) in enumerate(bounds(k, len(nd))):
            for c in range(a, b):
                own[c] = nd[i]
        owner_of.append(own)
    return nodes, k, owner_of


def _hierarchical(g: _Group, flat: torch.Tensor, reduce: Callable, node_size: int, piece: int) -> None:
    p, me = g.size, g.me
    nodes, k, owner_of = hierarchical_layout(p, node_size)
    if len(nodes) == 1 or k == 1:  # one node, or one rank per node: both levels collapse into a single ring
        _ring(g, flat, list(range(p)), bounds(flat.numel(), p), "rsag", reduce, piece)
        return
    j = me // k
    node = nodes[j]
    shards = bounds(flat.numel(), k)
    groups = bounds(k, len(node))  # member i owns shards groups[i][0]..groups[i][1]-1
    segs = [(shards[a][0], shards[b - 1][1]) for a, b in groups]  # len(node) <= k: every member owns >= 1 shard
    _ring(g, flat, node, segs, "rs", reduce, piece, tag_base=0, off=-1)
    for c in range(k):
        ring = [owner_of[jj][c] for jj in range(len(nodes))]
        if me in ring:
            lo, hi = shards[c]
            _ring(
                g,
                flat,
                ring,
                [(lo + a, lo + b) for a, b in bounds(hi - lo, len(ring))],
                "rsag",
                reduce,
                piece,
                tag_base=(1 + c) * 100_000,
            )
    _ring(g, flat, node, segs, "ag", None, piece, tag_base=50_000, off=-1)
