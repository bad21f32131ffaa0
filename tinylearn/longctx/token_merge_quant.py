"""Token merging that respects int8 quantization [Q233]: cosine similarity AND a quantization-error bound.

ToMe (``token_merge.bipartite_soft_matching``) merges the r A-tokens whose best B-token is most *cosine*-similar.
Cosine similarity ignores magnitude: two tokens x and 10 x have similarity 1, and their size-weighted average
(5.5 x) stands for neither. When the merged sequence is then stored / multiplied in int8 (per-token symmetric
scale absmax / 127), the value a downstream layer sees for an original token i is qdq(m), the int8 round trip of the
merged token m, and its error ||qdq(m) - x_i|| mixes the merge error and the rounding error.

``quant_aware_matching(metric, x, r, bound)`` keeps ToMe's bipartite graph (A = even tokens, B = odd tokens, each
A token's edge goes to its most cosine-similar B token) and its ranking, and adds the bound:

    1. edges sorted by  cosine - lam * (pairwise quantization error)  (lam = 0: ToMe's order exactly)
    2. walk the edges in that order; accept edge a -> b only if cosine >= ``min_similarity`` and, with a added to
       b's group G (b plus the A tokens already merged into it), the merged value m = size-weighted mean of G
       still satisfies  max_{i in G} ||qdq(m) - x_i|| / ||x_i|| <= ``bound``  (every member is re-checked: adding
       a token moves the mean of the whole group)
    3. stop after r accepted edges: r_eff <= r tokens are merged away (with several batch rows, r_eff is the
       minimum over rows, and each row keeps the first r_eff edges it accepted: a prefix of the acceptance walk is
       itself a state in which every group was checked, so the bound holds for every row)

With ``bound = inf`` and ``min_similarity = -1`` it returns ToMe's matching (the same src / dst edges). The result
is a ``token_merge.Matching``, so ``merge``, ``merge_wavg`` (differentiable on tl Tensors), ``unmerge`` and
``proportional_attention_bias`` apply unchanged.

``int8_roundtrip`` is the per-token symmetric int8 quantize -> dequantize of ``tinylearn.quant``
(quantize_dequantize with one scale per row, bit-exact with torch.quantize_per_channel). ``merged_attention_error``
measures what merging costs a layer: attention of the original queries over the merged (and int8-rounded) keys /
values with proportional attention (log size added to the scores) against full fp32 attention.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._inputs import as_int, to_numpy
from ..nn.token_merge import Matching, bipartite_soft_matching, merge_wavg, proportional_attention_bias

__all__ = [
    "int8_roundtrip",
    "merge_quant_errors",
    "merged_attention_error",
    "quant_aware_matching",
]


def int8_roundtrip(x: Any) -> np.ndarray:
    """Per-row symmetric int8 quantize -> dequantize of ``x`` [..., C] (scale = max|row| / 127, zero point 0;
    an all-zero row stays 0). float32."""
    from ..quant.affine import quantize_dequantize

    a = np.asarray(to_numpy(x, "x"), np.float32)
    if a.ndim == 0:
        raise ValueError("x: must have at least one dim (rows of C values), got a scalar")
    if not np.isfinite(a).all():
        raise ValueError("x: contains NaN or Inf")
    flat = a.reshape(-1, a.shape[-1]) if a.shape[-1] else a.reshape(-1, 0)
    if flat.shape[0] == 0 or flat.shape[1] == 0:
        return a.copy()
    scale = (np.abs(flat).max(axis=1) / np.float32(127.0)).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    out = quantize_dequantize(flat, scale, np.zeros(flat.shape[0], np.int64), "int8", axis=0)
    return out.reshape(a.shape)


def _rel_err(approx: np.ndarray, x: np.ndarray) -> np.ndarray:
    """||approx - x|| / ||x|| along the last dim (absolute error where x = 0)."""
    n = np.linalg.norm(x, axis=-1)
    return np.linalg.norm(approx - x, axis=-1) / np.where(n > 0, n, 1.0)


def quant_aware_matching(
    metric: Any,
    x: Any,
    r: int,
    bound: float,
    *,
    size: Any = None,
    protected: int = 0,
    min_similarity: float = -1.0,
    lam: float = 0.0,
) -> Matching:
    """ToMe matching of ``metric`` [B, N, Cm] (or [N, Cm]) restricted to merges of ``x`` [B, N, C] whose int8
    round trip stays within ``bound`` relative error of every original token (see the module docstring).

    ``size`` [B, N, 1]: tokens each row already stands for (None: 1); ``protected`` first A tokens are never merged;
    ``lam`` >= 0 ranks edges by cosine - lam * pairwise error. Returns a Matching with r_eff <= r merges."""
    m = np.asarray(to_numpy(metric, "metric"), np.float64)
    xa = np.asarray(to_numpy(x, "x"), np.float64)
    m = m[None] if m.ndim == 2 else m
    xa = xa[None] if xa.ndim == 2 else xa
    if m.ndim != 3:
        raise ValueError(f"metric: must be [B, N, C] or [N, C], got shape {m.shape}")
    if xa.ndim != 3 or xa.shape[:2] != m.shape[:2]:
        raise ValueError(f"x: must be [B={m.shape[0]}, N={m.shape[1]}, C] like metric, got shape {xa.shape}")
    if not np.isfinite(xa).all():
        raise ValueError("x: contains NaN or Inf")
    r = as_int(r, "r", min=0)
    if isinstance(bound, bool) or not isinstance(bound, (int, float, np.integer, np.floating)) or not bound >= 0:
        raise ValueError(f"bound: must be a number >= 0 (math.inf: no bound), got {bound!r}")
    if not (isinstance(min_similarity, (int, float)) and -1.0 <= min_similarity <= 1.0):
        raise ValueError(f"min_similarity: must be in [-1, 1], got {min_similarity!r}")
    if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam: must be a finite number >= 0, got {lam!r}")
    b, n, _ = xa.shape
    if size is None:
        s = np.ones((b, n))
    else:
        s = np.asarray(to_numpy(size, "size"), np.float64)
        s = s[None] if s.ndim == 2 else s
        if s.shape != (b, n, 1):
            raise ValueError(f"size: must have shape {(b, n, 1)}, got {s.shape}")
        if (s <= 0).any():
            raise ValueError("size: every token size must be > 0")
        s = s[..., 0]
    full = bipartite_soft_matching(m, n, protected)  # every mergeable A token ranked: r = Na - protected
    na = (n + 1) // 2
    if full.r == 0 or r == 0:
        return bipartite_soft_matching(m, 0, protected)
    unit = m / np.where((nrm := np.linalg.norm(m, axis=-1, keepdims=True)) > 0, nrm, 1)
    accepted: list[list[tuple[int, int]]] = []
    for bi in range(b):
        src, dst = full.src_idx[bi], full.dst_idx[bi]
        ai, bj = 2 * src, 2 * dst + 1  # token indices
        cos = (unit[bi, ai] * unit[bi, bj]).sum(-1)
        pair = (xa[bi, ai] * s[bi, ai, None] + xa[bi, bj] * s[bi, bj, None]) / (s[bi, ai] + s[bi, bj])[:, None]
        qp = int8_roundtrip(pair).astype(np.float64)
        perr = np.maximum(_rel_err(qp, xa[bi, ai]), _rel_err(qp, xa[bi, bj]))
        order = np.argsort(-(cos - lam * perr), kind="stable") if lam > 0 else np.arange(len(src))
        groups: dict[int, list[int]] = {}
        acc: list[tuple[int, int]] = []
        for e in order:
            if len(acc) == r:
                break
            if cos[e] < min_similarity:
                continue
            members = groups.get(int(dst[e]), [int(bj[e])]) + [int(ai[e])]
            w = s[bi, members]
            merged = (xa[bi, members] * w[:, None]).sum(0) / w.sum()
            q = int8_roundtrip(merged[None]).astype(np.float64)
            if _rel_err(q, xa[bi, members]).max() <= bound:
                groups[int(dst[e])] = members
                acc.append((int(src[e]), int(dst[e])))
        accepted.append(acc)
    r_eff = min(len(a) for a in accepted)
    src_idx = np.array([[p[0] for p in a[:r_eff]] for a in accepted], np.int64).reshape(b, r_eff)
    dst_idx = np.array([[p[1] for p in a[:r_eff]] for a in accepted], np.int64).reshape(b, r_eff)
    unm = np.array([np.setdiff1d(np.arange(na), src_idx[i]) for i in range(b)], np.int64).reshape(b, na - r_eff)
    return Matching(n, r_eff, unm, src_idx, dst_idx)


def merge_quant_errors(x: Any, matching: Matching, size: Any = None) -> np.ndarray:
    """Per original token, ||int8_roundtrip(merged token it went into) - x_i|| / ||x_i||: [B, N] (what
    ``quant_aware_matching`` bounds; unmerged tokens carry their own int8 rounding error)."""
    if not isinstance(matching, Matching):
        raise TypeError(f"matching: must be a Matching, got {type(matching).__name__}")
    from ..nn.token_merge import unmerge

    xa = np.asarray(to_numpy(x, "x"), np.float64)
    xa = xa[None] if xa.ndim == 2 else xa
    merged, _ = merge_wavg(xa, matching, size)
    back = unmerge(int8_roundtrip(merged).astype(np.float64), matching)
    return _rel_err(back, xa)


def merged_attention_error(q: Any, k: Any, v: Any, matching: Matching, *, quantize: bool = True) -> float:
    """||o_merged - o|| / ||o||: o = softmax(q k^T / sqrt(d)) v over all N keys (fp32/64), o_merged = the same
    queries over the merged keys / values (size-weighted means, int8-rounded when ``quantize``) with
    proportional attention (+ log size). q [B, Nq, D], k [B, N, D], v [B, N, Dv]."""
    if not isinstance(matching, Matching):
        raise TypeError(f"matching: must be a Matching, got {type(matching).__name__}")
    qa, ka, va = (np.asarray(to_numpy(t, name), np.float64) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    qa, ka, va = (a[None] if a.ndim == 2 else a for a in (qa, ka, va))
    if ka.shape[:2] != va.shape[:2] or qa.shape[0] != ka.shape[0] or qa.shape[-1] != ka.shape[-1]:
        raise ValueError(f"q/k/v: shapes {qa.shape}, {ka.shape}, {va.shape} do not form [B, Nq, D], [B, N, D/Dv]")
    sc = 1.0 / math.sqrt(qa.shape[-1])

    def attend(kk: np.ndarray, vv: np.ndarray, bias: Any = 0.0) -> np.ndarray:
        s = qa @ kk.transpose(0, 2, 1) * sc + bias
        p = np.exp(s - s.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ vv

    ref = attend(ka, va)
    km, size = merge_wavg(ka, matching)
    vm, _ = merge_wavg(va, matching)
    if quantize:
        km, vm = int8_roundtrip(km).astype(np.float64), int8_roundtrip(vm).astype(np.float64)
    out = attend(km, vm, proportional_attention_bias(size))
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
