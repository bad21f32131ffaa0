"""Exercises for notebooks/09_llm_inference: the four pieces of LLM serving you should be able to write from memory.

Run ``pytest exercises/09_llm_inference`` (your code) or ``pytest exercises/09_llm_inference --impl=reference``.
Reference solutions: tinylearn/inference/model.py (kv_append, kv_gather), tinylearn/inference/sampling.py
(top_p_filter), tinylearn/inference/speculative.py (accept_draft, residual_distribution),
tinylearn/inference/paged_math.py (blocks_needed, locate, kv_bytes_per_token).
"""

from __future__ import annotations

import numpy as np


# -- 1. dense KV cache ----------------------------------------------------------------------------------------------
def kv_append(k_cache: np.ndarray, v_cache: np.ndarray, length: int, k: np.ndarray, v: np.ndarray) -> int:
    """Write k, v [B, H, T, D] into preallocated caches [B, H, max_len, D] at positions [length, length + T) and
    return the new length. Raise ValueError mentioning ``max_len`` if the tokens do not fit.
    Reference: tinylearn/inference/model.py:kv_append."""
    raise NotImplementedError


def kv_gather(k_cache: np.ndarray, v_cache: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``length`` cached positions of both caches, [B, H, length, D] (views are fine).
    Reference: tinylearn/inference/model.py:kv_gather."""
    raise NotImplementedError


# -- 2. nucleus (top-p) sampling -----------------------------------------------------------------------------------
def top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most probable tokens whose total probability is >= top_p (always at least one
    token), zero the rest and renormalise. Example: probs [0.5, 0.3, 0.15, 0.05], top_p 0.6 -> [0.625, 0.375, 0, 0].
    Reference: tinylearn/inference/sampling.py:top_p_filter."""
    raise NotImplementedError


# -- 3. speculative decoding acceptance rule -----------------------------------------------------------------------
def accept_draft(p_x: float, q_x: float, u: float) -> bool:
    """Accept the draft token x (target prob p_x, draft prob q_x) iff u < min(1, p_x / q_x), u ~ U[0, 1).
    Reference: tinylearn/inference/speculative.py:accept_draft."""
    raise NotImplementedError


def residual_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The distribution to resample from after a rejection: max(0, p - q), normalised.
    Reference: tinylearn/inference/speculative.py:residual_distribution."""
    raise NotImplementedError


# -- 4. paged KV cache block table ---------------------------------------------------------------------------------
def blocks_needed(n_tokens: int, block_size: int) -> int:
    """Physical blocks a sequence of n_tokens occupies. Reference: tinylearn/inference/paged_math.py:blocks_needed."""
    raise NotImplementedError


def locate(block_table: list[int], block_size: int, pos: int) -> tuple[int, int]:
    """(physical block id, slot inside the block) of logical token position ``pos``; ValueError if pos is not
    covered by the table. Reference: tinylearn/inference/paged_math.py:locate."""
    raise NotImplementedError


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, dtype: str = "float32") -> int:
    """KV-cache bytes per token: K and V for every layer and KV head. "int8" stores 1-byte codes plus one float32
    scale per (token, head) for K and for V. Reference: tinylearn/inference/paged_math.py:kv_bytes_per_token."""
    raise NotImplementedError
