"""The process group every ``tl.dist`` collective runs on: argument validation, the group wrapper whose
point-to-point requests name the peer when it dies or hangs, and the cross-rank size handshake.

``_Group`` maps group-local ranks to global ranks and wraps ``dist.isend/irecv`` in ``_Work`` objects whose
``wait()`` raises ``peer_failure(...)`` (a RuntimeError naming this rank, the peer and the cause). ``_handshake``
is the one MAX all-reduce of [v, -v, ...] every collective starts with; ``check_same_across_ranks`` and
``check_params_across_ranks`` offer it to wrappers (DDP, ZeRO, TP, pipeline) whose later collectives run unchecked.
The collectives themselves are in ``tinylearn.dist.collectives``, the all-reduce algorithms in
``tinylearn.dist.allreduce_algorithms``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

ALGORITHMS = ("ring", "tree", "recursive_doubling", "halving_doubling", "hierarchical")
OPS = ("sum", "max", "min", "avg")
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
        return self._post(dist.isend, t, peer, tag, "send to")

    def irecv(self, t: torch.Tensor, peer: int, tag: int) -> _Work:
        return self._post(dist.irecv, t, peer, tag, "receive from")

    def _post(self, op: Callable[..., Any], t: torch.Tensor, peer: int, tag: int, verb: str) -> _Work:
        """Post a point-to-point request; posting raises too when the peer is already gone (gloo: 'Connection closed
        by peer'), and gets the same named error as a failed wait."""
        try:
            work = op(t, self.ranks[peer], group=self.group, tag=tag)
        except RuntimeError as e:
            raise peer_failure(f"{verb} {self.name(peer)}", self.name(self.me), e) from e
        return _Work(work, self, verb, peer)

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
