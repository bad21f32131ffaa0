"""Paged attention (vLLM's PagedAttention): decode queries attending over a ``PagedKVCache`` block by block.

``paged_attention(q, cache, seq_id, layer)`` (one query) and ``paged_attention_batch(q, cache, seq_ids, layer)`` (a
ragged batch) run the online-softmax recurrence over each sequence's block table, so no [S, H, D] gather is
materialised; registered as op ``inference.paged_attention`` with a numpy reference and the C++ kernel
(cpp_src/inference_paged_decode.cpp, versions "simd" and "scalar").

Layout: the block manager (``PagedKVCache``: allocate, fork, copy-on-write, prefix index, eviction) is in
``tinylearn.inference.paged_cache``, the pure arithmetic (``blocks_needed``, ``locate``, ``kv_bytes_per_token``,
the int8 codec, ``priority_keep``, ``dense_attention``) in ``tinylearn.inference.paged_math``; this module
re-exports them, so every ``tinylearn.inference.paged.X`` of before the split still works.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import backends
from .paged_cache import _DTYPES, PagedKVCache, PagedSequenceCache, _pos_int, _Seq  # noqa: F401  (re-exported)
from .paged_math import (  # noqa: F401  (re-exported: the names this module held before the split)
    _attn_arrays,
    attention_received,
    blocks_needed,
    dense_attention,
    dequantize_int8,
    kv_bytes_per_token,
    locate,
    priority_keep,
    quantize_int8,
)


def _q_float32(q: Any) -> np.ndarray:
    return np.asarray(q.data if hasattr(q, "data") and not isinstance(q, np.ndarray) else q, dtype=np.float32)


def paged_attention(
    q: Any, cache: PagedKVCache, seq_id: int, layer: int, *, backend: str | None = None, version: str | None = None
) -> np.ndarray:
    """One decode query q [Hq, D] attending over the sequence's cached tokens, reading block by block.

    Online softmax across blocks (running max m, normaliser l, accumulator acc -- the FlashAttention/vLLM
    recurrence), so no [S, H, D] gather is materialised. Hq must be a multiple of the cache's n_kv_heads (GQA).
    ``backend``: "cpp" (the C++ kernel, the default where it is built) or "numpy" (the block loop); see
    ``paged_attention_batch``."""
    _check_cache(cache)
    qa = _q_float32(q)
    h, d = cache.n_kv_heads, cache.head_dim
    if qa.ndim != 2 or qa.shape[1] != d or qa.shape[0] % h:
        raise ValueError(f"q: expected shape [Hq, head_dim={d}] with Hq a multiple of n_kv_heads={h}, got {qa.shape}")
    return paged_attention_batch(qa[None], cache, [seq_id], layer, backend=backend, version=version)[0]


def paged_attention_batch(
    q: Any,
    cache: PagedKVCache,
    seq_ids: Any,
    layer: int,
    *,
    backend: str | None = None,
    version: str | None = None,
) -> np.ndarray:
    """A ragged batch of decode queries: q [B, Hq, D], query b attends over the cached tokens of ``seq_ids[b]``
    (each its own length) in ``layer`` -> [B, Hq, D] float32. Registered as ``inference.paged_attention``:
    "numpy" (the per-block loop, the reference) and "cpp" (cpp_src/inference_paged_decode.cpp: block-table gather
    fused with the online softmax, int8 and fp8 (E4M3) dequantized in the kernel; versions "simd" -- AVX2 where the
    CPU and TINYLEARN_CPU_FEATURES allow it -- and "scalar")."""
    _check_cache(cache)
    qa = _q_float32(q)
    h, d = cache.n_kv_heads, cache.head_dim
    if qa.ndim != 3 or qa.shape[2] != d or qa.shape[1] % h or qa.shape[1] == 0:
        raise ValueError(
            f"q: expected shape [B, Hq, head_dim={d}] with Hq a multiple of n_kv_heads={h}, got {qa.shape}"
        )
    ids = list(seq_ids) if isinstance(seq_ids, list | tuple | np.ndarray) else None
    if ids is None or len(ids) != qa.shape[0]:
        raise ValueError(f"seq_ids: expected a list of {qa.shape[0]} sequence ids (one per query), got {seq_ids!r}")
    layer = cache._layer(layer)
    for sid in ids:
        if cache._seq(sid).lens[layer] == 0:
            raise ValueError(f"seq_id: sequence {sid} has no cached tokens in layer {layer}")
    return backends.dispatch("inference.paged_attention", qa, cache, ids, layer, backend=backend, version=version)


def _check_cache(cache: Any) -> None:
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache: expected a PagedKVCache, got {type(cache).__name__}")


def _paged_attention_numpy(q: np.ndarray, cache: PagedKVCache, seq_ids: list[int], layer: int) -> np.ndarray:
    """The reference: per query, the online softmax over the sequence's blocks in numpy (one block per step)."""
    return np.stack([_paged_attention_one(qb, cache, sid, layer) for qb, sid in zip(q, seq_ids)])


def _paged_attention_one(q: np.ndarray, cache: PagedKVCache, seq_id: int, layer: int) -> np.ndarray:
    h, d = cache.n_kv_heads, cache.head_dim
    g = q.shape[0] // h
    qg = q.reshape(h, g, d)
    scale = 1.0 / np.sqrt(d)
    m = np.full((h, g), -np.inf, dtype=np.float32)
    lsum = np.zeros((h, g), dtype=np.float32)
    acc = np.zeros((h, g, d), dtype=np.float32)
    for kb, vb in cache.iter_blocks(seq_id, layer):
        s = np.einsum("hgd,nhd->hgn", qg, kb) * scale
        m_new = np.maximum(m, s.max(-1))
        alpha = np.exp(m - m_new)
        p = np.exp(s - m_new[..., None])
        lsum = lsum * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + np.einsum("hgn,nhd->hgd", p, vb)
        m = m_new
    return (acc / lsum[..., None]).reshape(q.shape).astype(np.float32)


def _block_tables(cache: PagedKVCache, seq_ids: list[int], layer: int) -> tuple[np.ndarray, np.ndarray]:
    """(block_tables int32 [B, max blocks], lens int32 [B]) of the sequences: what the C++ kernel walks."""
    seqs = [cache._seq(sid) for sid in seq_ids]
    lens = np.array([s.lens[layer] for s in seqs], dtype=np.int32)
    if len(seqs) == 1:
        return np.array([seqs[0].table], dtype=np.int32), lens
    tables = np.zeros((len(seqs), max(len(s.table) for s in seqs)), dtype=np.int32)
    for i, s in enumerate(seqs):
        tables[i, : len(s.table)] = s.table
    return tables, lens


def _paged_attention_cpp(
    q: np.ndarray, cache: PagedKVCache, seq_ids: list[int], layer: int, *, path: str = "auto"
) -> np.ndarray:
    tables, lens = _block_tables(cache, seq_ids, layer)
    kernel = backends.load_C("inference").paged_decode
    return kernel(q, cache._data, cache._scale, tables, lens, layer, path)


def _example(rng: Any) -> tuple[tuple, dict]:
    """A ragged GQA batch over an int8 cache with a forked (shared-block) sequence, for the conformance test."""
    cache = PagedKVCache(2, 2, 16, num_blocks=16, block_size=4, dtype="int8")
    ids = []
    for n in (1, 6, 9):
        sid = cache.new_sequence()
        for layer in range(2):
            k, v = (rng.standard_normal((n, 2, 16)).astype(np.float32) for _ in range(2))
            cache.append(sid, layer, k, v)
        ids.append(sid)
    ids.append(cache.fork(ids[-1]))
    return (rng.standard_normal((4, 4, 16)).astype(np.float32), cache, ids, 1), {}


backends.register("inference.paged_attention", "numpy", _paged_attention_numpy, example=_example)
for _v, _path in (("simd", "auto"), ("scalar", "scalar")):
    backends.register(
        "inference.paged_attention",
        "cpp",
        functools.partial(_paged_attention_cpp, path=_path),
        version=_v,
        available=functools.partial(backends.C_available, "inference"),
    )
