"""Mixture of experts (Switch / GShard): a router picks ``top_k`` of ``num_experts`` feed-forward experts per token.

    logits = x W_r^T                      [T, E]   (router: Linear(d_model, E, bias=False))
    probs  = softmax(logits)              [T, E]
    top-k experts per token               (ties: the lower expert index first)
    gates  = probs[t, e_j]                top-1: the raw probability (Switch); top-2: renormalised g_j / (g_1 + g_2)
    y_t    = sum_j gates_tj * expert_{e_j}(x_t)        expert(x) = gelu(x W1_e + b1_e) W2_e + b2_e

Capacity (``dropless=False``): each expert has C = ceil(capacity_factor * T * top_k / E) slots. Slots are
handed out GShard-style: every token's first choice (in token order) before any second choice, so a second choice
never evicts a first. An assignment past slot C is dropped: that expert contributes 0 to the token (the residual
connection is the caller's). The kept tokens are copied into a padded buffer [E, C, d_model] and the experts run
as one batched matmul over it.

Dropless (``dropless=True``): no capacity; the T * top_k assignments are sorted by expert (stable, so in token
order inside a group) and a grouped GEMM runs one matmul per non-empty group of variable size (``grouped_linear``).

Auxiliary losses (scalars, differentiable; in ``moe.l_aux`` after forward, for the caller to add to its loss):

    switch balance loss   E * sum_e f_e * P_e     f_e = fraction of tokens whose FIRST choice is e (a count, no
                                                  gradient; GShard's m_e), P_e = mean router probability of e
    router z-loss         mean_t logsumexp(logits_t)^2     (ST-MoE)
    l_aux = aux_loss_coef * balance + z_loss_coef * z

Under uniform routing the balance loss is 1; it is minimised when f and P are both uniform.

``last_stats`` after forward: tokens_per_expert (assignments routed to each expert, before the capacity cut),
processed_per_expert, capacity (None when dropless), dropped (assignments cut), dropped_fraction (of T*top_k),
max_load / mean_load (of tokens_per_expert) and their ratio ``load_imbalance`` (1.0 = perfectly balanced).

The routing itself (``route``) is plain numpy on the probabilities and is shared with the torch expert-parallel
version in ``tinylearn.parallel.moe_parallel``, so both pick the same experts and slots for the same inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._inputs import as_int, is_int, is_real
from ..autograd.function import Function
from ..autograd.ops_index import index_add_rows
from ..autograd.tensor import Tensor
from . import functional as F
from .module import Module
from .parameter import Parameter

__all__ = ["MoE", "moe_ffn", "route", "Routing", "grouped_linear", "capacity"]

AUX_LOSSES = ("switch", "none")


def _check_config(num_experts: Any, top_k: Any, capacity_factor: Any, aux_loss: Any = "switch") -> None:
    if not is_int(num_experts) or num_experts < 1:
        raise ValueError(f"num_experts: expected an int >= 1, got {num_experts!r}")
    if not is_int(top_k) or top_k not in (1, 2):
        raise ValueError(f"top_k: expected 1 or 2 (Switch or GShard routing), got {top_k!r}")
    if top_k > num_experts:
        raise ValueError(f"top_k: {top_k} is more than num_experts={num_experts}")
    if not is_real(capacity_factor) or not math.isfinite(capacity_factor) or capacity_factor <= 0:
        raise ValueError(f"capacity_factor: expected a finite number > 0, got {capacity_factor!r}")
    if aux_loss not in AUX_LOSSES:
        raise ValueError(f"aux_loss: expected one of {AUX_LOSSES}, got {aux_loss!r}")


def capacity(tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: C = ceil(capacity_factor * tokens * top_k / num_experts) (at least 1)."""
    tokens, num_experts = as_int(tokens, "tokens", min=0), as_int(num_experts, "num_experts", min=1)
    top_k = as_int(top_k, "top_k", min=1)
    if not is_real(capacity_factor) or not math.isfinite(capacity_factor) or capacity_factor <= 0:
        raise ValueError(f"capacity_factor: expected a finite number > 0, got {capacity_factor!r}")
    return max(1, math.ceil(capacity_factor * tokens * top_k / num_experts - 1e-9))


@dataclass
class Routing:
    """Where every (token t, choice j) assignment goes. Arrays are [T, top_k] unless noted."""

    expert: np.ndarray  # int64 expert index, choice 0 = most probable
    position: np.ndarray  # int64 slot inside the expert's queue (GShard priority: all first choices first)
    keep: np.ndarray  # bool: position < capacity (all True when dropless)
    counts: np.ndarray  # [E] int64 assignments routed to each expert (before the capacity cut)
    first_counts: np.ndarray  # [E] int64 tokens whose first choice is each expert (the balance loss's f_e * T)
    capacity: int | None


def route(probs: np.ndarray, top_k: int, cap: int | None) -> Routing:
    """Top-k experts per token and their queue positions; ``cap`` None = dropless."""
    if probs.ndim != 2:
        raise ValueError(f"probs: expected [tokens, experts], got shape {probs.shape}")
    t, e = probs.shape
    expert = np.argsort(-probs, axis=1, kind="stable")[:, :top_k].astype(np.int64)
    flat = expert.T.reshape(-1)  # choice-major: every first choice (token order), then every second choice
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=e).astype(np.int64)
    starts = np.cumsum(counts) - counts
    pos_flat = np.empty_like(flat)
    pos_flat[order] = np.arange(flat.size, dtype=np.int64) - starts[flat[order]]
    position = pos_flat.reshape(top_k, t).T.copy()
    keep = np.ones_like(position, dtype=bool) if cap is None else position < cap
    first = np.bincount(expert[:, 0], minlength=e).astype(np.int64)
    return Routing(expert, position, keep, counts, first, cap)


# ------------------------------------------------------------------------------------------- differentiable cores
class _ScatterRows(Function):
    """out = zeros(n, d); out[index[i]] += rows[i]  (dispatch into expert slots, combine back into tokens)."""

    @staticmethod
    def forward(ctx: Any, rows: np.ndarray, index: np.ndarray, n: int) -> np.ndarray:
        ctx.index = index
        out = np.zeros((n, rows.shape[1]), dtype=rows.dtype)
        index_add_rows(out, index, rows)
        return out

    @staticmethod
    def backward(ctx: Any, g: np.ndarray) -> tuple[np.ndarray, None, None]:
        return g[ctx.index], None, None


def _check_offsets(offsets: np.ndarray, n: int, e: int) -> np.ndarray:
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.shape != (e + 1,) or offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
        raise ValueError(f"offsets: expected {e + 1} non-decreasing group starts from 0 to {n}, got {offsets.tolist()}")
    return offsets


class _GroupedLinear(Function):
    """y[o_e:o_{e+1}] = x[o_e:o_{e+1}] @ w[e] + b[e]: one GEMM per non-empty group of rows."""

    @staticmethod
    def forward(ctx: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        ctx.save_for_backward(x, w)
        ctx.offsets = offsets
        y = np.empty((x.shape[0], w.shape[2]), dtype=np.result_type(x, w))
        for e in range(w.shape[0]):
            lo, hi = offsets[e], offsets[e + 1]
            if hi > lo:
                np.matmul(x[lo:hi], w[e], out=y[lo:hi])
                y[lo:hi] += b[e]
        return y

    @staticmethod
    def backward(ctx: Any, g: np.ndarray) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        off = ctx.offsets
        gx = np.zeros_like(x) if ctx.needs_input_grad[0] else None
        gw = np.zeros_like(w) if ctx.needs_input_grad[1] else None
        gb = np.zeros((w.shape[0], w.shape[2]), dtype=g.dtype) if ctx.needs_input_grad[2] else None
        for e in range(w.shape[0]):
            lo, hi = off[e], off[e + 1]
            if hi == lo:
                continue
            if gx is not None:
                gx[lo:hi] = g[lo:hi] @ w[e].T
            if gw is not None:
                gw[e] = x[lo:hi].T @ g[lo:hi]
            if gb is not None:
                gb[e] = g[lo:hi].sum(0)
        return gx, gw, gb, None


def grouped_linear(x: Tensor, weight: Tensor, bias: Tensor, offsets: np.ndarray) -> Tensor:
    """Grouped GEMM over variable-size row groups: rows offsets[e]:offsets[e+1] of ``x`` [N, d_in] use
    ``weight[e]`` [d_in, d_out] and ``bias[e]`` [d_out]. Differentiable in x, weight and bias."""
    if x.ndim != 2 or weight.ndim != 3 or bias.ndim != 2:
        raise ValueError(f"x/weight/bias: expected 2-D/3-D/2-D, got shapes {x.shape}, {weight.shape}, {bias.shape}")
    if x.shape[1] != weight.shape[1] or bias.shape != (weight.shape[0], weight.shape[2]):
        raise ValueError(f"x/weight/bias: shapes {x.shape}, {weight.shape}, {bias.shape} do not match")
    off = _check_offsets(offsets, x.shape[0], weight.shape[0])
    return _GroupedLinear.apply(x, weight, bias, off)


# ------------------------------------------------------------------------------------------------ functional MoE
def moe_ffn(
    x: Tensor,
    router_weight: Tensor,
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
    top_k: int = 1,
    capacity_factor: float = 1.25,
    dropless: bool = False,
) -> tuple[Tensor, Tensor, Tensor, dict[str, Any]]:
    """The MoE layer as a function of its weights: returns (y, balance_loss, z_loss, stats), y shaped like x.

    router_weight [E, d_model]; w1 [E, d_model, d_ff]; b1 [E, d_ff]; w2 [E, d_ff, d_model]; b2 [E, d_model]."""
    e, d = router_weight.shape
    _check_config(e, top_k, capacity_factor)
    if x.ndim < 1 or x.shape[-1] != d:
        raise ValueError(f"input: last dimension must be d_model={d}, got shape {x.shape}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, d)
    t = x2.shape[0]
    logits = x2 @ router_weight.T
    probs = F.softmax(logits, -1)
    cap = None if dropless else capacity(t, e, top_k, capacity_factor)
    r = route(probs.data, top_k, cap)
    gates = probs[np.arange(t)[:, None], r.expert] if t else probs[:, :top_k]
    if top_k == 2:
        gates = gates / gates.sum(-1, keepdim=True)
    tok, choice = np.nonzero(r.keep)  # kept assignments, token-major
    ex = r.expert[tok, choice]
    if dropless:
        order = np.argsort(ex, kind="stable")
        tok, choice, ex = tok[order], choice[order], ex[order]
        offsets = np.concatenate([[0], np.cumsum(np.bincount(ex, minlength=e))]).astype(np.int64)
        h = grouped_linear(x2[tok], w1, b1, offsets).gelu()
        out_rows = grouped_linear(h, w2, b2, offsets)
    else:
        slot = ex * cap + r.position[tok, choice]
        buf = _ScatterRows.apply(x2[tok], slot, e * cap).reshape(e, cap, d)
        h = (buf @ w1 + b1.unsqueeze(1)).gelu()
        out = (h @ w2 + b2.unsqueeze(1)).reshape(e * cap, d)
        out_rows = out[slot]
    y = _ScatterRows.apply(out_rows * gates[tok, choice].unsqueeze(-1), tok, t)
    f = r.first_counts.astype(probs.dtype) / max(t, 1)
    balance = (probs.mean(0) * Tensor(f, dtype=f.dtype)).sum() * float(e) if t else probs.sum() * 0.0
    z = (logits.logsumexp(-1) ** 2).mean() if t else logits.sum() * 0.0
    kept = int(r.keep.sum())
    n = t * top_k
    mean_load = n / e
    stats = {
        "tokens": t,
        "top_k": top_k,
        "capacity": cap,
        "tokens_per_expert": r.counts.tolist(),
        "processed_per_expert": np.bincount(ex, minlength=e).tolist(),
        "dropped": n - kept,
        "dropped_fraction": (n - kept) / n if n else 0.0,
        "max_load": int(r.counts.max()) if e else 0,
        "mean_load": mean_load,
        "load_imbalance": float(r.counts.max() / mean_load) if n else 1.0,
    }
    return y.reshape(*lead, d), balance, z, stats


class MoE(Module):
    """Mixture-of-experts feed-forward layer (see the module docstring): ``y = moe(x)``, y shaped like x [..., d].

    After forward: ``l_aux`` (aux_loss_coef * balance + z_loss_coef * z-loss, a differentiable scalar to add to the
    training loss; 0 when aux_loss="none" and z_loss_coef=0), ``balance_loss``, ``z_loss`` and ``last_stats``."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        num_experts: int,
        top_k: int = 1,
        capacity_factor: float = 1.25,
        aux_loss: str = "switch",
        z_loss_coef: float = 0.0,
        dropless: bool = False,
        aux_loss_coef: float = 1e-2,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        for name, v in (("d_model", d_model), ("d_ff", d_ff)):
            if not is_int(v) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        _check_config(num_experts, top_k, capacity_factor, aux_loss)
        for name, v in (("z_loss_coef", z_loss_coef), ("aux_loss_coef", aux_loss_coef)):
            if not is_real(v) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name}: expected a finite number >= 0, got {v!r}")
        self.d_model, self.d_ff, self.num_experts, self.top_k = int(d_model), int(d_ff), int(num_experts), int(top_k)
        self.capacity_factor, self.aux_loss_kind, self.dropless = float(capacity_factor), aux_loss, bool(dropless)
        self.z_loss_coef, self.aux_loss_coef = float(z_loss_coef), float(aux_loss_coef)
        from ..autograd.factory import get_rng

        rng = get_rng()
        e = self.num_experts

        def uni(shape: tuple[int, ...], fan_in: int) -> Parameter:
            bound = 1.0 / math.sqrt(fan_in)
            return Parameter(rng.uniform(-bound, bound, size=shape).astype(dtype))

        self.router_weight = uni((e, d_model), d_model)  # Linear(d_model, E, bias=False).weight
        self.w1 = uni((e, d_model, d_ff), d_model)
        self.b1 = uni((e, d_ff), d_model)
        self.w2 = uni((e, d_ff, d_model), d_ff)
        self.b2 = uni((e, d_model), d_ff)
        self.l_aux: Tensor | None = None
        self.balance_loss: Tensor | None = None
        self.z_loss: Tensor | None = None
        self.last_stats: dict[str, Any] = {}

    def forward(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"input: expected a tl.Tensor, got {type(x).__name__}")
        y, bal, z, stats = moe_ffn(
            x, self.router_weight, self.w1, self.b1, self.w2, self.b2, self.top_k, self.capacity_factor, self.dropless
        )
        self.balance_loss, self.z_loss, self.last_stats = bal, z, stats
        l_aux = bal * (self.aux_loss_coef if self.aux_loss_kind == "switch" else 0.0)
        self.l_aux = l_aux + z * self.z_loss_coef
        return y

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_ff={self.d_ff}, num_experts={self.num_experts}, top_k={self.top_k}, "
            f"capacity_factor={self.capacity_factor}, aux_loss={self.aux_loss_kind!r}, z_loss_coef={self.z_loss_coef}, "
            f"dropless={self.dropless}"
        )
