"""Attention for a batch of requests that share a K/V prefix, the prefix read once [Q211].

S requests (e.g. one system prompt, or n samples of one prompt) share the keys/values of a P-token prefix and each
has its own Ls-token suffix; each request has Lq queries (the last Lq positions of its suffix: Lq = 1 when decoding).
Per-request attention reads the prefix K/V S times: S * (P + Ls) tokens of K and V. Here the attention over the
prefix is computed **once per prefix block for all requests**: the queries of all S requests are stacked into one
[H, S * Lq, D] matrix and multiplied by each prefix block (one GEMM with S * Lq rows instead of S GEMVs), so the
prefix K/V is read once: P + S * Ls tokens.

The two parts are combined with the online-softmax (flash-attention) merge: each part j keeps, per query, its running
max m_j, its normaliser l_j = sum exp(s - m_j) and its unnormalised output o_j = sum exp(s - m_j) v; with m = max(m_1,
m_2) the result is (e^(m_1-m) o_1 + e^(m_2-m) o_2) / (e^(m_1-m) l_1 + e^(m_2-m) l_2), equal to one softmax over the
concatenated keys. Prefix blocks are merged the same way, one after the other. The suffix part is causal (query i of
Lq sits at suffix position Ls - Lq + i) when ``causal``; the whole prefix is visible to every query.

``KVReads`` counts the K/V bytes the computation reads (incremented where each block is used);
``shared_kv_bytes`` / ``per_sequence_kv_bytes`` are the formulas. ``per_sequence_attention`` is the reference: torch
SDPA per request on [prefix | suffix]. Tensors are torch (autograd works through every op).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._inputs import as_int

__all__ = [
    "KVReads",
    "materialize_kv",
    "per_sequence_attention",
    "per_sequence_kv_bytes",
    "shared_kv_bytes",
    "shared_prefix_attention",
]


@dataclass
class KVReads:
    """Counter of K/V bytes read: ``prefix`` and ``suffix`` parts (incremented by ``shared_prefix_attention``)."""

    prefix: int = 0
    suffix: int = 0

    @property
    def total(self) -> int:
        return self.prefix + self.suffix


def _check(
    q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor, causal: bool
) -> tuple[int, int, int, int, int, int]:
    for name, t, nd in (
        ("q", q, 4),
        ("k_prefix", kp, 3),
        ("v_prefix", vp, 3),
        ("k_suffix", ks, 4),
        ("v_suffix", vs, 4),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != nd:
            want = "[S, H, L, D]" if nd == 4 else "[H, P, D]"
            raise ValueError(f"{name}: expected {want}, got shape {tuple(t.shape)}")
    s, h, lq, d = q.shape
    if lq < 1:
        raise ValueError(f"q: needs >= 1 query per sequence, got shape {tuple(q.shape)}")
    if kp.shape != vp.shape or kp.shape[0] != h or kp.shape[2] != d:
        raise ValueError(f"k_prefix, v_prefix: expected [{h}, P, {d}], got {tuple(kp.shape)} and {tuple(vp.shape)}")
    if ks.shape != vs.shape or ks.shape[:2] != (s, h) or ks.shape[3] != d:
        raise ValueError(
            f"k_suffix, v_suffix: expected [{s}, {h}, Ls, {d}], got {tuple(ks.shape)} and {tuple(vs.shape)}"
        )
    p, ls = kp.shape[1], ks.shape[2]
    if causal and ls < lq:
        raise ValueError(f"k_suffix: causal needs a suffix at least as long as the queries ({lq}), got Ls={ls}")
    if p + ls < 1:
        raise ValueError("k_prefix, k_suffix: no keys at all (P + Ls = 0)")
    return s, h, lq, d, p, ls


def _merge(
    a: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None, b: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Online-softmax merge of two partials (m, l, o); m is a detached shift: exact in value and in gradient."""
    if a is None:
        return b
    m = torch.maximum(a[0], b[0])
    ea, eb = torch.exp(a[0] - m), torch.exp(b[0] - m)
    ea, eb = torch.nan_to_num(ea), torch.nan_to_num(eb)  # a part with no visible key has m = -inf
    return m, ea * a[1] + eb * b[1], ea.unsqueeze(-1) * a[2] + eb.unsqueeze(-1) * b[2]


def _partial(s: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m = s.detach().amax(-1)
    e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)).unsqueeze(-1))
    return m, e.sum(-1), e @ v


def shared_prefix_attention(
    q: torch.Tensor,
    k_prefix: torch.Tensor,
    v_prefix: torch.Tensor,
    k_suffix: torch.Tensor,
    v_suffix: torch.Tensor,
    block: int = 512,
    causal: bool = True,
    scale: float | None = None,
    reads: KVReads | None = None,
) -> torch.Tensor:
    """[S, H, Lq, D] outputs; the prefix [H, P, D] is processed once per ``block`` keys for all S requests."""
    s, h, lq, d, p, ls = _check(q, k_prefix, v_prefix, k_suffix, v_suffix, causal)
    block = as_int(block, "block")
    if block < 1:
        raise ValueError(f"block: must be >= 1, got {block}")
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    esz = k_prefix.element_size()
    acc = None
    if p:
        qh = q.permute(1, 0, 2, 3).reshape(h, s * lq, d) * sc  # all requests' queries: one [H, S*Lq, D] matrix
        for j in range(0, p, block):
            kb, vb = k_prefix[:, j : j + block], v_prefix[:, j : j + block]
            if reads is not None:
                reads.prefix += (kb.numel() + vb.numel()) * esz
            acc = _merge(acc, _partial(qh @ kb.transpose(-1, -2), vb))
        m, l_, o = acc
        acc = (
            m.reshape(h, s, lq).permute(1, 0, 2),
            l_.reshape(h, s, lq).permute(1, 0, 2),
            o.reshape(h, s, lq, d).permute(1, 0, 2, 3),
        )
    if ls:
        if reads is not None:
            reads.suffix += (k_suffix.numel() + v_suffix.numel()) * k_suffix.element_size()
        sc_suf = (q * sc) @ k_suffix.transpose(-1, -2)  # [S, H, Lq, Ls]
        if causal:
            qi = torch.arange(lq, device=q.device)[:, None] + (ls - lq)
            sc_suf = sc_suf.masked_fill(torch.arange(ls, device=q.device)[None, :] > qi, float("-inf"))
        acc = _merge(acc, _partial(sc_suf, v_suffix))
    _, l_, o = acc
    return o / l_.unsqueeze(-1)


def materialize_kv(
    k_prefix: torch.Tensor, v_prefix: torch.Tensor, k_suffix: torch.Tensor, v_suffix: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-request caches [S, H, P + Ls, D]: the prefix copied into every request (what per-request SDPA reads)."""
    s = k_suffix.shape[0]
    return (
        torch.cat([k_prefix.unsqueeze(0).expand(s, -1, -1, -1), k_suffix], dim=2),
        torch.cat([v_prefix.unsqueeze(0).expand(s, -1, -1, -1), v_suffix], dim=2),
    )


def per_sequence_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, scale: float | None = None
) -> torch.Tensor:
    """Reference: torch SDPA on per-request caches k, v [S, H, P + Ls, D]; the Lq queries are the last positions."""
    lq, n = q.shape[2], k.shape[2]
    if not causal:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    ok = torch.arange(n, device=q.device)[None, :] <= torch.arange(lq, device=q.device)[:, None] + (n - lq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=ok, scale=scale)


def shared_kv_bytes(s: int, h: int, p: int, ls: int, d: int, elem: int = 4) -> int:
    """K/V bytes read with the prefix shared: 2 * H * D * (P + S * Ls) * elem."""
    s, h, p, ls, d, elem = (as_int(x, n) for x, n in zip((s, h, p, ls, d, elem), "s h p ls d elem".split()))
    return 2 * h * d * (p + s * ls) * elem


def per_sequence_kv_bytes(s: int, h: int, p: int, ls: int, d: int, elem: int = 4) -> int:
    """K/V bytes read per request: 2 * H * D * S * (P + Ls) * elem."""
    s, h, p, ls, d, elem = (as_int(x, n) for x, n in zip((s, h, p, ls, d, elem), "s h p ls d elem".split()))
    return 2 * h * d * s * (p + ls) * elem
