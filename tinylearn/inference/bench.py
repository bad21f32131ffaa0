"""``tinylearn bench inference``: decode speed vs context length, with and without a KV cache.

One decode step = the logits of token S+1 given S tokens of context. With a cache it processes 1 new token and
reads S cached K/V rows per layer (O(S) attention); without one it re-runs all S+1 tokens (O(S^2) attention and
S+1 MLP rows). Side by side on the same weights: tinylearn (its own autograd/nn, numpy), torch eager with a
Hugging-Face-style ``past_key_values`` cache (the baseline), and tinygrad (TinyJit, fixed-size cache of S+1 slots
written through a one-hot mask; see tinylearn.inference.tinygrad_ref). Second table: the attention of one decode
query over S cached tokens, paged (block-wise online softmax) vs dense numpy vs torch SDPA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..bench.comparators import Comparison, tinygrad_jit
from ..bench.table import Table
from .config import GPTConfig

BENCH_CONFIG = GPTConfig(vocab_size=256, d_model=128, n_heads=8, n_layers=4, max_seq_len=1100, n_kv_heads=2)


def _tok_s(row: Any) -> None:
    if row is not None and row.median_ms:
        row.extra["tok/s"] = 1e3 / row.median_ms


def decode_table(full: bool = False, progress: Callable[[str], None] | None = None) -> Table:
    import torch

    cfg = BENCH_CONFIG
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # batch-1 decode of a small model: one thread each (numpy's small GEMMs are serial too)
    try:
        return _decode_table(cfg, full, progress)
    finally:
        torch.set_num_threads(threads)


def _decode_table(cfg: GPTConfig, full: bool, progress: Callable[[str], None] | None) -> Table:
    import torch

    from ..autograd import no_grad
    from .model import TinyGPT
    from .tinygrad_ref import build_decode_step
    from .torch_ref import torch_reference

    lengths = [32, 128, 512, 1024] if full else [32, 128, 512]
    torch.manual_seed(0)
    ref = torch_reference(cfg).eval()
    model = TinyGPT.from_config(cfg).load_torch_state_dict(ref.state_dict())
    sd = {k: v.numpy() for k, v in ref.state_dict().items()}
    cmp = Comparison(f"decode 1 token at context S ({_describe(cfg)})", baseline="torch", progress=progress, repeat=7)
    rng = np.random.default_rng(0)
    for s in lengths:
        ids = rng.integers(0, cfg.vocab_size, (1, s + 1))
        with cmp.case(f"S={s}") as c:
            cache = model.new_cache(1)
            with no_grad():
                model(ids[:, :s], cache)

            def tl_cached(cache: Any = cache, ids: Any = ids, s: int = s) -> Any:
                cache.length = s  # decode the same position every call
                with no_grad():
                    return model(ids[:, s:], cache)

            def tl_full(ids: Any = ids) -> Any:
                with no_grad():
                    return model(ids)

            tids = torch.from_numpy(ids)
            with torch.no_grad():
                _, past = ref(tids[:, :s], use_cache=True)

            def torch_cached(tids: Any = tids, past: Any = past, s: int = s) -> Any:
                with torch.no_grad():
                    return ref(tids[:, s:], past_key_values=past, use_cache=True)[0]

            def torch_full(tids: Any = tids) -> Any:
                with torch.no_grad():
                    return ref(tids)

            _tok_s(c.add("torch", torch_cached, note="past_key_values cache"))
            _tok_s(c.add("torch no-cache", torch_full, note="full recompute"))
            _tok_s(c.add("tinylearn cache", tl_cached, note="dense KV cache"))
            _tok_s(c.add("tinylearn no-cache", tl_full, note="full recompute"))

            def build(tg: Any, ids: Any = ids, s: int = s) -> Callable[[], Any]:
                step, make = build_decode_step(tg, cfg, sd, s + 1)
                f = tinygrad_jit(step)
                ins = make(int(ids[0, s]), s)
                return lambda: f(*ins)

            _tok_s(c.add_tinygrad("tinygrad", build, note="TinyJit, fixed cache of S+1 slots"))
    cmp.note(
        f"torch threads: {torch.get_num_threads()} (set for this table); "
        "tok/s = 1 / median step time (batch 1, fp32, CPU)"
    )
    cmp.note("torch.compile: n/a here (the cache grows every step: a recompile or dynamic shapes per length)")
    return cmp.table


def attention_table(full: bool = False, progress: Callable[[str], None] | None = None) -> Table:
    """Decode attention of one query over S cached tokens: the paged ladder (numpy block loop -> C++ scalar -> C++
    SIMD, all reading the block table) beside torch SDPA and tinygrad (TinyJit) on a contiguous [Hq, S, D] cache."""
    import torch

    from ..bench.comparators import tinygrad_jit
    from .paged import PagedKVCache, dense_attention, paged_attention

    h, hq, d = 2, 8, 64
    lengths = [128, 1024, 4096] if full else [128, 1024]
    cmp = Comparison(f"decode attention over S cached tokens (Hq={hq}, Hkv={h}, D={d})", progress=progress)
    rng = np.random.default_rng(1)
    for s in lengths:
        cache = PagedKVCache(1, h, d, num_blocks=s // 16 + 1, block_size=16)
        sid = cache.new_sequence()
        cache.append(
            sid, 0, rng.standard_normal((s, h, d), dtype=np.float32), rng.standard_normal((s, h, d), dtype=np.float32)
        )
        q = rng.standard_normal((hq, d), dtype=np.float32)
        k, v = cache.gather(sid, 0)
        kc = np.ascontiguousarray(k.transpose(1, 0, 2).repeat(hq // h, 0))  # [Hq, S, D]: the contiguous cache
        vc = np.ascontiguousarray(v.transpose(1, 0, 2).repeat(hq // h, 0))
        tq, tk, tv = torch.from_numpy(q)[:, None], torch.from_numpy(kc), torch.from_numpy(vc)

        def tg_build(tg: Any, q: np.ndarray = q, kc: np.ndarray = kc, vc: np.ndarray = vc) -> Callable[[], Any]:
            xs = (tg.Tensor(q[:, None]), tg.Tensor(kc), tg.Tensor(vc))
            run = tinygrad_jit(lambda a, b, c: a.scaled_dot_product_attention(b, c))
            return lambda: run(*xs)

        def paged(backend: str, version: str | None = None, q: np.ndarray = q, cache: Any = cache, sid: int = sid):
            return lambda: paged_attention(q, cache, sid, 0, backend=backend, version=version)

        with cmp.case(f"S={s}", nbytes=2 * s * h * d * 4) as c:
            c.add("torch", lambda tq=tq, tk=tk, tv=tv: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv))
            c.add_tinygrad("tinygrad", tg_build, note="TinyJit, contiguous K/V")
            c.add("numpy dense (gathered)", lambda q=q, k=k, v=v: dense_attention(q, k, v))
            c.add("tinylearn paged numpy loop", paged("numpy"), note="one numpy pass per 16-token block")
            c.add("tinylearn paged C++ scalar", paged("cpp", "scalar"))
            c.add("tinylearn paged C++ SIMD", paged("cpp", "simd"), note="the default")
    cmp.note(
        "paged: block-table gather fused with the online softmax, each K/V row read once for its Hq/Hkv query "
        "heads; torch SDPA and tinygrad read a contiguous [Hq, S, D] cache (no block table)"
    )
    cmp.note(f"torch threads: {torch.get_num_threads()}")
    return cmp.table


def _describe(c: GPTConfig) -> str:
    return f"d={c.d_model}, L={c.n_layers}, H={c.n_heads}, Hkv={c.kv_heads}, V={c.vocab_size}"


def run(full: bool = False, progress: Callable[[str], None] | None = None) -> list[Table]:
    return [decode_table(full, progress), _one_thread(attention_table, full, progress)]


def _one_thread(fn: Callable[..., Table], *args: Any) -> Table:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)
