"""Token merging (ToMe, Bolya et al. 2023) [Q233]: bipartite soft matching that merges r tokens per layer.

Algorithm (``bipartite_soft_matching(metric, r)``, metric = the keys of the layer's attention, [B, N, C]):

    1. cosine similarity: metric rows normalised to unit length
    2. alternate split: set A = tokens 0, 2, 4, ..., set B = tokens 1, 3, 5, ...
    3. each A token finds its most similar B token (one edge per A token: a bipartite graph, no cycles, so the
       merges are independent and need no clustering iterations)
    4. keep the r most similar edges (ties by index, stable sort); those A tokens are merged into their B token,
       the other A tokens and every B token are kept: N -> N - r tokens
    5. merged values: the size-weighted average (``merge_wavg``: sum of x * size over the merged group / sum of
       size), with the size vector (tokens each output token stands for) carried to the next layer

``protected`` (e.g. 1 for a class token at index 0) keeps the first tokens of A out of the merges: they are
always among the kept tokens (A tokens never receive merges, so a protected token stays exactly as it is).

Output order (as the reference implementation): the unmerged A tokens (in order of decreasing similarity, or in
index order when ``protected`` > 0), then every B token in index order.

Proportional attention: after merging, a token standing for s original tokens should get s times the attention
weight; ``proportional_attention_bias(size)`` is log(size), added to the attention scores before the softmax
(softmax(q k^T / sqrt(d) + log s)).

``unmerge`` is the inverse map back to N tokens: every token gets the value of the output token it was merged
into (so ``unmerge(merge(x)) == x`` exactly when the merged tokens were identical).

Functions take numpy arrays (or torch / tl tensors, read as arrays) and return numpy arrays; ``merge``,
``unmerge`` and ``merge_wavg`` on a ``tl.Tensor`` stay differentiable (they apply the linear merge / unmerge
matrices with tl ops).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._inputs import as_int, to_numpy
from ..autograd.tensor import Tensor

__all__ = [
    "Matching",
    "bipartite_soft_matching",
    "merge",
    "merge_wavg",
    "proportional_attention_bias",
    "unmerge",
]


@dataclass(frozen=True)
class Matching:
    """The result of one bipartite soft matching: which A tokens are merged into which B tokens."""

    n: int  # tokens before merging
    r: int  # tokens merged away
    unm_idx: np.ndarray  # int64 [B, Na - r]: kept A tokens (positions within A)
    src_idx: np.ndarray  # int64 [B, r]: merged A tokens (positions within A)
    dst_idx: np.ndarray  # int64 [B, r]: the B token (position within B) each of them goes into

    @property
    def batch(self) -> int:
        return int(self.unm_idx.shape[0])

    @property
    def n_out(self) -> int:
        return self.n - self.r

    def merge_matrix(self) -> np.ndarray:
        """0/1 [B, N - r, N]: output token t = sum of the inputs with a 1 in row t (merge in 'sum' mode)."""
        b, nb = self.batch, self.n // 2
        m = np.zeros((b, self.n_out, self.n))
        u = self.unm_idx.shape[1]
        bi = np.arange(b)[:, None]
        m[bi, np.arange(u)[None, :], 2 * self.unm_idx] = 1
        m[:, u + np.arange(nb), 2 * np.arange(nb) + 1] = 1
        m[bi, u + self.dst_idx, 2 * self.src_idx] = 1
        return m

    def unmerge_matrix(self) -> np.ndarray:
        """0/1 [B, N, N - r]: input token i gets the output token it was merged into."""
        return self.merge_matrix().transpose(0, 2, 1)


def bipartite_soft_matching(metric: Any, r: int, protected: int = 0) -> Matching:
    """Match tokens of ``metric`` [B, N, C] (or [N, C]: batch 1) by cosine similarity; merge ``r`` of them
    (clipped to what set A can give: (N+1)//2 - protected). ``protected`` first A tokens are never merged."""
    m = np.asarray(to_numpy(metric, "metric"), np.float64)
    if m.ndim == 2:
        m = m[None]
    if m.ndim != 3:
        raise ValueError(f"metric: must be [B, N, C] or [N, C], got shape {m.shape}")
    if not np.isfinite(m).all():
        raise ValueError("metric: contains NaN or Inf")
    r = as_int(r, "r", min=0)
    protected = as_int(protected, "protected", min=0)
    b, n, _ = m.shape
    na, nb = (n + 1) // 2, n // 2
    if protected > na:
        raise ValueError(f"protected: {protected} exceeds the {na} tokens of set A (N = {n})")
    r = min(r, na - protected) if nb > 0 else 0
    norm = np.linalg.norm(m, axis=-1, keepdims=True)
    m = m / np.where(norm > 0, norm, 1)
    a, bset = m[:, ::2], m[:, 1::2]
    if nb == 0 or r == 0:
        unm = np.broadcast_to(np.arange(na), (b, na)).astype(np.int64)
        empty = np.zeros((b, 0), np.int64)
        return Matching(n, 0, unm.copy(), empty, empty.copy())
    scores = a @ bset.transpose(0, 2, 1)  # [B, Na, Nb]
    if protected:
        scores[:, :protected, :] = -np.inf
    node_max = scores.max(axis=-1)
    node_idx = scores.argmax(axis=-1)
    edge_idx = np.argsort(-node_max, axis=-1, kind="stable")
    unm_idx, src_idx = edge_idx[:, r:], edge_idx[:, :r]
    dst_idx = np.take_along_axis(node_idx, src_idx, axis=-1)
    if protected:
        unm_idx = np.sort(unm_idx, axis=-1)
    return Matching(n, r, unm_idx.astype(np.int64), src_idx.astype(np.int64), dst_idx.astype(np.int64))


def _check_x(x: np.ndarray, mt: Matching, name: str, n: int) -> np.ndarray:
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3 or x.shape[0] != mt.batch or x.shape[1] != n:
        raise ValueError(f"{name}: must be [B={mt.batch}, {n}, C] for this matching, got shape {x.shape}")
    return x


def merge(x: Any, matching: Matching, mode: str = "mean") -> Any:
    """Merge tokens of ``x`` [B, N, C] per ``matching``: [B, N - r, C]. ``mode`` 'sum' adds the merged tokens
    into their destination; 'mean' averages the destination with the tokens merged into it (unweighted; use
    ``merge_wavg`` for the size-weighted average)."""
    if not isinstance(matching, Matching):
        raise TypeError(f"matching: must be a Matching, got {type(matching).__name__}")
    if mode not in ("sum", "mean"):
        raise ValueError(f"mode: must be 'sum' or 'mean', got {mode!r}")
    if isinstance(x, Tensor):
        x3 = x if x.ndim == 3 else x.unsqueeze(0)
        _check_x(np.empty(x3.shape, bool), matching, "x", matching.n)
        mm = matching.merge_matrix().astype(x.dtype)
        out = Tensor(mm) @ x3
        if mode == "mean":
            out = out / Tensor(mm.sum(axis=-1, keepdims=True))
        return out if x.ndim == 3 else out[0]
    xa = np.asarray(to_numpy(x, "x"))
    squeeze = xa.ndim == 2
    x3 = _check_x(xa, matching, "x", matching.n)
    bsz, _, c = x3.shape
    src, dst = x3[:, ::2], x3[:, 1::2]
    nb = dst.shape[1]
    unm = np.take_along_axis(src, matching.unm_idx[..., None], axis=1)
    moved = np.take_along_axis(src, matching.src_idx[..., None], axis=1)
    dst = dst.astype(np.result_type(dst.dtype, np.float32) if mode == "mean" else dst.dtype, copy=True)
    flat = dst.reshape(bsz * nb, c)
    idx = (matching.dst_idx + np.arange(bsz)[:, None] * nb).ravel()
    np.add.at(flat, idx, moved.reshape(-1, c))
    if mode == "mean":
        cnt = np.ones(bsz * nb)
        np.add.at(cnt, idx, 1)
        flat /= cnt[:, None]
    out = np.concatenate([unm.astype(flat.dtype), flat.reshape(bsz, nb, c)], axis=1)
    return out[0] if squeeze else out


def unmerge(x: Any, matching: Matching) -> Any:
    """Back to N tokens: [B, N - r, C] -> [B, N, C], each input position gets its output token's value."""
    if not isinstance(matching, Matching):
        raise TypeError(f"matching: must be a Matching, got {type(matching).__name__}")
    if isinstance(x, Tensor):
        x3 = x if x.ndim == 3 else x.unsqueeze(0)
        _check_x(np.empty(x3.shape, bool), matching, "x", matching.n_out)
        out = Tensor(matching.unmerge_matrix().astype(x.dtype)) @ x3
        return out if x.ndim == 3 else out[0]
    xa = np.asarray(to_numpy(x, "x"))
    squeeze = xa.ndim == 2
    x3 = _check_x(xa, matching, "x", matching.n_out)
    bsz, _, c = x3.shape
    u = matching.unm_idx.shape[1]
    unm, dst = x3[:, :u], x3[:, u:]
    src = np.take_along_axis(dst, matching.dst_idx[..., None], axis=1)
    out = np.zeros((bsz, matching.n, c), x3.dtype)
    out[:, 1::2] = dst
    bi = np.arange(bsz)[:, None]
    out[bi, 2 * matching.unm_idx] = unm
    out[bi, 2 * matching.src_idx] = src
    return out[0] if squeeze else out


def merge_wavg(x: Any, matching: Matching, size: Any = None) -> tuple[Any, Any]:
    """Size-weighted average merge: (sum(x * s) / sum(s) per output token, the merged sizes [B, N - r, 1]).
    ``size`` [B, N, 1] (None: every token stands for 1)."""
    is_t = isinstance(x, Tensor)
    shape = x.shape
    if size is None:
        size = np.ones(tuple(shape[:-1]) + (1,), np.float64 if not is_t else x.dtype)
    s = size if isinstance(size, Tensor) else np.asarray(to_numpy(size, "size"))
    if tuple(s.shape) != tuple(shape[:-1]) + (1,):
        raise ValueError(f"size: must have shape {tuple(shape[:-1]) + (1,)}, got {tuple(s.shape)}")
    if not isinstance(s, Tensor) and (s <= 0).any():
        raise ValueError("size: every token size must be > 0")
    if is_t:
        st = s if isinstance(s, Tensor) else Tensor(np.asarray(s, x.dtype))
        xs = merge(x * st, matching, "sum")
        ss = merge(st, matching, "sum")
        return xs / ss, ss
    xa = np.asarray(to_numpy(x, "x"))
    xs = merge(xa * s, matching, "sum")
    ss = merge(s, matching, "sum")
    return xs / ss, ss


def proportional_attention_bias(size: Any) -> np.ndarray:
    """log(size) [B, 1, N'] (from sizes [B, N', 1]): add to attention scores so a token standing for s tokens
    gets s times the weight (ToMe's proportional attention)."""
    s = np.asarray(to_numpy(size, "size"), np.float64)
    if s.ndim < 2 or s.shape[-1] != 1:
        raise ValueError(f"size: must be [..., N, 1], got shape {s.shape}")
    if (s <= 0).any():
        raise ValueError("size: every token size must be > 0")
    return np.log(np.swapaxes(s, -1, -2))
