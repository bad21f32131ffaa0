"""TinyGPT's single-token decode step written with tinygrad Tensors, for the benchmark's tinygrad column.

TinyJit needs fixed shapes, so the KV cache is a fixed [Hkv, S, hd] buffer per layer (S = context + 1): the step
writes the new K/V at position ``pos`` through a one-hot row mask and attends over all S slots with an additive
mask (0 up to pos, -inf after). The cache buffers are jit inputs and the updated caches are outputs, so a caller
can feed them back. Same parameter names and math as ``torch_reference`` (erf GELU, rotate-half RoPE, GQA).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .config import GPTConfig
from .model import rope_tables


def build_decode_step(tg: Any, config: Any, state: dict[str, np.ndarray], cache_len: int) -> Any:
    """(step, make_inputs): ``step(*make_inputs(token, pos, caches))`` -> (logits [1, V], *new caches).

    ``make_inputs(token, pos, caches=None)`` builds the tinygrad inputs (caches None: zero caches)."""
    c = GPTConfig.coerce(config)
    T = tg.Tensor  # noqa: N806
    w = {k: T(np.ascontiguousarray(v, dtype=np.float32)).realize() for k, v in state.items()}
    hd, h, hkv, g = c.head_dim, c.n_heads, c.kv_heads, c.group
    cos_t, sin_t = rope_tables(c.max_seq_len, hd)

    def lin(x: Any, name: str, bias: bool = True) -> Any:
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if bias else y

    def ln(x: Any, name: str) -> Any:
        return x.layernorm(eps=1e-5) * w[name + ".weight"] + w[name + ".bias"]

    def rot(x: Any) -> Any:
        return x[..., hd // 2 :].neg().cat(x[..., : hd // 2], dim=-1)

    def step(onehot: Any, cos: Any, sin: Any, wmask: Any, amask: Any, *caches: Any) -> Any:
        x = onehot @ w["tok_emb.weight"]  # [1, d]
        if not c.rope:
            x = x + wmask.reshape(1, cache_len) @ w["pos_emb.weight"][:cache_len]
        out = []
        for i in range(c.n_layers):
            p = f"blocks.{i}."
            y = ln(x, p + "ln1")
            q = lin(y, p + "attn.q_proj").reshape(h, hd)
            k = lin(y, p + "attn.k_proj").reshape(hkv, hd)
            v = lin(y, p + "attn.v_proj").reshape(hkv, hd)
            if c.rope:
                q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            kc = caches[2 * i] * (1 - wmask) + k.reshape(hkv, 1, hd) * wmask  # [Hkv, S, hd]
            vc = caches[2 * i + 1] * (1 - wmask) + v.reshape(hkv, 1, hd) * wmask
            s = q.reshape(hkv, g, hd) @ kc.transpose(-1, -2) * (1.0 / math.sqrt(hd)) + amask  # [Hkv, g, S]
            o = (s.softmax(-1) @ vc).reshape(1, h * hd)
            x = x + lin(o, p + "attn.o_proj")
            y = ln(x, p + "ln2")
            x = x + lin(_gelu(lin(y, p + "mlp.fc")), p + "mlp.proj")
            out += [kc, vc]
        return (lin(ln(x, "ln_f"), "lm_head", bias=False), *out)

    def make_inputs(token: int, pos: int, caches: list[Any] | None = None) -> tuple[Any, ...]:
        if not 0 <= pos < cache_len:
            raise ValueError(f"pos: must be in [0, {cache_len}), got {pos}")
        onehot = np.zeros((1, c.vocab_size), np.float32)
        onehot[0, token] = 1
        wm = np.zeros((cache_len, 1), np.float32)
        wm[pos] = 1
        am = np.where(np.arange(cache_len) <= pos, 0.0, -np.inf).astype(np.float32)
        if caches is None:
            caches = [T.zeros(hkv, cache_len, hd).contiguous().realize() for _ in range(2 * c.n_layers)]
        ins = [onehot, cos_t[pos : pos + 1], sin_t[pos : pos + 1], wm, am]
        return (*(T(a).realize() for a in ins), *caches)

    return step, make_inputs


def _gelu(x: Any) -> Any:
    """Exact (erf) GELU, torch.nn.GELU()'s default; tinygrad's Tensor.gelu is the tanh approximation."""
    return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())
