"""Collectives built from torch.distributed point-to-point messages (isend/irecv), in place on torch tensors.

all_reduce(x) leaves sum/max/min/avg over ranks of x in x on every rank. Algorithms (p ranks, n bytes):

* ``ring`` — reduce-scatter then all-gather around a ring, 2(p-1) steps of n/p bytes; each chunk is split into
  pieces of at most ``chunk_bytes`` that are forwarded as soon as they are reduced (pipelined across steps).
  Chunk c at step s: rank r sends chunk (r-s) mod p and receives (r-s-1) mod p (reduce-scatter), then sends
  (r+1-s) and receives (r-s) (all-gather). Bandwidth-optimal: each rank sends 2(p-1)/p * n bytes.
* ``tree`` — binomial tree: reduce to rank 0 in ceil(log2 p) rounds (round k: ranks with lowest set bit k send
  to r - 2^k), then broadcast back the same way. Latency 2 ceil(log2 p) messages, but whole-vector messages.
* ``recursive_doubling`` — log2 p rounds of full-vector exchange with partner r XOR 2^k (latency-optimal).
* ``halving_doubling`` — Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather:
  2 log2 p messages and 2(p-1)/p * n bytes. For p not a power of two both recursive algorithms first fold the
  r = p - 2^floor(log2 p) extra ranks into the first r ranks and send the result back at the end.
* ``hierarchical`` — two levels with ``node_size`` k ranks per node (consecutive ranks): intra-node ring
  reduce-scatter (each rank owns 1/k of the vector), inter-node ring all-reduce of every shard among the ranks
  that own it (one per node), intra-node ring all-gather. Latency 2(k-1) + 2(m-1) steps instead of 2(p-1) for
  m nodes, same bytes as ring. Nodes may be unequal (p not divisible by k).

Every call first does a size handshake (one MAX all-reduce of [numel, dtype, algorithm]); a mismatch raises
ValueError on every rank naming the first differing field and each rank's value (``check_same_across_ranks`` and
``check_params_across_ranks`` offer the same handshake to wrappers: DDP, ZeRO, TP, pipeline). A point-to-point
message whose peer died or hung raises RuntimeError naming this rank, the peer and the cause.

Integer-valued data give results identical to ``dist.all_reduce``; fp32 sums may
differ in the last bits because the summation order differs (each algorithm still gives bitwise-identical
results on all ranks). avg = sum / p (float dtypes only).

Why one ~700-line module: the five algorithms and the four public collectives share the private group wrapper,
size handshake, tagged p2p exchange and workspace helpers; split apart, those internals would become a cross-module
API. The sections below (validation, ring, tree etc., public API) are the seams.

Why one file (> 500 lines): the five all-reduce algorithms share the chunking, tagging and in-place reduction
helpers and are read side by side in notebook 06; splitting them would scatter one comparison over five files.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .._inputs import is_int

ALGORITHMS = ("ring", "tree", "recursive_doubling", "halving_doubling", "hierarchical")
OPS = ("sum", "max", "min", "avg")
DEFAULT_CHUNK_BYTES = 4 << 20
_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
)


# ----------------------------------------------------------------------------------------------- validation
def _norm_op(op: Any) -> str:
    """Accept "sum"/"max"/"min"/"avg" (any case) or the matching ``dist.ReduceOp`` member."""
    if isinstance(op, str):
        return op.lower()
    for name, member in (("sum", "SUM"), ("max", "MAX"), ("min", "MIN"), ("avg", "AVG")):
        if hasattr(dist.ReduceOp, member) and op == getattr(dist.ReduceOp, member):
            return name
    return op


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"op: unknown reduction {op!r}; expected one of {OPS}")


def _check_algorithm(algorithm: str, allowed: tuple[str, ...] = ALGORITHMS) -> None:
    if algorithm not in allowed:
        raise ValueError(f"algorithm: unknown algorithm {algorithm!r}; expected one of {allowed}")


def _check_tensor(name: str, t: Any, op: str | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name}: unsupported dtype {t.dtype}")
    if op == "avg" and not t.dtype.is_floating_point:
        raise TypeError(f"{name}: op='avg' needs a floating-point tensor, got {t.dtype} (integer average is inexact)")
    if op in ("sum", "avg") and t.dtype == torch.bool:
        raise TypeError(f"{name}: op={op!r} is not defined for bool tensors")


def _check_initialized() -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialized: call inside tl.dist.launch(...) or after "
            "dist.init_process_group(...)"
        )


class _Group:
    """The members of a process group (global ranks) and this process's index among them."""

    def __init__(self, group: Any) -> None:
        _check_initialized()
        self.group = group
        if group is None or group == dist.group.WORLD:
            self.size = dist.get_world_size()
            self.ranks = list(range(self.size))
            self.me = dist.get_rank()
            self.group = None
        else:
            self.ranks = list(dist.get_process_group_ranks(group))
            self.size = len(self.ranks)
            self.me = dist.get_rank(group)
            if self.me < 0:
                raise ValueError(f"group: this process (global rank {dist.get_rank()}) is not a member of {self.ranks}")

    def isend(self, t: torch.Tensor, peer: int, tag: int) -> _Work:
        return _Work(dist.isend(t, dst=self.ranks[peer], group=self.group, tag=tag), self, "send to", peer)

    def irecv(self, t: torch.Tensor, peer: int, tag: int) -> _Work:
        return _Work(dist.irecv(t, src=self.ranks[peer], group=self.group, tag=tag), self, "receive from", peer)

    def name(self, member: int) -> str:
        """'rank 3' (world group) or 'rank 3 (group rank 1)' for a subgroup member."""
        glob = self.ranks[member]
        return f"rank {glob}" if self.group is None else f"rank {glob} (group rank {member})"


class _Work:
    """A point-to-point request whose failure names the peer: when a rank dies (connection closed) or hangs (the
    process-group timeout), the survivors' error says which rank they were waiting for and why."""

    __slots__ = ("work", "g", "verb", "peer")

    def __init__(self, work: Any, g: _Group, verb: str, peer: int) -> None:
        self.work, self.g, self.verb, self.peer = work, g, verb, peer

    def wait(self) -> Any:
        try:
            return self.work.wait()
        except RuntimeError as e:
            raise peer_failure(f"{self.verb} {self.g.name(self.peer)}", self.g.name(self.g.me), e) from e


def peer_failure(what: str, me: str, cause: BaseException) -> RuntimeError:
    """The RuntimeError a surviving rank raises when a message exchange with a peer fails: names this rank, the
    operation and peer, and the cause (peer died: connection closed; peer hung: timed out)."""
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    low = text.lower()
    if "timed out" in low or "timeout" in low:
        why = "timed out (the peer is hung, or stopped calling the same collectives)"
    elif "closed" in low or "reset" in low or "broken pipe" in low or "connection" in low:
        why = "connection closed (the peer died or raised)"
    else:
        why = "failed"
    return RuntimeError(f"{me}: {what} {why}: {type(cause).__name__}: {text}")


def _handshake(
    g: _Group,
    what: str,
    values: list[int],
    labels: list[str] | None = None,
    show: Callable[[int, int], str] | None = None,
) -> None:
    """All ranks must agree on ``values`` (sizes, dtype, algorithm): one MAX all-reduce of [v, -v, ...].

    ``labels`` names each value (default: ``what`` split at ", "); ``show(i, v)`` formats value v of field i (a
    dtype index as its name...). On a mismatch every rank finds the same first differing field, gathers every
    rank's value of it (one more small collective, on the failure path only) and raises ValueError naming it.
    """
    meta = torch.tensor([x for v in values for x in (v, -v)], dtype=torch.int64)
    try:
        dist.all_reduce(meta, op=dist.ReduceOp.MAX, group=g.group)
    except RuntimeError as e:
        others = [g.name(j) for j in range(g.size) if j != g.me]
        peers = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
        raise peer_failure(f"handshake of {what!r} with {peers}", g.name(g.me), e) from e
    names = labels if labels is not None else what.split(", ")
    for i, v in enumerate(values):
        hi, lo = int(meta[2 * i]), -int(meta[2 * i + 1])
        if hi != lo:
            field = names[i] if len(names) == len(values) else f"field {i}"
            parts = [torch.zeros(1, dtype=torch.int64) for _ in range(g.size)]
            dist.all_gather(parts, torch.tensor([v], dtype=torch.int64), group=g.group)
            fmt = show or (lambda _i, x: str(x))
            per_rank = ", ".join(f"{g.name(j)} has {fmt(i, int(t))}" for j, t in enumerate(parts))
            raise ValueError(
                f"{field}: mismatch across ranks: {per_rank} (raised on {g.name(g.me)}, which has {fmt(i, v)}; "
                f"checked: {what})"
            )


def check_same_across_ranks(
    what: str,
    fields: list[tuple[str, int]],
    group: Any = None,
    show: Callable[[int, int], str] | None = None,
    *,
    count_first: bool = True,
) -> None:
    """Collective: every rank of ``group`` passes ``fields`` ((label, int) pairs); unless all ranks pass the same
    values, every rank raises ValueError naming the first differing label and each rank's value of it.

    The number of fields is compared first (one tiny all-reduce), so ranks may safely pass lists of different
    lengths; ``count_first=False`` skips that when the length is fixed. Then the values (one all-reduce of 2 int64
    per field). Use it once at construction of anything that later runs collectives without a check (a size
    mismatch inside gloo aborts the process). ``show(i, v)`` formats value v of field i for the message.
    """
    g = _Group(group)
    if count_first:
        _handshake(g, f"{what}: number of fields", [len(fields)], labels=[f"{what}: number of fields"])
    if fields:
        _handshake(g, what, [int(v) for _, v in fields], labels=[name for name, _ in fields], show=show)


def check_params_across_ranks(
    who: str, params: list[torch.Tensor], group: Any = None, setup: list[tuple[str, int]] | tuple = ()
) -> None:
    """Collective: every rank must hold the same parameters (count, dim, dtype, requires_grad, shape) and the same
    ``setup`` fields; otherwise every rank raises ValueError naming ``who``, the first differing ``params[i]``
    field and each rank's value. Three small all-reduces (plus their length checks): for constructors of wrappers
    (DDP, ZeRO) whose later collectives run unchecked."""

    def show_flags(i: int, v: int) -> str:
        kind = i % 3
        if kind == 1:
            return str(_DTYPES[v]) if 0 <= v < len(_DTYPES) else f"dtype code {v}"
        return str(bool(v)) if kind == 2 else str(v)

    check_same_across_ranks(f"{who} setup", [*setup, ("number of parameters", len(params))], group)
    flags = []
    for i, p in enumerate(params):
        code = _DTYPES.index(p.dtype) if p.dtype in _DTYPES else 99
        flags += [(f"params[{i}].dim()", p.dim()), (f"params[{i}].dtype", code)]
        flags.append((f"params[{i}].requires_grad", int(p.requires_grad)))
    check_same_across_ranks(f"{who} parameter dtypes and requires_grad flags", flags, group, show_flags)
    dims = [(f"params[{i}].shape[{d}]", n) for i, p in enumerate(params) for d, n in enumerate(p.shape)]
    check_same_across_ranks(f"{who} parameter shapes", dims, group, count_first=False)  # dims agree by now


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


# ----------------------------------------------------------------------------------------------- public API
def _flat(tensor: torch.Tensor) -> tuple[torch.Tensor, bool]:
    if tensor.is_contiguous():
        return tensor.view(-1), False
    return tensor.contiguous().view(-1), True


def all_reduce(
    tensor: torch.Tensor,
    op: str = "sum",
    algorithm: str = "ring",
    group: Any = None,
    *,
    node_size: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    check: bool = True,
) -> torch.Tensor:
    """In-place all-reduce of ``tensor`` over ``group`` (default: the world) with the chosen algorithm.

    op: "sum" | "max" | "min" | "avg" (avg: float dtypes). algorithm: see the module docstring.
    ``node_size`` (hierarchical): ranks per node, default ``default_node_size(p)``. ``chunk_bytes``: ring
    pipeline piece size. ``check=False`` skips the size handshake (benchmarks only). Returns ``tensor``.
    """
    op = _norm_op(op)
    _check_op(op)
    _check_algorithm(algorithm)
    _check_tensor("tensor", tensor, op)
    if node_size is not None and (not is_int(node_size) or node_size < 1):
        raise ValueError(f"node_size: expected an int >= 1, got {node_size!r}")
    node_size = None if node_size is None else int(node_size)
    if not is_int(chunk_bytes) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes: expected an int >= 1, got {chunk_bytes!r}")
    chunk_bytes = int(chunk_bytes)
    g = _Group(group)
    if check:
        _handshake(
            g,
            "tensor numel, dtype, algorithm, op, chunk_bytes, node_size",
            [
                tensor.numel(),
                _DTYPES.index(tensor.dtype),
                ALGORITHMS.index(algorithm),
                OPS.index(op),
                int(chunk_bytes),  # shapes the ring's pieces: a mismatch used to abort inside gloo
                int(node_size) if node_size is not None else default_node_size(g.size),  # a mismatch deadlocked
            ],
        )
    if g.size == 1 or tensor.numel() == 0:
        return tensor
    flat, copied = _flat(tensor)
    reduce = _reducer(op)
    piece = max(1, chunk_bytes // flat.element_size())
    if algorithm == "ring":
        _ring(g, flat, list(range(g.size)), bounds(flat.numel(), g.size), "rsag", reduce, piece)
    elif algorithm == "tree":
        _binomial_reduce(g, flat, reduce, 0, tag=0)
        _binomial_bcast(g, flat, 0, tag=100)
    elif algorithm in ("recursive_doubling", "halving_doubling"):
        _recursive(g, flat, reduce, algorithm == "halving_doubling", tag=0)
    else:
        _hierarchical(g, flat, reduce, node_size or default_node_size(g.size), piece)
    if op == "avg":
        flat.div_(g.size)
    if copied:
        tensor.copy_(flat.view(tensor.shape))
    return tensor


def reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor,
    op: str = "sum",
    group: Any = None,
    *,
    check: bool = True,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> torch.Tensor:
    """Like ``dist.reduce_scatter_tensor(output, input, op)``: ``input`` holds p equal chunks (flattened,
    numel == p * output.numel()); rank r's ``output`` receives the reduction of chunk r. Ring algorithm,
    p-1 steps of n/p bytes. ``input`` is not modified. Returns ``output``."""
    op = _norm_op(op)
    _check_op(op)
    _check_tensor("output", output, op)
    _check_tensor("input", input, op)
    if output.dtype != input.dtype:
        raise TypeError(f"output: dtype {output.dtype} differs from input dtype {input.dtype}")
    g = _Group(group)
    if input.numel() != g.size * output.numel():
        raise ValueError(
            f"input: numel {input.numel()} must equal world_size ({g.size}) * output.numel() "
            f"({output.numel()}); input shape {tuple(input.shape)}, output shape {tuple(output.shape)}"
        )
    if check:
        _handshake(g, "output numel, dtype, op", [output.numel(), _DTYPES.index(output.dtype), OPS.index(op)])
    work = input.contiguous().view(-1).clone()
    m = output.numel()
    if g.size > 1 and m > 0:
        segs = [(i * m, (i + 1) * m) for i in range(g.size)]
        piece = max(1, chunk_bytes // work.element_size())
        _ring(g, work, list(range(g.size)), segs, "rs", _reducer(op), piece, off=-1)
    mine = work[g.me * m : (g.me + 1) * m]
    if op == "avg":
        mine = mine / g.size
    output.copy_(mine.view(output.shape))
    return output


def all_gather(
    output: torch.Tensor | list[torch.Tensor],
    input: torch.Tensor,
    group: Any = None,
    *,
    check: bool = True,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> torch.Tensor | list[torch.Tensor]:
    """Like ``dist.all_gather_into_tensor(output, input)`` (output numel == p * input.numel(), rank r's input
    lands in chunk r) or, when ``output`` is a list of p tensors, like ``dist.all_gather(list, input)``.
    Ring algorithm, p-1 steps. Returns ``output``."""
    _check_tensor("input", input)
    g = _Group(group)
    m = input.numel()
    if isinstance(output, list | tuple):
        if len(output) != g.size:
            raise ValueError(f"output: expected a list of {g.size} tensors, got {len(output)}")
        for i, o in enumerate(output):
            _check_tensor(f"output[{i}]", o)
            if o.numel() != m:
                raise ValueError(f"output[{i}]: numel {o.numel()} differs from input numel {m}")
        flat_out = torch.empty(g.size * m, dtype=input.dtype)
    else:
        _check_tensor("output", output)
        if output.dtype != input.dtype:
            raise TypeError(f"output: dtype {output.dtype} differs from input dtype {input.dtype}")
        if output.numel() != g.size * m:
            raise ValueError(
                f"output: numel {output.numel()} must equal world_size ({g.size}) * input.numel() ({m}); "
                f"output shape {tuple(output.shape)}, input shape {tuple(input.shape)}"
            )
        flat_out, copied = _flat(output)
    if check:
        _handshake(g, "input numel, dtype", [m, _DTYPES.index(input.dtype)])
    flat_out[g.me * m : (g.me + 1) * m] = input.reshape(-1)
    if g.size > 1 and m > 0:
        segs = [(i * m, (i + 1) * m) for i in range(g.size)]
        _ring(
            g, flat_out, list(range(g.size)), segs, "ag", None, max(1, chunk_bytes // flat_out.element_size()), off=-1
        )
    if isinstance(output, list | tuple):
        for i, o in enumerate(output):
            o.copy_(flat_out[i * m : (i + 1) * m].view(o.shape))
    elif copied:
        output.copy_(flat_out.view(output.shape))
    return output


def broadcast(
    tensor: torch.Tensor,
    src: int = 0,
    group: Any = None,
    algorithm: str = "tree",
    *,
    check: bool = True,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> torch.Tensor:
    """Like ``dist.broadcast(tensor, src)`` (``src`` is the rank within ``group``): in place on every rank.

    algorithm "tree": binomial tree, ceil(log2 p) rounds of n bytes. "ring": pipelined chain src -> src+1 -> ...,
    pieces of ``chunk_bytes``: (p - 2 + n/piece) piece-times, better for large n.
    """
    _check_algorithm(algorithm, ("tree", "ring"))
    _check_tensor("tensor", tensor)
    g = _Group(group)
    if not is_int(src) or not 0 <= src < g.size:
        raise ValueError(f"src: expected a rank in [0, {g.size}), got {src!r}")
    src = int(src)
    if check:
        _handshake(g, "tensor numel, dtype, src", [tensor.numel(), _DTYPES.index(tensor.dtype), src])
    if g.size == 1 or tensor.numel() == 0:
        return tensor
    flat, copied = _flat(tensor)
    if algorithm == "tree":
        _binomial_bcast(g, flat, src, tag=0)
    else:
        vr = (g.me - src) % g.size
        pieces = _pieces(0, flat.numel(), max(1, chunk_bytes // flat.element_size()))
        sends = []
        for j, (a, b) in enumerate(pieces):
            if vr > 0:
                g.irecv(flat[a:b], (g.me - 1) % g.size, j).wait()
            if vr < g.size - 1:
                sends.append(g.isend(flat[a:b], (g.me + 1) % g.size, j))
        for w in sends:
            w.wait()
    if copied:
        tensor.copy_(flat.view(tensor.shape))
    return tensor
