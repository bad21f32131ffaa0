"""Megatron-style tensor parallelism (Shoeybi et al., 2019) over the t ranks of ``group``.

Two conjugate operators make a split layer exact:

    f  (copy to the TP region)      forward: identity          backward: all-reduce (sum) of the input gradient
    g  (reduce from the TP region)  forward: all-reduce (sum)  backward: identity

``ColumnParallelLinear`` splits W (out x in) by output rows: rank r computes Y_r = X W_r^T + b_r (f in front,
because every rank's X receives a partial input gradient W_r^T dY_r that must be summed). ``gather_output``
all-gathers the Y_r along the last dimension (backward: keep own slice). ``RowParallelLinear`` splits W by input
columns: rank r computes X_r W_r^T, partial sums that g all-reduces; the bias is added once, after the reduction.
An MLP Column(gather_output=False) -> GeLU -> Row(input_is_parallel=True) and an attention block (q/k/v split by
heads, output projection split by rows) each need exactly one all-reduce forward and one backward, so a
transformer layer costs 2 + 2 all-reduces of b·s·h elements per step (``allreduces_per_layer``).

Weights are initialised like ``nn.Linear`` on the full matrix (same RNG on every rank) and sliced, so a TP layer
built after ``torch.manual_seed(s)`` equals the dense layer built after the same seed; ``from_linear`` slices an
existing dense layer.

Every rank must feed the same input shape (batch included): the outermost TP call (a layer, ``ParallelMLP``,
``ParallelSelfAttention``, ``copy_to_tp``/``reduce_from_tp``) handshakes the input's dims and dtype once per
forward (one all-reduce of 20 int64, ``check_input_across_ranks``); a mismatch raises ValueError on every rank
naming the dimension and each rank's value instead of aborting inside gloo. Backward shapes follow from forward.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..dist import all_gather, all_reduce
from ..dist.collectives import check_same_across_ranks
from ..dist.counters import Counters

COUNTS = Counters("all_reduce", "all_gather")


def reset_counts() -> None:
    """Zero the per-process counters of ``collective_counts``."""
    COUNTS.reset()


def collective_counts() -> dict[str, int]:
    """Collectives issued by the tensor-parallel operators in this process since ``reset_counts()``."""
    return COUNTS.snapshot()


def allreduces_per_layer(forward: bool = True, backward: bool = True) -> int:
    """All-reduces per transformer layer (attention + MLP) with Megatron TP: one per block and direction."""
    return 2 * int(forward) + 2 * int(backward)


def _tp(group: Any) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tensor parallel layers need torch.distributed: run inside tl.dist.launch(...) or torchrun")
    return dist.get_world_size(group), dist.get_rank(group)


def _allreduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    out = x.contiguous().clone()
    COUNTS["all_reduce"] += 1
    all_reduce(out, op="sum", algorithm="ring", group=group, check=False)
    return out


def _gather_last(x: torch.Tensor, group: Any) -> torch.Tensor:
    t, _ = _tp(group)
    parts = [torch.empty_like(x) for _ in range(t)]
    COUNTS["all_gather"] += 1
    all_gather(parts, x.contiguous(), group=group, check=False)
    return torch.cat(parts, dim=-1)


def _my_slice(x: torch.Tensor, group: Any) -> torch.Tensor:
    t, r = _tp(group)
    n = x.shape[-1]
    if n % t:
        raise ValueError(f"input: last dimension {n} (shape {tuple(x.shape)}) is not divisible by the TP size {t}")
    return x.narrow(-1, r * (n // t), n // t).contiguous()


_MAX_DIMS = 8
_TLS = threading.local()
_DTYPE_CODES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def check_input_across_ranks(x: torch.Tensor, group: Any = None, who: str = "tensor parallel") -> None:
    """Collective: every TP rank must feed the same input shape and dtype (the batch included). The collectives of
    the TP operators run unchecked, and a size mismatch inside gloo aborts the rank; this one all-reduce of 20 int64
    makes every rank raise ValueError naming the first differing dimension and each rank's value instead."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(x).__name__}")
    shape = list(x.shape)
    if len(shape) > _MAX_DIMS:  # fold leading dimensions: fixed-size message, numel still compared
        shape = [math.prod(shape[: len(shape) - _MAX_DIMS + 1]), *shape[len(shape) - _MAX_DIMS + 1 :]]
    shape += [-1] * (_MAX_DIMS - len(shape))
    code = _DTYPE_CODES.index(x.dtype) if x.dtype in _DTYPE_CODES else 99
    fields = [("input.dim()", x.dim()), ("input.dtype", code)]
    fields += [(f"input.shape[{d}]" + (" (the batch)" if d == 0 else ""), n) for d, n in enumerate(shape)]

    def show(i: int, v: int) -> str:
        if i == 1:
            return str(_DTYPE_CODES[v]) if v < len(_DTYPE_CODES) else f"dtype code {v}"
        return "(no such dimension)" if i >= 2 and v == -1 else str(v)

    check_same_across_ranks(f"{who} input (shape {tuple(x.shape)} here)", fields, group, show, count_first=False)


@contextlib.contextmanager
def _entry(x: torch.Tensor, group: Any, who: str) -> Iterator[None]:
    """Check the input once per outermost TP call (nested TP modules see shapes derived from it)."""
    if getattr(_TLS, "inside", False):
        yield
        return
    check_input_across_ranks(x, group, who)
    _TLS.inside = True
    try:
        yield
    finally:
        _TLS.inside = False


class _CopyToTP(torch.autograd.Function):  # f
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _allreduce(g, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):  # g
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        return _allreduce(x, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _gather_last(x, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _my_slice(g, ctx.group), None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _my_slice(x, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _gather_last(g, ctx.group), None


def copy_to_tp(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """f: identity forward, all-reduce of the gradient backward."""
    with _entry(x, group, "copy_to_tp"):
        return _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """g: all-reduce forward, identity backward."""
    with _entry(x, group, "reduce_from_tp"):
        return _ReduceFromTP.apply(x, group)


def _dense_init(out_features: int, in_features: int, bias: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """nn.Linear's initialisation of the full matrix (kaiming_uniform(a=sqrt(5)), bias U(±1/sqrt(in)))."""
    w = torch.empty(out_features, in_features)
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    b = None
    if bias:
        bound = 1 / math.sqrt(in_features) if in_features > 0 else 0
        b = torch.empty(out_features).uniform_(-bound, bound)
    return w, b


def _check_dims(in_features: int, out_features: int) -> None:
    for name, v in (("in_features", in_features), ("out_features", out_features)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")


class ColumnParallelLinear(nn.Module):
    """Y = X W^T + b with W split by output rows: rank r holds rows [r·out/t, (r+1)·out/t)."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, gather_output: bool = True, group: Any = None
    ) -> None:
        super().__init__()
        _check_dims(in_features, out_features)
        t, r = _tp(group)
        if out_features % t:
            raise ValueError(f"out_features: {out_features} is not divisible by the tensor-parallel size {t}")
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.group = gather_output, group
        self.tp_size, self.tp_rank = t, r
        w, b = _dense_init(out_features, in_features, bias)
        self._load_dense(w, b)

    def _load_dense(self, w: torch.Tensor, b: torch.Tensor | None) -> None:
        k = self.out_features // self.tp_size
        rows = slice(self.tp_rank * k, (self.tp_rank + 1) * k)
        self.weight = nn.Parameter(w.detach()[rows].clone())
        self.bias = nn.Parameter(b.detach()[rows].clone()) if b is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, gather_output: bool = True, group: Any = None) -> ColumnParallelLinear:
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, gather_output, group)
        m._load_dense(linear.weight, linear.bias)
        return m

    def local_forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's output slice, without the f operator (for callers that applied f once for several layers)."""
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"input: last dimension must be in_features={self.in_features}, got shape {tuple(x.shape)}"
            )
        with _entry(x, self.group, "ColumnParallelLinear"):
            y = self.local_forward(copy_to_tp(x, self.group))
            return _GatherFromTP.apply(y, self.group) if self.gather_output else y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features} (local {self.weight.shape[0]}), "
            f"tp={self.tp_size}, gather_output={self.gather_output}"
        )


class RowParallelLinear(nn.Module):
    """Y = X W^T + b with W split by input columns: rank r holds columns [r·in/t, (r+1)·in/t); the partial
    products are summed by an all-reduce and the (replicated) bias is added after it."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        input_is_parallel: bool = False,
        group: Any = None,
    ) -> None:
        super().__init__()
        _check_dims(in_features, out_features)
        t, r = _tp(group)
        if in_features % t:
            raise ValueError(f"in_features: {in_features} is not divisible by the tensor-parallel size {t}")
        self.in_features, self.out_features, self.input_is_parallel, self.group = (
            in_features,
            out_features,
            input_is_parallel,
            group,
        )
        self.tp_size, self.tp_rank = t, r
        w, b = _dense_init(out_features, in_features, bias)
        self._load_dense(w, b)

    def _load_dense(self, w: torch.Tensor, b: torch.Tensor | None) -> None:
        k = self.in_features // self.tp_size
        self.weight = nn.Parameter(w.detach()[:, self.tp_rank * k : (self.tp_rank + 1) * k].clone())
        self.bias = nn.Parameter(b.detach().clone()) if b is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, input_is_parallel: bool = False, group: Any = None) -> RowParallelLinear:
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, input_is_parallel, group)
        m._load_dense(linear.weight, linear.bias)
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = self.in_features // self.tp_size
        if self.input_is_parallel:
            if x.shape[-1] != local:
                raise ValueError(
                    f"input: input_is_parallel=True expects last dimension in_features/tp={local}, got {tuple(x.shape)}"
                )
        elif x.shape[-1] != self.in_features:
            raise ValueError(
                f"input: last dimension must be in_features={self.in_features}, got shape {tuple(x.shape)}"
            )
        with _entry(x, self.group, "RowParallelLinear"):
            if not self.input_is_parallel:
                x = _ScatterToTP.apply(x, self.group)
            y = reduce_from_tp(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features} (local {self.weight.shape[1]}), out_features={self.out_features}, "
            f"tp={self.tp_size}, input_is_parallel={self.input_is_parallel}"
        )


class DenseMLP(nn.Module):
    """The single-process reference: fc1 -> GeLU -> fc2."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class ParallelMLP(nn.Module):
    """Column(gather_output=False) -> GeLU -> Row(input_is_parallel=True): one all-reduce forward, one backward."""

    def __init__(self, dense: DenseMLP, group: Any = None) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear.from_linear(dense.fc1, gather_output=False, group=group)
        self.fc2 = RowParallelLinear.from_linear(dense.fc2, input_is_parallel=True, group=group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with _entry(x, self.fc1.group, "ParallelMLP"):
            return self.fc2(F.gelu(self.fc1(x)))


class DenseSelfAttention(nn.Module):
    """The single-process reference: multi-head self-attention with separate q/k/v/o projections."""

    def __init__(self, embed: int, n_heads: int, causal: bool = True) -> None:
        super().__init__()
        if embed % n_heads:
            raise ValueError(f"n_heads: embed={embed} is not divisible by n_heads={n_heads}")
        self.embed, self.n_heads, self.causal = embed, n_heads, causal
        self.q, self.k, self.v, self.o = (nn.Linear(embed, embed) for _ in range(4))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
        b, s, _ = q.shape
        split = [t.view(b, s, heads, -1).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(*split, is_causal=self.causal)
        return y.transpose(1, 2).reshape(b, s, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(self.attend(self.q(x), self.k(x), self.v(x), self.n_heads))


class ParallelSelfAttention(nn.Module):
    """Heads split over the TP ranks: q/k/v column-parallel (rank r computes heads [r·h/t, (r+1)·h/t)), the output
    projection row-parallel. f is applied once to x (one backward all-reduce), g once after the output projection."""

    def __init__(self, dense: DenseSelfAttention, group: Any = None) -> None:
        super().__init__()
        t, _ = _tp(group)
        if dense.n_heads % t:
            raise ValueError(f"n_heads: {dense.n_heads} heads cannot be split over {t} tensor-parallel ranks")
        self.group, self.local_heads, self.causal = group, dense.n_heads // t, dense.causal
        self.q, self.k, self.v = (
            ColumnParallelLinear.from_linear(lin, gather_output=False, group=group)
            for lin in (dense.q, dense.k, dense.v)
        )
        self.o = RowParallelLinear.from_linear(dense.o, input_is_parallel=True, group=group)
        self._attend = dense.attend.__func__  # same math as the dense module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with _entry(x, self.group, "ParallelSelfAttention"):
            x = copy_to_tp(x, self.group)
            q, k, v = self.q.local_forward(x), self.k.local_forward(x), self.v.local_forward(x)
            return self.o(self._attend(self, q, k, v, self.local_heads))


# ----------------------------------------------------------------------------------- single-process simulation
def simulate_column_parallel(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, world_size: int
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Column split in one process: rank r's output slice X W_r^T + b_r for each r, and their concatenation
    along the last dimension (what ``gather_output=True`` returns)."""
    if weight.shape[0] % world_size:
        raise ValueError(f"weight: {weight.shape[0]} output rows are not divisible by world_size={world_size}")
    k = weight.shape[0] // world_size
    parts = [
        F.linear(x, weight[r * k : (r + 1) * k], None if bias is None else bias[r * k : (r + 1) * k])
        for r in range(world_size)
    ]
    return parts, torch.cat(parts, dim=-1)


def simulate_row_parallel(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, world_size: int
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Row split in one process: rank r's partial product X_r W_r^T (X_r = its slice of the input's last dim)
    and their sum (the all-reduce) plus the bias, added once."""
    if weight.shape[1] % world_size:
        raise ValueError(f"weight: {weight.shape[1]} input columns are not divisible by world_size={world_size}")
    k = weight.shape[1] // world_size
    parts = [F.linear(x[..., r * k : (r + 1) * k], weight[:, r * k : (r + 1) * k]) for r in range(world_size)]
    total = torch.stack(parts).sum(0)
    return parts, total + bias if bias is not None else total
