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

Layout: ``tinylearn.dist.group`` holds the validation, the process-group wrapper and the handshake;
``tinylearn.dist.allreduce_algorithms`` the five algorithms and their schedule helpers; this module the four public
collectives (and it re-exports the names it held before the split, so ``tinylearn.dist.collectives.X`` still works).
"""

from __future__ import annotations

from typing import Any

import torch

from .._inputs import is_int
from .allreduce_algorithms import (  # noqa: F401  (re-exported: the names this module held before the split)
    _WS,
    _binomial_bcast,
    _binomial_reduce,
    _exchange,
    _hierarchical,
    _int_arg,
    _pieces,
    _recursive,
    _reducer,
    _ring,
    _workspace,
    bounds,
    default_node_size,
    hierarchical_layout,
    recursive_doubling_partner,
    ring_schedule,
)
from .group import (  # noqa: F401  (re-exported: the names this module held before the split)
    _DTYPES,
    ALGORITHMS,
    OPS,
    _check_algorithm,
    _check_initialized,
    _check_op,
    _check_tensor,
    _Group,
    _handshake,
    _norm_op,
    _Work,
    check_params_across_ranks,
    check_same_across_ranks,
    peer_failure,
)

DEFAULT_CHUNK_BYTES = 4 << 20


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
