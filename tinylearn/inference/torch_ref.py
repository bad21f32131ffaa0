"""The TinyGPT architecture in torch (same parameter names, same RoPE tables): the oracle for tests and the torch
column of the benchmark. ``forward(ids, past_key_values=None, use_cache=False)`` follows Hugging Face's
``past_key_values`` convention: a list of (K, V) [B, Hkv, S, hd] per layer, returned grown by the new tokens."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .config import GPTConfig
from .model import rope_tables


def torch_reference(config: Any) -> Any:
    """A torch.nn.Module with TinyGPT's architecture and parameter names (``config``: GPTConfig, dict or object)."""
    import torch
    from torch import nn

    c = GPTConfig.coerce(config)

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], dim=-1)

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = nn.Linear(c.d_model, c.n_heads * c.head_dim)
            self.k_proj = nn.Linear(c.d_model, c.kv_heads * c.head_dim)
            self.v_proj = nn.Linear(c.d_model, c.kv_heads * c.head_dim)
            self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.d_model)

        def forward(self, x: torch.Tensor, rope: Any, start: int, past: Any) -> tuple[torch.Tensor, Any]:
            b, t, _ = x.shape
            hd, h, hkv = c.head_dim, c.n_heads, c.kv_heads
            q = self.q_proj(x).view(b, t, h, hd).transpose(1, 2)
            k = self.k_proj(x).view(b, t, hkv, hd).transpose(1, 2)
            v = self.v_proj(x).view(b, t, hkv, hd).transpose(1, 2)
            if rope is not None:
                cos, sin = rope[0][start : start + t], rope[1][start : start + t]
                q = q * cos + rotate_half(q) * sin
                k = k * cos + rotate_half(k) * sin
            if past is not None:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            s = k.shape[2]
            kr = k.repeat_interleave(c.group, dim=1)
            vr = v.repeat_interleave(c.group, dim=1)
            scores = q @ kr.transpose(-1, -2) / math.sqrt(hd)
            if t > 1:
                keep = torch.arange(s)[None, :] <= (start + torch.arange(t))[:, None]
                scores = scores.masked_fill(~keep, float("-inf"))
            out = (scores.softmax(-1) @ vr).transpose(1, 2).reshape(b, t, h * hd)
            return self.o_proj(out), (k, v)

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(c.d_model, 4 * c.d_model)
            self.act = nn.GELU()
            self.proj = nn.Linear(4 * c.d_model, c.d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(self.act(self.fc(x)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(c.d_model)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm(c.d_model)
            self.mlp = MLP()

        def forward(self, x: torch.Tensor, rope: Any, start: int, past: Any) -> tuple[torch.Tensor, Any]:
            a, kv = self.attn(self.ln1(x), rope, start, past)
            x = x + a
            return x + self.mlp(self.ln2(x)), kv

    class TorchGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = c
            self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
            if not c.rope:
                self.pos_emb = nn.Embedding(c.max_seq_len, c.d_model)
            self.blocks = nn.ModuleList([Block() for _ in range(c.n_layers)])
            self.ln_f = nn.LayerNorm(c.d_model)
            self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
            if c.rope:
                cos, sin = rope_tables(c.max_seq_len, c.head_dim)
                self.register_buffer("rope_cos", torch.from_numpy(cos), persistent=False)
                self.register_buffer("rope_sin", torch.from_numpy(sin), persistent=False)

        def forward(self, ids: Any, past_key_values: Any = None, use_cache: bool = False) -> Any:
            ids = torch.as_tensor(np.asarray(ids) if not isinstance(ids, torch.Tensor) else ids, dtype=torch.long)
            if ids.dim() == 1:
                ids = ids[None]
            t = ids.shape[1]
            start = 0 if past_key_values is None else past_key_values[0][0].shape[2]
            if start + t > c.max_seq_len:
                raise ValueError(f"ids: {start} cached + {t} new tokens exceed max_seq_len={c.max_seq_len}")
            x = self.tok_emb(ids)
            if not c.rope:
                x = x + self.pos_emb(torch.arange(start, start + t))
            rope = (self.rope_cos, self.rope_sin) if c.rope else None
            new_past = []
            for i, blk in enumerate(self.blocks):
                x, kv = blk(x, rope, start, None if past_key_values is None else past_key_values[i])
                new_past.append(kv)
            logits = self.lm_head(self.ln_f(x))
            return (logits, new_past) if use_cache else logits

    return TorchGPT()
