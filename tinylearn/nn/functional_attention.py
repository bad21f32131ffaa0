"""torch.nn.functional.scaled_dot_product_attention and the masked softmax it (and MultiheadAttention) uses.

    sdpa          softmax(Q K^T * scale + M) V                 M: bool mask (False = masked out) or additive float
    masked row    a query row whose scores are all -inf (every key masked) gets probabilities 0, output 0 and
                  gradient 0, as torch 2.x's scaled_dot_product_attention (plain softmax would give NaN there)
    enable_gqa    grouped-query attention: key / value heads [.., Hk, S, E] are repeated (repeat_interleave on dim -3)
                  to the query's Hq heads; Hk must divide Hq

Without mask, dropout, GQA repetition or a non-default scale (and outside autocast) sdpa is one node on the
registered ``kernels.attention`` flash kernel (functional_fused.py; no row is ever fully masked there: the causal
mask is top-left aligned, so query row i always sees key 0); otherwise the composite below.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..autograd.errors import DimError, ShapeError
from ..autograd.tensor import Tensor
from . import functional_fused as _fused
from .functional_dropout import dropout

__all__ = ["masked_softmax", "repeat_kv_heads", "scaled_dot_product_attention"]


def masked_softmax(scores: Tensor, dim: int = -1) -> Tensor:
    """softmax over ``dim`` where a slice whose scores are all -inf gives zeros (and a zero gradient) instead of
    NaN: torch's ``_safe_softmax``, what its scaled_dot_product_attention does for a fully masked query row."""
    if scores.shape[dim] == 0:  # no keys: nothing to normalise (the output a @ v is then 0, as torch)
        return scores
    dead = np.isneginf(scores.data).all(axis=dim, keepdims=True)
    if not dead.any():
        return scores.softmax(dim)
    return scores.masked_fill(dead, 0.0).softmax(dim).masked_fill(dead, 0.0)


def repeat_kv_heads(query: Tensor, kv: Tensor, name: str) -> Tensor:
    """``kv`` [..., Hk, S, E] with each head repeated Hq / Hk times (torch's enable_gqa: repeat_interleave on -3)."""
    if query.ndim < 3 or kv.ndim < 3:
        raise DimError(
            f"{name}: enable_gqa needs query and {name} with a head dim (-3), got shapes {query.shape} and {kv.shape}"
        )
    hq, hk = query.shape[-3], kv.shape[-3]
    if hk < 1 or hq % hk:
        raise ShapeError(
            f"{name}: its {hk} heads (shape {kv.shape}) must divide the query's {hq} heads (shape {query.shape})"
        )
    if hk == hq:
        return kv
    r = hq // hk
    lead, (s, e) = kv.shape[:-3], kv.shape[-2:]
    return kv.unsqueeze(-3).expand(*lead, hk, r, s, e).reshape(*lead, hq, s, e)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """softmax(Q K^T * scale + mask) V; a bool mask keeps True positions, a float mask is added; a fully masked row
    gives 0 (torch 2.x). ``enable_gqa=True`` repeats key / value heads to the query's head count."""
    if enable_gqa:
        key, value = repeat_kv_heads(query, key, "key"), repeat_kv_heads(query, value, "value")
    if _fused.sdpa_fits(query, key, value, attn_mask, dropout_p, scale):
        return _fused.ScaledDotProductAttention.apply(query, key, value, causal=bool(is_causal))
    lq, lk = query.shape[-2], key.shape[-2]
    s = (query @ key.transpose(-2, -1)) * (1.0 / math.sqrt(query.shape[-1]) if scale is None else scale)
    if is_causal:
        s = s.masked_fill(~np.tril(np.ones((lq, lk), bool)), -np.inf)
    if attn_mask is not None:
        m = attn_mask.data if isinstance(attn_mask, Tensor) else np.asarray(attn_mask)
        s = s.masked_fill(~m, -np.inf) if m.dtype == np.bool_ else s + attn_mask
    a = masked_softmax(s)
    if dropout_p > 0:
        a = dropout(a, dropout_p)
    return a @ value
