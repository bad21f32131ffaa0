"""TinyGPT: a pre-LN decoder-only transformer on tinylearn's own autograd/nn, with a dense KV cache.

    x = tok_emb[ids] (+ pos_emb[pos] when rope=False)
    per block:  x = x + attn(ln1(x));  x = x + mlp(ln2(x))        (pre-LN; mlp = fc -> GELU(erf) -> proj)
    logits = lm_head(ln_f(x))                                      (lm_head untied, no bias)

Attention: q [B, H, T, hd], k/v [B, Hkv, S, hd]; H = Hkv * g. Grouped-query attention without copying K/V:
query head h uses KV head h // g (torch ``repeat_interleave`` order), so q reshaped to [B, Hkv, g*T, hd] multiplies
each KV head once. Causal mask: query i (absolute position start + i) sees keys j <= start + i.

RoPE, rotate-half convention (GPT-NeoX / Llama in Hugging Face): for a head vector x of size hd,
    x1, x2 = x[:hd/2], x[hd/2:];  rotate_half(x) = [-x2, x1]
    rope(x, pos) = x * cos(pos * f) + rotate_half(x) * sin(pos * f),  f_i = 10000^(-2i/hd), cos/sin repeated twice
so dims i and i + hd/2 form one rotating pair (not the interleaved (2i, 2i+1) pairs of the original paper/GPT-J).
Rotating q and k by their absolute positions makes q.k depend only on the position difference.

Dense KV cache: per layer K and V arrays [B, Hkv, max_seq_len, hd]; a step with T new tokens writes positions
[length, length + T) and attends over [0, length + T). Decoding one token then costs O(S) instead of re-running
the whole prefix (O(S^2) attention + O(S) MLP rows per token).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import Function, Tensor, cat, no_grad
from ..nn import GELU, Embedding, LayerNorm, Linear, Module, ModuleList
from ..nn import functional as F
from . import decode_fast
from .checks import int_arg
from .config import GPTConfig
from .rope import rope_kernel

ROPE_BASE = 10000.0


def rope_tables(max_seq_len: int, head_dim: int, base: float = ROPE_BASE) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin float32 [max_seq_len, head_dim] (rotate-half layout: the hd/2 frequencies repeated twice)."""
    for name, v in (("max_seq_len", max_seq_len), ("head_dim", head_dim)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
    if head_dim % 2:
        raise ValueError(f"head_dim: rotate-half RoPE needs an even head_dim, got {head_dim}")
    if not (isinstance(base, int | float | np.integer | np.floating) and np.isfinite(base) and base > 0):
        raise ValueError(f"base: must be a finite number > 0, got {base!r}")
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(max_seq_len, dtype=np.float64)[:, None] * inv_freq[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rotate_half(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return cat([-x[..., h:], x[..., :h]], dim=-1)


class Rope(Function):
    """y = x * cos + rotate_half(x) * sin as one op (the composite is 7 ops: two muls, a neg, two slices, a cat
    and an add, each a graph node; a decode step rotates q and k in every layer).

    rotate_half is the linear map R([x1, x2]) = [-x2, x1]; its transpose is R^T([u1, u2]) = [u2, -u1], so
    dx = g * cos + R^T(g * sin). cos/sin are constants (no gradient)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        y = rope_kernel(x, cos, sin, False)
        if y is not None:
            return y
        h = x.shape[-1] // 2
        out = x * cos
        out[..., :h] -= x[..., h:] * sin[..., :h]
        out[..., h:] += x[..., :h] * sin[..., h:]
        return out

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        gx = rope_kernel(g, cos, sin, True)
        if gx is not None:
            return gx, None, None
        h = g.shape[-1] // 2
        u = g * sin
        gx = g * cos
        gx[..., :h] += u[..., h:]
        gx[..., h:] -= u[..., :h]
        return gx, None, None


def apply_rope(x: Tensor, cos: np.ndarray, sin: np.ndarray) -> Tensor:
    """x [..., T, hd] rotated by cos/sin [T, hd] (positions already sliced): x * cos + rotate_half(x) * sin.
    cos/sin may be any shape that broadcasts to x's with the same last dim (e.g. [hd] for one position)."""
    cs, ss, xs = np.shape(cos), np.shape(sin), tuple(x.shape)
    try:
        fits = cs == ss and cs[-1:] == xs[-1:] and np.broadcast_shapes(xs, cs) == xs
    except ValueError:
        fits = False
    if not fits or xs[-1] % 2:
        raise ValueError(f"cos, sin: expected one shape broadcasting to x {xs} (even last dim), got {cs}, {ss}")
    return Rope.apply(x, np.asarray(cos, x.dtype), np.asarray(sin, x.dtype))


def causal_mask(t: int, start: int) -> np.ndarray:
    """[t, start + t] additive mask: 0 where key j <= start + i, -inf above."""
    t, start = int_arg(t, "t", minimum=0), int_arg(start, "start", minimum=0)
    s = start + t
    keep = np.arange(s)[None, :] <= (start + np.arange(t))[:, None]
    return np.where(keep, 0.0, -np.inf).astype(np.float32)


class DenseKVCache:
    """Preallocated per-layer K/V [B, Hkv, max_seq_len, hd] and the number of cached positions ``length``."""

    def __init__(self, config: GPTConfig, batch_size: int = 1, dtype: Any = np.float32) -> None:
        c = GPTConfig.coerce(config)
        batch_size = int_arg(batch_size, "batch_size")
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        try:
            dtype = np.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"dtype: expected a numpy float dtype, got {dtype!r}") from e
        if dtype.kind != "f":
            raise TypeError(f"dtype: expected a numpy float dtype, got {dtype}")
        shape = (batch_size, c.kv_heads, c.max_seq_len, c.head_dim)
        self.k = [np.zeros(shape, dtype) for _ in range(c.n_layers)]
        self.v = [np.zeros(shape, dtype) for _ in range(c.n_layers)]
        self.batch_size, self.max_seq_len, self.length = batch_size, c.max_seq_len, 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k + self.v)

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store k/v [B, Hkv, T, hd] at positions [length, length + T); return all cached K/V of ``layer``."""
        end = kv_append(self.k[layer], self.v[layer], self.length, k, v)
        return kv_gather(self.k[layer], self.v[layer], end)


def kv_append(k_cache: np.ndarray, v_cache: np.ndarray, length: int, k: np.ndarray, v: np.ndarray) -> int:
    """Write k/v [B, H, T, D] into the preallocated caches [B, H, max_len, D] at [length, length + T).

    Returns the new length; ValueError (naming max_len) when the caches would overflow."""
    length = int_arg(length, "length", minimum=0)
    k, v = np.asarray(k), np.asarray(v)
    if k.ndim != 4 or np.ndim(k_cache) != 4 or np.shape(v_cache) != np.shape(k_cache):
        raise ValueError(f"k, k_cache: expected 4-D [B, H, T, D] arrays, got {k.shape}, {np.shape(k_cache)}")
    t = k.shape[2]
    if k.shape != v.shape or k.shape[:2] != k_cache.shape[:2] or k.shape[3] != k_cache.shape[3]:
        raise ValueError(f"k, v: expected [B, H, T, D] matching the cache {k_cache.shape}, got {k.shape}, {v.shape}")
    if length + t > k_cache.shape[2]:
        raise ValueError(f"length: {length} + {t} new tokens exceed the cache's max_len={k_cache.shape[2]}")
    k_cache[:, :, length : length + t] = k
    v_cache[:, :, length : length + t] = v
    return length + t


def kv_gather(k_cache: np.ndarray, v_cache: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``length`` cached positions (views, no copy): [B, H, length, D] each."""
    length = int_arg(length, "length", minimum=0)
    if length > np.shape(k_cache)[2]:
        raise ValueError(f"length: {length} exceeds the cache's max_len={np.shape(k_cache)[2]}")
    return k_cache[:, :, :length], v_cache[:, :, :length]


class Attention(Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.c = c
        self.q_proj = Linear(c.d_model, c.n_heads * c.head_dim)
        self.k_proj = Linear(c.d_model, c.kv_heads * c.head_dim)
        self.v_proj = Linear(c.d_model, c.kv_heads * c.head_dim)
        self.o_proj = Linear(c.n_heads * c.head_dim, c.d_model)

    def forward(
        self, x: Tensor, rope: tuple[np.ndarray, np.ndarray] | None, start: int, cache: Any, layer: int
    ) -> Tensor:
        c = self.c
        b, t, _ = x.shape
        hd, h, hkv, g = c.head_dim, c.n_heads, c.kv_heads, c.group
        q = self.q_proj(x).reshape(b, t, h, hd).transpose(1, 2)
        k = self.k_proj(x).reshape(b, t, hkv, hd).transpose(1, 2)
        v = self.v_proj(x).reshape(b, t, hkv, hd).transpose(1, 2)
        if rope is not None:
            cos, sin = rope[0][start : start + t], rope[1][start : start + t]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            ka, va = cache.write(layer, k.data, v.data)
            k, v = Tensor(ka), Tensor(va)
        s = start + t
        if t == 1:  # decode: no mask; the fused attention op (the C++ flash kernel where built), GQA as g query rows
            out = F.scaled_dot_product_attention(q.reshape(b, hkv, g, hd), k, v)
            return self.o_proj(out.reshape(b, 1, h * hd))
        if start == 0 and not (q.requires_grad or k.requires_grad or v.requires_grad):
            # inference prefill from position 0: causal attention over the t new tokens in one fused flash kernel
            # (kernels.attention, the C++ kernel where built; GQA by repeating the kv heads) instead of five ops.
            # Training keeps the explicit scores: their [B, H, T, T] activations are what notebook 11's memory
            # estimator models and measures
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # [B, H, T, hd]
            return self.o_proj(out.transpose(1, 2).reshape(b, t, h * hd))
        scores = (q.reshape(b, hkv, g * t, hd) @ k.transpose(-1, -2)) * (1.0 / np.sqrt(hd))
        if t > 1:
            scores = (scores.reshape(b, hkv, g, t, s) + Tensor(causal_mask(t, start))).reshape(b, hkv, g * t, s)
        out = F.softmax(scores, -1) @ v  # [B, Hkv, g*T, hd]; F.softmax: the C++ row kernel (the method: numpy)
        out = out.reshape(b, h, t, hd).transpose(1, 2).reshape(b, t, h * hd)
        return self.o_proj(out)


class MLP(Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.fc = Linear(c.d_model, 4 * c.d_model)
        self.act = GELU()
        self.proj = Linear(4 * c.d_model, c.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.ln1 = LayerNorm(c.d_model)
        self.attn = Attention(c)
        self.ln2 = LayerNorm(c.d_model)
        self.mlp = MLP(c)

    def forward(self, x: Tensor, rope: Any, start: int, cache: Any, layer: int) -> Tensor:
        x = x + self.attn(self.ln1(x), rope, start, cache, layer)
        return x + self.mlp(self.ln2(x))


def check_ids(ids: Any, vocab_size: int, name: str = "ids") -> np.ndarray:
    """ids as an int64 [B, T] array (a [T] list/array becomes [1, T]); TypeError/ValueError naming the problem."""
    if isinstance(ids, Tensor):
        ids = ids.data
    arr = np.asarray(ids)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise TypeError(f"{name}: token ids must be integers, got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"{name}: expected shape [B, T] with T >= 1, got {tuple(np.asarray(ids).shape)}")
    if arr.min() < 0 or arr.max() >= vocab_size:
        raise ValueError(f"{name}: token ids must lie in [0, {vocab_size}), got range [{arr.min()}, {arr.max()}]")
    return arr.astype(np.int64)


class TinyGPT(Module):
    """Decoder-only transformer; ``model(ids [B, T]) -> logits [B, T, V]``; see the module docstring."""

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        n_heads: int,
        n_layers: int,
        max_seq_len: int,
        n_kv_heads: int | None = None,
        rope: bool = True,
    ) -> None:
        super().__init__()
        c = GPTConfig(vocab_size, d_model, n_heads, n_layers, max_seq_len, n_kv_heads, rope)
        self.config = c
        self.tok_emb = Embedding(vocab_size, d_model)
        if not rope:
            self.pos_emb = Embedding(max_seq_len, d_model)
        self.blocks = ModuleList([Block(c) for _ in range(n_layers)])
        self.ln_f = LayerNorm(d_model)
        self.lm_head = Linear(d_model, vocab_size, bias=False)
        self._rope = rope_tables(max_seq_len, c.head_dim) if rope else None

    @classmethod
    def from_config(cls, config: Any) -> TinyGPT:
        c = GPTConfig.coerce(config)
        return cls(c.vocab_size, c.d_model, c.n_heads, c.n_layers, c.max_seq_len, c.n_kv_heads, c.rope)

    def new_cache(self, batch_size: int = 1) -> DenseKVCache:
        """An empty dense KV cache for ``forward(ids, cache=...)``."""
        return DenseKVCache(self.config, batch_size)

    def forward(self, ids: Any, cache: Any = None) -> Tensor:
        """logits [B, T, V]. With ``cache``: ids are the next T tokens after ``cache.length`` cached ones.

        ``cache``: a DenseKVCache (``new_cache``) or ``PagedKVCache.model_cache(seq_id)`` (paged blocks)."""
        c = self.config
        ids = check_ids(ids, c.vocab_size)
        b, t = ids.shape
        start = 0
        if cache is not None:
            if not all(hasattr(cache, a) for a in ("write", "length", "batch_size")):
                raise TypeError(
                    f"cache: expected a DenseKVCache (or write/length/batch_size), got {type(cache).__name__}"
                )
            if cache.batch_size != b:
                raise ValueError(f"cache: batch size {cache.batch_size} does not match ids batch {b}")
            start = cache.length
        if start + t > c.max_seq_len:
            raise ValueError(f"ids: {start} cached + {t} new tokens exceed max_seq_len={c.max_seq_len}")
        plan = decode_fast.eligible(self, (Block, Attention, MLP)) if t == 1 and cache is not None else None
        if plan is not None:
            return decode_fast.step(self, ids, cache, start, Rope, plan)  # no graph: the ops' forwards directly
        x = self.tok_emb(ids)
        if not c.rope:
            x = x + self.pos_emb(np.arange(start, start + t))
        for i, blk in enumerate(self.blocks):
            x = blk(x, self._rope, start, cache, i)
        if cache is not None:
            cache.length = start + t
        return self.lm_head(self.ln_f(x))

    @no_grad()
    def logits_last(self, ids: Any, cache: DenseKVCache | None = None) -> np.ndarray:
        """float32 [V] logits of the last position (batch 1), without autograd."""
        return self.forward(ids, cache).data[0, -1]

    def load_torch_state_dict(self, sd: Any) -> TinyGPT:
        """Load a ``torch_reference(config).state_dict()`` (same parameter names)."""
        arrays = {k: (v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)) for k, v in sd.items()}
        self.load_state_dict(arrays)
        return self

    def extra_repr(self) -> str:
        return str(self.config)
