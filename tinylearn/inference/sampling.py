"""Sampling: temperature, top-k, top-p (nucleus) and ``generate``.

    temperature T:  p = softmax(logits / T); T = 0 means greedy (argmax, ties -> lowest id)
    top-k:          keep the k largest logits (ties with the k-th value are kept), renormalise
    top-p:          sort p descending, keep the smallest prefix whose cumulative probability >= p (at least one
                    token: token i is kept when the mass *before* it is < p), renormalise
Order as in Hugging Face's generate: temperature, then top-k, then top-p (on the top-k renormalised distribution).
Sampling draws u ~ U[0,1) from ``numpy.random.default_rng(seed)`` and inverts the CDF, so a seed fixes the output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .session import max_len, open_session


def _check(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not isinstance(temperature, int | float) or not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature: must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int | np.integer) or top_k < 1):
        raise ValueError(f"top_k: must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (not isinstance(top_p, int | float) or not 0 < top_p <= 1):
        raise ValueError(f"top_p: must be None or in (0, 1], got {top_p!r}")


def softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def top_k_filter(probs: np.ndarray, k: int) -> np.ndarray:
    """Zero all but the k most probable entries (ties with the k-th kept) and renormalise."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise TypeError(f"k: expected an int >= 1, got {type(k).__name__} {k!r}")
    if k < 1:
        raise ValueError(f"k: must be >= 1, got {k}")
    p = np.asarray(probs, dtype=np.float64)
    if k >= p.shape[-1]:
        return p / p.sum()
    kth = np.sort(p)[-k]
    out = np.where(p >= kth, p, 0.0)
    return out / out.sum()


def top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Nucleus: keep the smallest most-probable set with cumulative probability >= top_p (>= 1 token)."""
    if isinstance(top_p, bool) or not isinstance(top_p, int | float | np.integer | np.floating):
        raise TypeError(f"top_p: expected a float in (0, 1], got {type(top_p).__name__} {top_p!r}")
    if not 0.0 < top_p <= 1.0:  # also rejects NaN
        raise ValueError(f"top_p: must be in (0, 1], got {top_p}")
    p = np.asarray(probs, dtype=np.float64)
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]  # mass of the tokens ranked above each one
    keep_sorted = before < top_p
    keep_sorted[0] = True
    out = np.zeros_like(p)
    kept = order[keep_sorted]
    out[kept] = p[kept]
    return out / out.sum()


def filter_probs(
    logits: Any, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> np.ndarray:
    """The float64 distribution sampling draws from (temperature > 0): softmax(logits/T) -> top-k -> top-p."""
    _check(temperature, top_k, top_p)
    if temperature == 0:
        raise ValueError("temperature: 0 means greedy decoding; filter_probs needs temperature > 0")
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 1:
        raise ValueError(f"logits: expected a [V] vector, got shape {logits.shape}")
    p = softmax(logits / temperature)
    if top_k is not None:
        p = top_k_filter(p, int(top_k))
    if top_p is not None:
        p = top_p_filter(p, float(top_p))
    return p


def sample_from(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw: the first index whose cumulative probability exceeds u ~ U[0, 1)."""
    c = np.cumsum(probs)
    i = int(np.searchsorted(c, rng.random() * c[-1], side="right"))
    i = min(i, len(probs) - 1)
    while probs[i] == 0 and i > 0:  # u landed exactly on a boundary of a zero-probability tail
        i -= 1
    return i


def choose(
    logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None, rng: np.random.Generator
) -> int:
    if temperature == 0:
        return int(np.argmax(logits))
    return sample_from(filter_probs(logits, temperature, top_k, top_p), rng)


def generate(
    model: Any,
    prompt_ids: Any,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    kv_cache: bool = True,
    seed: int = 0,
) -> list[int]:
    """The ``max_new_tokens`` tokens generated after ``prompt_ids`` (the prompt itself is not repeated).

    kv_cache=True: one prefill forward over the prompt, then one single-token forward per new token (O(S) each);
    False: every step re-runs the model over the whole sequence (O(S^2) attention per step)."""
    _check(temperature, top_k, top_p)
    prompt = [int(t) for t in np.asarray(prompt_ids).reshape(-1)]
    if not prompt:
        raise ValueError("prompt_ids: need at least one token")
    if not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: must be an int >= 0, got {max_new_tokens!r}")
    m = max_len(model)
    if m is not None and len(prompt) + max_new_tokens - 1 > m:
        raise ValueError(
            f"max_new_tokens: prompt {len(prompt)} + {max_new_tokens} new tokens exceed max_seq_len={m} (+1)"
        )
    rng = np.random.default_rng(seed)
    out: list[int] = []
    if max_new_tokens == 0:
        return out
    sess = open_session(model, kv_cache)
    logits = sess.extend(prompt)[-1]
    while True:
        tok = choose(logits, temperature, top_k, top_p, rng)
        out.append(tok)
        if len(out) == max_new_tokens:
            return out
        logits = sess.extend([tok])[-1]
