"""Megatron sequence parallelism (Korthikanti et al., 2022) around ``ColumnParallelLinear`` / ``RowParallelLinear``.

Plain tensor parallelism keeps LayerNorm and dropout replicated: every rank holds the full [b, s, H] activation
there. Sequence parallelism shards those regions along the sequence ([b, s/P, H] per rank) and rewrites the two
conjugate TP operators:

    TP:  f = identity fwd / all-reduce bwd        g = all-reduce fwd / identity bwd
    SP:  g' = all-gather(seq) fwd / reduce-scatter(seq) bwd   (``gather_from_sp``, in front of the Column layer)
         r' = reduce-scatter(seq) fwd / all-gather(seq) bwd   (``reduce_scatter_to_sp``, after the Row layer)

A ring all-reduce is a reduce-scatter followed by an all-gather, so both versions send the same bytes per rank
(2·(P-1)/P·b·s·H elements per direction per block), while the LayerNorm region's activations shrink by P.

Parameters used inside the sequence-sharded region (LayerNorm weight/bias, the Row layer's bias, added after the
reduce-scatter) see only this rank's tokens: their gradients are partial sums, and ``allreduce_sp_grads()`` sums
them over the group after backward (Megatron does the same for its ``sequence_parallel`` parameters). That is the
one extra collective of SP: 3·H elements, next to the b·s·H activations.

``SequenceParallelMLP`` (LN -> Column -> GeLU -> Row) equals ``nn.LayerNorm`` + ``DenseMLP`` on the full sequence
(forward, input gradient, parameter gradients) up to fp32 summation order. The sequence must split evenly: a
length not divisible by the world size raises ValueError naming seq and world size (no padding).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .._inputs import as_int
from ..dist import all_gather, all_reduce, reduce_scatter
from ..dist.collectives import check_same_across_ranks
from ..dist.counters import Counters
from .tensor_parallel import ColumnParallelLinear, DenseMLP, RowParallelLinear

__all__ = [
    "SequenceParallelMLP",
    "gather_from_sp",
    "reduce_scatter_to_sp",
    "reset_sp_counts",
    "sp_bytes",
    "sp_counts",
]

COUNTS = Counters("all_gather", "reduce_scatter", "all_reduce")


def reset_sp_counts() -> None:
    """Zero the per-process counters of ``sp_counts``."""
    COUNTS.reset()


def sp_counts() -> dict[str, int]:
    """Collectives issued by the sequence-parallel operators in this process since ``reset_sp_counts()``."""
    return COUNTS.snapshot()


def _world(group: Any) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("sequence parallelism needs torch.distributed: run inside tl.dist.launch(...) or torchrun")
    return dist.get_world_size(group), dist.get_rank(group)


def _gather_seq(x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
    p, _ = _world(group)
    parts = [torch.empty_like(x) for _ in range(p)]
    COUNTS["all_gather"] += 1
    all_gather(parts, x.contiguous(), group=group, check=False)
    return torch.cat(parts, dim=dim)


def _reduce_scatter_seq(x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
    p, _ = _world(group)
    n = x.shape[dim]
    if n % p:
        raise ValueError(f"seq: length {n} (dim {dim} of shape {tuple(x.shape)}) is not divisible by world size {p}")
    front = x.movedim(dim, 0).contiguous()  # sequence chunks become contiguous flat segments
    out = torch.empty((n // p, *front.shape[1:]), dtype=x.dtype)
    COUNTS["reduce_scatter"] += 1
    reduce_scatter(out, front, op="sum", group=group, check=False)
    return out.movedim(0, dim)


class _GatherFromSP(torch.autograd.Function):  # all-gather fwd <-> reduce-scatter bwd
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:  # type: ignore[override]
        ctx.group, ctx.dim = group, dim
        return _gather_seq(x, group, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return _reduce_scatter_seq(grad, ctx.group, ctx.dim), None, None


class _ReduceScatterToSP(torch.autograd.Function):  # reduce-scatter fwd <-> all-gather bwd
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:  # type: ignore[override]
        ctx.group, ctx.dim = group, dim
        return _reduce_scatter_seq(x, group, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return _gather_seq(grad.contiguous(), ctx.group, ctx.dim), None, None


def gather_from_sp(x: torch.Tensor, group: Any = None, dim: int = 1) -> torch.Tensor:
    """All-gather the sequence shards along ``dim`` (backward: reduce-scatter of the gradient)."""
    return _GatherFromSP.apply(x, group, dim)


def reduce_scatter_to_sp(x: torch.Tensor, group: Any = None, dim: int = 1) -> torch.Tensor:
    """Sum the ranks' partial [b, s, H] and keep this rank's sequence shard (backward: all-gather)."""
    return _ReduceScatterToSP.apply(x, group, dim)


class SequenceParallelMLP(nn.Module):
    """LayerNorm -> Column(no gather) -> GeLU -> Row on [b, s/P, H] sequence shards (input and output).

    Built from a dense ``nn.LayerNorm`` and ``DenseMLP`` (weights sliced like ``ParallelMLP``); ``dropout`` acts on
    the sequence-sharded output (p=0 by default, so it can be compared with the dense module).
    """

    def __init__(self, norm: nn.LayerNorm, dense: DenseMLP, group: Any = None, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(norm, nn.LayerNorm):
            raise TypeError(f"norm: expected an nn.LayerNorm, got {type(norm).__name__}")
        if not isinstance(dense, DenseMLP):
            raise TypeError(f"dense: expected a DenseMLP, got {type(dense).__name__}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: expected 0 <= p < 1, got {dropout!r}")
        self.group, self.dropout = group, dropout
        self.world, self.rank = _world(group)
        self.norm = nn.LayerNorm(norm.normalized_shape, eps=norm.eps)
        self.norm.load_state_dict(norm.state_dict())
        self.fc1 = ColumnParallelLinear.from_linear(dense.fc1, gather_output=False, group=group)
        self.fc2 = RowParallelLinear.from_linear(dense.fc2, input_is_parallel=True, group=group)
        self.hidden = dense.fc1.in_features

    def sp_parameters(self) -> list[nn.Parameter]:
        """Parameters whose gradients are partial per rank (used on sequence shards): LN weight/bias, Row bias."""
        ps = [self.norm.weight, self.norm.bias, self.fc2.bias]
        return [p for p in ps if p is not None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.hidden:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"input: expected [batch, seq_local, hidden={self.hidden}], got {shape}")
        check_same_across_ranks(
            f"SequenceParallelMLP input (shape {tuple(x.shape)} here)",
            [("batch", x.shape[0]), ("seq_local", x.shape[1]), ("hidden", x.shape[2])],
            self.group,
            count_first=False,
        )
        h = gather_from_sp(self.norm(x), self.group, dim=1)  # [b, s, H]
        y = F.gelu(self.fc1.local_forward(h))  # [b, s, ffn/P]
        out = reduce_scatter_to_sp(F.linear(y, self.fc2.weight), self.group, dim=1)  # [b, s/P, H]
        if self.fc2.bias is not None:
            out = out + self.fc2.bias
        return F.dropout(out, self.dropout, self.training) if self.dropout else out

    def allreduce_sp_grads(self) -> int:
        """Sum the partial gradients of ``sp_parameters()`` over the group (call after backward). Returns the
        number of elements reduced."""
        grads = [p.grad for p in self.sp_parameters() if p.grad is not None]
        if not grads:
            return 0
        flat = torch.cat([gr.reshape(-1) for gr in grads])
        COUNTS["all_reduce"] += 1
        all_reduce(flat, op="sum", algorithm="ring", group=self.group, check=False)
        off = 0
        for gr in grads:
            gr.copy_(flat[off : off + gr.numel()].view_as(gr))
            off += gr.numel()
        return flat.numel()


def sp_bytes(batch: int, seq: int, hidden: int, world_size: int, element_size: int = 4) -> dict[str, int]:
    """Activation bytes each rank sends per direction in one MLP block: TP (ring all-reduce of b·s·H) and SP
    (all-gather + reduce-scatter of b·s·H): equal, 2·(P-1)/P·b·s·H elements."""
    batch, seq, hidden = (as_int(v, n, min=1) for v, n in ((batch, "batch"), (seq, "seq"), (hidden, "hidden")))
    world_size, element_size = as_int(world_size, "world_size", min=1), as_int(element_size, "element_size", min=1)
    if seq % world_size:
        raise ValueError(f"seq: length {seq} is not divisible by world_size={world_size} (one shard per rank)")
    full = batch * seq * hidden * element_size
    per = 2 * full * (world_size - 1) // world_size
    return {"tp_fwd_bytes": per, "tp_bwd_bytes": per, "sp_fwd_bytes": per, "sp_bwd_bytes": per}
