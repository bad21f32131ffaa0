"""ModelRunner: ONE forward per engine step over a ragged batch of prefill chunks and decode tokens.

The scheduled work of a step is a list of (sequence, start, tokens, logit rows): a prefill chunk of several tokens
at positions [start, start + t), or one decode token (t = 1). All N scheduled tokens are concatenated into one
[N, d_model] matrix and every position-independent op runs on all N rows at once with the model's own modules:

    x = tok_emb(ids) (+ pos_emb(pos) when rope=False)                           one gather, N rows
    per layer:  h = ln1(x);  q, k, v = q_proj(h), k_proj(h), v_proj(h)         one GEMM each over N rows
                q, k rotated by each token's own position (RoPE, rotate-half, as the model's Rope op)
                K/V of all N tokens scattered into the paged arena in one indexed write (int8 / fp8: codes + scales)
                attention per sequence:
                  decode tokens   one ``paged_attention_batch`` call (the C++ ragged kernel over block tables,
                                  fp32 / int8 / FP8 blocks read in place)
                  prefill chunks  q [t] against the sequence's gathered K/V [start + t], causal mask offset by start
                x = x + o_proj(attn);  x = x + mlp(ln2(x))                      N rows at once
    logits = lm_head(ln_f(x[rows])) only for the rows whose next token is sampled (a chunk that does not reach
    the end of its sequence needs none; a speculative verify needs all of its k + 1 rows).
The caller reserves the blocks (``BlockManager.reserve``) first; the runner writes K/V and sets the lengths.
Positions and cache indices coincide unless the engine's token-priority eviction dropped tokens: then an item's
``start`` is its cache index and ``pos_start`` its position. ``capture`` (cache ids) keeps each such item's last
query per layer in ``last_q`` -- the query the eviction scores the cached tokens with.
GQA: query head h reads KV head h // g (g = n_heads / n_kv_heads), as TinyGPT's Attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..autograd import Tensor, no_grad
from ..inference.model import TinyGPT
from ..inference.paged import paged_attention_batch
from ..inference.paged_cache import PagedKVCache
from ..inference.paged_math import locate


@dataclass
class BatchItem:
    """One sequence's share of a step: ``tokens`` at positions [start, start + len(tokens)) of cache sequence
    ``cache_id``; ``n_logits`` rows at the end that need logits (0, 1, or k + 1 for a speculative verify)."""

    cache_id: int
    start: int
    tokens: list[int]
    n_logits: int
    pos_start: int | None = None  # the tokens' positions (RoPE / learned); None = start. Differs from the cache
    # index ``start`` after token-priority eviction dropped tokens from the sequence's cache


def _pos0(it: BatchItem) -> int:
    return it.start if it.pos_start is None else it.pos_start


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [N, H, hd] rotated by per-row cos/sin [N, 1, hd]: x * cos + rotate_half(x) * sin (the model's Rope op)."""
    h = x.shape[-1] // 2
    out = x * cos
    out[..., :h] -= x[..., h:] * sin[..., :h]
    out[..., h:] += x[..., :h] * sin[..., h:]
    return out


def _causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int, g: int) -> np.ndarray:
    """q [t, H, hd] at positions start..start+t-1 over k/v [S, Hkv, hd] (S = start + t) -> [t, H, hd]."""
    t, h, hd = q.shape
    hkv, s = k.shape[1], k.shape[0]
    qh = q.reshape(t, hkv, g, hd).transpose(1, 2, 0, 3).reshape(hkv, g * t, hd)
    scores = (qh @ k.transpose(1, 2, 0)) * np.float32(1.0 / np.sqrt(hd))  # [Hkv, g*t, S]
    if t > 1:
        keep = np.arange(s)[None, :] <= (start + np.arange(t))[:, None]
        scores = np.where(keep[None, None], scores.reshape(hkv, g, t, s), -np.inf).reshape(hkv, g * t, s)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    p = scores / scores.sum(-1, keepdims=True)
    out = (p @ v.transpose(1, 0, 2)).reshape(hkv, g, t, hd)  # [Hkv, g, t, hd]
    return out.transpose(2, 0, 1, 3).reshape(t, h, hd)


class ModelRunner:
    """Runs ``TinyGPT``'s weights over a ragged batch against a ``PagedKVCache``; see the module docstring."""

    def __init__(self, model: TinyGPT, cache: PagedKVCache) -> None:
        self.model, self.cache = model, cache
        c = model.config
        self.h, self.hkv, self.hd, self.g = c.n_heads, c.kv_heads, c.head_dim, c.group
        self.forward_calls = 0
        self.capture: set[int] = set()  # cache ids whose last query per layer is kept (token-priority eviction)
        self.last_q: dict[int, dict[int, np.ndarray]] = {}

    def forward(self, items: list[BatchItem]) -> list[np.ndarray]:
        """One forward over all items; returns float32 logits [n_logits, V] per item (empty for n_logits=0)."""
        if not items:
            return []
        with no_grad():
            return self._forward(items)

    def _forward(self, items: list[BatchItem]) -> list[np.ndarray]:
        m, cache = self.model, self.cache
        self.forward_calls += 1
        ids = np.fromiter((t for it in items for t in it.tokens), dtype=np.int64)
        n = ids.shape[0]
        pos = np.concatenate([np.arange(p0, p0 + len(it.tokens)) for it in items for p0 in [_pos0(it)]])
        offs = np.cumsum([0] + [len(it.tokens) for it in items])
        seqs = [cache.seqs[it.cache_id] for it in items]
        where = [
            locate(s.table, cache.block_size, np.arange(it.start, it.start + len(it.tokens)))
            for s, it in zip(seqs, items)
        ]
        blk = np.concatenate([w[0] for w in where])
        slot = np.concatenate([w[1] for w in where])
        dec = [i for i, it in enumerate(items) if len(it.tokens) == 1]
        dec_rows = offs[dec] if dec else None
        dec_ids = [items[i].cache_id for i in dec]
        pre = [i for i, it in enumerate(items) if len(it.tokens) > 1]
        rope = m._rope
        if rope is not None:
            cos, sin = rope[0][pos][:, None, :], rope[1][pos][:, None, :]
        x = m.tok_emb(ids)
        if not m.config.rope:
            x = x + m.pos_emb(pos)
        for layer, block in enumerate(m.blocks):
            a = block.attn
            hx = block.ln1(x)
            q = a.q_proj(hx).data.reshape(n, self.h, self.hd)
            k = a.k_proj(hx).data.reshape(n, self.hkv, self.hd)
            v = a.v_proj(hx).data.reshape(n, self.hkv, self.hd)
            if rope is not None:
                q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            if self.capture:
                for i, it in enumerate(items):
                    if it.cache_id in self.capture:
                        self.last_q.setdefault(it.cache_id, {})[layer] = q[offs[i + 1] - 1].copy()
            self._write(layer, blk, slot, k, v)
            for s, it in zip(seqs, items):
                s.lens[layer] = it.start + len(it.tokens)
            out = np.empty((n, self.h, self.hd), dtype=np.float32)
            if dec:  # the C++ paged-decode kernel reads fp32, int8 and fp8 blocks in place
                out[dec_rows] = paged_attention_batch(q[dec_rows], cache, dec_ids, layer)
            for i in pre:
                kg, vg = cache.gather(items[i].cache_id, layer)
                out[offs[i] : offs[i + 1]] = _causal_attention(q[offs[i] : offs[i + 1]], kg, vg, items[i].start, self.g)
            x = x + a.o_proj(Tensor(out.reshape(n, self.h * self.hd)))
            x = x + block.mlp(block.ln2(x))
        rows = np.concatenate([np.arange(offs[i + 1] - it.n_logits, offs[i + 1]) for i, it in enumerate(items)])
        xl = Tensor(x.data[rows]) if len(rows) < n else x
        logits = m.lm_head(m.ln_f(xl)).data if len(rows) else np.zeros((0, m.config.vocab_size), np.float32)
        res, r = [], 0
        for it in items:
            res.append(logits[r : r + it.n_logits])
            r += it.n_logits
        return res

    def _write(self, layer: int, blk: np.ndarray, slot: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        c = self.cache
        for j, t in ((0, k), (1, v)):
            if c._scale is None:
                c._data[blk, layer, j, slot] = t
            else:
                codes, scales = c.encode_kv(t)
                c._data[blk, layer, j, slot] = codes
                c._scale[blk, layer, j, slot] = scales
