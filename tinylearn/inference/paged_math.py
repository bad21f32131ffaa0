"""The pure numpy arithmetic of the paged KV cache (``tinylearn.inference.paged_cache``): blocks a sequence needs,
logical position -> (physical block, slot) through a block table, bytes per cached token, the int8 KV codec
(symmetric, one float32 scale per (token, head)), the token-priority eviction policy (H2O heavy hitters + a recent
window, from the attention each token received) and the dense attention that paged attention must equal.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._inputs import to_numpy
from .checks import int_arg


def priority_keep(scores: Any, budget: int, recent: int = 0) -> np.ndarray:
    """Token-priority eviction policy (H2O, Zhang et al. 2023): bool mask [S] keeping the last ``recent`` tokens
    and, up to ``budget`` in total, the tokens with the highest ``scores`` (e.g. the attention each token received
    from recent queries, summed over heads and queries: the "heavy hitters")."""
    budget, recent = int_arg(budget, "budget"), int_arg(recent, "recent")
    raw = to_numpy(scores, "scores")
    if raw.dtype.kind not in "fiu":
        raise TypeError(f"scores: expected numeric scores, got dtype {raw.dtype}")
    sc = np.asarray(raw, dtype=np.float64)
    if np.isnan(sc).any():
        raise ValueError("scores: NaN scores cannot be ranked")
    if sc.ndim != 1 or not 0 <= recent <= budget:
        raise ValueError(
            f"scores, budget, recent: need 1-D scores and 0 <= recent <= budget, got {sc.shape}, {budget}, {recent}"
        )
    n = sc.shape[0]
    keep = np.zeros(n, dtype=bool)
    if budget >= n:
        keep[:] = True
        return keep
    keep[n - recent :] = recent > 0
    rest = np.flatnonzero(~keep)
    order = rest[np.argsort(-sc[rest], kind="stable")]
    keep[order[: budget - int(keep.sum())]] = True
    return keep


def attention_received(q: Any, k: Any) -> np.ndarray:
    """Attention mass each cached token receives: softmax(q k^T / sqrt(D)) summed over queries and heads.
    q [Nq, Hq, D] (recent queries), k [S, H, D] (Hq a multiple of H, GQA) -> [S]."""
    q, k = (a.astype(np.float32, copy=False) for a in _attn_arrays(q, k, q_ndim=3))
    g = q.shape[1] // k.shape[1]
    s = np.einsum("nhd,shd->nhs", q, np.repeat(k, g, axis=1)) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p.sum(axis=(0, 1))


def blocks_needed(n_tokens: int, block_size: int) -> int:
    """Blocks a sequence of n_tokens occupies: ceil(n_tokens / block_size) (the last one may be partly empty)."""
    n_tokens, block_size = int_arg(n_tokens, "n_tokens"), int_arg(block_size, "block_size")
    if n_tokens < 0 or block_size < 1:
        raise ValueError(f"n_tokens, block_size: need n_tokens >= 0 and block_size >= 1, got {n_tokens}, {block_size}")
    return -(-n_tokens // block_size)


def locate(block_table: Any, block_size: int, pos: Any) -> tuple[Any, Any]:
    """Logical token position(s) -> (physical block id, slot in the block) through the block table."""
    block_size = int_arg(block_size, "block_size", minimum=1)
    table = np.asarray(block_table, dtype=np.int64)
    raw = to_numpy(pos, "pos")
    if raw.size and not np.issubdtype(raw.dtype, np.integer):
        raise TypeError(f"pos: token positions must be integers, got dtype {raw.dtype}")
    p = raw.astype(np.int64)
    if p.size and (p.min() < 0 or p.max() >= len(table) * block_size):
        raise ValueError(
            f"pos: {int(p.max()) if p.size else p} outside the {len(table)} block(s) x {block_size} slots of the table"
        )
    blk, slot = table[p // block_size] if p.size else p, p % block_size
    if p.ndim == 0:
        return int(blk), int(slot)
    return blk, slot


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per (token, head): x [T, H, D] -> codes int8 [T, H, D], scales float32 [T, H].

    x must be finite: an Inf would give its row an Inf scale and dequantize the whole row to NaN."""
    a = to_numpy(x, "x")
    if a.dtype.kind not in "fiu" and a.dtype.name != "bfloat16":
        raise TypeError(f"x: expected a numeric array, got dtype {a.dtype}")
    if a.ndim < 1 or a.shape[-1] == 0:
        raise ValueError(f"x: expected [..., D] with D >= 1, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("x: int8 quantisation needs finite values, got NaN or Inf")
    x = a
    amax = np.abs(x).max(axis=-1)
    scale = (amax / 127.0).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0)
    q = np.clip(np.rint(x / safe[..., None]), -127, 127).astype(np.int8)
    return q, scale


def dequantize_int8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """codes [..., D] * scales [...] -> float32 [..., D] (the inverse of ``quantize_int8``)."""
    q, scale = to_numpy(q, "q"), np.asarray(to_numpy(scale, "scale"))
    if q.ndim < 1 or scale.shape != q.shape[:-1]:
        raise ValueError(f"scale: expected shape {q.shape[:-1]} (one scale per row of q {q.shape}), got {scale.shape}")
    return q.astype(np.float32) * scale[..., None]


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, dtype: str = "float32") -> int:
    """2 * n_layers * n_kv_heads * head_dim * bytes (+ one float32 scale per token and head for int8)."""
    n_layers, n_kv_heads = int_arg(n_layers, "n_layers", minimum=1), int_arg(n_kv_heads, "n_kv_heads", minimum=1)
    head_dim = int_arg(head_dim, "head_dim", minimum=1)
    if dtype == "float32":
        return 2 * n_layers * n_kv_heads * head_dim * 4
    if dtype == "int8":
        return 2 * n_layers * n_kv_heads * (head_dim * 1 + 4)
    raise ValueError(f"dtype: expected 'float32' or 'int8', got {dtype!r}")


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(D)) v for one query: q [Hq, D], k/v [S, H, D], query head h uses KV head h // (Hq/H)."""
    q, k, v = _attn_arrays(q, k, v, q_ndim=2)
    hq, d = q.shape
    g = hq // k.shape[1]
    kr = np.repeat(k, g, axis=1)  # [S, Hq, D]
    vr = np.repeat(v, g, axis=1)
    s = np.einsum("hd,shd->hs", q, kr) / np.sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hs,shd->hd", p, vr).astype(np.float32)


def _attn_arrays(q: Any, k: Any, v: Any = None, *, q_ndim: int) -> tuple[np.ndarray, ...]:
    """q [..., Hq, D] (q_ndim dims), k (and v) [S, H, D] with S >= 1 and Hq a multiple of H (ints -> float32)."""
    qa, ka = to_numpy(q, "q"), to_numpy(k, "k")
    arrays = [("q", qa), ("k", ka)] + ([("v", to_numpy(v, "v"))] if v is not None else [])
    for name, a in arrays:
        if a.dtype.kind not in "fiu" and a.dtype.name != "bfloat16":
            raise TypeError(f"{name}: expected a numeric array, got dtype {a.dtype}")
    if qa.ndim != q_ndim or ka.ndim != 3 or ka.shape[0] == 0 or ka.shape[1] == 0:
        want = "[Hq, D]" if q_ndim == 2 else "[Nq, Hq, D]"
        raise ValueError(f"q, k: expected q {want} and k [S >= 1, H, D], got shapes {qa.shape}, {ka.shape}")
    if qa.shape[-1] != ka.shape[-1] or qa.shape[-2] % ka.shape[1]:
        raise ValueError(f"q, k: need equal head_dim and Hq a multiple of H (GQA), got {qa.shape}, {ka.shape}")
    if v is not None and arrays[2][1].shape != ka.shape:
        raise ValueError(f"v: expected the shape of k {ka.shape}, got {arrays[2][1].shape}")
    return tuple(a if a.dtype.kind == "f" else a.astype(np.float32) for _, a in arrays)
