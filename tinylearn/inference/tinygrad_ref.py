"""TinyGPT's prefill and single-token decode step written with tinygrad Tensors, for the benchmarks' tinygrad column.

Same parameter names and math as ``torch_reference`` (erf GELU, rotate-half RoPE, GQA), weights copied from a
state dict. Both steps have fixed shapes, as TinyJit needs:

* ``build_prefill``: ``P`` prompt tokens into an empty cache: causal attention over the prompt, logits [P, V] and the
  K/V of every layer written to the first ``P`` slots of a fixed [Hkv, S, hd] cache (zeros after);
* ``build_decode_step``: one token at position ``pos``: the step writes the new K/V into the fixed cache through a
  one-hot row mask and attends over all S slots with an additive mask (0 up to pos, -inf after).

The caches are outputs (and the decode step's inputs), so a caller can feed a prefill's caches to the decode step.
Each step realizes its outputs together, in one schedule: realizing them one by one would recompute the layers they
share (the logits and every layer's caches hang off the same graph). ``jit_compiled`` wraps a step in TinyJit and
compiles it on the spot, optionally with NOOPT=1 (no hand-coded kernel optimisations: tinygrad's Python codegen is
most of the compile time on CPU, and without upcasts/unrolls it has far less to rewrite).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..bench.comparators import tinygrad_jit
from .config import GPTConfig
from .model import rope_tables


class _Graph:
    """The weights as tinygrad Tensors and the layers shared by the prefill and the decode step."""

    def __init__(self, tg: Any, config: Any, state: dict[str, np.ndarray]) -> None:
        self.c = c = GPTConfig.coerce(config)
        self.T = tg.Tensor
        self.w = {k: tg.Tensor(np.ascontiguousarray(v, dtype=np.float32)).realize() for k, v in state.items()}
        self.cos, self.sin = rope_tables(c.max_seq_len, c.head_dim)

    def lin(self, x: Any, name: str, bias: bool = True) -> Any:
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if bias else y

    def ln(self, x: Any, name: str) -> Any:
        return x.layernorm(eps=1e-5) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        hd = self.c.head_dim
        return x * cos + x[..., hd // 2 :].neg().cat(x[..., : hd // 2], dim=-1) * sin

    def forward(self, x: Any, attend: Callable[[int, Any, Any, Any], tuple[Any, Any, Any]]) -> tuple[Any, ...]:
        """Blocks and head on embeddings ``x`` [T, d]; ``attend(layer, q, k, v)`` -> (o [T, h*hd], K cache, V cache)."""
        c, caches = self.c, []
        t = x.shape[0]
        for i in range(c.n_layers):
            p = f"blocks.{i}."
            y = self.ln(x, p + "ln1")
            q = self.lin(y, p + "attn.q_proj").reshape(t, c.n_heads, c.head_dim)
            k = self.lin(y, p + "attn.k_proj").reshape(t, c.kv_heads, c.head_dim)
            v = self.lin(y, p + "attn.v_proj").reshape(t, c.kv_heads, c.head_dim)
            o, kc, vc = attend(i, q, k, v)
            x = x + self.lin(o, p + "attn.o_proj")
            x = x + self.lin(_gelu(self.lin(self.ln(x, p + "ln2"), p + "mlp.fc")), p + "mlp.proj")
            caches += [kc, vc]
        logits = self.lin(self.ln(x, "ln_f"), "lm_head", bias=False)
        logits.realize(*caches)  # one schedule for all outputs (see the module docstring)
        return (logits, *caches)

    def onehot(self, tokens: list[int]) -> np.ndarray:
        v = self.c.vocab_size
        if not tokens or min(tokens) < 0 or max(tokens) >= v:
            raise ValueError(f"tokens: need 1+ ids in [0, {v}), got {tokens}")
        a = np.zeros((len(tokens), v), np.float32)
        a[np.arange(len(tokens)), tokens] = 1
        return a


def build_prefill(tg: Any, config: Any, state: dict[str, np.ndarray], prompt_len: int, cache_len: int) -> Any:
    """(prefill, make_inputs): ``prefill(*make_inputs(tokens))`` -> (logits [P, V], *caches [Hkv, S, hd] per layer).

    ``tokens``: ``prompt_len`` ids; the caches hold their K/V in slots [0, P) and zeros in [P, cache_len)."""
    g = _Graph(tg, config, state)
    c, hd, hkv = g.c, g.c.head_dim, g.c.kv_heads
    p = int(prompt_len)
    if not 1 <= p <= min(cache_len, c.max_seq_len):
        raise ValueError(f"prompt_len: must be in [1, min(cache_len, max_seq_len)], got {prompt_len}")
    if cache_len > c.max_seq_len:
        raise ValueError(f"cache_len: must be <= max_seq_len={c.max_seq_len}, got {cache_len}")

    def prefill(onehot: Any, cos: Any, sin: Any, amask: Any) -> Any:
        x = onehot @ g.w["tok_emb.weight"]  # [P, d]
        if not c.rope:
            x = x + g.w["pos_emb.weight"][:p]

        def attend(i: int, q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
            q, k, v = q.permute(1, 0, 2), k.permute(1, 0, 2), v.permute(1, 0, 2)  # [heads, P, hd]
            if c.rope:
                q, k = g.rope(q, cos, sin), g.rope(k, cos, sin)
            s = q.reshape(hkv, c.group, p, hd) @ k.reshape(hkv, 1, p, hd).transpose(-1, -2) * (1.0 / math.sqrt(hd))
            o = (s + amask).softmax(-1) @ v.reshape(hkv, 1, p, hd)  # [Hkv, g, P, hd]
            o = o.reshape(c.n_heads, p, hd).permute(1, 0, 2).reshape(p, c.n_heads * hd)
            pad = ((0, 0), (0, cache_len - p), (0, 0))
            return o, k.pad(pad), v.pad(pad)

        return g.forward(x, attend)

    def make_inputs(tokens: Any) -> tuple[Any, ...]:
        toks = [int(t) for t in np.asarray(tokens).reshape(-1)]
        if len(toks) != p:
            raise ValueError(f"tokens: expected {p} ids (prompt_len), got {len(toks)}")
        am = np.triu(np.full((p, p), -np.inf, np.float32), 1)
        return tuple(g.T(a).realize() for a in (g.onehot(toks), g.cos[:p], g.sin[:p], am))

    return prefill, make_inputs


def build_decode_step(tg: Any, config: Any, state: dict[str, np.ndarray], cache_len: int) -> Any:
    """(step, make_inputs): ``step(*make_inputs(token, pos, caches))`` -> (logits [1, V], *new caches).

    ``make_inputs(token, pos, caches=None)`` builds the tinygrad inputs (caches None: zero caches)."""
    g = _Graph(tg, config, state)
    c, hd, hkv = g.c, g.c.head_dim, g.c.kv_heads

    def step(onehot: Any, cos: Any, sin: Any, wmask: Any, amask: Any, *caches: Any) -> Any:
        x = onehot @ g.w["tok_emb.weight"]  # [1, d]
        if not c.rope:
            x = x + wmask.reshape(1, cache_len) @ g.w["pos_emb.weight"][:cache_len]

        def attend(i: int, q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
            q, k = q.reshape(c.n_heads, hd), k.reshape(hkv, hd)
            if c.rope:
                q, k = g.rope(q, cos, sin), g.rope(k, cos, sin)
            kc = caches[2 * i] * (1 - wmask) + k.reshape(hkv, 1, hd) * wmask  # [Hkv, S, hd]
            vc = caches[2 * i + 1] * (1 - wmask) + v.reshape(hkv, 1, hd) * wmask
            s = q.reshape(hkv, c.group, hd) @ kc.transpose(-1, -2) * (1.0 / math.sqrt(hd)) + amask  # [Hkv, g, S]
            return (s.softmax(-1) @ vc).reshape(1, c.n_heads * hd), kc, vc

        return g.forward(x, attend)

    def make_inputs(token: int, pos: int, caches: list[Any] | None = None) -> tuple[Any, ...]:
        if not 0 <= pos < cache_len:
            raise ValueError(f"pos: must be in [0, {cache_len}), got {pos}")
        wm = np.zeros((cache_len, 1), np.float32)
        wm[pos] = 1
        am = np.where(np.arange(cache_len) <= pos, 0.0, -np.inf).astype(np.float32)
        if caches is None:
            caches = [g.T.zeros(hkv, cache_len, hd).contiguous().realize() for _ in range(2 * c.n_layers)]
        ins = [g.onehot([token]), g.cos[pos : pos + 1], g.sin[pos : pos + 1], wm, am]
        return (*(g.T(a).realize() for a in ins), *caches)

    return step, make_inputs


def jit_compiled(tg: Any, step: Any, inputs: tuple[Any, ...], noopt: bool = False) -> tuple[Callable[[], Any], float]:
    """(replay, seconds): ``step`` under TinyJit on the fixed ``inputs``, compiled now.

    TinyJit runs (and compiles) on its first call and captures the kernels on the second; both happen here, with
    tinygrad's NOOPT=1 when ``noopt``, and ``seconds`` is their wall time. ``replay()`` runs the captured kernels.
    The kernels compile in this process (PARALLEL=0): tinygrad's default pool of spawned compile workers, each
    re-importing tinygrad, made the compile of a TinyGPT step 1.4-2.4x slower on a 2-core box."""
    if not isinstance(noopt, bool):
        raise TypeError(f"noopt: expected a bool, got {type(noopt).__name__} {noopt!r}")
    f = tinygrad_jit(step)
    t0 = time.perf_counter()
    with tg.helpers.Context(NOOPT=int(noopt), PARALLEL=0):
        for _ in range(2):
            f(*inputs)
    return (lambda: f(*inputs)), time.perf_counter() - t0


def _gelu(x: Any) -> Any:
    """Exact (erf) GELU, torch.nn.GELU()'s default; tinygrad's Tensor.gelu is the tanh approximation."""
    return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())
