"""Dynamic attention pruning from cross-batch statistics: drop heads and key columns [Q231].

Two statistics are kept as exponential moving averages (EMA, weight ``decay`` on the past) over the batches that
``AttentionPruner.observe`` sees (dense attention, no gradient):

* **head contribution**: the mean L2 norm of each head's output softmax(q k^T / sqrt(d)) v over batch and
  positions. A pruned head outputs 0, so the error it causes is its output: drop the heads with the smallest EMA.
* **token importance**: per key position j, the column sum of the attention probabilities (the attention mass all
  queries put on j, averaged over batch and heads) divided by the number of queries that can see j (N - j when
  causal, N otherwise), so early positions are not favoured just because more queries see them. Heavy-hitter
  positions (H2O, Zhang et al. 2023) keep a high EMA across batches.

``plan(n, keep_ratio, head_keep)`` turns the statistics into a ``PrunePlan``: the ceil(head_keep * H) heads with the
largest contribution, and ceil(keep_ratio * n) key positions: the first ``keep_first`` and last ``keep_last``
positions are never pruned (the attention sink and the most recent tokens), the rest are the highest-importance
positions. ``strategy="random"`` picks the same counts at random (the baseline the statistics must beat).

``pruned_attention(q, k, v, plan)`` computes attention only for the kept heads over the kept keys (a gathered, smaller
SDPA: FLOPs 4 * B * H_kept * N * n_kept * D instead of 4 * B * H * N * N * D, ``PrunePlan.flops``), the pruned heads'
outputs are zero. ``pruned_reference`` is the oracle: torch SDPA over all keys with a boolean mask of the kept
columns, times a 0/1 head mask. Tensors are torch [B, H, N, D]; everything is differentiable (torch autograd).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._inputs import as_int

__all__ = ["AttentionPruner", "PrunePlan", "attention_flops", "pruned_attention", "pruned_reference"]


def attention_flops(b: int, h: int, nq: int, nk: int, d: int) -> int:
    """Multiply-add FLOPs of q k^T and p v: 4 * B * H * Nq * Nk * D (softmax not counted)."""
    return 4 * as_int(b, "b") * as_int(h, "h") * as_int(nq, "nq") * as_int(nk, "nk") * as_int(d, "d")


@dataclass(frozen=True)
class PrunePlan:
    """Kept heads and kept key positions (sorted int64 tensors) for sequences of length ``n`` with ``n_heads``."""

    heads: torch.Tensor
    keys: torch.Tensor
    n: int
    n_heads: int

    def flops(self, b: int, d: int) -> int:
        return attention_flops(b, len(self.heads), self.n, len(self.keys), d)

    def dense_flops(self, b: int, d: int) -> int:
        return attention_flops(b, self.n_heads, self.n, self.n, d)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected [B, H, N, D], got shape {tuple(t.shape)}")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"k, v: shapes must equal q's {tuple(q.shape)}, got {tuple(k.shape)} and {tuple(v.shape)}")
    b, h, n, d = q.shape
    return b, h, n, d


class AttentionPruner:
    """EMA statistics of head contribution and key-position importance, and the pruning plans they give."""

    def __init__(self, n_heads: int, max_len: int, decay: float = 0.9, keep_first: int = 1, keep_last: int = 1) -> None:
        self.n_heads, self.max_len = as_int(n_heads, "n_heads"), as_int(max_len, "max_len")
        if self.n_heads < 1 or self.max_len < 1:
            raise ValueError(f"n_heads, max_len: must be >= 1, got {self.n_heads}, {self.max_len}")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay: must be in [0, 1), got {decay}")
        self.keep_first, self.keep_last = as_int(keep_first, "keep_first"), as_int(keep_last, "keep_last")
        if self.keep_first < 0 or self.keep_last < 0:
            raise ValueError(f"keep_first, keep_last: must be >= 0, got {self.keep_first}, {self.keep_last}")
        self.decay = float(decay)
        self.head_score = torch.zeros(self.n_heads, dtype=torch.float64)
        self.token_score = torch.zeros(self.max_len, dtype=torch.float64)
        self.token_seen = torch.zeros(self.max_len, dtype=torch.bool)
        self.batches = 0

    def _ema(self, old: torch.Tensor, new: torch.Tensor, first: torch.Tensor | bool) -> torch.Tensor:
        return torch.where(torch.as_tensor(first), new, self.decay * old + (1 - self.decay) * new)

    @torch.no_grad()
    def observe(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> None:
        """Update the EMAs from one batch's dense attention."""
        b, h, n, d = _check_qkv(q, k, v)
        if h != self.n_heads:
            raise ValueError(f"q: expected {self.n_heads} heads, got {h}")
        if n > self.max_len:
            raise ValueError(f"q: sequence length {n} exceeds max_len={self.max_len}")
        s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d)
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        p = torch.softmax(s, dim=-1)
        head = (p @ v.double()).norm(dim=-1).mean(dim=(0, 2))  # [H]
        seen_by = (n - torch.arange(n)).double() if causal else torch.full((n,), float(n), dtype=torch.float64)
        tok = p.sum(dim=2).mean(dim=(0, 1)) / seen_by  # [N]: mean probability a query that can see j puts on j
        self.head_score = self._ema(self.head_score, head, self.batches == 0)
        self.token_score[:n] = self._ema(self.token_score[:n], tok, ~self.token_seen[:n])
        self.token_seen[:n] = True
        self.batches += 1

    def plan(
        self, n: int, keep_ratio: float = 1.0, head_keep: float = 1.0, strategy: str = "importance", seed: int = 0
    ) -> PrunePlan:
        """Kept heads and key positions for length ``n``; first/last tokens always kept."""
        n = as_int(n, "n")
        if not 1 <= n <= self.max_len:
            raise ValueError(f"n: must be in [1, {self.max_len}], got {n}")
        if not 0.0 < keep_ratio <= 1.0:
            raise ValueError(f"keep_ratio: must be in (0, 1], got {keep_ratio}")
        if not 0.0 < head_keep <= 1.0:
            raise ValueError(f"head_keep: must be in (0, 1], got {head_keep}")
        if strategy not in ("importance", "random"):
            raise ValueError(f"strategy: expected 'importance' or 'random', got {strategy!r}")
        if strategy == "importance" and self.batches == 0:
            raise RuntimeError("plan: no statistics yet, call observe() on at least one batch first")
        g = torch.Generator().manual_seed(as_int(seed, "seed"))
        n_heads = max(1, math.ceil(head_keep * self.n_heads - 1e-9))
        hscore = self.head_score if strategy == "importance" else torch.rand(self.n_heads, generator=g).double()
        heads = torch.sort(torch.topk(hscore, n_heads, sorted=False).indices).values
        forced = torch.zeros(n, dtype=torch.bool)
        forced[: self.keep_first] = True
        if self.keep_last:
            forced[max(0, n - self.keep_last) :] = True
        n_keep = min(n, max(int(forced.sum()), math.ceil(keep_ratio * n - 1e-9), 1))
        tscore = self.token_score[:n].clone() if strategy == "importance" else torch.rand(n, generator=g).double()
        tscore[forced] = float("inf")
        keys = torch.sort(torch.topk(tscore, n_keep, sorted=False).indices).values
        return PrunePlan(heads=heads, keys=keys, n=n, n_heads=self.n_heads)


def _check_plan(plan: PrunePlan, h: int, n: int) -> None:
    if not isinstance(plan, PrunePlan):
        raise TypeError(f"plan: expected a PrunePlan, got {type(plan).__name__}")
    if plan.n != n or plan.n_heads != h:
        raise ValueError(f"plan: made for n={plan.n}, heads={plan.n_heads}; inputs have n={n}, heads={h}")


def _causal_ok(plan: PrunePlan, n: int) -> torch.Tensor:
    return plan.keys[None, :] <= torch.arange(n)[:, None]  # [N, n_kept]


def pruned_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: PrunePlan, causal: bool = False
) -> torch.Tensor:
    """Attention over the kept heads and key columns only; pruned heads output 0. [B, H, N, D]."""
    b, h, n, d = _check_qkv(q, k, v)
    _check_plan(plan, h, n)
    if causal and (len(plan.keys) == 0 or int(plan.keys[0]) != 0):
        raise ValueError("plan: causal attention needs key 0 kept (keep_first >= 1) so every query sees a key")
    qh, kh, vh = q[:, plan.heads], k[:, plan.heads][:, :, plan.keys], v[:, plan.heads][:, :, plan.keys]
    if len(plan.keys) == n:  # every column kept: the plain (causal) kernel, no mask
        oh = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    else:
        oh = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=_causal_ok(plan, n) if causal else None)
    out = q.new_zeros(b, h, n, d)
    return out.index_copy(1, plan.heads, oh)


def pruned_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: PrunePlan, causal: bool = False
) -> torch.Tensor:
    """Oracle: torch SDPA over all N keys with the pruned columns masked out, times a 0/1 head mask."""
    b, h, n, d = _check_qkv(q, k, v)
    _check_plan(plan, h, n)
    col = torch.zeros(n, dtype=torch.bool)
    col[plan.keys] = True
    ok = col[None, :].expand(n, n)
    if causal:
        ok = ok & torch.ones(n, n, dtype=torch.bool).tril()
    hm = torch.zeros(h, dtype=q.dtype)
    hm[plan.heads] = 1
    return F.scaled_dot_product_attention(q, k, v, attn_mask=ok) * hm[None, :, None, None]
