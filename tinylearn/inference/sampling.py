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

from .._inputs import to_numpy
from .checks import (
    InvalidDistributionError,
    bool_arg,
    check_vocab,
    int_arg,
    logit_vector,
    prob_vector,
    real_arg,
    seed_arg,
    token_list,
)
from .session import max_len, open_session


def _check(temperature: float, top_k: int | None, top_p: float | None) -> None:
    t = real_arg(temperature, "temperature")
    if not np.isfinite(t) or t < 0:
        raise ValueError(f"temperature: must be a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        int_arg(top_k, "top_k", minimum=1)
    if top_p is not None and not 0 < real_arg(top_p, "top_p") <= 1:  # also rejects NaN
        raise ValueError(f"top_p: must be None or in (0, 1], got {top_p!r}")


def softmax(x: np.ndarray) -> np.ndarray:
    """float64 softmax over the last axis (NaN in, NaN out, as torch's softmax)."""
    a = to_numpy(x, "x")
    if a.dtype.kind not in "fiu" and a.dtype.name != "bfloat16":
        raise TypeError(f"x: expected numeric logits, got dtype {a.dtype}")
    if a.ndim == 0 or a.shape[-1] == 0:
        raise ValueError(f"x: softmax needs at least one entry on the last axis, got shape {a.shape}")
    x = np.asarray(a, dtype=np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def top_k_filter(probs: np.ndarray, k: int) -> np.ndarray:
    """Zero all but the k most probable entries (ties with the k-th kept) and renormalise."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise TypeError(f"k: expected an int >= 1, got {type(k).__name__} {k!r}")
    if k < 1:
        raise ValueError(f"k: must be >= 1, got {k}")
    k = int(k)  # -k of a numpy uint8 would wrap around
    p = prob_vector(probs)
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
    p = prob_vector(probs)
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
    """The float64 distribution sampling draws from (temperature > 0): softmax(logits/T) -> top-k -> top-p.

    NaN or +inf logits (and all -inf) have no distribution: InvalidDistributionError (a RuntimeError and a
    ValueError), as ``torch.multinomial`` refuses the NaN probabilities softmax would give."""
    _check(temperature, top_k, top_p)
    if temperature == 0:
        raise ValueError("temperature: 0 means greedy decoding; filter_probs needs temperature > 0")
    logits = logit_vector(logits)
    p = softmax(logits / float(temperature))
    if not np.isfinite(p).all():  # a huge logit range / tiny temperature overflowing exp
        raise InvalidDistributionError(
            f"logits: softmax(logits / temperature={temperature!r}) is not finite; raise the temperature"
        )
    if top_k is not None:
        p = top_k_filter(p, int(top_k))
    if top_p is not None:
        p = top_p_filter(p, float(top_p))
    return p


def sample_from(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw: the first index whose cumulative probability exceeds u ~ U[0, 1).

    ``probs`` need not sum to 1, but must be finite, >= 0 and not all zero (as for ``torch.multinomial``)."""
    probs = prob_vector(probs)
    if not isinstance(rng, np.random.Generator):
        got = type(rng).__name__
        raise TypeError(f"rng: expected a numpy.random.Generator (np.random.default_rng(seed)), got {got}")
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
        if np.isnan(logits).any():  # argmax would pick the first NaN as if it were the best token
            raise InvalidDistributionError("logits: the model produced NaN logits; greedy decoding has no argmax")
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
    prompt = token_list(prompt_ids, "prompt_ids")
    max_new_tokens = int_arg(max_new_tokens, "max_new_tokens", minimum=0)
    kv_cache = bool_arg(kv_cache, "kv_cache")
    seed = seed_arg(seed)
    m = max_len(model)
    if m is not None and len(prompt) + max_new_tokens - 1 > m:
        raise ValueError(
            f"max_new_tokens: prompt {len(prompt)} + {max_new_tokens} new tokens exceed max_seq_len={m} (+1)"
        )
    rng = np.random.default_rng(seed)
    out: list[int] = []
    sess = open_session(model, kv_cache)  # refuses a non-model even when nothing is generated
    check_vocab(prompt, sess, "prompt_ids")
    if max_new_tokens == 0:
        return out
    logits = sess.extend(prompt)[-1]
    while True:
        tok = choose(logits, temperature, top_k, top_p, rng)
        out.append(tok)
        if len(out) == max_new_tokens:
            return out
        logits = sess.extend([tok])[-1]
